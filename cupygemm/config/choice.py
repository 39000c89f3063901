"""Config choice: :func:`choose` prices the named candidates with the cost model, applies the measured rules and the
overrides in order, and sizes the grid; :func:`choose_config` memoizes it by M class.

``CUPYGEMM_PRINT_CONFIGS=1`` prints each choice; :func:`cupygemm.config.override_config` forces fields for tuning.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
import threading
from typing import Iterable, Iterator, NamedTuple

from .. import contract, env
from ..util import ceil_div
from .constants import (BLOCK_K, KIND_CONTIGUOUS, KIND_MASKED, KIND_NAMES, KIND_NORMAL, SM90_MAX_SMEM_PER_BLOCK,
                        STREAM_K_KINDS, THREE_WG_BLOCK_M, kind_id)
from .cost import Estimate, estimate, interleave_k_pays, interleave_k_regime, largest_masked_draw
from .legality import (GemmConfig, make_config, multicast_options, serial_m_possible, split_k_extent,
                       two_acc_sets_fit, wgmma_n_for)
from .overrides import config_version, forced

# 192-row tiles are weighed for normal GEMMs up to this K, against 256-row picks (see cost.THREE_WG_OVERHEAD_FACTOR).
THREE_WG_MAX_K = 1536

# The model's load term does not rank split-K configs (wide split tiles measured slower than it predicts), so they come
# from a measured rule instead: when even 64x64 tiles would leave half the SMs idle, use 48-column tiles split over
# the most CTAs (2..4, at least 8 K blocks each) that still fit one wave. On an H200: 64x2112x7168 11.3 -> 9.4 us,
# 128x2112x7168 12.3 -> 10.5 us; where 64x64 tiles fill more SMs, split-K only tied or lost (benchmarks/NOTES.md,
# "Split-K across CTAs").
SPLIT_K_BLOCK_N = 48
MAX_SPLIT_K = 4
MIN_SPLIT_K_BLOCKS = 8

# Side-aware kernels (packed B) load B in 32-row TMA boxes, one per packed 4 KiB chunk. A CTA whose B rows are not
# whole chunks loads 16- or 8-row boxes, and many small boxes held the loop back: 64x112 tiles on 128x7168x16384 took
# 110 us packed against 49.8 plain (H100; benchmarks/NOTES.md, "L2-side-aware weights"). So packed weights get tiles
# whose B rows per CTA are multiples of 32 (with B multicast each CTA loads half the tile), and 64x32 split-K tiles,
# whose units of 28 K blocks on 64x2112x7168 run interleaved K (10.6 us against 11.1 on one warpgroup; plain 64x48 split
# 3: 11.2). Their 128-row split-K tiles are the plain ones (through global memory 128x48 split 3 took 12.1 us on
# 128x2112x7168 against 12.8 for 128x32 split 2, benchmarks/NOTES.md, "Split-K clusters"; as clusters with two
# accumulator sets, below, 128x32 split 2 wins).
SIDE_CHUNK_ROWS = 32
SIDE_SPLIT_K_BLOCK_N = 32
# Split-K tiles of two splits that all run in one round meet as 2-CTA clusters: the partner writes its sums into the
# leader's shared memory rather than global memory (cuda_src/reduction.cuh, ClusterSplit). Packed 64x2112x7168 on
# an H100: 10.6 -> 10.2-10.3 us; 32x2112x7168 11.5 -> 10.9 (benchmarks/NOTES.md, "Split-K clusters").
SPLIT_CLUSTER_DEFAULT = True
# Split-K tiles are 32 columns wide and split two ways, as clusters, where that keeps as many SMs busy as the
# 48-column rule. 128-row ones (with two accumulator sets) on an H100 (benchmarks/NOTES.md, "Two accumulator sets";
# against 128x48 split 3 or 2): 65-128 x 2112 x 7168 7-9 % faster plain (12.5 -> 11.4 us at 128 rows), 2-5 % packed
# (11.9 -> 11.35); 257-384 x 576 x 7168 6 %; 960-1024 x 256 x 7168 4-5 %. With one accumulator set these tiles were
# slower than the 48-column ones (12.1-12.5 us as clusters): the two-warpgroup K loop's chain of issue, wait and
# promotion bounds them (benchmarks/NOTES.md, "Two accumulator sets"). 64-row ones (two interleaved warpgroups, as
# packed B has had since benchmarks/NOTES.md, "Split-K clusters") against 64x48 split 3, three passes
# (benchmarks/NOTES.md, "Split-K clusters"): 1-64 x 2112 x 7168 5 % faster on an H100 (64 rows 11.0 -> 10.5 us, 1 row
# 10.9 -> 10.2-10.4) and 8-10 % on an H200 (64 rows 9.5 -> 8.6); N = 1536 on 96 CTAs (an H100 PCIe's 114 SMs) 5-10 %.
CLUSTER_SPLIT_K_BLOCK_N = 32
# Tiles of one math warpgroup (64 rows, no interleaved K) take two accumulator sets too. On an H100: 64x2112x7168
# (64x48 split 3) 11.2-11.3 -> 11.0-11.1 us, 64x24576x1536 (64x96) 18.6-18.7 -> 18.4-18.5, 64x7168x2048 (64x64)
# 8.9 -> 8.6-8.75 plain and 8.9-9.1 -> 8.9-9.0 packed; 1-4.5 % on eight other problems (64x576x7168 7.9 -> 7.6,
# masked 2x64x3072x1536 11.3-11.55 -> 10.9-11.05), none slower; one-warpgroup tiles 112 and 128 wide 0-3 %
# (128x7168x2048 on 64x112 with B multicast 10.1-10.2 -> 9.8-9.9, masked 16x32x3072x1536 35.4 -> 34.4, the N = 32768
# shapes on 64x128 within 0.5 %). Unsplit 128-row tiles gained nothing
# (128x24576x1536, 128x7168x2048) or lost (128x32 on 128x4096x7168 packed: 15.3-15.4 against 15.1-15.2), so they
# keep one set (benchmarks/NOTES.md, "Two accumulator sets").
TWO_ACC_SETS_ONE_WG = True

#: Rows per memo class: see m_class.
M_CLASS_ROWS = 64


class Problem(NamedTuple):
    """What the choice reads: the kind, ``m_rows`` (M, total rows, or expected rows per group), N, K, groups, SMs;
    masked: ``max_m``, the rows a group can have, where it caps the group sizes the model averages over (else None)."""

    kind: int
    m_rows: int
    n: int
    k: int
    num_groups: int
    num_sms: int
    max_m: int | None = None
    sides: bool = False  # B packed side-aware: tiles whose B rows per CTA are whole 32-row chunks


class Candidate(NamedTuple):
    """A tile and its schedule, as the model prices them."""

    block_m: int
    block_n: int
    serial_m: bool = False
    multicast: int = 0
    split_k: int = 1
    stream_k: bool = False


def price(p: Problem, c: Candidate) -> Estimate:
    return estimate(p.kind, p.m_rows, p.n, p.k, p.num_groups, c.block_m, c.block_n, p.num_sms, c.multicast,
                    c.split_k, c.stream_k, max_m=p.max_m)


def _score(priced: tuple[Candidate, Estimate]) -> tuple:
    """Lower time first; then a fuller last wave; then fewer bytes moved per output."""
    c, e = priced
    bm, bn = c.block_m, c.block_n
    return round(e.seconds * 1e9), -e.last_wave_util, (bm + bn) / (bm * bn), c.multicast, c.stream_k


def _best(priced: Iterable[tuple[Candidate, Estimate]]) -> tuple[Candidate, Estimate]:
    """The lowest score; the first one on ties."""
    return min(priced, key=_score)


# --- the named candidates -----------------------------------------------------------------------------------------

def candidate_block_ms(kind: int, m_rows: int) -> tuple[int, ...]:
    if kind == KIND_CONTIGUOUS:
        # Groups are padded to 128 rows: a 128-row block never spans two groups; a 256-row block holding two is
        # run as two tiles, one per half (cuda_src/scheduler.cuh).
        return (128, 256)
    if m_rows <= 64:
        return (64,)
    if kind == KIND_NORMAL and m_rows > 128:
        return (64, 128, 192, 256)
    return (64, 128, 256)


def candidate_tiles(kind: int, m_rows: int) -> list[tuple[int, int, bool]]:
    """(block_m, block_n, serial_m) the model considers: tiles whose whole block_n fits one wgmma.

    Split-N tiles serialize MMA and promotion within a warpgroup; the model only proposes whole ones (splits stay
    reachable through override_config). 256-row tiles whose two m64 sub-tiles per warpgroup do not fit at once run
    them serially. Two accumulator sets (the next MMA batch overlapping this batch's promotion) measured no faster
    (benchmarks/NOTES.md, "Two accumulator sets" and "Power cap"), so no candidate has them."""
    tiles = []
    for bm in candidate_block_ms(kind, m_rows):
        for bn in range(16, 257, 8):
            if wgmma_n_for(bm, bn) == bn:
                tiles.append((bm, bn, False))
            elif serial_m_possible(bm) and wgmma_n_for(bm, bn, serial_m=True) == bn:
                tiles.append((bm, bn, True))
    return tiles


def _multicast_candidates(p: Problem, bm: int, bn: int) -> list[int]:
    """The legal multicast modes the model weighs for a tile. Sharing A between 64-row tiles never paid in the sweeps
    (10 small-M shapes: equal or 2-6 % slower than no multicast, benchmarks/NOTES.md, "Multicast"), though the model's
    load term says it should; 192-row tiles cannot share B."""
    if p.num_sms < 2:
        return [0]
    return [mc for mc in multicast_options(p.kind, p.m_rows, p.n, bm, bn)
            if not (mc == 2 and bm == THREE_WG_BLOCK_M) and not (mc == 1 and bm == 64)
            and not (mc == 2 and p.sides and bn % (2 * SIDE_CHUNK_ROWS))]


def _stream_k_weighed(p: Problem, bm: int, plain: Estimate) -> bool:
    """Whether the model also weighs the tile with a stream-K tail: masked GEMMs (whose groups' sizes the tail
    absorbs) and normal ones of two or more waves, the measured cases (one partial wave is interleaved K's), not on
    interleaved-K or 192-row tiles, nor for side-aware kernels, which have no tail."""
    return (p.kind in STREAM_K_KINDS and (p.kind == KIND_MASKED or plain.waves >= 2) and not p.sides
            and not interleave_k_regime(bm, p.k, plain.waves) and bm != THREE_WG_BLOCK_M)


def model_candidates(p: Problem, tiles: Iterable[tuple[int, int, bool]]) -> Iterator[tuple[Candidate, Estimate]]:
    """Every tile with each multicast mode the model weighs, without and (where weighed) with a stream-K tail,
    priced."""
    for bm, bn, serial in tiles:
        for mc in _multicast_candidates(p, bm, bn):
            plain = Candidate(bm, bn, serial, mc)
            est = price(p, plain)
            yield plain, est
            if _stream_k_weighed(p, bm, est):
                tail = plain._replace(stream_k=True)
                yield tail, price(p, tail)


# --- the measured rules -------------------------------------------------------------------------------------------

def shares_single_a_block(p: Problem, c: Candidate) -> bool:
    """A normal GEMM whose A is one 128-row block, shared by A multicast. Every CTA reads that block from L2 while B
    streams from memory: sharing it saves L2 reads only, and the tile without it measured 2-4 % faster (128x32768x512
    on an H200 and an H100, 128x24576x1536 on an H100; benchmarks/NOTES.md, "Multicast"). The rule drops multicast from
    the model's pick rather than excluding such candidates: excluded, the model moves to other tiles, which were not
    measured; 256-row single blocks (M <= 256, more of the tile's operand bytes are A) were not measured either."""
    return c.multicast == 1 and p.kind == KIND_NORMAL and c.block_m == 128 and p.m_rows <= c.block_m


def split_k_tile(kind: int, m_rows: int, n: int, k: int, num_sms: int,
                 sides: bool = False) -> tuple[int, int, int] | None:
    """(block_m, block_n, split_k) of split-K across CTAs where the measured rule asks for it (see SPLIT_K_BLOCK_N;
    SIDE_SPLIT_K_BLOCK_N for packed B), else None: a normal GEMM whose 64x64 tiles would fill at most half the SMs,
    with at least two splits of 8+ K blocks in one wave; 32-column tiles in two splits (CLUSTER_SPLIT_K_BLOCK_N) where
    they keep as many SMs busy."""
    if kind != KIND_NORMAL or ceil_div(m_rows, 64) * ceil_div(n, 64) > num_sms // 2:
        return None
    bm = 64 if m_rows <= 64 else 128
    bn = SIDE_SPLIT_K_BLOCK_N if sides and bm == 64 else SPLIT_K_BLOCK_N
    tiles = ceil_div(m_rows, bm) * ceil_div(n, bn)
    ks = min(MAX_SPLIT_K, num_sms // tiles, ceil_div(k, BLOCK_K) // MIN_SPLIT_K_BLOCKS)
    if ks < 2:
        return None
    if SPLIT_CLUSTER_DEFAULT and ceil_div(k, BLOCK_K) // 2 >= MIN_SPLIT_K_BLOCKS:
        units = ceil_div(m_rows, bm) * ceil_div(n, CLUSTER_SPLIT_K_BLOCK_N) * 2
        if tiles * ks <= units <= num_sms:
            return bm, CLUSTER_SPLIT_K_BLOCK_N, 2
    return bm, bn, ks


def _apply_overrides(p: Problem, c: Candidate, est: Estimate, fields: dict) -> tuple[Candidate, Estimate]:
    """The pick with the forced fields. A forced tile (block_m or block_n) starts from no multicast, split or tail
    and is priced anew; forced interleave_k or split_k replace the model's stream-K tail (they exclude each other),
    and a changed split or tail is priced anew. The estimate's waves and tiles size the grid and the stages."""
    if "block_m" in fields or "block_n" in fields:
        c = Candidate(fields.get("block_m", c.block_m), fields.get("block_n", c.block_n),
                      fields.get("serial_m", False), fields.get("multicast", 0), fields.get("split_k", 1),
                      fields.get("stream_k", False))
        est = price(p, c)
    c = c._replace(serial_m=fields.get("serial_m", c.serial_m), multicast=fields.get("multicast", c.multicast))
    if fields.get("interleave_k") or fields.get("split_k", 1) > 1:
        c = c._replace(stream_k=fields.get("stream_k", False))
    if fields.get("split_k", c.split_k) != c.split_k or fields.get("stream_k", c.stream_k) != c.stream_k:
        c = c._replace(split_k=fields.get("split_k", c.split_k), stream_k=fields.get("stream_k", c.stream_k))
        est = price(p, c)
    legal = multicast_options(p.kind, p.m_rows, p.n, c.block_m, c.block_n)
    if c.multicast not in legal:
        raise ValueError(f"multicast={c.multicast} is not legal for {KIND_NAMES[p.kind]} M={p.m_rows} N={p.n} with "
                         f"block {c.block_m}x{c.block_n} (legal: {legal})")
    return c, est


def _interleave_k(p: Problem, c: Candidate, est: Estimate, fields: dict) -> bool:
    """Forced, or where the tile is in interleaved K's measured regime, unless a stream-K tail or a forced split wgmma
    (which interleaved K cannot run) excludes it."""
    if "interleave_k" in fields:
        return fields["interleave_k"]
    return (not c.stream_k and fields.get("wgmma_n", c.block_n) == c.block_n
            and interleave_k_pays(c.block_m, c.block_n, split_k_extent(p.k, c.split_k), est.waves))


def _split_cluster(c: Candidate, est: Estimate, grid: int) -> bool:
    """Whether a split-K pick runs as clusters (SPLIT_CLUSTER_DEFAULT): two splits, every unit in one round, no
    multicast. (Clusters of three or four splits did not all fit at once on an H100: 42 of 44 clusters of three,
    so the kernel took two rounds, 64x2112x7168 18 us against 11.1; benchmarks/NOTES.md, "Split-K clusters".)"""
    return SPLIT_CLUSTER_DEFAULT and c.split_k == 2 and not c.multicast and not c.stream_k and grid == est.tiles


def fewest_ctas_for_rounds(tiles: int, grid: int, cluster: int) -> int:
    """The smallest grid (whole clusters) that runs ``tiles`` in as many rounds as ``grid`` CTAs do. Normal GEMMs
    launch that many: where the last round is partly filled, fewer CTAs with full rounds measured 0.5-1.8 % faster
    on an H200 (4096x7168x16384, 4096x4096x7168 on 128 CTAs, 4096x2112x7168 on 118; DeepGEMM sizes its grid the
    same way), while contiguous 8x4096x4096x7168 on 130 measured 2 % slower (benchmarks/NOTES.md, "Tile choice and
    the cost model")."""
    units, clusters = ceil_div(tiles, cluster), max(1, grid // cluster)
    rounds = ceil_div(units, clusters)
    return min(grid, ceil_div(units, rounds) * cluster)


def _grid(p: Problem, c: Candidate, est: Estimate) -> int:
    """The persistent grid. Masked groups' sizes are only known on the device, and a stream-K tail spreads over all
    SMs: those keep every SM. Otherwise no more CTAs than tiles, whole clusters with multicast, and for normal GEMMs
    the fewest CTAs that take as many rounds."""
    grid = p.num_sms if p.kind == KIND_MASKED or c.stream_k else min(p.num_sms, est.tiles)
    if c.multicast:
        grid = max(2, min(grid + grid % 2, p.num_sms - p.num_sms % 2))
    if p.kind == KIND_NORMAL and not c.stream_k:
        grid = fewest_ctas_for_rounds(est.tiles, grid, 2 if c.multicast else 1)
    return max(grid, 1)


# --- the choice ---------------------------------------------------------------------------------------------------

def choose(kind: int, m_rows: int, n: int, k: int, num_groups: int, num_sms: int,
           smem_limit: int = SM90_MAX_SMEM_PER_BLOCK, max_m: int | None = None,
           sides: bool = False) -> tuple[GemmConfig, Estimate]:
    """The config for exactly ``m_rows`` (unmemoized; :func:`choose_config` is the memoized entry), and the model's
    estimate of the pick. ``max_m`` (masked): caps the group sizes the model averages over. ``sides``: B is packed
    side-aware (tiles of whole 32-row chunks; the result is still the plain config, see side_aware_config)."""
    p = Problem(kind, m_rows, n, k, num_groups, num_sms, max_m if kind == KIND_MASKED else None, sides)
    tiles = candidate_tiles(kind, m_rows)
    if sides:
        tiles = [t for t in tiles if t[1] % SIDE_CHUNK_ROWS == 0]
    three_wg_tiles = [t for t in tiles if t[0] == THREE_WG_BLOCK_M]

    # 1. The model's best tile, multicast and tail over the candidates (192-row tiles aside).
    pick, est = _best(model_candidates(p, [t for t in tiles if t[0] != THREE_WG_BLOCK_M]))
    # 2. 192-row tiles only challenge a 256-row pick, the comparison measured (benchmarks/NOTES.md, "Tile choice and the
    # cost model");
    #    their halved per-tile overhead is relative to the 256-row tiles' epilogue, not to the 128-row ones'.
    if pick.block_m == 256 and k <= THREE_WG_MAX_K:
        pick, est = _best([(pick, est), *model_candidates(p, three_wg_tiles)])
    # 3. A single 128-row A block is not shared.
    if shares_single_a_block(p, pick):
        pick = pick._replace(multicast=0)
        est = price(p, pick)
    # 4. Split-K across CTAs where even 64x64 tiles leave half the SMs idle.
    split = split_k_tile(kind, m_rows, n, k, num_sms, sides)
    if split is not None:
        pick = Candidate(split[0], split[1], split_k=split[2])
        est = price(p, pick)
    # 5. The forced fields.
    fields = forced(kind, n, k)
    pick, est = _apply_overrides(p, pick, est, fields)
    # 6. Interleaved K where the tile is in its measured regime.
    interleave = _interleave_k(p, pick, est, fields)
    # 7. Build it on the grid, with as many stages as fit (capped by the rounds each CTA runs).
    grid = _grid(p, pick, est)

    def build(split_cluster: bool, two_acc_sets: bool = False) -> GemmConfig:
        return make_config(kind, n, k, pick.block_m, pick.block_n, num_sms=grid, smem_limit=smem_limit,
                           wgmma_n=fields.get("wgmma_n"), num_stages=fields.get("num_stages"),
                           raster_n=fields.get("raster_n"), multicast=pick.multicast, interleave_k=interleave,
                           serial_m=pick.serial_m, split_k=pick.split_k, stream_k=pick.stream_k,
                           tile_rounds=est.waves, split_cluster=split_cluster, two_acc_sets=two_acc_sets)

    if "split_cluster" in fields:
        cfg = build(fields["split_cluster"])
    else:
        cfg = build(False)
        if _split_cluster(pick, est, grid):  # unless its partial tile would cost pipeline stages
            try:
                clustered = build(True)
            except ValueError:
                clustered = None
            if clustered is not None and clustered.num_stages == cfg.num_stages:
                cfg = clustered
    # 8. Two accumulator sets where one warpgroup's chain of issue, wait and promotion bounds the K loop: the rule's
    #    128-row clusters (CLUSTER_SPLIT_K_BLOCK_N) and tiles of one math warpgroup (TWO_ACC_SETS_ONE_WG).
    two_acc = fields.get("two_acc_sets", two_acc_sets_fit(cfg) and (
        (cfg.split_cluster and cfg.block_m == 128 and cfg.block_n == CLUSTER_SPLIT_K_BLOCK_N)
        or (TWO_ACC_SETS_ONE_WG and cfg.num_math_wg == 1)))
    if two_acc:
        cfg = build(cfg.split_cluster, True)
    if "num_sms" in fields:
        cfg = dataclasses.replace(cfg, num_sms=fields["num_sms"] - fields["num_sms"] % contract.cluster_size(cfg))
    return cfg, est


def m_class(kind: int, m_rows: int) -> int:
    """The memo class of ``m_rows``: problems of one class get the same config.

    For normal and contiguous GEMMs the search reads M only through ceil_div(M, b) for the tile heights b in
    {64, 128, 192, 256} (tile counts, multicast pairs along M, the split-K tile rule) and the tests M <= 64 and
    M <= 128, which are ceil_div(M, 64) <= 1 and ceil_div(M, 128) <= 1. Since ceil_div(ceil_div(M, 64), j) =
    ceil_div(M, 64 j), all of them are functions of ceil_div(M, 64): that is the class (tests/test_config.py checks
    the memoized choice against the search for a grid of M). Masked GEMMs average over group sizes drawn from the
    exact expected_m, so there the class is M itself.
    """
    if kind == KIND_MASKED:
        return m_rows
    return ceil_div(m_rows, M_CLASS_ROWS)


def _check_problem(kind: int, m_rows: int, n: int, k: int, num_groups: int, num_sms: int) -> None:
    """ValueError/TypeError naming the first argument of choose_config that is not a positive int."""
    kind_id(kind)
    for name, value in (("m_rows", m_rows), ("n", n), ("k", k), ("num_groups", num_groups), ("num_sms", num_sms)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"choose_config: {name}: expected a positive int, got {type(value).__name__} {value!r}")
        if value < 1:
            raise ValueError(f"choose_config: {name}: expected a positive int, got {value}")


def choose_config(kind: int, m_rows: int, n: int, k: int, num_groups: int, num_sms: int,
                  smem_limit: int = SM90_MAX_SMEM_PER_BLOCK, max_m: int | None = None,
                  sides: bool = False) -> GemmConfig:
    """Pick the config for a GEMM. ``m_rows``: M (normal), total rows (contiguous), expected rows per group (masked).
    ``max_m`` (masked only, else ignored): the rows a group can have. The model plans masked groups of expected_m
    rows give or take 30 % (cost.MASKED_SPREAD); where max_m is below that, no group can be larger than max_m
    (every row valid when max_m = expected_m), and the plan uses the capped sizes. ``sides``: B is packed
    side-aware; the pick is among tiles that load whole packed chunks (SIDE_CHUNK_ROWS), before
    :func:`~cupygemm.config.side_aware_config` turns it into the side-aware kernel's config.

    Memoized by :func:`m_class` (every M = 1..4096 of six (N, K) pairs is 6 x 64 entries, not 24,576), so a
    serving loop over varying M searches once per class and the GEMM call's host overhead stays small.
    Non-positive dimensions, groups or SM counts raise ValueError (TypeError for non-ints).
    """
    if (type(m_rows) is not int or type(n) is not int or type(k) is not int or type(num_groups) is not int
            or type(num_sms) is not int or m_rows < 1 or n < 1 or k < 1 or num_groups < 1 or num_sms < 1
            or kind not in KIND_NAMES):
        _check_problem(kind, m_rows, n, k, num_groups, num_sms)
    if kind != KIND_MASKED:
        # The class's largest M stands for all of it, so the memo's key is a function of the class alone.
        m_rows = m_class(kind, m_rows) * M_CLASS_ROWS
        max_m = None
    elif max_m is not None:
        if type(max_m) is not int or max_m < 1:
            raise ValueError(f"choose_config: max_m: expected a positive int, got {max_m!r}")
        # Only a cap that some averaged group size exceeds changes the estimate: keep the others out of the key.
        if max_m >= largest_masked_draw(m_rows, num_groups):
            max_m = None
    return _choose_memo(kind, m_rows, n, k, num_groups, num_sms, smem_limit, config_version(), max_m, bool(sides))


def memo_info():
    """Hits, misses and size of the config memo (functools' CacheInfo)."""
    return _choose_memo.cache_info()


def clear_memo() -> None:
    """Forget every memoized choice (tests; after changing the model's constants)."""
    _choose_memo.cache_clear()


_print_lock = threading.Lock()


@functools.lru_cache(maxsize=16384)
def _choose_memo(kind: int, m_rows: int, n: int, k: int, num_groups: int, num_sms: int, smem_limit: int,
                 override_version: int, max_m: int | None = None, sides: bool = False) -> GemmConfig:
    cfg, est = choose(kind, m_rows, n, k, num_groups, num_sms, smem_limit, max_m, sides)
    if env.print_configs():
        with _print_lock:
            rows = (f"M={m_rows}" + (f" (max {max_m})" if max_m is not None else "") if kind == KIND_MASKED
                    else f"M={m_rows - M_CLASS_ROWS + 1}..{m_rows}")  # the memo class this choice serves
            print(f"[cupygemm] {rows} G={num_groups} -> {cfg.describe()} "
                  f"(est {est.seconds * 1e6:.1f} us, {est.waves} waves, last wave {est.last_wave_util:.0%})",
                  file=sys.stderr)
    return cfg


def model_rows(kind: int, rows: int, expected_m: int | None = None) -> int:
    """The ``m_rows`` the cost model is given for a problem: M (normal), the total rows of A including
    padding (contiguous), or expected_m clamped to [1, max_m] (masked; ``rows`` = max_m)."""
    if kind == KIND_MASKED:
        return max(1, min(int(expected_m if expected_m is not None else rows), rows))
    return rows


B_EVICT_FIRST_ENV = env.B_EVICT_FIRST


# GPUs (a substring of the device name) where B tiles read by one row block go into L2 as first to evict whatever
# B's size: after the bench's L2 flush the 64- and 128-row seed shapes took 3-13 % less time on the H100 and 2-10 %
# less on the H200 (A/B in one process; none more), at a cost of 0-4 % (14-26 % on the N = 24576 shapes) when a loop
# keeps the same weights warm in L2 (benchmarks/NOTES.md, "B first to evict"). Elsewhere auto keeps the rule for B
# larger than L2.
B_EVICT_FIRST_ON = ("H100", "H200")


def b_evict_first(num_groups: int, n: int, k: int, l2_bytes: int, device_name: str) -> bool:
    """Whether the kernel may load B tiles that one CTA (or multicast pair) reads alone (M fits one row block) as
    first to evict from L2.

    Streamed with the normal priority, such tiles push out other data, dirty lines too: the previous kernels'
    outputs, written back to memory while this GEMM loads and read from memory again by their next reader
    (benchmarks/NOTES.md, "B first to evict"). As first to evict they mostly replace each other, so they are gone by
    the next call. Decode reads each layer's weights once per step, with every other layer's weights streaming through
    L2 in between, so nothing is lost there; a loop that calls the same small-M GEMM back to back on weights that fit
    in L2 loses what L2 kept for it (on the H100 1-3 % on most decode shapes, 23 % on 64x24576x1536 with L2 warm).
    ``CUPYGEMM_B_EVICT_FIRST``: ``auto`` (default) allows it for any B on the GPUs of :data:`B_EVICT_FIRST_ON` and
    elsewhere when B (all groups) is larger than L2 and so cannot stay cached between calls anyway; ``1`` always;
    ``0`` never.
    """
    rule = b_evict_first_rule(device_name)
    return rule == "any B" or (rule == "B larger than L2" and num_groups * n * k > l2_bytes)


def b_evict_first_rule(device_name: str) -> str:
    """Which B read by one row block may go into L2 first to evict on a GPU named ``device_name`` (the rule
    :func:`b_evict_first` applies): ``"any B"``, ``"B larger than L2"`` or ``"no B"``."""
    mode = env.b_evict_first_mode()
    if mode == "0":
        return "no B"
    if mode == "1" or any(s in device_name for s in B_EVICT_FIRST_ON):
        return "any B"
    return "B larger than L2"
