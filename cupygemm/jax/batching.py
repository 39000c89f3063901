"""The op of each kind: :func:`cupygemm.jax.calls.gemm` with its ``vmap`` rule and its no-derivative rule.

``vmap`` (``jax.custom_batching.custom_vmap``): a dense kind (A [M, K], B [N, K], out [M, N], no layout operand,
nothing accumulated) batched over A only (shared weights) folds the mapped axis into M: one GEMM with ``V*M`` rows.
Batched over its weights, it becomes one call of the family's masked kind (the kind whose operands are the dense
kind's with a leading group axis, whose layout operand counts each group's rows and whose static argument is
``expected_m``), one group per element and every row valid. Every other op (grouped kinds, accumulating kinds,
packed weights, a dense kind without a masked kind) runs once per mapped element, in sequence (``lax.map``).

Differentiation (``jax.custom_jvp``): any derivative raises TypeError naming the function (these are raw FP8
kernels without a VJP/JVP; differentiable layers are built on top of them).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

from .. import kinds
from ..kinds import GemmKind
from . import calls
from .packed import PackedSpec


def no_derivative(name: str) -> Callable:
    """A JVP rule that raises TypeError: ``cupygemm.jax.NAME`` has no derivative."""
    def jvp(primals: tuple, tangents: tuple) -> Any:
        raise TypeError(f"cupygemm.jax.{name} has no derivative: it is an FP8 inference kernel without a VJP/JVP. "
                        "Apply jax.lax.stop_gradient to its inputs, or differentiate a float reference instead.")
    return jvp


def _broadcast(x: jax.Array, batched: bool, size: int) -> jax.Array:
    return x if batched else jnp.broadcast_to(x, (size,) + x.shape)


def sequential_rule(op: Callable) -> Callable:
    """A vmap rule running ``op`` once per mapped element (``lax.map``), unbatched operands closed over."""
    def rule(axis_size: int, in_batched: list[bool], *args: jax.Array) -> tuple[jax.Array, bool]:
        mapped = tuple(x for x, bt in zip(args, in_batched) if bt)

        def one(xs: tuple) -> jax.Array:
            it = iter(xs)
            return op(*(next(it) if bt else x for x, bt in zip(args, in_batched)))
        return lax.map(one, mapped), True
    return rule


def foldable(kind: GemmKind) -> bool:
    """A dense kind whose mapped A folds into M."""
    return ((kind.a_dims, kind.b_dims, kind.out_dims) == ("MK", "NK", "MN") and kind.layout is None
            and not kind.accumulates)


def masked_form(kind: GemmKind) -> GemmKind | None:
    """The family's masked kind of a dense kind: the same operands with a leading group axis, a layout operand of
    rows per group and ``expected_m`` (None when the family has none)."""
    for other in kinds.KINDS:
        if (other.family == kind.family and other.out_dtype == kind.out_dtype and not other.accumulates
                and (other.a_dims, other.b_dims, other.out_dims) == ("G" + kind.a_dims, "G" + kind.b_dims,
                                                                     "G" + kind.out_dims)
                and other.layout is not None and other.static == "expected_m"):
            return other
    return None


def _fold_rule(kind: GemmKind, op: Callable) -> Callable:
    def rule(axis_size: int, in_batched: list[bool], a: jax.Array, sfa: jax.Array, b: jax.Array,
             sfb: jax.Array) -> tuple[jax.Array, bool]:
        a_b, sfa_b, b_b, sfb_b = in_batched
        a, sfa = _broadcast(a, a_b, axis_size), _broadcast(sfa, sfa_b, axis_size)
        v, m, k = a.shape
        if not (b_b or sfb_b):
            # Shared weights: the mapped axis is more rows of one GEMM.
            d = op(a.reshape(v * m, k), sfa.reshape(v * m, sfa.shape[-1]), b, sfb)
            return d.reshape((v, m) + d.shape[1:]), True
        # Weights per element: a masked grouped GEMM, one group per element, all rows valid.
        masked = masked_form(kind)
        if masked is None:
            return sequential_rule(op)(axis_size, [True, True, b_b, sfb_b], a, sfa, b, sfb)
        b, sfb = _broadcast(b, b_b, axis_size), _broadcast(sfb, sfb_b, axis_size)
        masked_m = jnp.full((v,), m, jnp.int32)
        dims = dict(zip(kind.a_dims, a.shape[1:])) | dict(zip(kind.b_dims, b.shape[1:]))
        out = jnp.zeros((v,) + tuple(dims[d] for d in kind.out_dims), masked.out_dtype)
        return vmappable(masked, m, None)(a, sfa, b, sfb, masked_m, out), True
    return rule


@functools.lru_cache(maxsize=None)
def vmappable(kind: GemmKind, static: int | None, packed: PackedSpec | None) -> Callable:
    """The kind's call (for one static argument and packed layout) with its vmap rule."""
    def impl(*operands: jax.Array) -> jax.Array:
        return calls.sharded_gemm(kind, static, packed, operands)

    op = jax.custom_batching.custom_vmap(impl)
    op.def_vmap(_fold_rule(kind, op) if packed is None and foldable(kind) else sequential_rule(op))
    return op


@functools.lru_cache(maxsize=None)
def op(kind: GemmKind, static: int | None, packed: PackedSpec | None) -> Callable:
    """:func:`vmappable` without a derivative: what the public functions call."""
    wrapped = jax.custom_jvp(vmappable(kind, static, packed))
    wrapped.defjvp(no_derivative(kind.api))
    return wrapped
