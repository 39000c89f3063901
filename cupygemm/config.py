"""Kernel configuration: block sizes, pipeline depth and grid, chosen by a small cost model.

The model is deterministic: for every legal (block_m, block_n) it estimates the kernel time as
(number of waves) x (time of one tile), where a tile costs the larger of its tensor-core time and the
time to stream its A and B tiles into the SM, and breaks ties towards fuller last waves and fewer
bytes. ``CUPYGEMM_PRINT_CONFIGS=1`` prints each choice; :func:`override_config` forces one for tuning.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import sys
import threading
from dataclasses import dataclass

from . import env
from .device import SM90_MAX_SMEM_PER_BLOCK
from .layout import M_ALIGNMENT_FOR_CONTIGUOUS_LAYOUT as M_ALIGNMENT

KIND_NORMAL, KIND_CONTIGUOUS, KIND_MASKED = 0, 1, 2
KIND_NAMES = {KIND_NORMAL: "normal", KIND_CONTIGUOUS: "contiguous", KIND_MASKED: "masked"}

BLOCK_K = 128
_STATIC_SMEM = 1024  # the kernel's __align__(1024) extern declaration reserves this much static smem
_MAX_STAGES = 8
# Split-K over two warpgroups drains the pipeline twice as fast (each takes every other stage): up to 12 stages for
# tiles of at most 64 K blocks, whose run is short next to the memory latency after a dirty-L2 flush. There
# 64x4096x7168 and 128x4096x7168 (56 K blocks) took 1.0-1.5 us less with 12 than with 8; 64x7168x16384 (128 K blocks)
# 0.5-0.9 us more, with B first to evict or not (benchmarks/NOTES.md section 23; between 56 and 128 not measured).
_DEEP_SPLIT_K_MAX_K_BLOCKS = 64
_MAX_STAGES_SPLIT_K = 12
# A CTA running several tiles keeps at most one tile's K blocks in flight (but 3 or more): with 8 stages on 4 K
# blocks the producer requested its second tile whole before the first one's data arrived, and after a dirty-L2
# flush 64x32768x512 took ~1 us longer than with 3-6 (NOTES 23).
_MIN_STAGES_MULTI_TILE = 3
# setmaxnreg budgets (64 x 1024 registers, one CTA per SM): the producer warpgroup hands registers to the math ones.
_PRODUCER_REGS_TWO_WG, _MATH_REGS_TWO_WG = 40, 232  # 128 x 40 + 256 x 232 = 64 x 1024
_PRODUCER_REGS_THREE_WG, _MATH_REGS_THREE_WG = 24, 160  # 128 x 24 + 384 x 160 <= 64 x 1024
_MATH_REGS_ONE_WG = 255  # no setmaxnreg: 256 threads x 255
THREE_WG_BLOCK_M = 192  # the tile height run by three math warpgroups, one m64 slice each
_OTHER_REGS_THREE_WG = 32  # 192x128 (64 + 64 accumulators) compiles at 160 without spills
_OTHER_REGS = 64  # registers the math loop needs besides accumulators (addresses, scales, loop state)
_OTHER_REGS_LEAN = 40  # ... where tiles do not straddle scale blocks, and beside two accumulator sets

# The model's constants, fitted by scripts/fit_model.py to a sweep of every legal tile (multicast, split-K and
# serial 256-row variants included) on the 29 seed shapes on an H200 (benchmarks/results/tune-sweep-*-h200-v2.json,
# benchmarks/NOTES.md section 9). With the session-3 rule (no A-multicast on 64-row tiles) the pick is within 1.6 % of
# the fastest measured config on the 19 normal shapes (geomean; 8.5 % worst). The grouped picks were measured
# directly against DeepGEMM and over several group-size draws instead (sections 10 and 13): the v2 sweep predates
# 256-row contiguous tiles and drew other group sizes than the peers.
_MMA_PEAK_PER_SM = 1979e12 / 132  # FP8 dense datasheet rate of one SM
_MMA_EFFICIENCY = {64: 0.5, 128: 0.5, 192: 0.5, 256: 0.5}  # achieved fraction of it per tile height, while streaming
_LOAD_BYTES_PER_SM = 40e9  # achieved A+B streaming rate into one SM
_TILE_OVERHEAD_S = 1.0e-6  # prologue/epilogue per tile not hidden by the pipeline
_STRADDLE_PENALTY = 0.2  # tiles crossing 128-column scale blocks promote with extra selects
_STRADDLE_SPECIALIZED_PENALTY = 0.05  # ... or, with at most 8 boundary offsets, a K loop compiled per offset
_MULTICAST_PENALTY = 1.02  # a 2-CTA cluster runs in lock-step: pays only where it relieves the operand stream
# Masked groups' sizes are only known on the device. The config is planned for the spread the peers' tests draw
# (each group int(expected_m x U(0.7, 1.3)) rows): the estimate is averaged over a fixed set of such draws. Planning
# for exactly expected_m rows (DeepGEMM's way, used here until session 6) bets on the draw: on four draws of the six
# masked seed shapes its 256-row picks were 1.18x the fastest of four configs on geomean (1.59x at worst), the
# averaged picks 1.09x (1.29x); benchmarks/NOTES.md section 13.
_MASKED_SPREAD = (0.7, 1.3)
_MASKED_DRAWS = 16
# Split-K over two warpgroups (64-row tiles) measured 0.92-0.96x the time with >= 56 K blocks, 1.0-1.06x with
# <= 16, on problems of at most two waves (benchmarks/NOTES.md section 7); with many waves (M = 4096) 64-row
# split tiles lost to 128-row tiles (989 vs 820 us). Used from 32 K blocks on, in at most two waves.
_SPLIT_K_MIN_BLOCKS = 32
# The widest split-K tile: 64x184 (wider ones split their wgmma) spills registers in its rolled K loop under NVRTC
# 12.9 and 13.5 (13.0 does not); the model never picks it (a scan of normal and masked problems, NOTES section 23d).
_SPLIT_K_MAX_BLOCK_N = 176
_SPLIT_K_FACTOR = 0.93
# Split-K across CTAs (k_slices): each unit stores its FP32 partial tile, the tile's last unit reads them all back
# (about 1.5 us per wave: store, release, counter round trip, reads; benchmarks/NOTES.md section 11).
_REDUCE_BYTES_PER_SM = 100e9
_REDUCE_OVERHEAD_S = 1.2e-6
# The model's load term does not rank sliced configs (wide sliced tiles measured slower than it predicts), so they
# come from a measured rule instead: when even 64x64 tiles would leave half the SMs idle, use 48-column tiles with
# the most slices (2..4, at least 8 K blocks each) that still fit one wave. On an H200: 64x2112x7168 11.3 -> 9.4 us,
# 128x2112x7168 12.3 -> 10.5 us; where 64x64 tiles fill more SMs slices only tied or lost (section 11).
_SLICED_BLOCK_N = 48
# Stream-K tail (``stream_k``): a partly filled last round's tiles split along K (cuda_src/scheduler.cuh's plan)
# into at most this many pieces each. The tail costs, beyond its pieces' share of a tile, a fixed part and the
# unit's last piece reading every piece's partial tile back on one SM. Fitted to 13 split tails of the masked seed
# shapes on an H200 (measured tail 4-6 us + the bytes at ~80 GB/s; in the model's units, whose tile times run ~1/0.7
# of measured ones), NOTES 15.
STREAM_K_KINDS = (KIND_NORMAL, KIND_MASKED)  # the kernel has no stream-K tail for the contiguous layout
_SK_MAX_SPLIT = 8
_SK_TAIL_OVERHEAD_S = 6.4e-6
_SK_READ_BYTES_PER_SM = 56e9
# A stream-K kernel's whole tiles ran 0-4 % slower than the plain kernel's until its partial sums stopped pinning the
# accumulators to register quads (NOTES 19d), ~0.5 % since. Refitted per kind where the factor decides (NOTES 20):
# masked picks that change at 1.0 measured faster on 7 of 10 problems (by up to 6.6 %; the other three within 1 %),
# the two normal picks that change measured 2.4-3.5 % slower, so normal GEMMs keep 1.02.
_SK_KERNEL_FACTOR = {KIND_NORMAL: 1.02, KIND_MASKED: 1.0}
_MAX_K_SLICES = 4
# Three math warpgroups on 192-row tiles (one m64 slice each) against the 256-row tiles' two warpgroups of two serial
# slices: measured per unit of work 3-10 % faster where K <= 1536 (4096x32768x512 136.0 -> 122.6 us,
# 4096x24576x1536 239.4 -> 232.2) and, with the M = 4096 shapes' extra round of tiles, 2-9 % slower from K = 2048
# (benchmarks/NOTES.md section 16). Their per-tile cost beyond the K loop (the epilogue stores 64 rows per warpgroup,
# not 128) is taken as half the 256-row tiles'; they are weighed for normal GEMMs up to this K, against 256-row picks.
_THREE_WG_MAX_K = 1536
_THREE_WG_OVERHEAD_FACTOR = 0.5
_MIN_SLICE_K_BLOCKS = 8


@dataclass(frozen=True)
class GemmConfig:
    """Everything that specializes one compiled kernel, plus its launch grid."""

    kind: int
    shape_n: int
    shape_k: int
    block_m: int
    block_n: int
    wgmma_n: int
    num_stages: int
    num_math_wg: int
    swizzle_d: int
    raster_n: int
    num_sms: int  # persistent grid size
    smem_bytes: int  # dynamic shared memory per CTA
    double_acc: bool = False  # two accumulator sets: the next MMA batch overlaps this batch's promotion
    multicast: int = 0  # 0 none; 1: 2-CTA clusters share A (pairs along N); 2: share B (pairs along M)
    split_k: bool = False  # block_m 64: two math warpgroups take alternate K blocks of the same rows
    serial_m: bool = False  # a warpgroup's m64 slices run one after the other through one temporary accumulator
    k_slices: int = 1  # normal GEMMs: each tile's K blocks split over this many CTAs (FP32 partials, last one reduces)
    stream_k: bool = False  # the last round's tiles split along K over the idle CTAs (normal, masked)

    @property
    def threads(self) -> int:
        return 128 * (self.num_math_wg + 1)

    @property
    def math_regs(self) -> int:
        if self.num_math_wg == 3:
            return _MATH_REGS_THREE_WG
        return _MATH_REGS_TWO_WG if self.num_math_wg > 1 else _MATH_REGS_ONE_WG

    @property
    def producer_regs(self) -> int:
        """The producer warpgroup's registers after setmaxnreg (unused with one math warpgroup)."""
        return _PRODUCER_REGS_THREE_WG if self.num_math_wg == 3 else _PRODUCER_REGS_TWO_WG

    @property
    def a_box_rows(self) -> int:
        """Rows of A per TMA load. Masked tiles load 64-row boxes and skip those past the group's rows (they lie
        inside the tensor, so they would be read for nothing); otherwise the CTA's share of the tile in one box."""
        if self.kind == KIND_MASKED and self.block_m > 64:
            return 64
        return self.block_m // 2 if self.multicast == 1 else self.block_m

    def defines(self) -> dict[str, object]:
        """The CUPYGEMM_* constants that instantiate cuda_src/fp8_gemm.cu."""
        return {
            "CUPYGEMM_SHAPE_N": self.shape_n,
            "CUPYGEMM_SHAPE_K": self.shape_k,
            "CUPYGEMM_BLOCK_M": self.block_m,
            "CUPYGEMM_BLOCK_N": self.block_n,
            "CUPYGEMM_WGMMA_N": self.wgmma_n,
            "CUPYGEMM_NUM_STAGES": self.num_stages,
            "CUPYGEMM_NUM_MATH_WG": self.num_math_wg,
            "CUPYGEMM_MATH_REGS": self.math_regs,
            "CUPYGEMM_PRODUCER_REGS": self.producer_regs,
            "CUPYGEMM_SWIZZLE_D": self.swizzle_d,
            "CUPYGEMM_RASTER_N": self.raster_n,
            "CUPYGEMM_KIND": self.kind,
            "CUPYGEMM_MULTICAST": self.multicast,
            "CUPYGEMM_INTERLEAVE_K": int(self.split_k),
            "CUPYGEMM_SERIAL_M": int(self.serial_m),
            "CUPYGEMM_SPLIT_K": self.k_slices,
            "CUPYGEMM_STREAM_K": int(self.stream_k),
            "CUPYGEMM_A_BOX_M": self.a_box_rows,
            "CUPYGEMM_CLUSTER_ATTR": "__cluster_dims__(2, 1, 1)" if self.multicast else "",
        }

    def describe(self) -> str:
        return (f"{KIND_NAMES[self.kind]} N={self.shape_n} K={self.shape_k}: block {self.block_m}x{self.block_n} "
                f"(wgmma n{self.wgmma_n}), {self.num_stages} stages, {self.num_math_wg} math WG, "
                f"swizzle_d {self.swizzle_d}, {'2 acc sets, ' if self.double_acc else ''}"
                f"{['', 'multicast A x2, ', 'multicast B x2, '][self.multicast]}"
                f"{'split-K over 2 WG, ' if self.split_k else ''}{'serial m64 slices, ' if self.serial_m else ''}"
                f"{f'K over {self.k_slices} CTAs, ' if self.k_slices > 1 else ''}"
                f"{'stream-K tail, ' if self.stream_k else ''}"
                f"grid {self.num_sms}, "
                f"smem {self.smem_bytes} B")


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def _round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def smem_per_stage(block_m: int, block_n: int) -> int:
    return block_m * BLOCK_K + block_n * BLOCK_K + _round_up(block_m * 4, 128)


