"""Partitioning rules: cupygemm.jax's custom calls under plain ``jit`` over sharded arrays (issue 47).

Without rules XLA runs a custom call on whole operands (it all-gathers sharded ones). Here each op is wrapped in
``jax.experimental.custom_partitioning``: a Shardy sharding rule lets shardings propagate through the op, and the
partition callback, which sees the operands' actual shardings, picks what each device computes and emits the
per-device call on the local shards (one custom call per device, planned for the local shapes at partition time).

What each op may be split along is :mod:`cupygemm.sharding`'s rule (shared with torch's DTensor). The callback
gives each factor the mesh axes of the first operand dimension (in operand order, then the result's) that is
sharded along it, in the rule's priority order, and keeps them only where the rule allows it and the shards are
whole; an axis shards one factor at most (activations first: M, then K, then N or G). Anything else is replicated,
i.e. gathered before the call. A K-sharded GEMM sums each device's GEMM of its K slice by ``lax.psum`` in float32,
rounded to BF16 once more: the partial products are BF16-rounded by the kernel first, so the result can differ from
a one-device GEMM by a few BF16 ulps (each partial's rounding plus the sum's); a K-sharded accumulating call adds
``out + psum(partial)`` in float32. The k-grouped weight gradient's flat operands have no dimension to shard: use
``shard_map``.

Inside ``shard_map`` (every mesh axis manual) the wrapper lowers to the plain call on the local shards.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.custom_partitioning import SdyShardingRule, custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from ..sharding import BLOCK, Dims, Rule


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
    used: set[str] = set()
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
        if shards > 1 and rule.divides(f, shards):
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
    split = {f for f in blocked if sizes.get(f, 0) % BLOCK == 0}
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
            extra[d + "r"] = BLOCK
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
