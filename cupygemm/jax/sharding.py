"""Partitioning rules: cupygemm.jax's custom calls under plain ``jit`` over sharded arrays (issue 47).

Without rules XLA runs a custom call on whole operands (it all-gathers sharded ones). Here each op is wrapped in
``jax.experimental.custom_partitioning``: a Shardy sharding rule lets shardings propagate through the op, and the
partition callback, which sees the operands' actual shardings, picks what each device computes and emits the
per-device call on the local shards (one custom call per device, planned for the local shapes at partition time).

Every operand dimension is a *factor* (``m``, ``n``, ``k``, ``g``); a scale dimension that counts 128-blocks of a
factor is that factor's block (a scale follows its data). The callback gives each factor the mesh axes of the
first operand dimension (in operand order, then the result's) that is sharded along it, in a fixed priority order,
and keeps them only where the op allows it and the shard divides evenly:

- an axis shards one factor at most (activations first: M, then K, then N or G);
- a factor with 128-blocks in a scale (K everywhere, N for 128x128 SFB, M for the per-block cast) is sharded only
  where each shard is a multiple of 128 (``size % (128 * shards) == 0``), so that block boundaries fall on shard
  boundaries; the contiguous kind's M likewise (its groups are 128-row aligned). Otherwise it is replicated.

Rules per op (anything else is replicated, i.e. gathered before the call):

- casts: rows (M) and columns (K); the transposed casts are a transpose then the per-token cast, so their
  T axis (the cast's K) keeps its sharding only where T / shards is a multiple of 128;
- dense GEMM: A rows -> D rows; B rows (N, column-parallel) -> D columns; K sharded consistently on A, B and
  their scales (row-parallel) -> each device's GEMM of its K slice, summed by ``lax.psum`` in float32 and
  rounded to BF16 once more: the partial products are BF16-rounded by the kernel first, so the result can differ
  from a one-device GEMM by a few BF16 ulps (each partial's rounding plus the sum's);
- masked grouped: groups (G of a, sfa, b, sfb, masked_m, out) and N; contiguous: rows (A, SFA, m_indices, out)
  with every group's weights replicated, and N;
- wgrad: M, N and K (K is the tokens: data-parallel weight gradients); a K-sharded call accumulates
  ``out + psum(partial)`` in float32;
- k-grouped wgrad: none (its flat operands have no dimension to shard): use ``shard_map``.

Inside ``shard_map`` (every mesh axis manual) the wrapper lowers to the plain call on the local shards.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.custom_partitioning import SdyShardingRule, custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from ..kinds import GemmKind
from ..layout import M_ALIGNMENT_FOR_CONTIGUOUS_LAYOUT

_BLOCK = 128

Dims = tuple[str, ...]  # one factor per dimension; "k/" is a dimension counting 128-blocks of k


@dataclass(frozen=True, eq=False)
class Rule:
    """How one op (at one set of global shapes) may be partitioned; a static argument of the wrapper."""

    impl: Callable[..., Any]  # the op on (local) operands
    operands: tuple[Dims | None, ...]  # None: never sharded (packed bytes)
    results: tuple[Dims, ...]
    shapes: tuple[tuple[int, ...], ...]  # the operands'
    allowed: tuple[str, ...]  # factors that may be sharded, in priority order
    align: tuple[tuple[str, int], ...] = ()  # a factor's shards must be multiples of this
    accumulates: bool = False  # the last operand is out, the result is out + A @ B.T

    def sizes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for dims, shape in zip(self.operands, self.shapes):
            for f, n in zip(dims or (), shape):
                if not f.endswith("/"):
                    out.setdefault(f, n)
        return out

    def blocked(self) -> set[str]:
        return {f[:-1] for dims in (*self.operands, *self.results) for f in dims or () if f.endswith("/")}

    def multiple(self, factor: str) -> int:
        need = dict(self.align).get(factor, 1)
        return max(need, _BLOCK) if factor in self.blocked() else need

    def reduced(self) -> tuple[str, ...]:
        """Allowed factors absent from the results: sharding them needs a sum."""
        present = {f.rstrip("/") for dims in self.results for f in dims}
        return tuple(f for f in self.allowed if f not in present)


def _axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _spec_of(x: Any, ndim: int) -> tuple[tuple[str, ...], ...]:
    sharding = getattr(x, "sharding", None)
    spec = tuple(getattr(sharding, "spec", ()) or ())
    return tuple(_axes(e) for e in spec) + ((),) * (ndim - len(spec))


def decide(rule: Rule, mesh: Any, operand_specs: Sequence[tuple[tuple[str, ...], ...]],
           result_specs: Sequence[tuple[tuple[str, ...], ...]]) -> dict[str, tuple[str, ...]]:
    """The mesh axes each factor is sharded along (see the module docstring), from the operands' shardings and
    the result shardings XLA proposes."""
    sizes, used = rule.sizes(), set()
    chosen: dict[str, tuple[str, ...]] = {}
    pairs = list(zip(rule.operands, operand_specs)) + list(zip(rule.results, result_specs))
    for f in rule.allowed:
        found: tuple[str, ...] = ()
        for dims, spec in pairs:
            for d, axes in zip(dims or (), spec):
                if d.rstrip("/") == f and axes and not found:
                    found = axes
        found = tuple(a for a in found if a not in used)
        shards = math.prod(mesh.shape[a] for a in found)
        if shards > 1 and sizes.get(f, 0) % (shards * rule.multiple(f)) == 0:
            chosen[f] = found
            used.update(found)
    return chosen


def _spec(dims: Dims | None, ndim: int, chosen: dict[str, tuple[str, ...]]) -> PartitionSpec:
    if dims is None:
        return PartitionSpec(*([None] * ndim))
    entries = []
    for d in dims:
        axes = chosen.get(d.rstrip("/"), ())
        entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*entries)


def _partition(rule: Rule, mesh: Any, arg_shapes: Any, result_shape: Any) -> tuple:
    args = list(arg_shapes)
    results = list(result_shape) if isinstance(result_shape, (tuple, list)) else [result_shape]
    chosen = decide(rule, mesh, [_spec_of(x, len(x.shape)) for x in args],
                    [_spec_of(r, len(r.shape)) for r in results])
    reduce_axes = tuple(a for f in rule.reduced() for a in chosen.get(f, ()))
    arg_shardings = tuple(NamedSharding(mesh, _spec(d, len(x.shape), chosen)) for d, x in zip(rule.operands, args))
    out_shardings = [NamedSharding(mesh, _spec(d, len(r.shape), chosen)) for d, r in zip(rule.results, results)]

    def lower(*ops: jax.Array) -> Any:
        if not reduce_axes:
            return rule.impl(*ops)
        if rule.accumulates:  # each device's partial from zeros, out added once
            out = ops[-1]
            partial = rule.impl(*ops[:-1], jnp.zeros_like(out))
            return out + lax.psum(partial.astype(out.dtype), reduce_axes)
        d = rule.impl(*ops)
        return lax.psum(d.astype(jnp.float32), reduce_axes).astype(d.dtype)

    result_sharding = tuple(out_shardings) if isinstance(result_shape, (tuple, list)) else out_shardings[0]
    return mesh, lower, result_sharding, arg_shardings


def _sharding_rule(rule: Rule, mesh: Any, value_types: Any, result_types: Any) -> SdyShardingRule | tuple:
    """The Shardy rule (einsum-like) of ``rule``: a blocked factor whose size is a multiple of 128 is split into
    its blocks and the 128 inside them (``(kb kr)``), so a scale's block dimension shares the sharding of its
    data; otherwise the scale dimension is its own factor and the data's factor is not sharded."""
    sizes, blocked = rule.sizes(), rule.blocked()
    split = {f for f in blocked if sizes.get(f, 0) % _BLOCK == 0}
    extra: dict[str, int] = {}
    own = 0

    def name(d: str) -> str:
        nonlocal own
        if d.endswith("/"):
            if d[:-1] in split:
                return d[:-1] + "b"
            own += 1
            return f"s{own}"
        if d in split:
            extra[d + "r"] = _BLOCK
            return f"({d}b {d}r)"
        return d

    def side(dims_list: Sequence[Dims | None], shapes: Sequence[tuple[int, ...]]) -> str:
        nonlocal own
        parts = []
        for dims, shape in zip(dims_list, shapes):
            if dims is None:  # a dimension of its own per axis, never sharded
                names = []
                for _ in shape:
                    own += 1
                    names.append(f"s{own}")
                parts.append(" ".join(names))
            else:
                parts.append(" ".join(name(d) for d in dims))
        return ", ".join(parts)

    lhs = side(rule.operands, rule.shapes)
    rhs = side(rule.results, [()] * len(rule.results))
    factors = list(dict.fromkeys(" ".join([lhs, rhs]).replace("(", " ").replace(")", " ").replace(",", " ").split()))

    def base(f: str) -> str:
        return f[:-1] if f[:-1] in split and f[-1] in "br" else f
    present = {base(f) for f in rhs.replace("(", " ").replace(")", " ").replace(",", " ").split()}
    allowed = {f for f in rule.allowed if f not in blocked or f in split}
    # Shardy wants the special factors in the order the factors first appear.
    reduction = tuple(f for f in factors if base(f) not in present and base(f) in allowed)
    replicate = tuple(f for f in factors if base(f) not in allowed and f not in reduction)
    return f"{lhs} -> {rhs}", dict(extra, reduction_factors=reduction, need_replication_factors=replicate)


