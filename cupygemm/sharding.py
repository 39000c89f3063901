"""How each operator may be split across devices: the rules JAX's partitioner (:mod:`cupygemm.jax.sharding`) and
torch's DTensor (:mod:`cupygemm.torch.sharding`) apply, in one place and without a framework.

Every operand dimension is a *factor* (``m``, ``n``, ``k``, ``g``); a scale dimension that counts 128-blocks of a
factor is that factor's block (``"k/"``): a scale follows its data. An op may be split along the factors its rule
allows, and only where every shard is whole:

- a factor with 128-blocks in a scale (K everywhere, N for 128x128 SFB, M for the per-block cast) only where each
  shard is a multiple of 128 (``size % (128 * shards) == 0``), so that block boundaries fall on shard boundaries;
  the contiguous kind's M likewise (its groups are 128-row aligned); any other factor where the shards are equal;
- a factor absent from the results (K of a GEMM) leaves each device a partial result, to be summed.

Rules per op:

- casts: rows (M) and columns (K); the fused transposed casts likewise (their results transposed);
- dense GEMM and the storing weight gradient: M, K and N;
- masked grouped: groups (G) and N (each group's rows belong together: masked_m counts them); contiguous: rows
  (every group's weights on every device) and N;
- accumulating kinds: M, K and N, the sum added to ``out`` once;
- flat operands (the k-grouped weight gradient): none.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .kinds import GemmKind
from .layout import M_ALIGNMENT_FOR_CONTIGUOUS_LAYOUT
from .quantization import BLOCK_WITH_TRANSPOSE, TRANSPOSED, TRANSPOSED_ROWWISE

BLOCK = 128

Dims = tuple[str, ...]  # one factor per dimension; "k/" is a dimension counting 128-blocks of k


@dataclass(frozen=True, eq=False)
class Rule:
    """How one op (at one set of global shapes) may be split."""

    impl: Callable[..., Any] | None  # the op on (local) operands, for a partitioner that calls it (JAX's)
    operands: tuple[Dims | None, ...]  # None: never split (packed bytes)
    results: tuple[Dims, ...]
    shapes: tuple[tuple[int, ...], ...]  # the operands'
    allowed: tuple[str, ...]  # factors that may be split, in priority order
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
        return max(need, BLOCK) if factor in self.blocked() else need

    def reduced(self) -> tuple[str, ...]:
        """Allowed factors absent from the results: splitting them needs a sum."""
        present = {f.rstrip("/") for dims in self.results for f in dims}
        return tuple(f for f in self.allowed if f not in present)

    def divides(self, factor: str, shards: int) -> bool:
        """Whether ``shards`` whole shards of ``factor`` exist (see the module docstring)."""
        return self.sizes().get(factor, 0) % (shards * self.multiple(factor)) == 0


@dataclass(frozen=True)
class Split:
    """The op split along ``factor`` over one mesh axis: the dimension of each operand and result that is split
    (None: whole on every device; for a result of a reduced factor, a partial sum on every device)."""

    factor: str
    operands: tuple[int | None, ...]
    results: tuple[int | None, ...]
    partial: bool  # the results are partial sums


def _index(dims: Dims | None, factor: str) -> int | None:
    for i, d in enumerate(dims or ()):
        if d.rstrip("/") == factor:
            return i
    return None


def splits(rule: Rule, shards: int) -> list[Split]:
    """The ways to split the op along one mesh axis of ``shards`` devices, in the rule's priority order (each
    factor it allows whose shards are whole). Keeping every operand whole on every device is always possible and
    not listed."""
    if shards < 2:
        return []
    reduced = set(rule.reduced())
    return [Split(f, tuple(None if dims is None else _index(dims, f) for dims in rule.operands),
                  tuple(_index(dims, f) for dims in rule.results), f in reduced)
            for f in rule.allowed if rule.divides(f, shards)]


def gemm_rule(kind: GemmKind, impl: Callable[..., Any] | None, shapes: Sequence[tuple[int, ...]], packed: bool,
              sfa_stacked: bool, sfb_stacked: bool) -> Rule | None:
    """The rule of a GEMM kind from its descriptor's dimensions, for operands of ``shapes`` (a, sfa, b, sfb, then
    the layout and out where the kind has them); None: the kind is not split (flat operands).
    ``sfa_stacked``/``sfb_stacked``: the scales come as the transposed stack [..., KB, rows]."""
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
    return Rule(impl, tuple(ops[:len(shapes)]), (dims(kind.out_dims),), tuple(tuple(s) for s in shapes), allowed,
                align, kind.accumulates)


def cast_rule(impl: Callable[..., Any] | None, shape: tuple[int, ...], block_rows: bool) -> Rule:
    """The rule of a cast of x [m, k] of ``shape``: ``(q [m, k], s)`` with 1x128 (``block_rows``: 128x128)
    scales."""
    return Rule(impl, (("m", "k"),), (("m", "k"), ("m/" if block_rows else "m", "k/")), (tuple(shape),), ("m", "k"))


#: The fused casts' results of x [m, k] (cupygemm.quantization.fused_cast_outputs, by factor).
FUSED_CAST_RESULTS: dict[str, tuple[Dims, ...]] = {
    TRANSPOSED: (("k", "m"), ("k", "m/")),
    TRANSPOSED_ROWWISE: (("k", "m"), ("k", "m/"), ("m", "k"), ("m", "k/")),
    BLOCK_WITH_TRANSPOSE: (("m", "k"), ("m/", "k/"), ("k", "m"), ("k/", "m/")),
}


def fused_cast_rule(impl: Callable[..., Any] | None, entry: str, shape: tuple[int, ...]) -> Rule:
    """The rule of the fused cast ``entry`` of x [m, k] of ``shape``."""
    return Rule(impl, (("m", "k"),), FUSED_CAST_RESULTS[entry], (tuple(shape),), ("m", "k"))