def smem_bytes(block_m: int, block_n: int, stages: int, split_k: bool = False) -> int:
    d = _round_up(block_m * block_n * 2, 1024)
    handoff = block_n * 256 if split_k else 0  # split-K: one float per accumulator register of a warpgroup
    return d + stages * smem_per_stage(block_m, block_n) + stages * 16 + handoff


def output_swizzle(block_n: int) -> int:
    """Widest TMA swizzle whose span divides the output tile's row (128/64/32 bytes, else none)."""
    for sw in (128, 64, 32):
        if (block_n * 2) % sw == 0:
            return sw
    return 0


def _straddles(block_n: int) -> bool:
    """Whether tiles of this width can cross 128-column B-scale blocks."""
    return not (BLOCK_K % block_n == 0 or block_n % BLOCK_K == 0)


def _math_reg_budget(block_m: int, block_n: int) -> int:
    """Registers per math thread left for accumulators (the rest hold addresses, scales and loop state).

    Two math warpgroups get 232 from setmaxnreg and need 40 besides accumulators, 64 when tiles straddle
    128-column scale blocks (masked 128x184, 256x120-serial and 256x88 spill with less). One warpgroup runs
    at 255 without setmaxnreg and needs 64 (64x208 spills). Three (192-row tiles) get 160 and need 32."""
    if block_m == THREE_WG_BLOCK_M:
        return _MATH_REGS_THREE_WG - _OTHER_REGS_THREE_WG
    if block_m == 64:
        return _MATH_REGS_ONE_WG - _OTHER_REGS
    return _MATH_REGS_TWO_WG - (_OTHER_REGS if _straddles(block_n) else _OTHER_REGS_LEAN)


