"""Trace-time checks of cupygemm.jax's arguments: the eager path's own checks, on Views of the traced arrays.

Under ``jit`` only shapes and dtypes are known, and that is all the kinds' checks (:attr:`GemmKind.check
<cupygemm.kinds.GemmKind>`, built from :mod:`cupygemm.validate`) read besides pointers and strides. So each
operand becomes a :class:`~cupygemm.tensors.View` with a null pointer, C-contiguous strides (what XLA hands a
custom call) and device 0, and the kind's check runs on them with the JAX argument names (``a``, ``sfa``, ``b``,
``sfb``, ``out`` and the kind's layout operand): the same messages as an eager call, the same
:class:`~cupygemm.validate.Problem` (sizes and output shape). What only JAX needs is checked here too: operands
must be arrays, and the kind's static argument a Python int (it is part of the traced program).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..kinds import GemmKind
from ..tensors import FP8_E4M3, View
from ..validate import Names, Problem


def view(x: Any, name: str) -> View:
    """The View a check reads of a JAX array (or tracer): its shape and dtype, C-contiguous, at address 0."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name}: expected a JAX array, got {type(x).__name__}")
    shape = tuple(int(d) for d in x.shape)
    return View(0, shape, _strides(shape, np.dtype(x.dtype).itemsize), np.dtype(x.dtype), 0)


def b_view(shape: tuple[int, ...]) -> View:
    """The View of packed weights' B (their shape; the bytes are never read through it), as
    :meth:`cupygemm.PackedWeights.b_view` makes it for an eager call."""
    return View(0, shape, _strides(shape, 1), FP8_E4M3, 0)


def _strides(shape: tuple[int, ...], item: int) -> tuple[int, ...]:
    out, acc = [], item
    for d in reversed(shape):
        out.insert(0, acc)
        acc *= max(d, 1)
    return tuple(out)


def names(kind: GemmKind) -> Names:
    """The operands' names in messages: the JAX functions' parameter names."""
    return Names(a="a", sfa="sfa", b="b", sfb="sfb", out="out", layout=kind.layout)


def problem(kind: GemmKind, a: Any, sfa: Any, b: Any, sfb: Any, out: Any, layout: Any, static: int | None,
            packed_shape: tuple[int, ...] | None = None) -> Problem:
    """The kind's check on the operands' Views (``packed_shape``: ``b`` holds side-aware packed weights of B's
    shape); ValueError/TypeError naming the argument, as for an eager call."""
    views = (view(a, "a"), view(sfa, "sfa"), view(b, "b") if packed_shape is None else b_view(packed_shape),
             view(sfb, "sfb"), None if out is None else view(out, "out"))
    if kind.layout:
        views += (view(layout, kind.layout),)
    return kind.check(views, static, names=names(kind))


def static_int(kind: GemmKind, value: Any) -> int:
    """The kind's static argument (``expected_m``) as a Python int: it is part of the traced program."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise TypeError(f"{kind.static}: expected a non-negative Python int (static: it picks the kernel config), "
                        f"got {value!r}")
    return int(value)