def _call(rule: Rule, *operands: jax.Array) -> Any:
    return rule.impl(*operands)


partitioned = custom_partitioning(_call, static_argnums=(0,))
partitioned.def_partition(partition=_partition, sharding_rule=_sharding_rule)


def apply(rule: Rule, *operands: jax.Array) -> Any:
    """``rule.impl(*operands)`` with the rule's partitioning under ``jit`` over sharded operands."""
    return partitioned(rule, *operands)


def gemm_rule(kind: GemmKind, impl: Callable[..., Any], operands: Sequence[Any], packed: bool,
              sfa_stacked: bool, sfb_stacked: bool) -> Rule | None:
    """The rule of a GEMM kind from its descriptor's dimensions (None: the kind is not partitioned, e.g. flat
    operands). ``sfa_stacked``/``sfb_stacked``: the scales came as the transposed stack [..., KB, rows]."""
    if "F" in kind.a_dims + kind.b_dims:
        return None

    def dims(letters: str) -> Dims:
        return tuple(c.lower() for c in letters)

    def scales(letters: str, rows: str, block_rows: bool, stacked: bool) -> Dims:
        out = tuple((c.lower() + "/") if c == "K" or (block_rows and c == rows) else c.lower() for c in letters)
        return out[:-2] + (out[-1], out[-2]) if stacked else out

    ops: list[Dims | None] = [dims(kind.a_dims), scales(kind.a_dims, "M", False, sfa_stacked),
                              None if packed else dims(kind.b_dims),
                              scales(kind.b_dims, "N", kind.b_block_scales, sfb_stacked)]
    align: tuple[tuple[str, int], ...] = ()
    if kind.layout:
        ops.append(("g",) if "G" in kind.a_dims else ("m",))
    if kind.layout or kind.accumulates:
        ops.append(dims(kind.out_dims))
    if kind.accumulates:
        allowed: tuple[str, ...] = ("m", "k", "n")
    elif kind.layout and "G" in kind.a_dims:  # masked: each group's rows belong together (masked_m counts them)
        allowed = ("g", "n")
    elif kind.layout:  # contiguous: rows (their groups 128-aligned), every group's weights on every device
        allowed = ("m", "n")
        align = (("m", M_ALIGNMENT_FOR_CONTIGUOUS_LAYOUT),)
    else:
        allowed = ("m", "k", "n")
    if packed:  # the packed bytes cannot be split: B's dimensions stay whole
        allowed = tuple(f for f in allowed if f not in kind.b_dims.lower())
    return Rule(impl, tuple(ops), (dims(kind.out_dims),), tuple(tuple(x.shape) for x in operands), allowed, align,
                kind.accumulates)


def cast_rule(impl: Callable[..., Any], x: Any, block_rows: bool) -> Rule:
    """The rule of a cast of ``x`` [m, k]: ``(q [m, k], s)`` with 1x128 (``block_rows``: 128x128) scales."""
    return Rule(impl, (("m", "k"),), (("m", "k"), ("m/" if block_rows else "m", "k/")), (tuple(x.shape),),
                ("m", "k"))
