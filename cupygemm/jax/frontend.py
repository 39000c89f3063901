"""The public GEMM functions of cupygemm.jax, made from the kind descriptors: signature, docstring, jitted boundary.

For a kind (:class:`cupygemm.kinds.GemmKind`) whose eager function is ``cupygemm.NAME``, :func:`public` makes
``cupygemm.jax.NAME(a, sfa, b, sfb, *own, out)``: ``own`` are the kind's layout operand (an int32 JAX array that
may be traced) then its static argument (a Python int); ``out`` is there when the kernel keeps rows of it (a
layout operand: optional, zeros by default) or accumulates into it (required). ``sfb`` defaults to None when
nothing required follows it (packed weights carry their scales). The function is a plain Python function (so
``help()`` shows its signature) calling one jitted boundary per kind, which unpacks packed weights, runs the
kind's check on the operands' shapes and dtypes (:mod:`.checks`), makes the default ``out``, and calls the kind's
op (:mod:`.batching`). Eager calls (concrete arrays) therefore run the same traced program as calls under ``jit``,
ordered on XLA's stream like any JAX result.
"""
from __future__ import annotations

import functools
import keyword
import textwrap
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..kinds import FORWARD, GemmKind
from ..packing import PackedWeights
from ..tensors import BF16
from . import batching, checks
from .calls import has_out
from .packed import unpack

_WIDTH = 100  # docstring lines


def _boundary(kind: GemmKind) -> Callable:
    """The kind's jitted boundary: ``(a, sfa, b, sfb, layout, static, out) -> result`` (static: argument 5)."""
    takes_out = has_out(kind)

    def boundary(a: Any, sfa: Any, b: Any, sfb: Any, layout: Any, static: int | None, out: Any) -> jax.Array:
        b, sfb, packed = unpack(b, sfb)
        p = checks.problem(kind, a, sfa, b, sfb, out, layout, static, None if packed is None else packed.shape)
        bits = out is not None and kind.out_dtype == BF16 and np.dtype(out.dtype) == np.uint16
        if bits:  # bfloat16 as uint16 bits (the eager path takes them too): the same bits back
            out = lax.bitcast_convert_type(out, jnp.bfloat16)
        elif out is None and takes_out:  # (an accumulating kind's check wants out: it says so)
            out = jnp.zeros(p.out_shape, kind.out_dtype)
        operands = (a, sfa, b, sfb) + ((layout,) if kind.layout else ()) + ((out,) if takes_out else ())
        d = batching.op(kind, static, packed)(*operands)
        return lax.bitcast_convert_type(d, jnp.uint16) if bits else d

    boundary.__name__ = boundary.__qualname__ = f"{kind.api}_boundary"
    return jax.jit(boundary, static_argnums=5)


def _dims(dims: str, scales: str = "") -> str:
    """A shape from dimension letters (``scales``: "A" for 1x128 scales of K, "B" for 128x128 block scales)."""
    if "F" in dims:
        return "(the groups back to back, flat)"
    names = {"G": "G", "M": "M", "N": "N", "K": "K"}
    if scales:
        names["K"] = "ceil(K/128)"
        if scales == "B":
            names["N"] = "ceil(N/128)"
    return "[" + ", ".join(names[d] for d in dims) + "]"


