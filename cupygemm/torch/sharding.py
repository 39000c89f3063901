"""DTensor sharding rules for the operators (``torch.ops.cupygemm.*``), so that they take ``DTensor`` operands.

Registered with ``torch.distributed.tensor.experimental.register_sharding`` once DTensor is loaded, never loading it
(about half a second of import): at :mod:`cupygemm.torch`'s import if ``torch.distributed.tensor`` is loaded by
then, else at the first public call that sees a tensor subclass (DTensor is one). A program that calls
``torch.ops.cupygemm.*`` on DTensors directly where neither happened calls :func:`ensure_registered` first. The rules are
:mod:`cupygemm.sharding`'s, the ones JAX's partitioner applies:
for each mesh axis DTensor may keep every operand whole, or split the op along one factor the rule allows whose
shards are whole (128-blocks of a scale never straddle two devices). So, on a 1-D mesh:

- activations sharded by rows (``Shard(0)``, their scales too) and weights replicated give outputs sharded by rows;
- weights sharded by rows (column-parallel: ``Shard(0)`` of B and its 128x128 scales, N a multiple of 128 x the
  mesh) give outputs sharded by columns;
- both operands sharded along K (row-parallel) give ``Partial`` outputs: each device's GEMM of its K slice, which
  DTensor sums when they are redistributed (in the output's dtype: BF16 partial sums for the forward kinds, FP32 for
  the weight gradient, whose token-sharded form is data parallelism's gradient sum);
- the masked kind splits along groups (expert parallelism) or N; the contiguous kind along rows or N;
- the casts along rows or columns (their results transposed for the fused transposed casts).

DTensor picks among these by redistribution cost and redistributes operands that match none. Operators that
accumulate into ``out`` (``*_out``, the accumulating weight gradients) and those on packed weights get no rule:
DTensor refuses them on DTensor operands.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import torch

from .. import sharding as rules
from ..kinds import FORWARD, KINDS, GemmKind
from ..quantization import BLOCK_WITH_TRANSPOSE, TRANSPOSED, TRANSPOSED_ROWWISE
from ..util import ceil_div


def _stacked(shape: tuple[int, ...], rows: int, kb: int) -> bool | None:
    """Scales of ``rows`` rows and ``kb`` 128-blocks given as the transposed stack [..., kb, rows] (True) or
    row-major [..., rows, kb] (False); None where the shape cannot tell (``kb == rows``)."""
    last = tuple(shape[-2:])
    if kb == rows:
        return None
    return last == (kb, rows)


def _gemm_rule(kind: GemmKind, specs: list[Any]) -> rules.Rule | None:
    shapes = [tuple(s.shape) for s in specs]
    a, sfa, b, sfb = shapes[:4]
    kb = ceil_div(a[-1], 128)
    # Only the 1D1D kinds take scales as the transposed stack (DeepGEMM's form); B's 128x128 scales never.
    sfa_stacked = False if kind.family == FORWARD else _stacked(sfa, a[-2], kb)
    sfb_stacked = False if kind.b_block_scales else _stacked(sfb, b[-2], kb)
    if sfa_stacked is None or sfb_stacked is None:
        return None
    return rules.gemm_rule(kind, None, shapes, False, sfa_stacked, sfb_stacked)


def _strategies(rule: rules.Rule | None, args: tuple, tensors: list[int], outputs: int, mesh_size: int) -> list:
    """register_sharding's list of (output placements, input placements) for ``rule`` over ``args`` (the op's
    arguments, ``tensors`` the positions of the rule's operands among them)."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    def inputs(dims: tuple[int | None, ...]) -> list:
        placements: list = [None] * len(args)
        for pos, d in zip(tensors, dims):
            placements[pos] = Replicate() if d is None else Shard(d)
        return placements

    out = [([Replicate()] * outputs, inputs((None,) * len(tensors)))]
    for s in rules.splits(rule, mesh_size) if rule is not None else ():
        results = [Shard(d) if d is not None else Partial() if s.partial else Replicate() for d in s.results]
        out.append((results, inputs(s.operands)))
    return out


def _mesh_size(spec: Any) -> int:
    return int(spec.mesh.size())


def _gemm_strategy(kind: GemmKind) -> Callable[..., list]:
    n_tensors = 4 + bool(kind.layout)

    def strategy(*args: Any, **kwargs: Any) -> list:
        specs = list(args[:n_tensors])
        return _strategies(_gemm_rule(kind, specs), args, list(range(n_tensors)), 1, _mesh_size(specs[0]))
    return strategy


def _cast_strategy(make: Callable[[tuple[int, ...]], rules.Rule], outputs: int) -> Callable[..., list]:
    def strategy(x: Any, *args: Any, **kwargs: Any) -> list:
        return _strategies(make(tuple(x.shape)), (x, *args), [0], outputs, _mesh_size(x))
    return strategy


_registered = False


def ensure_registered() -> None:
    """Registers the rules now (importing DTensor) unless they are."""
    global _registered
    if not _registered:
        register(torch.ops.cupygemm)
        _registered = True


def register_if_loaded() -> None:
    """Registers the rules if DTensor is loaded and they are not yet: a flag test once they are (the public
    functions' path for tensor subclasses). Not while Dynamo traces the call: it cannot trace ``register_sharding``,
    and a ``fullgraph=True`` compile of a call on plain tensors failed with DTensor loaded. A program whose first
    call on DTensors is compiled calls :func:`ensure_registered` first."""
    if not _registered and "torch.distributed.tensor" in sys.modules and not torch.compiler.is_compiling():
        ensure_registered()


def register(ops: Any) -> bool:
    """Registers the rules for ``ops`` (``torch.ops.cupygemm``), importing DTensor; False where this torch has
    none."""
    if not torch.distributed.is_available():
        return False
    try:
        from torch.distributed.tensor.experimental import register_sharding
    except ImportError:  # a torch before register_sharding (2.5)
        return False
    for kind in KINDS:
        if not kind.accumulates and "F" not in kind.a_dims + kind.b_dims:
            register_sharding(getattr(ops, kind.api).default)(_gemm_strategy(kind))
    register_sharding(ops.per_token_cast_to_fp8.default)(
        _cast_strategy(lambda shape: rules.cast_rule(None, shape, block_rows=False), 2))
    register_sharding(ops.per_block_cast_to_fp8.default)(
        _cast_strategy(lambda shape: rules.cast_rule(None, shape, block_rows=True), 2))
    for entry in (TRANSPOSED, TRANSPOSED_ROWWISE, BLOCK_WITH_TRANSPOSE):
        register_sharding(getattr(ops, entry).default)(
            _cast_strategy(lambda shape, entry=entry: rules.fused_cast_rule(None, entry, shape),
                           len(rules.FUSED_CAST_RESULTS[entry])))
    return True