def _acc_regs(block_m: int, block_n: int, wgmma_n: int, serial_m: bool = False, acc_sets: int = 1) -> int:
    """Accumulator registers per math thread: temporary wgmma accumulators plus the promoted FP32 sums."""
    m_sub = block_m // (64 * math_warpgroups(block_m))
    return (1 if serial_m else m_sub) * acc_sets * (wgmma_n // 2) + m_sub * (block_n // 2)


def wgmma_n_for(block_m: int, block_n: int, serial_m: bool = False, double_acc: bool = False) -> int | None:
    """The wgmma N used for a tile: the whole block_n when the accumulators fit, else an even split."""
    for parts in (1, 2, 3, 4):
        if block_n % parts or (block_n // parts) % 8:
            continue
        wn = block_n // parts
        fits = (double_acc_fits(block_m, block_n, wn, serial_m) if double_acc
                else _acc_regs(block_m, block_n, wn, serial_m) <= _math_reg_budget(block_m, block_n))
        if fits:
            return wn
    return None


def math_warpgroups(block_m: int, split_k: bool = False) -> int:
    """Math warpgroups of a tile: one per 64 rows up to three (192), two for 256 rows (two m64 slices each), two
    for a 64-row tile split along K over warpgroups."""
    if block_m == 64:
        return 2 if split_k else 1
    return 3 if block_m == THREE_WG_BLOCK_M else 2


def serial_m_possible(block_m: int) -> bool:
    """Serial m64 slices need a warpgroup owning more than one slice (256-row tiles)."""
    return block_m == 256


def double_acc_fits(block_m: int, block_n: int, wgmma_n: int, serial_m: bool = False) -> bool:
    """Whether two temporary accumulator sets plus the final one fit in the math registers."""
    # 64x128 (one warpgroup, 192 accumulator registers) and 256x96 (serial slices, 192, straddling scale blocks)
    # compile without spills. (192-row tiles take no second set.)
    budget = (_MATH_REGS_ONE_WG if block_m == 64 else _MATH_REGS_TWO_WG) - _OTHER_REGS_LEAN
    return _acc_regs(block_m, block_n, wgmma_n, serial_m, acc_sets=2) <= budget


def _stages_for(block_m: int, block_n: int, num_k_blocks: int, smem_limit: int, split_k: bool = False,
                tile_rounds: int = 1) -> int:
    """The most pipeline stages that fit in shared memory, within the caps above; ``num_k_blocks``: the K blocks one
    tile (or K slice) sums, ``tile_rounds``: the tiles each CTA runs."""
    budget = smem_limit - _STATIC_SMEM
    cap = _MAX_STAGES_SPLIT_K if split_k and num_k_blocks <= _DEEP_SPLIT_K_MAX_K_BLOCKS else _MAX_STAGES
    if tile_rounds > 1:
        cap = min(cap, max(num_k_blocks, _MIN_STAGES_MULTI_TILE))
    # Split-K needs an even count (the kernel's parity waits; see make_config).
    step = 2 if split_k else 1
    stages = 0
    for s in range(cap - cap % step, 0, -step):
        if smem_bytes(block_m, block_n, s, split_k) <= budget:
            stages = s
            break
    return stages


def split_k_fits(block_m: int, block_n: int) -> bool:
    """Whether a tile can run split-K over two warpgroups: 64 rows, at most _SPLIT_K_MAX_BLOCK_N columns (the
    caller also needs one accumulator set and an unsplit wgmma)."""
    return block_m == 64 and block_n <= _SPLIT_K_MAX_BLOCK_N


def split_k_regime(block_m: int, k: int, waves: int) -> bool:
    """Whether a 64-row tile's K and waves are where split-K over two warpgroups paid (see _SPLIT_K_MIN_BLOCKS).
    The model offers no stream-K tail there (one partial wave is split-K's), whatever the tile's width."""
    return block_m == 64 and ceil_div(k, BLOCK_K) >= _SPLIT_K_MIN_BLOCKS and waves <= 2


def split_k_pays(block_m: int, block_n: int, k: int, waves: int) -> bool:
    """Whether split-K over two warpgroups is used for a tile the model proposes."""
    return split_k_regime(block_m, k, waves) and split_k_fits(block_m, block_n)


def _selects_scales_at_run_time(block_n: int) -> bool:
    """Whether tiles of this width straddle 128-column scale blocks at more than 8 offsets, so the kernel picks each
    column's B scale at run time instead of compiling its K loop per offset (cuda_src/fp8_gemm.cu)."""
    return _straddles(block_n) and BLOCK_K // math.gcd(block_n, BLOCK_K) > 8


def _straddle_penalty(block_n: int) -> float:
    """Extra promotion cost of tiles crossing 128-column scale blocks: small where the K loop is compiled per
    boundary offset, larger where scales are selected at run time."""
    if not _straddles(block_n):
        return 0.0
    return _STRADDLE_PENALTY if _selects_scales_at_run_time(block_n) else _STRADDLE_SPECIALIZED_PENALTY


def _tile_seconds(block_m: int, block_n: int, k: int, multicast: int = 0, split: bool = False) -> float:
    k_eff = _round_up(k, BLOCK_K)
    rate = _MMA_PEAK_PER_SM * _MMA_EFFICIENCY[block_m]
    mma = 2.0 * block_m * block_n * k_eff / rate * (1.0 + _straddle_penalty(block_n))
    # Multicast halves the L2 reads of the shared operand (A when 1, B when 2) and costs the pair's lock-step.
    a_rows = block_m / 2 if multicast == 1 else block_m
    b_rows = block_n / 2 if multicast == 2 else block_n
    load = (a_rows + b_rows) * k_eff / _LOAD_BYTES_PER_SM
    # Widths that are odd multiples of 8 (run-time scale selects in the MMA -> promotion chain, unswizzled output
    # staging) also cost where loads bound the tile: 64x56 lost 2-7 % to 64x64 on 64x7168x2048 in four runs and
    # 1.7 % on 64x7168x16384, where the load term alone ranked 56 first (benchmarks/NOTES.md section 12).
    chain = 1.0 + _STRADDLE_PENALTY if _selects_scales_at_run_time(block_n) else 1.0
    lockstep = _MULTICAST_PENALTY if multicast else 1.0
    overhead = _TILE_OVERHEAD_S * (_THREE_WG_OVERHEAD_FACTOR if block_m == THREE_WG_BLOCK_M else 1.0)
    return max(mma, load * chain) * lockstep * (_SPLIT_K_FACTOR if split else 1.0) + overhead


def multicast_options(kind: int, m_rows: int, n: int, block_m: int, block_n: int) -> list[int]:
    """Legal multicast modes: pairs along N need an even number of n blocks; pairs along M (normal GEMMs
    only) an even number of m blocks and B halves of whole 8-row swizzle atoms."""
    opts = [0]
    if ceil_div(n, block_n) % 2 == 0:
        opts.append(1)
    if kind == KIND_NORMAL and block_n % 16 == 0 and ceil_div(m_rows, block_m) % 2 == 0:
        opts.append(2)
    return opts


@dataclass(frozen=True)
class _Estimate:
    seconds: float
    waves: int
    last_wave_util: float
    tiles: int


@functools.lru_cache(maxsize=256)
def _masked_group_rows(expected_m: int, groups: int) -> tuple[tuple[int, ...], ...]:
    """The group sizes the masked estimate averages over: _MASKED_DRAWS deterministic draws of
    int(expected_m x f) rows per group, f spread evenly over _MASKED_SPREAD (a different offset per group).
    Cached: every candidate tile of a problem averages over the same draws."""
    lo, hi = _MASKED_SPREAD
    golden = (math.sqrt(5.0) - 1.0) / 2.0
    return tuple(tuple(max(1, int(expected_m * (lo + (hi - lo) * (((d + 0.5) / _MASKED_DRAWS + g * golden) % 1.0))))
                       for g in range(groups)) for d in range(_MASKED_DRAWS))


def stream_k_tail(units: int, clusters: int, k_blocks: int) -> tuple[int, int]:
    """(tail units, pieces per tail unit) of the kernel's stream-K plan (cuda_src/scheduler.cuh): the R units of a
    partly filled last round, each split along K into min(clusters // R, K blocks, _SK_MAX_SPLIT) pieces; (0, 1)
    when that is no split."""
    tail = units % clusters
    split = min(clusters // tail, k_blocks, _SK_MAX_SPLIT) if tail else 1
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
        seconds += (tile_s - _TILE_OVERHEAD_S) / split + _TILE_OVERHEAD_S + _SK_TAIL_OVERHEAD_S
        seconds += bm * bn * 4 * split / _SK_READ_BYTES_PER_SM
    return seconds * _SK_KERNEL_FACTOR[kind]


def _estimate(kind: int, m_rows: int, n: int, k: int, groups: int, bm: int, bn: int, num_sms: int,
              multicast: int = 0, k_slices: int = 1, stream_k: bool = False) -> _Estimate:
    """Time of a GEMM (waves x time of one tile, or with ``stream_k`` the full rounds plus the split tail).
    Masked: ``m_rows`` = expected_m; the time is the mean over _masked_group_rows, the waves and last-wave figures
    those of groups of exactly expected_m rows."""
    n_blocks = ceil_div(n, bn)
    sms = num_sms - num_sms % 2 if multicast else num_sms
    k_unit = slice_k(k, k_slices)

    def time_of(tiles: int) -> tuple[float, int]:
        waves = max(1, ceil_div(tiles, sms))
        unit = _tile_seconds(bm, bn, k_unit, multicast, split_k_pays(bm, bn, k_unit, waves))
        if k_slices > 1:
            # Every unit stores its FP32 partial tile; the tile's last CTA then reads the other slices' partials.
            unit += (bm * bn * 4 * k_slices) / _REDUCE_BYTES_PER_SM + _REDUCE_OVERHEAD_S
        if stream_k:
            return _stream_k_seconds(kind, tiles, sms, 2 if multicast else 1, k, unit, bm, bn), waves
        return waves * unit, waves

    m_blocks = ceil_div(m_rows, bm)
    if kind == KIND_MASKED:
        m_blocks *= groups
    elif kind == KIND_CONTIGUOUS and bm > M_ALIGNMENT:
        # About half of the group ends fall mid-block; each such block runs as two half tiles. Since both math
        # warpgroups share a half tile the two cost about one tile, but dropping this term moved half of the
        # contiguous picks to 256-row tiles, which measured 1-38 % slower on all six tried (NOTES section 18).
        m_blocks += ceil_div(groups, 2)
    tiles = m_blocks * n_blocks * k_slices
    seconds, waves = time_of(tiles)
    if kind == KIND_MASKED:
        draws = _masked_group_rows(m_rows, groups)
        seconds = sum(time_of(sum(ceil_div(r, bm) for r in rows) * n_blocks)[0] for rows in draws) / len(draws)
    last = tiles - (waves - 1) * sms
    return _Estimate(seconds, waves, last / sms, tiles)


def sliced_tile(kind: int, m_rows: int, n: int, k: int, num_sms: int) -> tuple[int, int, int] | None:
    """(block_m, block_n, k_slices) of split-K across CTAs where the measured rule asks for it, else None: a normal
    GEMM whose 64x64 tiles would fill at most half the SMs, with at least two slices of 8+ K blocks in one wave."""
    if kind != KIND_NORMAL or ceil_div(m_rows, 64) * ceil_div(n, 64) > num_sms // 2:
        return None
    bm = 64 if m_rows <= 64 else 128
    tiles = ceil_div(m_rows, bm) * ceil_div(n, _SLICED_BLOCK_N)
    ks = min(_MAX_K_SLICES, num_sms // tiles, ceil_div(k, BLOCK_K) // _MIN_SLICE_K_BLOCKS)
    return (bm, _SLICED_BLOCK_N, ks) if ks >= 2 else None


# Raster stripes (cuda_src/scheduler.cuh): a stripe of N blocks is swept over every row block before the next
# stripe starts. 16 blocks per stripe, as DeepGEMM's scheduler groups them; with A multicast a scheduling unit is a
# pair of blocks, so 8 units. It was 16 units (32 blocks) with A multicast too; against that, 16 blocks measured up
# to 3.7 % faster on the M = 4096 seed shapes, 0-11 % on the masked ones and 0.3-3.2 % on 9 of 12 contiguous layouts
# on an H100, and about the same or a little less on an H200; slower by 0.6-2.2 % on two contiguous seed layouts
# with K = 2048 and one other (benchmarks/NOTES.md sections 24c and 24e).
RASTER_N_BLOCKS = 16


def default_raster_n(multicast: int) -> int:
    """Scheduling units per raster stripe (n blocks, or n-block pairs with A multicast)."""
    return RASTER_N_BLOCKS // 2 if multicast == 1 else RASTER_N_BLOCKS


def fewest_ctas_for_rounds(tiles: int, grid: int, cluster: int) -> int:
    """The smallest grid (whole clusters) that runs ``tiles`` in as many rounds as ``grid`` CTAs do. Normal GEMMs
    launch that many: where the last round is partly filled, fewer CTAs with full rounds measured 0.5-1.8 % faster
    on an H200 (4096x7168x16384, 4096x4096x7168 on 128 CTAs, 4096x2112x7168 on 118; DeepGEMM sizes its grid the
    same way), while contiguous 8x4096x4096x7168 on 130 measured 2 % slower (benchmarks/NOTES.md section 18)."""
    units, clusters = ceil_div(tiles, cluster), max(1, grid // cluster)
    rounds = ceil_div(units, clusters)
    return min(grid, ceil_div(units, rounds) * cluster)


def slice_k(k: int, k_slices: int) -> int:
    """The K one split-K unit sums (its largest slice of the 128-wide K blocks)."""
    return ceil_div(ceil_div(k, BLOCK_K), k_slices) * BLOCK_K


_override_lock = threading.Lock()
_overrides: dict[tuple, dict] = {}
_override_version = 0  # bumped on every override change; part of the choice memo's key


_BOOL_FIELDS = ("double_acc", "split_k", "serial_m", "stream_k")
_OVERRIDE_FIELDS = ("block_m", "block_n", "wgmma_n", "num_stages", "num_sms", "raster_n", "multicast", "k_slices",
                    *_BOOL_FIELDS)


def _check_override(kind: int, n: int, k: int, fields: dict) -> dict:
    """``fields`` checked one by one (type and range) and, where the tile is forced, together through make_config;
    returns them with booleans normalized. Refusing here, not at the first GEMM, names the bad field at its source
    (block_m=100 used to pass here and fail later as a KeyError)."""
    def need_int(name: str, value: object, ok: bool, expected: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"override_config: {name}: expected {expected}, got {type(value).__name__} {value!r}")
        if not ok:
            raise ValueError(f"override_config: {name}: expected {expected}, got {value}")

    out = dict(fields)
    for name, v in fields.items():
        if name in _BOOL_FIELDS:
            if not (isinstance(v, bool) or (isinstance(v, int) and v in (0, 1))):
                raise TypeError(f"override_config: {name}: expected a bool, got {type(v).__name__} {v!r}")
            out[name] = bool(v)
            continue
        isint = isinstance(v, int) and not isinstance(v, bool)
        if name == "block_m":
            legal = (64, 128, 192, 256) if kind == KIND_NORMAL else (64, 128, 256)
            need_int(name, v, isint and v in legal, f"one of {', '.join(map(str, legal))} for {KIND_NAMES[kind]} GEMMs")
        elif name in ("block_n", "wgmma_n"):
            need_int(name, v, isint and v % 8 == 0 and 8 <= v <= 256, "a multiple of 8 in [8, 256]")
        elif name == "num_stages":
            need_int(name, v, isint and 1 <= v <= _MAX_STAGES_SPLIT_K, f"an int in [1, {_MAX_STAGES_SPLIT_K}]")
        elif name in ("num_sms", "raster_n"):
            need_int(name, v, isint and v >= 1, "a positive int")
        elif name == "multicast":
            need_int(name, v, isint and v in (0, 1, 2), "0 (off), 1 (share A) or 2 (share B)")
        elif name == "k_slices":
            kb = ceil_div(k, BLOCK_K)
            need_int(name, v, isint and 1 <= v <= min(kb, 64), f"an int in [1, {min(kb, 64)}] (K blocks of 128)")
            if v > 1 and kind != KIND_NORMAL:
                raise ValueError(f"override_config: k_slices > 1 (split-K across CTAs) needs a normal GEMM, "
                                 f"got {KIND_NAMES[kind]}")
    if out.get("stream_k") and kind not in STREAM_K_KINDS:
        # Refused here: choose_config prices a forced tail before make_config would refuse it.
        raise ValueError(f"override_config: stream_k needs a normal or masked GEMM, got {KIND_NAMES[kind]}")
    if "block_m" in out and "block_n" in out:
        # The whole tile is forced: make_config's combination rules apply now. (With only one of the two, the other
        # comes from the model for each M, so those rules run at the GEMM.)
        trial = {f: out[f] for f in ("wgmma_n", "num_stages", "raster_n", "double_acc", "multicast", "split_k",
                                       "serial_m", "k_slices", "stream_k") if f in out}
        sms = out.get("num_sms", 132)
        if out.get("multicast"):
            sms -= sms % 2
        try:
            make_config(kind, n, k, out["block_m"], out["block_n"], max(sms, 2), **trial)
        except ValueError as e:
            raise ValueError(f"override_config: {e}") from None
    return out


def override_config(kind: int | str, n: int, k: int, **fields: int | bool) -> None:
    """Force config fields (block_m, block_n, wgmma_n, num_stages, num_sms, raster_n, double_acc, multicast,
    split_k, serial_m, k_slices, stream_k) for a (kind, N, K).

    For tuning; ``fields`` empty removes the override. Every field is checked here (unknown names, types, ranges,
    and with block_m and block_n both given the combination), raising ValueError or TypeError that names it.
    """
    kind = kind_id(kind)
    for name, value in (("n", n), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"override_config: {name}: expected a positive int, got {type(value).__name__} {value!r}")
        if value < 1:
            raise ValueError(f"override_config: {name}: expected a positive int, got {value}")
    bad = set(fields) - set(_OVERRIDE_FIELDS)
    if bad:
        raise ValueError(f"override_config: unknown fields {sorted(bad)}; allowed: {sorted(_OVERRIDE_FIELDS)}")
    fields = _check_override(kind, n, k, fields)
    global _override_version
    with _override_lock:
        if fields:
            _overrides[(kind, n, k)] = dict(fields)
        else:
            _overrides.pop((kind, n, k), None)
        _override_version += 1


def config_version() -> int:
    """Changes whenever an override changes: part of the key of anything derived from a choice."""
    return _override_version


def kind_id(kind: int | str) -> int:
    """The kind's id from its id or name ("normal", "contiguous", "masked"); ValueError otherwise."""
    if isinstance(kind, str):
        for kid, name in KIND_NAMES.items():
            if name == kind:
                return kid
        raise ValueError(f"kind: expected one of {list(KIND_NAMES.values())}, got {kind!r}")
    if kind not in KIND_NAMES:
        raise ValueError(f"kind: expected one of {list(KIND_NAMES)}, got {kind!r}")
    return kind


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

    Split-N tiles serialize MMA and promotion within a warpgroup; the model only proposes whole ones
    (splits stay reachable through override_config). 256-row tiles whose two m64 slices per warpgroup do
    not fit at once run them serially."""
    tiles = []
    for bm in candidate_block_ms(kind, m_rows):
        for bn in range(16, 257, 8):
            if wgmma_n_for(bm, bn) == bn:
                tiles.append((bm, bn, False))
            elif serial_m_possible(bm) and wgmma_n_for(bm, bn, serial_m=True) == bn:
                tiles.append((bm, bn, True))
    return tiles


_print_lock = threading.Lock()


def model_rows(kind: int, rows: int, expected_m: int | None = None) -> int:
    """The ``m_rows`` the cost model is given for a problem: M (normal), the total rows of A including
    padding (contiguous), or expected_m clamped to [1, max_m] (masked; ``rows`` = max_m)."""
    if kind == KIND_MASKED:
        return max(1, min(int(expected_m if expected_m is not None else rows), rows))
    return rows


def _check_problem(kind: int, m_rows: int, n: int, k: int, num_groups: int, num_sms: int) -> None:
    """ValueError/TypeError naming the first argument of choose_config that is not a positive int."""
    kind_id(kind)
    for name, value in (("m_rows", m_rows), ("n", n), ("k", k), ("num_groups", num_groups), ("num_sms", num_sms)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"choose_config: {name}: expected a positive int, got {type(value).__name__} {value!r}")
        if value < 1:
            raise ValueError(f"choose_config: {name}: expected a positive int, got {value}")


#: Rows per memo class: see m_class.
M_CLASS_ROWS = 64


def m_class(kind: int, m_rows: int) -> int:
    """The memo class of ``m_rows``: problems of one class get the same config.

    For normal and contiguous GEMMs the search reads M only through ceil_div(M, b) for the tile heights b in
    {64, 128, 192, 256} (tile counts, multicast pairs along M, the sliced-tile rule) and the tests M <= 64 and
    M <= 128, which are ceil_div(M, 64) <= 1 and ceil_div(M, 128) <= 1. Since ceil_div(ceil_div(M, 64), j) =
    ceil_div(M, 64 j), all of them are functions of ceil_div(M, 64): that is the class (tests/test_config.py checks
    the memoized choice against the search for a grid of M). Masked GEMMs average over group sizes drawn from the
    exact expected_m, so there the class is M itself.
    """
    if kind == KIND_MASKED:
        return m_rows
    return -(-m_rows // M_CLASS_ROWS)


def choose_config(kind: int, m_rows: int, n: int, k: int, num_groups: int, num_sms: int,
                  smem_limit: int = SM90_MAX_SMEM_PER_BLOCK) -> GemmConfig:
    """Pick the config for a GEMM. ``m_rows``: M (normal), total rows (contiguous), expected rows per group (masked).

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
    return _choose_memo(kind, m_rows, n, k, num_groups, num_sms, smem_limit, _override_version)


def memo_info():
    """Hits, misses and size of the config memo (functools' CacheInfo)."""
    return _choose_memo.cache_info()


@functools.lru_cache(maxsize=16384)
def _choose_memo(kind: int, m_rows: int, n: int, k: int, num_groups: int, num_sms: int, smem_limit: int,
                 override_version: int) -> GemmConfig:
    """The search itself (unmemoized as ``_choose_memo.__wrapped__``), for exactly ``m_rows``."""
    best = None

    def consider(bm: int, bn: int, serial: bool) -> None:
        nonlocal best
        for mc in multicast_options(kind, m_rows, n, bm, bn) if num_sms >= 2 else [0]:
            if mc == 2 and bm == THREE_WG_BLOCK_M:
                continue
            if mc == 1 and bm == 64:
                # Sharing A between 64-row tiles never paid in the sweeps (10 small-M shapes: equal or 2-6 % slower
                # than no multicast, benchmarks/NOTES.md section 10), though the model's load term says it should.
                continue
            est = _estimate(kind, m_rows, n, k, num_groups, bm, bn, num_sms, mc)
            # The same tile with a stream-K tail: masked GEMMs (whose groups' sizes the tail absorbs) and normal ones
            # of two or more waves, the measured cases (one partial wave is split-K's), not with split-K over warpgroups.
            options = [(False, est)]
            if (kind in STREAM_K_KINDS and (kind == KIND_MASKED or est.waves >= 2) and not split_k_regime(bm, k, est.waves)
                    and bm != THREE_WG_BLOCK_M):
                options.append((True, _estimate(kind, m_rows, n, k, num_groups, bm, bn, num_sms, mc, stream_k=True)))
            for sk, e in options:
                # Lower time first; then a fuller last wave; then fewer bytes moved per output.
                score = (round(e.seconds * 1e9), -e.last_wave_util, (bm + bn) / (bm * bn), mc, sk)
                if best is None or score < best[0]:
                    best = (score, bm, bn, mc, serial, sk, e)

    # Two accumulator sets measured no faster (benchmarks/NOTES.md sections 2 and 17): never proposed.
    tiles = candidate_tiles(kind, m_rows)
    for bm, bn, serial in tiles:
        if bm != THREE_WG_BLOCK_M:
            consider(bm, bn, serial)
    # 192-row tiles only challenge a 256-row pick, the comparison measured (section 16c); their halved per-tile
    # overhead is relative to the 256-row tiles' epilogue, not to the 128-row ones'.
    if best is not None and best[1] == 256 and k <= _THREE_WG_MAX_K:
        for bm, bn, serial in tiles:
            if bm == THREE_WG_BLOCK_M:
                consider(bm, bn, serial)
    assert best is not None
    _, bm, bn, mc, serial, sk, est = best
    if mc == 1 and kind == KIND_NORMAL and bm == 128 and m_rows <= bm:
        # All of A is one 128-row block, which every CTA reads from L2 while B streams from memory: sharing it saves
        # L2 reads only, and the pick's tile without it measured 2-4 % faster (128x32768x512 on an H200 and an H100,
        # 128x24576x1536 on an H100; NOTES 20). Excluded from the search instead, the model moved to other tiles,
        # not measured; 256-row single blocks (M <= 256, more of the tile's operand bytes are A) were not measured.
        mc = 0
        est = _estimate(kind, m_rows, n, k, num_groups, bm, bn, num_sms, mc, stream_k=sk)
    ks = 1
    sliced = sliced_tile(kind, m_rows, n, k, num_sms)
    if sliced is not None:
        bm, bn, ks = sliced
        mc, serial, sk = 0, False, False
        est = _estimate(kind, m_rows, n, k, num_groups, bm, bn, num_sms, mc, ks)
    fields: dict[str, int] = {}
    with _override_lock:
        fields.update(_overrides.get((kind, n, k), {}))
    if "block_m" in fields or "block_n" in fields:
        bm, bn = fields.get("block_m", bm), fields.get("block_n", bn)
        mc = fields.get("multicast", 0)
        serial = fields.get("serial_m", False)
        ks = fields.get("k_slices", 1)
        sk = fields.get("stream_k", False)
        est = _estimate(kind, m_rows, n, k, num_groups, bm, bn, num_sms, mc, ks, sk)
    serial = fields.get("serial_m", serial)
    mc = fields.get("multicast", mc)
    if fields.get("split_k") or fields.get("double_acc") or fields.get("k_slices", 1) > 1:
        sk = fields.get("stream_k", False)  # forced splits replace the model's tail (they exclude each other)
    if fields.get("k_slices", ks) != ks or fields.get("stream_k", sk) != sk:  # the model's tile, re-estimated
        ks, sk = fields.get("k_slices", ks), fields.get("stream_k", sk)
        est = _estimate(kind, m_rows, n, k, num_groups, bm, bn, num_sms, mc, ks, sk)
    if mc not in multicast_options(kind, m_rows, n, bm, bn):
        raise ValueError(f"multicast={mc} is not legal for {KIND_NAMES[kind]} M={m_rows} N={n} with block "
                         f"{bm}x{bn} (legal: {multicast_options(kind, m_rows, n, bm, bn)})")
    # Masked groups' sizes are only known on the device, and a stream-K tail spreads over all SMs: keep every SM.
    # Otherwise no more CTAs than tiles.
    grid = num_sms if kind == KIND_MASKED or sk else min(num_sms, est.tiles)
    if mc:  # whole clusters of two
        grid = max(2, min(grid + grid % 2, num_sms - num_sms % 2))
    if kind == KIND_NORMAL and not sk:
        grid = fewest_ctas_for_rounds(est.tiles, grid, 2 if mc else 1)
    cfg = make_config(kind, n, k, bm, bn, num_sms=max(grid, 1), smem_limit=smem_limit,
                      wgmma_n=fields.get("wgmma_n"), num_stages=fields.get("num_stages"),
                      raster_n=fields.get("raster_n"), double_acc=fields.get("double_acc"), multicast=mc,
                      split_k=fields.get("split_k", not sk and not fields.get("double_acc")
                                         and fields.get("wgmma_n", bn) == bn
                                         and split_k_pays(bm, bn, slice_k(k, ks), est.waves)),
                      serial_m=serial, k_slices=ks, stream_k=sk, tile_rounds=est.waves)
    if "num_sms" in fields:
        cfg = dataclasses.replace(cfg, num_sms=fields["num_sms"] - (fields["num_sms"] % 2 if mc else 0))
    if env.print_configs():
        with _print_lock:
            rows = (f"M={m_rows}" if kind == KIND_MASKED
                    else f"M={m_rows - M_CLASS_ROWS + 1}..{m_rows}")  # the memo class this choice serves
            print(f"[cupygemm] {rows} G={num_groups} -> {cfg.describe()} "
                  f"(est {est.seconds * 1e6:.1f} us, {est.waves} waves, last wave {est.last_wave_util:.0%})",
                  file=sys.stderr)
    return cfg


B_EVICT_FIRST_ENV = env.B_EVICT_FIRST


def b_evict_first(num_groups: int, n: int, k: int, l2_bytes: int) -> bool:
    """Whether the kernel may load B tiles that one CTA (or multicast pair) reads alone (M fits one row block) as
    first to evict from L2.

    Streamed with the normal priority, such tiles push out other data, dirty lines too, whose write-backs then compete
    with the GEMM's loads (benchmarks/NOTES.md section 21); as first to evict they mostly replace each other, which
    also means they are gone by the next call. ``CUPYGEMM_B_EVICT_FIRST``: ``auto`` (default) allows it when B (all
    groups) is larger than L2 and so cannot stay cached between calls anyway; ``1`` always (B read once per step,
    as weights in inference); ``0`` never.
    """
    mode = env.b_evict_first_mode()
    if mode == "auto":
        return num_groups * n * k > l2_bytes
    return mode == "1"


def make_config(kind: int, n: int, k: int, block_m: int, block_n: int, num_sms: int,
                smem_limit: int = SM90_MAX_SMEM_PER_BLOCK, wgmma_n: int | None = None,
                num_stages: int | None = None, raster_n: int | None = None, double_acc: bool | None = None,
                multicast: int = 0, split_k: bool | None = None, serial_m: bool = False,
                k_slices: int = 1, stream_k: bool = False, tile_rounds: int = 1) -> GemmConfig:
    """Build (and check) a config for explicit block sizes. ``tile_rounds``: the tiles each CTA runs (the model's
    waves), which caps the default stage count (see _stages_for). ``raster_n``: scheduling units per raster stripe
    (default: :func:`default_raster_n`)."""
    kind = kind_id(kind)
    if block_m not in (64, 128, 192, 256):
        raise ValueError(f"block_m: expected 64, 128, 192 or 256, got {block_m}")
    if block_m == THREE_WG_BLOCK_M and (kind != KIND_NORMAL or k_slices > 1 or stream_k or split_k or double_acc
                                       or multicast == 2):
        raise ValueError("block_m 192 (three math warpgroups) needs a normal GEMM without k_slices, stream_k, "
                         "split_k, double_acc or B multicast")
    if kind == KIND_CONTIGUOUS and block_m not in (64, M_ALIGNMENT, 2 * M_ALIGNMENT):
        raise ValueError(f"block_m: contiguous layout needs 64, 128 or 256, got {block_m}")
    if block_n % 8 or not 8 <= block_n <= 256:
        raise ValueError(f"block_n: expected a multiple of 8 in [8, 256], got {block_n}")
    if serial_m and (not serial_m_possible(block_m) or split_k):
        raise ValueError(f"serial_m needs block_m == 256 and no split_k, got block_m={block_m}")
    wn = wgmma_n if wgmma_n is not None else wgmma_n_for(block_m, block_n, serial_m, bool(double_acc))
    if wn is None or block_n % wn or wn % 8:
        raise ValueError(f"block {block_m}x{block_n}: accumulators do not fit in registers (wgmma_n={wn})")
    num_k_blocks = ceil_div(k, BLOCK_K)
    if not isinstance(k_slices, int) or not 1 <= k_slices <= num_k_blocks:
        raise ValueError(f"k_slices: expected an int in [1, {num_k_blocks}] (K blocks of 128), got {k_slices!r}")
    split = bool(split_k)
    if split and (not split_k_fits(block_m, block_n) or double_acc or wn != block_n):
        raise ValueError(f"split_k needs block_m == 64, block_n <= {_SPLIT_K_MAX_BLOCK_N}, one accumulator set and "
                         f"an unsplit wgmma; got block {block_m}x{block_n}, wgmma_n={wn}, double_acc={bool(double_acc)}")
    stages = (num_stages if num_stages is not None else
              _stages_for(block_m, block_n, ceil_div(num_k_blocks, k_slices), smem_limit, split, tile_rounds))
    if split and stages % 2:
        # The warpgroups take alternate K blocks, so with an odd count each stage alternates between them, and a
        # warpgroup's parity wait two phases on passed while the other's phase in between was still loading: the
        # kernel read a stage being written and crashed (masked 8x16x4096x7168 on 64x128 tiles with 7 stages,
        # benchmarks/NOTES.md section 23e). With an even count every stage belongs to one warpgroup.
        raise ValueError(f"split_k needs an even num_stages, got {stages}")
    if stages < 1 or smem_bytes(block_m, block_n, stages, split) + _STATIC_SMEM > smem_limit:
        raise ValueError(f"block {block_m}x{block_n} with {stages} stages does not fit in {smem_limit} B of shared memory")
    if multicast not in (0, 1, 2):
        raise ValueError(f"multicast: expected 0 (off), 1 (share A) or 2 (share B), got {multicast}")
    if raster_n is None:
        raster_n = default_raster_n(multicast)
    if isinstance(raster_n, bool) or not isinstance(raster_n, int) or raster_n < 1:
        raise ValueError(f"raster_n: expected a positive int (scheduling units per raster stripe), got {raster_n!r}")
    if multicast == 1 and ceil_div(n, block_n) % 2:
        raise ValueError(f"multicast=1 pairs n blocks: N={n} with block_n={block_n} gives an odd count")
    if multicast == 2 and (kind != KIND_NORMAL or block_n % 16):
        raise ValueError("multicast=2 (share B) needs a normal GEMM and block_n % 16 == 0")
    if multicast and num_sms % 2:
        raise ValueError(f"multicast needs an even grid, got {num_sms}")
    if k_slices > 1 and kind != KIND_NORMAL:
        raise ValueError(f"k_slices > 1 (split-K across CTAs) needs a normal GEMM, got {KIND_NAMES[kind]}")
    if stream_k and (kind not in STREAM_K_KINDS or k_slices > 1 or split or double_acc):
        raise ValueError("stream_k needs a normal or masked GEMM without k_slices, split_k or double_acc")
    if double_acc and not double_acc_fits(block_m, block_n, wn, serial_m):
        raise ValueError(f"block {block_m}x{block_n} (wgmma_n={wn}): two accumulator sets do not fit in registers")
    return GemmConfig(
        kind=kind, shape_n=n, shape_k=k, block_m=block_m, block_n=block_n, wgmma_n=wn, num_stages=stages,
        num_math_wg=math_warpgroups(block_m, split), swizzle_d=output_swizzle(block_n), raster_n=raster_n,
        num_sms=num_sms, smem_bytes=smem_bytes(block_m, block_n, stages, split),
        double_acc=bool(double_acc), multicast=multicast, split_k=split, serial_m=bool(serial_m), k_slices=k_slices,
        stream_k=bool(stream_k),
    )
