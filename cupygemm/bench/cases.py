"""The cases of ``cupygemm bench``: which shapes run, and the rows of each (the grouped layouts' group sizes).

Group sizes are drawn like the peers' tests do (uniform in 0.7-1.3 x the expected rows, seeded per shape) or, with
``--match-rows``, rescaled to the valid-row totals a peer table measured so that both runs do the same work.
Everything here is pure Python and NumPy: it runs (and is tested) without a GPU.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from ..config import choose_config, kind_id, model_rows, side_aware_config
from ..layout import M_ALIGNMENT_FOR_CONTIGUOUS_LAYOUT as M_ALIGNMENT
from ..shapes import CONTIGUOUS, MASKED, NORMAL, parse_shape

KINDS = ("normal", "contiguous", "masked")
_KIND_ALIASES = {"contig": "contiguous"}

MASKED_MAX_M = 4096
GROUP_SPREAD = (0.7, 1.3)  # group sizes are uniform in this range times the expected rows


class BenchUsageError(ValueError):
    """A bad option combination (reported with exit code 2)."""


@dataclass(frozen=True)
class Shape:
    """One benchmark case. ``dims``: (M, N, K) for normal, (G, rows per group, N, K) for grouped kinds
    (contiguous: expected rows per group; masked: expected_m)."""

    kind: str
    dims: tuple[int, ...]

    @property
    def label(self) -> str:
        return "x".join(str(d) for d in self.dims)

    @property
    def groups(self) -> int:
        return 1 if self.kind == "normal" else self.dims[0]

    @property
    def m(self) -> int:
        """M (normal) or the expected rows per group (grouped)."""
        return self.dims[0] if self.kind == "normal" else self.dims[1]

    @property
    def n(self) -> int:
        return self.dims[-2]

    @property
    def k(self) -> int:
        return self.dims[-1]


def default_shapes(kinds: Iterable[str] = KINDS) -> list[Shape]:
    """The seed shapes of ``kinds``, in the order normal, contiguous, masked (28 for all three)."""
    kinds = set(kinds)
    shapes: list[Shape] = []
    if "normal" in kinds:
        shapes += [Shape("normal", dims) for dims in NORMAL]
    if "contiguous" in kinds:
        shapes += [Shape("contiguous", dims) for dims in CONTIGUOUS]
    if "masked" in kinds:
        shapes += [Shape("masked", dims) for dims in MASKED]
    return shapes


def parse_kinds(text: str | None) -> list[str] | None:
    """'normal,contiguous' -> ['normal', 'contiguous'] (None stays None: all kinds)."""
    if text is None:
        return None
    kinds: list[str] = []
    for tok in text.replace(" ", "").split(","):
        if not tok:
            continue
        kind = _KIND_ALIASES.get(tok.lower(), tok.lower())
        if kind not in KINDS:
            raise BenchUsageError(f"--kinds: unknown kind {tok!r}; expected a comma-separated subset of {','.join(KINDS)}")
        if kind not in kinds:
            kinds.append(kind)
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
    if min(shape.dims) < 1:
        raise BenchUsageError(f"shape {shape.label}: every dimension must be positive")
    if shape.k % 16:
        raise BenchUsageError(f"shape {shape.label}: K must be a multiple of 16 (got {shape.k})")
    if shape.n % 8:
        raise BenchUsageError(f"shape {shape.label}: N must be a multiple of 8 (got {shape.n})")


def select_shapes(kinds: list[str] | None, dims_list: list[tuple[int, ...]] | None) -> list[Shape]:
    """The shapes to run: the seed shapes of ``kinds`` (None: all), or ``dims_list`` interpreted with ``kinds``.

    MxNxK is a normal shape; GxMxNxK needs exactly one grouped kind in ``kinds`` (contiguous or masked).
    """
    if dims_list is None:
        return default_shapes(kinds if kinds is not None else KINDS)
    grouped = [k for k in (kinds or []) if k != "normal"]
    shapes = []
    for dims in dims_list:
        if len(dims) == 3:
            if kinds is not None and "normal" not in kinds:
                raise BenchUsageError(f"shape {'x'.join(map(str, dims))} is MxNxK (normal) but --kinds excludes normal")
            shape = Shape("normal", tuple(dims))
        else:
            if len(grouped) != 1:
                raise BenchUsageError(
                    f"shape {'x'.join(map(str, dims))} is GxMxNxK: give --kinds contiguous or --kinds masked "
                    "(exactly one grouped kind) to say which layout it is")
            shape = Shape(grouped[0], tuple(dims))
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
    """Entropy for the shape's generators: the same sizes and data for a shape whatever the shape list."""
    return [int(seed), KINDS.index(shape.kind), *(int(d) for d in shape.dims)]


@dataclass(frozen=True)
class Sizes:
    """Rows of one shape: ``group_rows`` valid rows per group (normal: (M,)); ``a_rows``: rows of A per
    group dimension (normal M, contiguous the padded total, masked max_m)."""

    group_rows: tuple[int, ...]
    a_rows: int

    @property
    def valid_m(self) -> int:
        return int(sum(self.group_rows))


