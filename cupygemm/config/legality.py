"""Which configs the kernel can run: :class:`GemmConfig`, :func:`make_config` (builds and checks one), and the fit
rules (registers, shared memory, interleaved K, multicast pairs) that the chooser's candidates and the overrides pass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import contract
from ..util import ceil_div
from .constants import (BLOCK_K, DEEP_INTERLEAVE_K_MAX_K_BLOCKS, INTERLEAVE_K_MAX_BLOCK_N, KIND_CONTIGUOUS, KIND_NAMES,
                        KIND_NORMAL, M_ALIGNMENT, MATH_REGS_ONE_WG, MATH_REGS_THREE_WG, MATH_REGS_TWO_WG, MAX_STAGES,
                        MAX_STAGES_INTERLEAVE_K, MIN_STAGES_MULTI_TILE, OTHER_REGS, OTHER_REGS_LEAN,
                        OTHER_REGS_THREE_WG, RASTER_N_BLOCKS, SM90_MAX_SMEM_PER_BLOCK, STATIC_SMEM, STREAM_K_KINDS,
                        THREE_WG_BLOCK_M, kind_id)


@dataclass(frozen=True)
class GemmConfig:
    """Everything that specializes one compiled kernel, plus its launch grid (:mod:`cupygemm.contract` turns it into
    the kernel's constants and launch values)."""

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
    multicast: int = 0  # 0 none; 1: 2-CTA clusters share A (pairs along N); 2: share B (pairs along M)
    interleave_k: bool = False  # block_m 64: two math warpgroups take alternate K blocks of the same rows
    serial_m: bool = False  # a warpgroup's m64 sub-tiles run one after the other through one temporary accumulator
    split_k: int = 1  # normal GEMMs: each tile's K blocks split over this many CTAs (FP32 partials, last one reduces)
    stream_k: bool = False  # the last round's tiles split along K over the idle CTAs (normal, masked)
    sides: bool = False  # L2-side-aware: B packed (cupygemm.packing), each half of N on the SMs of its L2 side
    split_cluster: bool = False  # split-K: a tile's splits run as one cluster and meet in shared memory
    two_acc_sets: bool = False  # two wgmma accumulator sets: a K block's wgmmas overlap the last one's promotion

    @property
    def threads(self) -> int:
        return contract.threads(self.num_math_wg)

    @property
    def math_regs(self) -> int:
        return contract.math_regs(self.num_math_wg)

    @property
    def producer_regs(self) -> int:
        return contract.producer_regs(self.num_math_wg)

    @property
    def a_box_rows(self) -> int:
        return contract.a_box_rows(self.kind, self.block_m, self.multicast)

    def describe(self) -> str:
        return (f"{KIND_NAMES[self.kind]} N={self.shape_n} K={self.shape_k}: block {self.block_m}x{self.block_n} "
                f"(wgmma n{self.wgmma_n}), {self.num_stages} stages, {self.num_math_wg} math WG, "
                f"swizzle_d {self.swizzle_d}, "
                f"{['', 'multicast A x2, ', 'multicast B x2, '][self.multicast]}"
                f"{'K interleaved over 2 WG, ' if self.interleave_k else ''}"
                f"{'serial m64 sub-tiles, ' if self.serial_m else ''}"
                f"{f'split-K over {self.split_k} CTAs, ' if self.split_k > 1 else ''}"
                f"{'one cluster per tile, ' if self.split_cluster else ''}"
                f"{'two accumulator sets, ' if self.two_acc_sets else ''}"
                f"{'stream-K tail, ' if self.stream_k else ''}"
                f"{'L2-side-aware B, ' if self.sides else ''}"
                f"grid {self.num_sms}, "
                f"smem {self.smem_bytes} B")


def split_k_extent(k: int, split_k: int) -> int:
    """The K one split-K unit sums (its largest split of the 128-wide K blocks)."""
    return ceil_div(ceil_div(k, BLOCK_K), split_k) * BLOCK_K


def output_swizzle(block_n: int) -> int:
    """Widest TMA swizzle whose span divides the output tile's row (128/64/32 bytes, else none)."""
    for sw in (128, 64, 32):
        if (block_n * 2) % sw == 0:
            return sw
    return 0


def straddles(block_n: int) -> bool:
    """Whether tiles of this width can cross 128-column B-scale blocks."""
    return not (BLOCK_K % block_n == 0 or block_n % BLOCK_K == 0)


def selects_scales_at_run_time(block_n: int) -> bool:
    """Whether tiles of this width straddle 128-column scale blocks at more than 8 offsets, so the kernel picks each
    column's B scale at run time instead of compiling its K loop per offset (cuda_src/fp8_gemm.cu)."""
    return straddles(block_n) and BLOCK_K // math.gcd(block_n, BLOCK_K) > 8


def _math_reg_budget(block_m: int, block_n: int) -> int:
    """Registers per math thread left for accumulators (the rest hold addresses, scales and loop state).

    Two math warpgroups get 232 from setmaxnreg and need 40 besides accumulators, 64 when tiles straddle
    128-column scale blocks (masked 128x184, 256x120-serial and 256x88 spill with less). One warpgroup runs
    at 255 without setmaxnreg and needs 64 (64x208 spills). Three (192-row tiles) get 160 and need 32."""
    if block_m == THREE_WG_BLOCK_M:
        return MATH_REGS_THREE_WG - OTHER_REGS_THREE_WG
    if block_m == 64:
        return MATH_REGS_ONE_WG - OTHER_REGS
    return MATH_REGS_TWO_WG - (OTHER_REGS if straddles(block_n) else OTHER_REGS_LEAN)


def _acc_regs(block_m: int, block_n: int, wgmma_n: int, serial_m: bool = False) -> int:
    """Accumulator registers per math thread: the temporary wgmma accumulators plus the promoted FP32 sums."""
    m_sub = block_m // (64 * contract.math_warpgroups(block_m))
    return (1 if serial_m else m_sub) * (wgmma_n // 2) + m_sub * (block_n // 2)


def wgmma_n_for(block_m: int, block_n: int, serial_m: bool = False) -> int | None:
    """The wgmma N used for a tile: the whole block_n when the accumulators fit, else an even split."""
    for parts in (1, 2, 3, 4):
        if block_n % parts or (block_n // parts) % 8:
            continue
        wn = block_n // parts
        if _acc_regs(block_m, block_n, wn, serial_m) <= _math_reg_budget(block_m, block_n):
            return wn
    return None


def serial_m_possible(block_m: int) -> bool:
    """Serial m64 sub-tiles need a warpgroup owning more than one sub-tile (256-row tiles)."""
    return block_m == 256


def interleave_k_fits(block_m: int, block_n: int) -> bool:
    """Whether a tile can interleave its K blocks over two warpgroups: 64 rows, at most INTERLEAVE_K_MAX_BLOCK_N
    columns (the caller also needs an unsplit wgmma)."""
    return block_m == 64 and block_n <= INTERLEAVE_K_MAX_BLOCK_N


def multicast_options(kind: int, m_rows: int, n: int, block_m: int, block_n: int) -> list[int]:
    """Legal multicast modes: pairs along N need an even number of n blocks; pairs along M (normal GEMMs
    only) an even number of m blocks and B halves of whole 8-row swizzle atoms."""
    opts = [0]
    if ceil_div(n, block_n) % 2 == 0:
        opts.append(1)
    if kind == KIND_NORMAL and block_n % 16 == 0 and ceil_div(m_rows, block_m) % 2 == 0:
        opts.append(2)
    return opts


def default_raster_n(multicast: int) -> int:
    """Scheduling units per raster stripe (n blocks, or n-block pairs with A multicast)."""
    return RASTER_N_BLOCKS // 2 if multicast == 1 else RASTER_N_BLOCKS


def stages_for(block_m: int, block_n: int, num_k_blocks: int, smem_limit: int, interleave_k: bool = False,
               tile_rounds: int = 1, split_cluster: bool = False) -> int:
    """The most pipeline stages that fit in shared memory, within the caps of :mod:`.constants`; ``num_k_blocks``: the
    K blocks one tile (or split-K unit) sums, ``tile_rounds``: the tiles each CTA runs."""
    budget = smem_limit - STATIC_SMEM
    deep = interleave_k and num_k_blocks <= DEEP_INTERLEAVE_K_MAX_K_BLOCKS
    cap = MAX_STAGES_INTERLEAVE_K if deep else MAX_STAGES
    if tile_rounds > 1:
        cap = min(cap, max(num_k_blocks, MIN_STAGES_MULTI_TILE))
    step = 2 if interleave_k else 1  # an even count: see make_config
    for s in range(cap - cap % step, 0, -step):
        if contract.smem_bytes(block_m, block_n, s, interleave_k, split_cluster) <= budget:
            return s
    return 0


#: Widest tile whose K loop runs on two accumulator sets: a second set fits the registers up to 96 columns with two
#: math warpgroups (232 registers each) and up to 128 with one (255; KernelTraits::kTwoAccSets).
TWO_ACC_SETS_MAX_N = {1: 128, 2: 96}


def _two_acc_sets_fit(block_m: int, block_n: int, wgmma_n: int, interleave_k: bool, serial_m: bool,
                      stream_k: bool) -> bool:
    """Whether the K loop on two accumulator sets compiles for these fields: one unsplit wgmma per K block, whole
    tiles only, and at most TWO_ACC_SETS_MAX_N columns."""
    wgs = contract.math_warpgroups(block_m, interleave_k)
    return (wgmma_n == block_n <= TWO_ACC_SETS_MAX_N.get(wgs, 0)) and not (interleave_k or serial_m or stream_k)


def two_acc_sets_fit(cfg: GemmConfig) -> bool:
    """Whether ``cfg`` could run its K loop on two accumulator sets (``two_acc_sets``)."""
    return _two_acc_sets_fit(cfg.block_m, cfg.block_n, cfg.wgmma_n, cfg.interleave_k, cfg.serial_m, cfg.stream_k)


def make_config(kind: int | str, n: int, k: int, block_m: int, block_n: int, num_sms: int,
                smem_limit: int = SM90_MAX_SMEM_PER_BLOCK, wgmma_n: int | None = None,
                num_stages: int | None = None, raster_n: int | None = None, multicast: int = 0,
                interleave_k: bool = False, serial_m: bool = False, split_k: int = 1, stream_k: bool = False,
                tile_rounds: int = 1, sides: bool = False, split_cluster: bool = False,
                two_acc_sets: bool = False) -> GemmConfig:
    """Build (and check) a config for explicit block sizes; ValueError names the rule a combination breaks.

    ``tile_rounds``: the tiles each CTA runs (the model's waves), which caps the default stage count (see
    :func:`stages_for`). ``raster_n``: scheduling units per raster stripe (default: :func:`default_raster_n`)."""
    kind = kind_id(kind)
    if block_m not in (64, 128, 192, 256):
        raise ValueError(f"block_m: expected 64, 128, 192 or 256, got {block_m}")
    if block_m == THREE_WG_BLOCK_M and (kind != KIND_NORMAL or split_k > 1 or stream_k or interleave_k
                                       or multicast == 2):
        raise ValueError("block_m 192 (three math warpgroups) needs a normal GEMM without split_k, stream_k, "
                         "interleave_k or B multicast")
    if kind == KIND_CONTIGUOUS and block_m not in (64, M_ALIGNMENT, 2 * M_ALIGNMENT):
        raise ValueError(f"block_m: contiguous layout needs 64, 128 or 256, got {block_m}")
    if block_n % 8 or not 8 <= block_n <= 256:
        raise ValueError(f"block_n: expected a multiple of 8 in [8, 256], got {block_n}")
    if serial_m and (not serial_m_possible(block_m) or interleave_k):
        raise ValueError(f"serial_m needs block_m == 256 and no interleave_k, got block_m={block_m}")
    wn = wgmma_n if wgmma_n is not None else wgmma_n_for(block_m, block_n, serial_m)
    if wn is None or block_n % wn or wn % 8:
        raise ValueError(f"block {block_m}x{block_n}: accumulators do not fit in registers (wgmma_n={wn})")
    num_k_blocks = ceil_div(k, BLOCK_K)
    if isinstance(split_k, bool) or not isinstance(split_k, int) or not 1 <= split_k <= num_k_blocks:
        raise ValueError(f"split_k: expected an int in [1, {num_k_blocks}] (K blocks of 128), got {split_k!r}")
    interleave = bool(interleave_k)
    if interleave and (not interleave_k_fits(block_m, block_n) or wn != block_n):
        raise ValueError(f"interleave_k needs block_m == 64, block_n <= {INTERLEAVE_K_MAX_BLOCK_N} and an unsplit "
                         f"wgmma; got block {block_m}x{block_n}, wgmma_n={wn}")
    if sides and stream_k:
        raise ValueError("sides (L2-side-aware B) has no stream-K tail: pass stream_k=False")
    # Side-aware kernels keep their side ticket and page bits after the stages, split-K clusters a partial tile.
    split_cluster = bool(split_cluster)
    if split_cluster and not (split_k == 2 and kind == KIND_NORMAL and not multicast and not stream_k):
        raise ValueError(f"split_cluster needs a normal GEMM with split_k=2, no multicast and no stream_k; got "
                         f"split_k={split_k}, multicast={multicast}, stream_k={stream_k}")
    two_acc_sets = bool(two_acc_sets)
    if two_acc_sets and not _two_acc_sets_fit(block_m, block_n, wn, interleave, bool(serial_m), bool(stream_k)):
        raise ValueError(f"two_acc_sets needs one unsplit wgmma (wgmma_n == block_n) of at most 128 columns with one "
                         f"math warpgroup or 96 with two, and no interleave_k, serial_m or stream_k; got block "
                         f"{block_m}x{block_n}, wgmma_n={wn}, interleave_k={interleave}, serial_m={serial_m}, "
                         f"stream_k={stream_k}")
    if split_cluster and num_sms % split_k:
        raise ValueError(f"split_cluster launches whole clusters of split_k={split_k} CTAs: the grid ({num_sms}) must "
                         f"be a multiple of it")
    ticket = contract.SIDE_SMEM_BYTES if sides else 0
    stages = (num_stages if num_stages is not None else
              stages_for(block_m, block_n, ceil_div(num_k_blocks, split_k), smem_limit - ticket, interleave,
                         tile_rounds, split_cluster))
    if interleave and stages % 2:
        # The warpgroups take alternate K blocks, so with an odd count each stage alternates between them, and a
        # warpgroup's parity wait two phases on passes while the other's phase in between is still loading: the
        # kernel reads a stage being written and crashes (masked 8x16x4096x7168 on 64x128 tiles with 7 stages,
        # benchmarks/NOTES.md, "Interleaved K"). With an even count every stage belongs to one warpgroup.
        raise ValueError(f"interleave_k needs an even num_stages, got {stages}")
    smem = contract.smem_bytes(block_m, block_n, stages, interleave, split_cluster) + ticket
    if stages < 1 or smem + STATIC_SMEM > smem_limit:
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
    if split_k > 1 and kind != KIND_NORMAL:
        raise ValueError(f"split_k > 1 (split-K across CTAs) needs a normal GEMM, got {KIND_NAMES[kind]}")
    if stream_k and (kind not in STREAM_K_KINDS or split_k > 1 or interleave):
        raise ValueError("stream_k needs a normal or masked GEMM without split_k or interleave_k")
    return GemmConfig(
        kind=kind, shape_n=n, shape_k=k, block_m=block_m, block_n=block_n, wgmma_n=wn, num_stages=stages,
        num_math_wg=contract.math_warpgroups(block_m, interleave), swizzle_d=output_swizzle(block_n),
        raster_n=raster_n, num_sms=num_sms, smem_bytes=smem, multicast=multicast, interleave_k=interleave,
        serial_m=bool(serial_m), split_k=split_k, stream_k=bool(stream_k), sides=bool(sides),
        split_cluster=split_cluster, two_acc_sets=two_acc_sets,
    )


def side_aware_config(cfg: GemmConfig, num_sms: int, smem_limit: int = SM90_MAX_SMEM_PER_BLOCK) -> GemmConfig:
    """``cfg`` for packed, L2-side-aware B (:mod:`cupygemm.packing`): the same tile, multicast and K split, on every
    SM (each cluster takes a ticket for its SMs' side, so all of them must be launched), without a stream-K tail;
    the same stages unless the side ticket and page bits (1 KiB) no longer fit beside them."""
    kw = dict(wgmma_n=cfg.wgmma_n, raster_n=cfg.raster_n, multicast=cfg.multicast, interleave_k=cfg.interleave_k,
              serial_m=cfg.serial_m, split_k=cfg.split_k, sides=True, split_cluster=cfg.split_cluster,
              two_acc_sets=cfg.two_acc_sets)
    num_sms -= num_sms % contract.cluster_size(cfg)  # whole clusters
    try:
        return make_config(cfg.kind, cfg.shape_n, cfg.shape_k, cfg.block_m, cfg.block_n, num_sms, smem_limit,
                           num_stages=cfg.num_stages, **kw)
    except ValueError:
        return make_config(cfg.kind, cfg.shape_n, cfg.shape_k, cfg.block_m, cfg.block_n, num_sms, smem_limit, **kw)
