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
problems), ``b_block_scales`` (SFB per 1x128 like SFA: transposed the same way), ``static`` (passed to the planner)
and ``name``; of the plan: ``sfa_m_pad`` (``sfb_m_pad`` where the plan has one, else the Problem's),
``scratch_floats``, ``scratch_counters`` and ``launch``.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

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


def kernel_scales(s: jax.Array, pad: int) -> jax.Array:
    """Row-major scales [..., rows, KB] -> the M-major buffer the kernel reads, [..., KB, pad] (a small XLA op)."""
    t = jnp.swapaxes(s, -1, -2)
    return jnp.pad(t, [(0, 0)] * (t.ndim - 1) + [(0, pad - t.shape[-1])])


def _kernel_scales_shape(shape: tuple[int, ...], pad: int) -> tuple[int, ...]:
    return tuple(shape[:-2]) + (shape[-1], pad)


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
    plans = be.plan(kind, p.m, p.n, p.k, p.num_groups, static, **({"sides": True} if packed is not None else {}))
    if not plans:
        raise CupygemmDeviceError("cupygemm.jax: no local GPU to plan the GEMM for")
    first = next(iter(plans.values()))
    sfa_pad = first.sfa_m_pad
    sfb_pad = 0 if kind.b_block_scales else getattr(first, "sfb_m_pad", 0) or p.sfb_m_pad
    floats = max(pl.scratch_floats for pl in plans.values())
    counters = max(pl.scratch_counters for pl in plans.values())
    if any(pl.sfa_m_pad != sfa_pad or getattr(pl, "sfb_m_pad", 0) != getattr(first, "sfb_m_pad", 0)
           for pl in plans.values()):
        raise CupygemmDeviceError("cupygemm.jax: the local GPUs disagree on the scales' layout; use one GPU model")
    ip = 1 if floats else 0
    ic = (ip + 1) if counters else 0
    il = 4 if kind.layout else 0

    def make_launch(plan: Any) -> Callable:
        run = plan.launch
        if packed is not None:  # B: the packed bytes at their offset in the operand
            off, sides = packed.data_offset, packed.launch_sides

            def launch(stream: int, a: list[int], r: list[int]) -> None:
                run(stream, a[0], a[1], a[2] + off, a[3], r[0], layout=a[il] if il else 0,
                    partials=r[ip] if ip else 0, counters=r[ic] if ic else 0, zero_counters=bool(ic),
                    page_sides=sides)
        elif il:
            def launch(stream: int, a: list[int], r: list[int]) -> None:
                # r[0] is the aliased ``out`` (also the last operand): rows the kernel skips keep its contents.
                run(stream, a[0], a[1], a[2], a[3], r[0], layout=a[il], partials=r[ip] if ip else 0,
                    counters=r[ic] if ic else 0, zero_counters=bool(ic))
        else:
            def launch(stream: int, a: list[int], r: list[int]) -> None:
                run(stream, a[0], a[1], a[2], a[3], r[0], partials=r[ip] if ip else 0,
                    counters=r[ic] if ic else 0, zero_counters=bool(ic))
        return launch

    expected = None
    if check:
        f32 = xla_ffi.ffi_dtype("float32")
        shapes = [(xla_ffi.ffi_dtype(x.dtype), tuple(x.shape)) for x in operands]
        shapes[1] = (f32, _kernel_scales_shape(shapes[1][1], sfa_pad))
        if sfb_pad:
            shapes[3] = (f32, _kernel_scales_shape(shapes[3][1], sfb_pad))
        shapes.append((xla_ffi.ffi_dtype(kind.out_dtype), tuple(p.out_shape)))
        if floats:
            shapes.append((f32, (floats,)))
        if counters:
            shapes.append((xla_ffi.ffi_dtype("uint32"), (counters,)))
        expected = tuple(shapes)
    name = f"{kind.name} GEMM M={p.m} N={p.n} K={p.k} G={p.num_groups}"
    e = xla_ffi.FfiEntry(name, len(operands), 1 + bool(floats) + bool(counters),
                         {dev: make_launch(pl) for dev, pl in plans.items()}, expected)
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
    operands[1] = kernel_scales(sfa, sfa_pad)
    if sfb_pad:
        operands[3] = kernel_scales(sfb, sfb_pad)
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
