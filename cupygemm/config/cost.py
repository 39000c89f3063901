"""The cost model: the estimated time of a GEMM run with a given tile, multicast, split-K and stream-K tail.

A GEMM's time is (number of waves) x (time of one tile), where a tile costs the larger of its tensor-core time and
the time to stream its A and B tiles into the SM, plus a fixed per-tile overhead. Split-K adds the partials' round
trip; a stream-K tail replaces the last partial round by pieces spread over the idle SMs; masked GEMMs average over
drawn group sizes.

The constants are fitted by scripts/fit_model.py to a sweep of every legal tile (multicast, interleaved-K and serial
256-row variants included) on the 29 seed shapes on an H200 (benchmarks/results/tune-sweep-*-h200-v2.json,
benchmarks/NOTES.md, "Tile choice and the cost model"). With the rule that 64-row tiles do not share A (see choice.py)
the pick is within 1.6 % of the fastest measured config on the 19 normal shapes (geomean; 8.5 % worst). The grouped
picks are measured directly against DeepGEMM and over several group-size draws instead (benchmarks/NOTES.md, "Contiguous
GEMMs" and "Masked GEMMs"): the v2 sweep has no 256-row contiguous tiles and drew other group sizes than the peers.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

from ..util import ceil_div, round_up
from .constants import BLOCK_K, KIND_CONTIGUOUS, KIND_MASKED, KIND_NORMAL, M_ALIGNMENT, THREE_WG_BLOCK_M
from .legality import interleave_k_fits, selects_scales_at_run_time, split_k_extent, straddles

MMA_PEAK_PER_SM = 1979e12 / 132  # FP8 dense datasheet rate of one SM
MMA_EFFICIENCY = {64: 0.5, 128: 0.5, 192: 0.5, 256: 0.5}  # achieved fraction of it per tile height, while streaming
LOAD_BYTES_PER_SM = 40e9  # achieved A+B streaming rate into one SM
TILE_OVERHEAD_S = 1.0e-6  # prologue/epilogue per tile not hidden by the pipeline
STRADDLE_PENALTY = 0.2  # tiles crossing 128-column scale blocks promote with extra selects
STRADDLE_SPECIALIZED_PENALTY = 0.05  # ... or, with at most 8 boundary offsets, a K loop compiled per offset
MULTICAST_PENALTY = 1.02  # a 2-CTA cluster runs in lock-step: pays only where it relieves the operand stream

# Masked groups' sizes are only known on the device. The config is planned for the spread the peers' tests draw (each
# group int(expected_m x U(0.7, 1.3)) rows): the estimate is averaged over a fixed set of such draws. Planning for
# exactly expected_m rows (DeepGEMM's way) bets on the draw: on four draws of the six masked seed shapes its 256-row
# picks were 1.18x the fastest of four configs on geomean (1.59x at worst), the averaged picks 1.09x (1.29x);
# benchmarks/NOTES.md, "Masked GEMMs".
MASKED_SPREAD = (0.7, 1.3)
MASKED_DRAWS = 16

# Interleaved K (64-row tiles, two warpgroups on alternate K blocks) measured 0.92-0.96x the time with >= 56 K blocks,
# 1.0-1.06x with <= 16, on problems of at most two waves (benchmarks/NOTES.md, "Interleaved K"), and 0.96x on split-K
# units of 28 (64x2112x7168, benchmarks/NOTES.md, "Interleaved K"); with many waves (M = 4096) 64-row interleaved tiles
# lost to 128-row tiles (989 vs 820 us). Used from 28 K blocks on (a tile's, or a split-K unit's), in at most two waves.
INTERLEAVE_K_MIN_BLOCKS = 28
INTERLEAVE_K_FACTOR = 0.93

# Split-K across CTAs: each unit stores its FP32 partial tile, the tile's last unit reads them all back (about 1.5 us
# per wave: store, release, counter round trip, reads; benchmarks/NOTES.md, "Split-K across CTAs").
REDUCE_BYTES_PER_SM = 100e9
REDUCE_OVERHEAD_S = 1.2e-6

# Stream-K tail: a partly filled last round's tiles split along K (cuda_src/scheduler.cuh's plan) into at most
# SK_MAX_SPLIT pieces each. The tail costs, beyond its pieces' share of a tile, a fixed part and the unit's last piece
# reading every piece's partial tile back on one SM. Fitted to 13 split tails of the masked seed shapes on an H200
# (measured tail 4-6 us + the bytes at ~80 GB/s; in the model's units, whose tile times run ~1/0.7 of measured ones),
# benchmarks/NOTES.md, "Stream-K tail".
SK_MAX_SPLIT = 8
SK_TAIL_OVERHEAD_S = 6.4e-6
SK_READ_BYTES_PER_SM = 56e9
# A stream-K kernel's whole tiles run ~0.5 % slower than the plain kernel's (its partial sums leave register by
# register: 16-byte stores pin the accumulators to register quads and cost 0-4 %, benchmarks/NOTES.md, "Stream-K tail").
# Fitted per kind where the factor decides (benchmarks/NOTES.md, "Stream-K tail"): masked picks that change at 1.0
# measured faster on 7 of 10 problems (by up to 6.6 %; the other three within 1 %), the two normal picks that change
# measured 2.4-3.5 % slower, so normal GEMMs keep 1.02.
SK_KERNEL_FACTOR = {KIND_NORMAL: 1.02, KIND_MASKED: 1.0}

# Three math warpgroups on 192-row tiles (one m64 sub-tile each) against the 256-row tiles' two warpgroups of two
# serial sub-tiles: measured per unit of work 3-10 % faster where K <= 1536 (4096x32768x512 136.0 -> 122.6 us,
# 4096x24576x1536 239.4 -> 232.2) and, with the M = 4096 shapes' extra round of tiles, 2-9 % slower from K = 2048
# (benchmarks/NOTES.md, "Tile choice and the cost model"). Their per-tile cost beyond the K loop (the epilogue stores 64
# rows per warpgroup, not 128) is taken as half the 256-row tiles'.
THREE_WG_OVERHEAD_FACTOR = 0.5


class Estimate(NamedTuple):
    seconds: float
    waves: int
    last_wave_util: float
    tiles: int


def interleave_k_regime(block_m: int, k: int, waves: int) -> bool:
    """Whether a 64-row tile's K and waves are where interleaved K paid (see INTERLEAVE_K_MIN_BLOCKS). The model
    offers no stream-K tail there (one partial wave is interleaved K's), whatever the tile's width."""
    return block_m == 64 and ceil_div(k, BLOCK_K) >= INTERLEAVE_K_MIN_BLOCKS and waves <= 2


def interleave_k_pays(block_m: int, block_n: int, k: int, waves: int) -> bool:
    """Whether interleaved K is used for a tile the model proposes."""
    return interleave_k_regime(block_m, k, waves) and interleave_k_fits(block_m, block_n)


def _straddle_penalty(block_n: int) -> float:
    """Extra promotion cost of tiles crossing 128-column scale blocks: small where the K loop is compiled per
    boundary offset, larger where scales are selected at run time."""
    if not straddles(block_n):
        return 0.0
    return STRADDLE_PENALTY if selects_scales_at_run_time(block_n) else STRADDLE_SPECIALIZED_PENALTY


def tile_seconds(block_m: int, block_n: int, k: int, multicast: int = 0, interleave_k: bool = False) -> float:
    """Time of one tile summing ``k``."""
    k_eff = round_up(k, BLOCK_K)
    rate = MMA_PEAK_PER_SM * MMA_EFFICIENCY[block_m]
    mma = 2.0 * block_m * block_n * k_eff / rate * (1.0 + _straddle_penalty(block_n))
    # Multicast halves the L2 reads of the shared operand (A when 1, B when 2) and costs the pair's lock-step.
    a_rows = block_m / 2 if multicast == 1 else block_m
    b_rows = block_n / 2 if multicast == 2 else block_n
    load = (a_rows + b_rows) * k_eff / LOAD_BYTES_PER_SM
    # Widths that are odd multiples of 8 (run-time scale selects in the MMA -> promotion chain, unswizzled output
    # staging) also cost where loads bound the tile: 64x56 lost 2-7 % to 64x64 on 64x7168x2048 in four runs and
    # 1.7 % on 64x7168x16384, where the load term alone ranked 56 first (benchmarks/NOTES.md, "Tile choice and the cost
    # model").
    chain = 1.0 + STRADDLE_PENALTY if selects_scales_at_run_time(block_n) else 1.0
    lockstep = MULTICAST_PENALTY if multicast else 1.0
    overhead = TILE_OVERHEAD_S * (THREE_WG_OVERHEAD_FACTOR if block_m == THREE_WG_BLOCK_M else 1.0)
    return max(mma, load * chain) * lockstep * (INTERLEAVE_K_FACTOR if interleave_k else 1.0) + overhead


@functools.lru_cache(maxsize=256)
def masked_group_rows(expected_m: int, groups: int, max_m: int | None = None) -> tuple[tuple[int, ...], ...]:
    """The group sizes the masked estimate averages over: MASKED_DRAWS deterministic draws of int(expected_m x f) rows
    per group, f spread evenly over MASKED_SPREAD (a different offset per group), none above ``max_m`` (the rows a
    group can have). Cached: every candidate tile of a problem averages over the same draws."""
    lo, hi = MASKED_SPREAD
    golden = (math.sqrt(5.0) - 1.0) / 2.0
    draws = tuple(tuple(max(1, int(expected_m * (lo + (hi - lo) * (((d + 0.5) / MASKED_DRAWS + g * golden) % 1.0))))
                        for g in range(groups)) for d in range(MASKED_DRAWS))
    if max_m is None:
        return draws
    return tuple(tuple(min(r, max_m) for r in rows) for rows in draws)


def largest_masked_draw(expected_m: int, groups: int) -> int:
    """The largest group size the uncapped masked estimate averages over: a max_m at or above it changes nothing."""
    return max(max(rows) for rows in masked_group_rows(expected_m, groups))


def stream_k_tail(units: int, clusters: int, k_blocks: int) -> tuple[int, int]:
    """(tail units, pieces per tail unit) of the kernel's stream-K plan (cuda_src/scheduler.cuh): the R units of a
    partly filled last round, each split along K into min(clusters // R, K blocks, SK_MAX_SPLIT) pieces; (0, 1)
    when that is no split."""
    tail = units % clusters
    split = min(clusters // tail, k_blocks, SK_MAX_SPLIT) if tail else 1
    return (tail, split) if split > 1 else (0, 1)


def _stream_k_seconds(kind: int, tiles: int, sms: int, cluster: int, k: int, tile_s: float, bm: int,
                      bn: int) -> float:
    """Time of `tiles` with the stream-K tail: the full rounds, then one piece of a tail unit per cluster, its
    partial tile stored and, for the unit's last piece, all of the unit's pieces read back."""
    units, clusters = tiles // cluster, max(1, sms // cluster)
    tail, split = stream_k_tail(units, clusters, ceil_div(k, BLOCK_K))
    rounds = ceil_div(units - tail, clusters)
    seconds = rounds * tile_s
    if tail:
        seconds += (tile_s - TILE_OVERHEAD_S) / split + TILE_OVERHEAD_S + SK_TAIL_OVERHEAD_S
        seconds += bm * bn * 4 * split / SK_READ_BYTES_PER_SM
    return seconds * SK_KERNEL_FACTOR[kind]


def estimate(kind: int, m_rows: int, n: int, k: int, groups: int, bm: int, bn: int, num_sms: int,
             multicast: int = 0, split_k: int = 1, stream_k: bool = False, max_m: int | None = None) -> Estimate:
    """Time of a GEMM (waves x time of one tile, or with ``stream_k`` the full rounds plus the split tail).
    Masked: ``m_rows`` = expected_m; the time is the mean over masked_group_rows (capped at ``max_m``), the waves
    and last-wave figures those of groups of exactly expected_m rows. Interleaved K is priced where the chooser would
    use it."""
    n_blocks = ceil_div(n, bn)
    sms = num_sms - num_sms % 2 if multicast else num_sms
    k_unit = split_k_extent(k, split_k)

    def time_of(tiles: int) -> tuple[float, int]:
        waves = max(1, ceil_div(tiles, sms))
        unit = tile_seconds(bm, bn, k_unit, multicast, interleave_k_pays(bm, bn, k_unit, waves))
        if split_k > 1:
            # Every unit stores its FP32 partial tile; the tile's last CTA then reads the other splits' partials.
            unit += (bm * bn * 4 * split_k) / REDUCE_BYTES_PER_SM + REDUCE_OVERHEAD_S
        if stream_k:
            return _stream_k_seconds(kind, tiles, sms, 2 if multicast else 1, k, unit, bm, bn), waves
        return waves * unit, waves

    m_blocks = ceil_div(m_rows, bm)
    if kind == KIND_MASKED:
        m_blocks *= groups
    elif kind == KIND_CONTIGUOUS and bm > M_ALIGNMENT:
        # About half of the group ends fall mid-block; each such block runs as two half tiles. Since both math
        # warpgroups share a half tile the two cost about one tile, but without this term half of the contiguous
        # picks move to 256-row tiles, which measured 1-38 % slower on all six tried (benchmarks/NOTES.md, "Contiguous
        # GEMMs").
        m_blocks += ceil_div(groups, 2)
    tiles = m_blocks * n_blocks * split_k
    seconds, waves = time_of(tiles)
    if kind == KIND_MASKED:
        draws = masked_group_rows(m_rows, groups, max_m)
        seconds = sum(time_of(sum(ceil_div(r, bm) for r in rows) * n_blocks)[0] for rows in draws) / len(draws)
    last = tiles - (waves - 1) * sms
    return Estimate(seconds, waves, last / sms, tiles)