def _doc(kind: GemmKind) -> str:
    out_dtype = np.dtype(kind.out_dtype).name
    eager = f":func:`cupygemm.{kind.api}`"
    packed = kind.family == FORWARD
    args = [("a", f"float8_e4m3fn (or uint8 e4m3 bits) {_dims(kind.a_dims)}."),
            ("sfa", f"float32 scales of A, as {eager} takes them." if "F" in kind.a_dims else
             f"float32 {_dims(kind.a_dims, 'A')}, one scale per row and 128 of K (row-major, as the casts "
             "return it)."),
            ("b", f"float8_e4m3fn {_dims(kind.b_dims)}"
                  + (", or :class:`~cupygemm.PackedWeights` of it (then ``sfb`` is None)." if packed else ".")),
            ("sfb", f"float32 scales of B, as {eager} takes them." if "F" in kind.b_dims else
             f"float32 {_dims(kind.b_dims, 'B' if kind.b_block_scales else 'A')}, "
             + ("one scale per 128x128 block." if kind.b_block_scales else "one scale per row and 128 of K."))]
    if kind.layout:
        args.append((kind.layout, "int32 JAX array on the device, read by the kernel (it may be traced and change "
                                  "from call to call; its values are not checked on the host)."))
    if kind.static:
        args.append((kind.static, "static Python int (part of the traced call: it picks the kernel config)."))
    if kind.accumulates:
        args.append(("out", f"{out_dtype} {_dims(kind.out_dims)}, accumulated into: the result is "
                            "``out + A @ B.T``. Passed to XLA as an operand aliased to the result: donate it under "
                            "``jit`` to accumulate in place."))
    elif kind.layout:
        args.append(("out", f"optional {out_dtype} {_dims(kind.out_dims)}: rows the kernel skips keep its values; "
                            "default zeros (one memset). Passed to XLA as an operand aliased to the result: donate "
                            "it under ``jit`` to make the call in place."))
    if batching.foldable(kind):
        vmapped = ("under ``vmap`` a mapped A becomes more rows of one GEMM and mapped weights a masked grouped "
                   "GEMM (one group per element)")
    else:
        vmapped = "under ``vmap`` one call per mapped element, in sequence"
    wrap = functools.partial(textwrap.fill, width=_WIDTH)
    lines = [wrap(f"{kind.summary[0].upper()}{kind.summary[1:]}, as an XLA custom call."), "",
             wrap(f"The JAX form of :func:`cupygemm.{kind.api}` (see it for the semantics and the constraints): "
                  "the same checks, plans and kernels."), "", "Args:"]
    lines += [wrap(f"{name}: {text}", initial_indent="    ", subsequent_indent="        ") for name, text in args]
    lines += ["", "Returns:", f"    {out_dtype} {_dims(kind.out_dims)}.", "",
              wrap(f"Works eagerly and under ``jit``, ``lax.scan`` and ``shard_map``; {vmapped}. No derivative "
                   "(TypeError). Shapes and dtypes are checked at trace time.")]
    return "\n".join(lines)


def _params(kind: GemmKind) -> list[str]:
    own = [x for x in (kind.layout, kind.static) if x]
    required_after = bool(own) or kind.accumulates
    params = ["a", "sfa", "b", "sfb" if required_after else "sfb=None", *own]
    if kind.accumulates:
        params.append("out")
    elif has_out(kind):
        params.append("out=None")
    return params


@functools.lru_cache(maxsize=None)
def public(kind: GemmKind) -> Callable[..., jax.Array]:
    """``cupygemm.jax.<kind.api>``: see the module docstring."""
    for name in (kind.api, kind.layout, kind.static):  # they become Python names in the generated function
        if name is not None and (not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_")
                                 or name in ("a", "sfa", "b", "sfb", "out")):
            raise ValueError(f"kind {kind.name!r}: {name!r} cannot name a parameter of a JAX function")
    params = _params(kind)
    args = ["a", "sfa", "b", "sfb", kind.layout or "None",
            f"_static({kind.static})" if kind.static else "None", "out" if has_out(kind) else "None"]
    source = f"def {kind.api}({', '.join(params)}):\n    return _boundary({', '.join(args)})\n"
    namespace: dict[str, Any] = {"_boundary": _boundary(kind), "_static": functools.partial(checks.static_int, kind),
                                 "jax": jax, "PackedWeights": PackedWeights}  # the annotations' names
    exec(compile(source, f"<cupygemm.jax.{kind.api}>", "exec"), namespace)
    fn = namespace[kind.api]
    fn.__module__ = "cupygemm.jax"
    fn.__qualname__ = kind.api
    fn.__doc__ = _doc(kind)
    packed = kind.family == FORWARD  # the kinds that take PackedWeights (as cupygemm.torch's packed operators)
    annotations = {"a": "jax.Array", "sfa": "jax.Array", "b": "jax.Array | PackedWeights" if packed else "jax.Array",
                   "sfb": "jax.Array | None" if packed else "jax.Array"}
    if kind.layout:
        annotations[kind.layout] = "jax.Array"
    if kind.static:
        annotations[kind.static] = "int"
    if has_out(kind):
        annotations["out"] = "jax.Array" if kind.accumulates else "jax.Array | None"
    annotations["return"] = "jax.Array"
    fn.__annotations__ = annotations
    return fn
