"""The cases of ``cupygemm bench``: which kinds and shapes run, and the sizes of each (group sizes, seeded).

Kinds come from the kind descriptors (:mod:`cupygemm.kinds`: names, aliases, ``seed_shapes``, ``shape_dims``); what
is particular to a family of kinds (drawing its group sizes, checking a shape) is its
:class:`~cupygemm.bench.kinds.BenchKind`, looked up through :mod:`cupygemm.bench.kinds`. The forward kinds' helpers
that scripts and the peer tables use (group-size spread, ``--match-rows``, the contiguous row layout) live here.
Everything here is pure Python and NumPy: it runs (and is tested) without a GPU.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from ..kinds import GemmKind, kind_named
from ..layout import M_ALIGNMENT_FOR_CONTIGUOUS_LAYOUT as M_ALIGNMENT
from ..shapes import parse_shape

MASKED_MAX_M = 4096
GROUP_SPREAD = (0.7, 1.3)  # group sizes are uniform in this range times the expected rows


class BenchUsageError(ValueError):
    """A bad option combination (reported with exit code 2)."""


@dataclass(frozen=True)
class Shape:
    """One benchmark case: a kind's name (:mod:`cupygemm.kinds`) and its dimensions as the kind's ``shape_dims``
    says: (M, N, K), or (G, M, N, K) where M is the rows per group (contiguous: expected rows per group; masked:
    expected_m; k-grouped wgrad: M of every group, and K each group's base token count)."""

    kind: str
    dims: tuple[int, ...]

    @property
    def descriptor(self) -> GemmKind:
        return kind_named(self.kind)

    @property
    def label(self) -> str:
        return "x".join(str(d) for d in self.dims)

    @property
    def groups(self) -> int:
        return self.dims[0] if "G" in self.descriptor.shape_dims else 1

    @property
    def m(self) -> int:
        """M (normal) or the expected rows per group (grouped)."""
        return self.dims[-3]

    @property
    def n(self) -> int:
        return self.dims[-2]

    @property
    def k(self) -> int:
        return self.dims[-1]


def _kinds(kinds: Iterable[str | GemmKind] | None) -> list[GemmKind]:
    """The descriptors of ``kinds`` (None: the default ones), in KINDS order."""
    from .kinds import bench_kinds, default_kinds

    if kinds is None:
        return default_kinds()
    wanted = {kind_named(k).name for k in kinds}
    return [k for k in bench_kinds() if k.name in wanted]


def default_shapes(kinds: Iterable[str | GemmKind] | None = None) -> list[Shape]:
    """The seed shapes (``GemmKind.seed_shapes``) of ``kinds``, in the kinds' registration order (None: the kinds
    ``cupygemm bench`` runs by default, the forward ones: 28 shapes, normal, contiguous, masked)."""
    return [Shape(k.name, tuple(dims)) for k in _kinds(kinds) for dims in k.seed_shapes]


def _kind_list() -> str:
    from .kinds import bench_kinds

    kinds = bench_kinds()
    aliases = [a for k in kinds for a in k.aliases]
    return ",".join(k.name for k in kinds) + (f" (aliases: {', '.join(aliases)})" if aliases else "")


def parse_kinds(text: str | None) -> list[str] | None:
    """'normal,contig' -> ['normal', 'contiguous']: every kind the bench has (cupygemm.kinds names and aliases);
    None stays None (the default kinds)."""
    from .kinds import lookup

    if text is None:
        return None
    kinds: list[str] = []
    for tok in text.replace(" ", "").split(","):
        if not tok:
            continue
        try:
            kind = kind_named(tok)
        except ValueError:
            kind = None
        if kind is None or lookup(kind) is None:
            raise BenchUsageError(f"--kinds: unknown kind {tok!r}; expected a comma-separated subset of "
                                  f"{_kind_list()}")
        if kind.name not in kinds:
            kinds.append(kind.name)
    if not kinds:
        raise BenchUsageError("--kinds: name at least one kind")
    return kinds


def parse_shape_texts(texts: Sequence[str] | None) -> list[tuple[int, ...]] | None:
    """Shape arguments ('MxNxK' or 'GxMxNxK', separated by spaces or commas) -> dimension tuples."""
    if not texts:
        return None
    dims = []
    for text in texts:
        for tok in text.split(","):
            tok = tok.strip()
            if tok:
                try:
                    dims.append(parse_shape(tok))
                except ValueError as e:
                    raise BenchUsageError(f"--shapes: {e}") from None
    if not dims:
        raise BenchUsageError("--shapes: no shape given")
    return dims


def _check_dims(shape: Shape) -> None:
    from .kinds import bench_kind

    if min(shape.dims) < 1:
        raise BenchUsageError(f"shape {shape.label}: every dimension must be positive")
    bench_kind(shape.kind).check_shape(shape)


def select_shapes(kinds: list[str] | None, dims_list: list[tuple[int, ...]] | None) -> list[Shape]:
    """The shapes to run: the seed shapes of ``kinds`` (None: the default kinds), or ``dims_list`` read as shapes of
    the one kind among ``kinds`` (None: the default kinds) whose shapes have that many dimensions (MxNxK: normal by
    default; GxMxNxK needs --kinds to name one kind, e.g. contiguous, masked or k_grouped_wgrad)."""
    from .kinds import shape_format

    if dims_list is None:
        return default_shapes(kinds)
    scope = _kinds(kinds)
    shapes = []
    for dims in dims_list:
        label = "x".join(map(str, dims))
        fits = [k for k in scope if len(k.shape_dims) == len(dims)]
        if not fits:
            from .kinds import bench_kinds

            others = [k for k in bench_kinds() if len(k.shape_dims) == len(dims)]
            if not others:
                raise BenchUsageError(f"shape {label}: no kind has shapes of {len(dims)} dimensions")
            raise BenchUsageError(f"shape {label} is {shape_format(others[0])}, a shape of "
                                  f"{', '.join(k.name for k in others)}, but --kinds excludes them")
        if len(fits) > 1:
            raise BenchUsageError(
                f"shape {label} is {shape_format(fits[0])}: give --kinds naming exactly one of "
                f"{', '.join(k.name for k in fits)} to say which kind it is")
        shape = Shape(fits[0].name, tuple(dims))
        _check_dims(shape)
        shapes.append(shape)
    return shapes


# ---- per-shape row layout (seeded) --------------------------------------------------------------------------------

def round_up(x: int, align: int) -> int:
    return (x + align - 1) // align * align


def masked_max_m(expected_m: int) -> int:
    """max_m of a masked shape: 4096, or more when 1.3 x expected_m would not fit."""
    return max(MASKED_MAX_M, round_up(math.ceil(expected_m * GROUP_SPREAD[1]), M_ALIGNMENT))


def shape_seed(shape: Shape, seed: int) -> list[int]:
    """Entropy for the shape's generators: the same sizes and data for a shape whatever the shape list (the kind
    enters as its kernel id, ``GemmKind.kid``)."""
    return [int(seed), shape.descriptor.kid, *(int(d) for d in shape.dims)]


@dataclass(frozen=True)
class Sizes:
    """Sizes of one shape: ``group_rows`` valid rows per group (normal: (M,)); ``a_rows``: rows of A per
    group dimension (normal M, contiguous the padded total, masked max_m); ``group_k``: each group's K where the
    groups differ along K (k-grouped wgrad; else empty)."""

    group_rows: tuple[int, ...]
    a_rows: int
    group_k: tuple[int, ...] = ()

    @property
    def valid_m(self) -> int:
        return int(sum(self.group_rows))


def make_sizes(shape: Shape, seed: int, valid_rows: int | None = None, full_groups: bool = False) -> Sizes:
    """The shape's sizes as its kind's bench code draws them (deterministic in shape and seed); ``valid_rows`` and
    ``full_groups`` apply to the forward grouped kinds (see :func:`cupygemm.bench.forward.make_sizes`)."""
    from .kinds import bench_kind

    return bench_kind(shape.kind).make_sizes(shape, seed, valid_rows, full_groups)


def match_total(rows: Sequence[int], total: int, expected: int) -> list[int]:
    """``rows`` rescaled to sum to ``total``, each kept within int(0.7 x expected)..int(1.3 x expected) (the
    peers' spread); the remainder of the rounding goes to the first groups with room. ValueError when no such
    sizes exist."""
    lo, hi = max(1, int(expected * GROUP_SPREAD[0])), max(1, int(expected * GROUP_SPREAD[1]))
    if not len(rows) * lo <= total <= len(rows) * hi:
        raise ValueError(f"{total} valid rows cannot be split into {len(rows)} groups of {lo}..{hi} rows")
    scale = total / sum(rows)
    out = [min(hi, max(lo, int(r * scale))) for r in rows]
    while sum(out) != total:
        step = 1 if sum(out) < total else -1
        for i, r in enumerate(out):
            if sum(out) != total and lo <= r + step <= hi:
                out[i] = r + step
    return out


def peer_valid_rows(path: str | os.PathLike) -> dict[tuple[str, tuple[int, ...]], int]:
    """Valid rows of each grouped shape in a peer table (benchmarks/peers/*.json), from its DeepGEMM rows:
    rows = TFLOPS x time / (2 N K). Keys are (kind, dims) as in :class:`Shape`."""
    with open(path) as f:
        table = json.load(f)
    out = {}
    for r in table.get("rows", []):
        try:
            kind = kind_named(r.get("kind"))
        except ValueError:
            continue
        if "G" not in kind.shape_dims or r.get("provider") != "deepgemm" or not r.get("tflops") or not r.get("us"):
            continue
        dims = tuple(int(d) for d in r["shape"])
        out[(kind.name, dims)] = round(r["tflops"] * 1e12 * r["us"] * 1e-6 / (2 * dims[-2] * dims[-1]))
    return out


def contiguous_m_indices(group_rows: Sequence[int], align: int = M_ALIGNMENT) -> np.ndarray:
    """int32 group index per row of the contiguous layout; -1 on each group's padding rows."""
    parts = []
    for g, rows in enumerate(group_rows):
        parts.append(np.full(rows, g, dtype=np.int32))
        parts.append(np.full(round_up(rows, align) - rows, -1, dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def config_m_rows(shape: Shape, sizes: Sizes) -> int:
    """Forward kinds: see :func:`cupygemm.bench.forward.config_m_rows`."""
    from .forward import config_m_rows as forward_m_rows

    return forward_m_rows(shape, sizes)


def shape_config(shape: Shape, sizes: Sizes, num_sms: int, smem_limit: int | None = None, sides: bool = False):
    """The config the library picks for this shape (compiled before anything is timed), or None for kinds whose
    kernels compile at their first call (:meth:`cupygemm.bench.kinds.BenchKind.config`)."""
    from .kinds import bench_kind

    return bench_kind(shape.kind).config(shape, sizes, num_sms, smem_limit, sides)


def check_rows(shape: Shape, sizes: Sizes, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Forward kinds: the sampled rows the checks read (see :func:`cupygemm.bench.forward.check_rows`)."""
    from .forward import check_rows as forward_rows

    return forward_rows(shape, sizes, count, seed)


def shape_sizes(shapes: Sequence[Shape], seed: int, match_rows: str | None,
                full_groups: bool = False) -> dict[Shape, Sizes]:
    """Each shape's sizes; with ``match_rows`` (a peer table of the forward kinds) grouped shapes get the valid-row
    totals it measured (BenchUsageError for kinds it does not apply to); with ``full_groups`` masked shapes run full
    groups (:func:`make_sizes`), whatever the table says."""
    from .kinds import bench_kind

    targets: dict[tuple[str, tuple[int, ...]], int] = {}
    if match_rows:
        other = list(dict.fromkeys(s.kind for s in shapes if not bench_kind(s.kind).match_rows))
        if other:
            raise BenchUsageError(f"--match-rows: the peer tables hold the forward seed shapes only; "
                                  f"{', '.join(other)} shapes have no valid rows to match there: drop --match-rows "
                                  "or run those kinds separately")
        try:
            targets = peer_valid_rows(match_rows)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise BenchUsageError(f"--match-rows: cannot read a peer table from {match_rows!r}: {e}") from None
    out = {}
    for s in shapes:
        try:
            out[s] = make_sizes(s, seed, targets.get((s.kind, tuple(s.dims))), full_groups)
        except ValueError as e:
            raise BenchUsageError(f"--match-rows: {s.kind} {s.label}: {e}") from None
    return out
