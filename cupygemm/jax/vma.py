"""Varying manual axes: how cupygemm.jax's custom calls are typed inside ``jax.shard_map``.

Inside ``shard_map`` a value's type says along which mesh axes it varies from device to device (its *vma*:
``jax.typeof(x).mat.varying`` in JAX 0.10, ``jax.typeof(x).vma`` before). An XLA custom call's results get their
types from the ``ShapeDtypeStruct`` s given to ``jax.ffi.ffi_call``, which vary along no axis unless told, and
``ffi_call`` wants its operands to agree. So a call here takes the union of its operands' varying axes
(:func:`union`), casts each operand to vary along all of them, and casts its results likewise (:func:`to_varying`:
``lax.pcast(..., to="varying")``, ``lax.pvary`` in older JAX; a no-op at run time). Without that, a cast whose two
``lax.platform_dependent`` branches are the custom call and ``jnp`` code fails to trace (the branches' types
differ), and a GEMM's result would claim to be the same on every device. (The results are cast after the call
rather than typed in its ``ShapeDtypeStruct`` s: how those say so differs between JAX versions.)

Outside ``shard_map`` (or with ``check_vma=False``) every union is empty and nothing here changes the program.
"""
from __future__ import annotations

from typing import Any

import jax
from jax import lax


def varying(x: Any) -> frozenset:
    """The mesh axes along which ``x`` varies (empty outside ``shard_map``)."""
    typeof = getattr(jax, "typeof", None)
    if typeof is None:  # pragma: no cover - a JAX without varying manual axes
        return frozenset()
    t = typeof(x)
    mat = getattr(t, "mat", None)
    if mat is not None:
        return frozenset(mat.varying)
    return frozenset(getattr(t, "vma", ()) or ())


def union(*xs: Any) -> frozenset:
    """The axes along which any of ``xs`` (None skipped) varies."""
    out: frozenset = frozenset()
    for x in xs:
        if x is not None:
            out |= varying(x)
    return out


def to_varying(x: Any, axes: frozenset) -> Any:
    """``x`` typed to vary along ``axes`` too (the values are unchanged)."""
    missing = tuple(sorted(axes - varying(x), key=str))
    if not missing:
        return x
    if hasattr(lax, "pcast"):
        return lax.pcast(x, missing, to="varying")
    return lax.pvary(x, missing)  # JAX before pcast
