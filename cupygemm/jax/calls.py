"""One GEMM as an XLA custom call, planned at trace time.

:func:`gemm` is the body of every kind's op. At trace time shapes are static: it checks the operands (the kind's
own check, :mod:`.checks`), answers empty problems without a kernel, and otherwise gets the handler entry of the
static problem (:func:`entry`: the backend plans the launch on every local GPU and the launch closure is
registered with the platform's handler), makes the scales' kernel layout with a small XLA op
(:func:`kernel_scales`), and emits one ``jax.ffi.ffi_call`` carrying the entry id. Its results: the output
(``out``, when the kind takes one, is an operand aliased to it), then the split-K/stream-K scratch the plan needs
(XLA allocates it; the tile counters are zeroed by a memset on XLA's stream before each launch).

What is read of the kind (:class:`cupygemm.kinds.GemmKind`): its operands (``layout``: an int32 operand after
``sfb``; an ``out`` operand when the kind has a layout or accumulates), ``out_dtype``, ``accumulates`` (empty
problems), ``b_block_scales`` (SFB per 1x128 like SFA: laid out the same way), ``static`` (passed to the planner)
and ``name``; of the kind's Problem: the sizes, the output's shape, and how each scale operand was given (in the
kernel's layout already, or the strides of a copy); of the plan: ``sfa_m_pad`` and ``sfb_m_pad`` (the Problem's
where the plan has none), ``scratch_floats``, ``scratch_counters`` and ``launch`` (called with
:meth:`cupygemm.plan.GemmPlan.launch`'s arguments: ``layout``, ``partials``, ``counters``, ``zero_counters``,
``page_sides``).
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .. import sharding as rules
from .. import xla_ffi
from ..env import check_inputs_enabled
from ..errors import CupygemmDeviceError
from ..kinds import GemmKind
from ..validate import Problem
from . import backend, checks, vma
from .packed import PackedSpec


def has_out(kind: GemmKind) -> bool:
    """The kind's op takes ``out`` (last operand, aliased to the result): the kernel leaves some of its rows
    (a layout operand) or accumulates into it."""
    return kind.layout is not None or kind.accumulates


def _stacked(shape: tuple[int, ...], rows: int, in_place: bool, strides: tuple[int, int, int] | None) -> bool:
    """Scales of ``rows`` rows given as the transposed stack [..., KB, rows] (DeepGEMM's form for 1x128 operands of
    the 1D1D kinds), not row-major [..., rows, KB] (the casts' form). The kind's check read them one way or the
    other; where both shapes are the same (KB == rows) its Problem says which: in place (only a stack can be, then)
    or copied with a column stride other than 1."""
    last = tuple(shape[-2:])
    if len(last) < 2 or last[-1] != rows:
        return False
    return last[0] != rows or (rows > 1 and (in_place or (strides is not None and strides[2] != 1)))


def kernel_scales(s: jax.Array, rows: int, pad: int, in_place: bool,
                  strides: tuple[int, int, int] | None) -> jax.Array:
    """Scales as the kernel reads them, [..., KB, pad] (M-major, padded rows): a stack already in that layout as
    it is (the Problem says in place); row-major [..., rows, KB] transposed and padded, a stack padded (a small XLA
    op)."""
    stacked = _stacked(tuple(s.shape), rows, in_place, strides)
    if stacked and in_place:
        return s
    t = s if stacked else jnp.swapaxes(s, -1, -2)
    return jnp.pad(t, [(0, 0)] * (t.ndim - 1) + [(0, pad - t.shape[-1])])


def _kernel_scales_shape(shape: tuple[int, ...], rows: int, pad: int, in_place: bool,
                         strides: tuple[int, int, int] | None) -> tuple[int, ...]:
    stacked = _stacked(shape, rows, in_place, strides)
    if stacked and in_place:
        return tuple(shape)
    return tuple(shape[:-2]) + ((shape[-2],) if stacked else (shape[-1],)) + (pad,)


def entry(kind: GemmKind, static: int | None, packed: PackedSpec | None, p: Problem,
          operands: tuple[Any, ...]) -> tuple[int, int, int, int, int]:
    """Plan (at trace time) and register the handler entry of one static problem (``packed``: B is packed weights,
    operand 2 their bytes).

    Returns ``(entry_id, sfa_pad, sfb_pad, scratch_floats, scratch_counters)`` (``sfb_pad`` 0 for 128x128 SFB).
    """
    be = backend.current()
    handler = backend.handler(be)
    check = check_inputs_enabled()
    key = (kind, static, tuple((tuple(x.shape), str(x.dtype)) for x in operands), check, packed)
    with be.lock:
        hit = be.entries.get(key)
    if hit is not None:
        return hit
    extra: dict[str, Any] = {"sides": True} if packed is not None else {}
    if "F" in kind.a_dims:  # flat groups: the stacked scales' rows are not implied by the sizes on the host
        extra["scale_rows"] = int(operands[1].shape[0])
    plans = be.plan(kind, p.m, p.n, p.k, p.num_groups, static, **extra)
    if not plans:
        raise CupygemmDeviceError("cupygemm.jax: no local GPU to plan the GEMM for")
    first = next(iter(plans.values()))
    # The scales' padded row count: the plan's (the kernel's contract), else the kind's check's.
    sfa_pad = getattr(first, "sfa_m_pad", None) or p.sfa_m_pad
    sfb_pad = 0 if kind.b_block_scales else getattr(first, "sfb_m_pad", None) or p.sfb_m_pad
    floats = max(pl.scratch_floats for pl in plans.values())
    counters = max(pl.scratch_counters for pl in plans.values())
    if any(getattr(pl, "sfa_m_pad", None) != getattr(first, "sfa_m_pad", None)
           or getattr(pl, "sfb_m_pad", None) != getattr(first, "sfb_m_pad", None) for pl in plans.values()):
        raise CupygemmDeviceError("cupygemm.jax: the local GPUs disagree on the scales' layout; use one GPU model")
    ip = 1 if floats else 0
    ic = (ip + 1) if counters else 0
    il = 4 if kind.layout else 0

    def call_args(a: Sequence[int], r: Sequence[int]) -> tuple[tuple[int, ...], dict[str, Any]]:
        """The plan's launch arguments after the stream, from the custom call's operand and result pointers."""
        kw = {"partials": r[ip] if ip else 0, "counters": r[ic] if ic else 0, "zero_counters": bool(ic)}
        if il:  # r[0] is the aliased ``out`` (also the last operand): rows the kernel skips keep its contents.
            kw["layout"] = a[il]
        if packed is not None:  # B: the packed bytes at their offset in the operand
            kw["page_sides"] = packed.launch_sides
            return (a[0], a[1], a[2] + packed.data_offset, a[3], r[0]), kw
        return (a[0], a[1], a[2], a[3], r[0]), kw

    def make_launch(plan: Any) -> xla_ffi.Launch:
        def launch(stream: int, a: Sequence[int], r: Sequence[int]) -> None:
            ptrs, kw = call_args(a, r)
            plan.launch(stream, *ptrs, **kw)
        return launch

    def make_bind(plan: Any) -> xla_ffi.Bind:
        def bind(a: Sequence[int], r: Sequence[int]) -> xla_ffi.Fire:
            ptrs, kw = call_args(a, r)
            return plan.bind(*ptrs, **kw)
        return bind

    expected = None
    if check:
        f32 = xla_ffi.ffi_dtype("float32")
        shapes = [(xla_ffi.ffi_dtype(x.dtype), tuple(x.shape)) for x in operands]
        shapes[1] = (f32, _kernel_scales_shape(shapes[1][1], p.m, sfa_pad, p.sfa_m_major, p.sfa_strides))
        if sfb_pad:
            shapes[3] = (f32, _kernel_scales_shape(shapes[3][1], p.n, sfb_pad, p.sfb_m_major, p.sfb_strides))
        shapes.append((xla_ffi.ffi_dtype(kind.out_dtype), tuple(p.out_shape)))
        if floats:
            shapes.append((f32, (floats,)))
        if counters:
            shapes.append((xla_ffi.ffi_dtype("uint32"), (counters,)))
        expected = tuple(shapes)
    name = f"{kind.name} GEMM M={p.m} N={p.n} K={p.k} G={p.num_groups}"
    e = xla_ffi.FfiEntry(name, len(operands), 1 + bool(floats) + bool(counters),
                         {dev: make_launch(pl) for dev, pl in plans.items()}, expected,
                         # plans that can bind their pointers (the GPU's; the CPU tests' host plans launch)
                         {dev: make_bind(pl) for dev, pl in plans.items()}
                         if all(hasattr(pl, "bind") for pl in plans.values()) else None)
    result = (handler.add(e), sfa_pad, sfb_pad, floats, counters)
    with be.lock:
        be.entries.setdefault(key, result)
    return result


def gemm(kind: GemmKind, static: int | None, packed: PackedSpec | None, operands: tuple[Any, ...]) -> jax.Array:
    """One GEMM of ``kind`` on ``operands`` (``a, sfa, b, sfb``, then the layout operand and ``out`` where the kind
    takes them; ``b`` the packed bytes when ``packed``): the custom call's result."""
    a, sfa, b, sfb = operands[:4]
    layout = operands[4] if kind.layout else None
    out = operands[-1] if has_out(kind) else None
    p = checks.problem(kind, a, sfa, b, sfb, out, layout, static, None if packed is None else packed.shape)
    if p.m == 0 or p.n == 0 or p.num_groups == 0:
        return out if out is not None else jnp.zeros(p.out_shape, kind.out_dtype)
    if p.k == 0:  # A @ B.T is zero
        return out if kind.accumulates else jnp.zeros(p.out_shape, kind.out_dtype)
    eid, sfa_pad, sfb_pad, floats, counters = entry(kind, static, packed, p, operands)
    operands = list(operands)
    operands[1] = kernel_scales(sfa, p.m, sfa_pad, p.sfa_m_major, p.sfa_strides)
    if sfb_pad:
        operands[3] = kernel_scales(sfb, p.n, sfb_pad, p.sfb_m_major, p.sfb_strides)
    axes = vma.union(*operands)
    operands = [vma.to_varying(x, axes) for x in operands]
    results = [jax.ShapeDtypeStruct(tuple(p.out_shape), kind.out_dtype)]
    if floats:
        results.append(jax.ShapeDtypeStruct((floats,), jnp.float32))
    if counters:
        results.append(jax.ShapeDtypeStruct((counters,), jnp.uint32))
    call = jax.ffi.ffi_call(backend.TARGET, results, vmap_method="sequential",
                            input_output_aliases={len(operands) - 1: 0} if out is not None else None)
    return vma.to_varying(call(*operands, entry_id=np.int64(eid))[0], axes)


def sharded_gemm(kind: GemmKind, static: int | None, packed: PackedSpec | None,
                 operands: tuple[Any, ...]) -> jax.Array:
    """:func:`gemm` with the kind's partitioning rule under ``jit`` over sharded operands (:mod:`.sharding`);
    kinds without one (flat operands) run on whole operands."""
    from . import sharding  # jax.experimental, imported where it is used

    a, sfa, b, sfb = operands[:4]
    layout = operands[4] if kind.layout else None
    out = operands[-1] if has_out(kind) else None
    p = checks.problem(kind, a, sfa, b, sfb, out, layout, static, None if packed is None else packed.shape)
    rule = rules.gemm_rule(
        kind, lambda *ops: gemm(kind, static, packed, ops), [tuple(x.shape) for x in operands], packed is not None,
        _stacked(tuple(sfa.shape), p.m, p.sfa_m_major, p.sfa_strides),
        not kind.b_block_scales and _stacked(tuple(sfb.shape), p.n, p.sfb_m_major, p.sfb_strides))
    if rule is None:
        return gemm(kind, static, packed, operands)
    return sharding.apply(rule, *operands)