def make_sizes(shape: Shape, seed: int, valid_rows: int | None = None, full_groups: bool = False) -> Sizes:
    """Group sizes like the peers' tests: int(expected x U(0.7, 1.3)) (at least 1); contiguous groups are padded
    to 128 rows; masked ones are clamped to max_m. Deterministic in (shape, seed). ``valid_rows``: make the
    sizes sum to it instead (see :func:`match_total`), to run the very row count a peer table measured.
    ``full_groups`` (masked): every group holds expected rows, all valid, and max_m = expected (a batch of
    equal full groups, the case DeepGEMM's own tests time)."""
    if shape.kind == "normal":
        return Sizes((shape.m,), shape.m)
    if full_groups and shape.kind == "masked":
        return Sizes((shape.m,) * shape.groups, shape.m)
    rng = np.random.default_rng(shape_seed(shape, seed))
    factors = rng.uniform(GROUP_SPREAD[0], GROUP_SPREAD[1], size=shape.groups)
    rows = [max(1, int(shape.m * f)) for f in factors]
    if valid_rows is not None:
        rows = match_total(rows, valid_rows, shape.m)
    if shape.kind == "contiguous":
        return Sizes(tuple(rows), sum(round_up(r, M_ALIGNMENT) for r in rows))
    max_m = masked_max_m(shape.m)
    return Sizes(tuple(min(r, max_m) for r in rows), max_m)


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
    kinds = {"contig": "contiguous", "contiguous": "contiguous", "masked": "masked"}
    out = {}
    for r in table.get("rows", []):
        kind = kinds.get(r.get("kind"))
        if kind is None or r.get("provider") != "deepgemm" or not r.get("tflops") or not r.get("us"):
            continue
        dims = tuple(int(d) for d in r["shape"])
        out[(kind, dims)] = round(r["tflops"] * 1e12 * r["us"] * 1e-6 / (2 * dims[-2] * dims[-1]))
    return out


def contiguous_m_indices(group_rows: Sequence[int], align: int = M_ALIGNMENT) -> np.ndarray:
    """int32 group index per row of the contiguous layout; -1 on each group's padding rows."""
    parts = []
    for g, rows in enumerate(group_rows):
        parts.append(np.full(rows, g, dtype=np.int32))
        parts.append(np.full(round_up(rows, align) - rows, -1, dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def config_m_rows(shape: Shape, sizes: Sizes) -> int:
    """The ``m_rows`` the API passes to choose_config: M, the contiguous total rows, or masked expected_m."""
    kid = kind_id(shape.kind)
    if shape.kind == "normal":
        return model_rows(kid, shape.m)
    if shape.kind == "contiguous":
        return model_rows(kid, sizes.a_rows)
    return model_rows(kid, sizes.a_rows, shape.m)


def shape_config(shape: Shape, sizes: Sizes, num_sms: int, smem_limit: int | None = None, sides: bool = False):
    """The GemmConfig the library picks for this shape (same arguments as cupygemm.gemm); ``sides``: on weights
    packed by cupygemm.pack_weights (the side-aware kernel's config)."""
    kid = kind_id(shape.kind)
    kwargs = {} if smem_limit is None else {"smem_limit": smem_limit}
    if shape.kind == "masked":
        kwargs["max_m"] = sizes.a_rows
    cfg = choose_config(kid, config_m_rows(shape, sizes), shape.n, shape.k, shape.groups, num_sms, sides=sides,
                        **kwargs)
    return side_aware_config(cfg, num_sms, *([] if smem_limit is None else [smem_limit])) if sides else cfg


def check_rows(shape: Shape, sizes: Sizes, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows to verify, as (flat row indices into the output viewed as 2-D [rows, N], their groups).

    Only valid rows: not contiguous padding, not masked rows past masked_m. Sorted, at most ``count``.
    """
    if shape.kind == "normal":
        flat = np.arange(shape.m)
        groups = np.zeros(shape.m, dtype=np.int64)
    else:
        flat_parts, group_parts, offset = [], [], 0
        for g, rows in enumerate(sizes.group_rows):
            start = offset if shape.kind == "contiguous" else g * sizes.a_rows
            flat_parts.append(start + np.arange(rows))
            group_parts.append(np.full(rows, g, dtype=np.int64))
            offset += round_up(rows, M_ALIGNMENT)
        flat = np.concatenate(flat_parts)
        groups = np.concatenate(group_parts)
    if len(flat) > count:
        rng = np.random.default_rng(shape_seed(shape, seed) + [1])
        pick = np.sort(rng.choice(len(flat), size=count, replace=False))
        flat, groups = flat[pick], groups[pick]
    return flat.astype(np.int64), groups.astype(np.int64)


def shape_sizes(shapes: Sequence[Shape], seed: int, match_rows: str | None,
                full_groups: bool = False) -> dict[Shape, Sizes]:
    """Each shape's rows; with ``match_rows`` (a peer table) grouped shapes get the valid-row totals it measured;
    with ``full_groups`` masked shapes run full groups (:func:`make_sizes`), whatever the table says."""
    targets: dict[tuple[str, tuple[int, ...]], int] = {}
    if match_rows:
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
