"""The GEMM kernel's host contract: everything the host must agree on with ``cuda_src/fp8_gemm.cu``.

For a :class:`~cupygemm.config.GemmConfig` (the tile, pipeline and schedule the chooser picked) and a problem, this
module states

* the template constants: :func:`defines`, the ``CUPYGEMM_*`` macros that instantiate the kernel;
* the entry point and its runtime parameters: :data:`GEMM_ENTRY`, :data:`GEMM_PARAM_NAMES`, :data:`GEMM_PARAMS`;
* the CTA shape and resources: :func:`math_warpgroups`, :func:`threads`, the setmaxnreg split (:func:`math_regs`,
  :func:`producer_regs`) and the dynamic shared memory (:func:`smem_bytes`, the kernel's smem layout);
* the TMA maps laid over A (two: whole boxes and A's last box), B, SFA and D (:func:`tma_specs`), the scalar
  arguments and the grid;
* the scratch split-K and the stream-K tail need (:func:`scratch_sizes`).

:func:`launch_contract` gathers the per-problem part in one :class:`LaunchContract`; :mod:`cupygemm.plan` adds the
loaded kernel and caches the result. Nothing here depends on device pointers or on a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import tma
from .config.constants import (BLOCK_K, KIND_MASKED, MATH_REGS_ONE_WG, MATH_REGS_THREE_WG, MATH_REGS_TWO_WG,
                               PRODUCER_REGS_THREE_WG, PRODUCER_REGS_TWO_WG, THREE_WG_BLOCK_M)
from .launch import DESC, PTR, SIDE_MAP, U32
from .packing import CHUNK_ROWS, MAX_PAGE_WORDS, PARAM_PAGE_WORDS, PackedLayout
from .util import ceil_div, round_up

if TYPE_CHECKING:
    from .config import GemmConfig

GEMM_FILE, GEMM_ENTRY = "fp8_gemm.cu", "cupygemm_fp8_gemm"
#: cupygemm_fp8_gemm's parameters in order, and their kinds (by-value TMA map, device pointer, 32-bit unsigned).
GEMM_PARAM_NAMES = ("tmap_a", "tmap_a_tail", "tmap_b", "tmap_sfa", "tmap_d", "sfb", "grouped_layout", "d",
                    "partials", "tile_counters", "shape_m", "num_groups", "ld_d", "b_evict_first")
GEMM_PARAMS = (DESC,) * 5 + (PTR,) * 5 + (U32,) * 4
#: Side-aware kernels (``GemmConfig.sides``) take eleven more: the SM side map (by value), B packed (tmap_b maps the
#: same buffer), the side ticket counters, the clusters that work on half 0 of N, the packed weights' base_low and
#: hash bits (cuda_src/l2_sides.cuh, PageSides), the first four words of their page bits (ParamPageSides: read
#: by normal GEMMs whose B spans at most 128 pages; the others copy the bits from the buffer), and whether a PDL
#: kernel may draw its ticket before its grid dependency wait: 1 where the tickets are one of a stream's two sets
#: that its launches take in turn (:func:`cupygemm.workspace.side_tickets`), 0 where they are the last
#: :data:`SIDE_TICKET_COUNTERS` of the launch's scratch counters.
SIDE_PARAM_NAMES = ("sm_sides", "packed_b", "side_tickets", "side_clusters0", "side_base_low", "side_hash",
                    "side_page_w0", "side_page_w1", "side_page_w2", "side_page_w3", "side_tickets_before_wait")
GEMM_PARAMS_SIDES = GEMM_PARAMS + (SIDE_MAP, PTR, PTR, U32, U32, U32) + (U32,) * PARAM_PAGE_WORDS + (U32,)
#: Shared memory of a side-aware kernel after the stages: the ticket and the page bits' barrier (16 bytes), then the
#: page bits (KernelTraits::SMEM_SIDES); and its uint32 counters in the scratch.
SIDE_SMEM_BYTES = 16 + MAX_PAGE_WORDS * 4
SIDE_TICKET_COUNTERS = 4

#: Threads of one warpgroup; the CTA is one producer warpgroup plus the math warpgroups.
WARPGROUP_THREADS = 128
#: Bytes of the barriers of one pipeline stage (full and empty, 8 bytes each).
_STAGE_BARRIER_BYTES = 16


# --- CTA shape and resources --------------------------------------------------------------------------------------

def math_warpgroups(block_m: int, interleave_k: bool = False) -> int:
    """Math warpgroups of a tile: one per 64 rows up to three (192), two for 256 rows (two m64 sub-tiles each), two
    for a 64-row tile whose K blocks alternate between warpgroups (``interleave_k``)."""
    if block_m == 64:
        return 2 if interleave_k else 1
    return 3 if block_m == THREE_WG_BLOCK_M else 2


def threads(num_math_wg: int) -> int:
    """Threads per CTA: the producer warpgroup and the math ones."""
    return WARPGROUP_THREADS * (num_math_wg + 1)


def math_regs(num_math_wg: int) -> int:
    """Registers per math thread after setmaxnreg (one math warpgroup runs without setmaxnreg at 255)."""
    if num_math_wg == 3:
        return MATH_REGS_THREE_WG
    return MATH_REGS_TWO_WG if num_math_wg > 1 else MATH_REGS_ONE_WG


def producer_regs(num_math_wg: int) -> int:
    """The producer warpgroup's registers after setmaxnreg (unused with one math warpgroup)."""
    return PRODUCER_REGS_THREE_WG if num_math_wg == 3 else PRODUCER_REGS_TWO_WG


def a_box_rows(kind: int, block_m: int, multicast: int) -> int:
    """Rows of A per TMA load. Masked tiles load 64-row boxes and skip those past the group's rows (they lie inside
    the tensor, so they would be read for nothing); otherwise the CTA's share of the tile in one box."""
    if kind == KIND_MASKED and block_m > 64:
        return 64
    return block_m // 2 if multicast == 1 else block_m


def smem_per_stage(block_m: int, block_n: int) -> int:
    """Shared memory of one pipeline stage: the A and B tiles and the A scales (128-byte aligned)."""
    return block_m * BLOCK_K + block_n * BLOCK_K + round_up(block_m * 4, 128)


def cluster_size(cfg: GemmConfig) -> int:
    """CTAs per cluster: a multicast pair, a tile's K splits (split_cluster), else 1 (no cluster)."""
    if cfg.multicast:
        return 2
    return cfg.split_k if cfg.split_cluster else 1


def cluster_split_bytes(block_m: int, block_n: int) -> int:
    """Shared memory of a split-K cluster's CTA besides the stages: two barriers per row group (32 bytes) and one
    partial tile of FP32 sums (KernelTraits::SMEM_CLUSTER_SPLIT)."""
    return 32 + block_m * block_n * 4


def smem_bytes(block_m: int, block_n: int, stages: int, interleave_k: bool = False,
               split_cluster: bool = False) -> int:
    """Dynamic shared memory per CTA: the BF16 output tile (1024-byte aligned for its swizzle), the stages, their
    barriers, with interleaved K the hand-off of one warpgroup's accumulators (one float per register), and in a
    split-K cluster its partial tile (:func:`cluster_split_bytes`). Side-aware kernels add SIDE_SMEM_BYTES."""
    d = round_up(block_m * block_n * 2, 1024)
    handoff = block_n * 256 if interleave_k else 0
    split = cluster_split_bytes(block_m, block_n) if split_cluster else 0
    return d + stages * smem_per_stage(block_m, block_n) + stages * _STAGE_BARRIER_BYTES + handoff + split


# --- template constants -------------------------------------------------------------------------------------------

def defines(cfg: GemmConfig, pdl: bool = False, b_prefetch: int = 0) -> dict[str, object]:
    """The CUPYGEMM_* constants that instantiate cuda_src/fp8_gemm.cu (the grid size is not one of them).

    ``pdl``: the kernel waits for the previous grid on its stream before touching memory and releases the next one
    after its last tile, for launches with programmatic dependent launch (:mod:`cupygemm.launch`). Left out when
    off (the kernel's default), so those kernels keep their sources, cache entries and code. ``b_prefetch``: with
    ``pdl``, bytes of B's first K blocks fetched into L2 before that wait (cuda_src/b_prefetch.cuh); only for
    weights the previous kernel cannot write."""
    pdl_define = {"CUPYGEMM_PDL": 1} if pdl else {}
    pdl_define |= {"CUPYGEMM_B_PREFETCH": b_prefetch} if pdl and b_prefetch else {}
    pdl_define |= {"CUPYGEMM_SIDES": 1, "CUPYGEMM_SIDE_BOX_ROWS": side_box_rows(cfg)} if cfg.sides else {}
    return pdl_define | {
        "CUPYGEMM_SHAPE_N": cfg.shape_n,
        "CUPYGEMM_SHAPE_K": cfg.shape_k,
        "CUPYGEMM_BLOCK_M": cfg.block_m,
        "CUPYGEMM_BLOCK_N": cfg.block_n,
        "CUPYGEMM_WGMMA_N": cfg.wgmma_n,
        "CUPYGEMM_NUM_STAGES": cfg.num_stages,
        "CUPYGEMM_NUM_MATH_WG": cfg.num_math_wg,
        "CUPYGEMM_MATH_REGS": math_regs(cfg.num_math_wg),
        "CUPYGEMM_PRODUCER_REGS": producer_regs(cfg.num_math_wg),
        "CUPYGEMM_SWIZZLE_D": cfg.swizzle_d,
        "CUPYGEMM_RASTER_N": cfg.raster_n,
        "CUPYGEMM_KIND": cfg.kind,
        "CUPYGEMM_MULTICAST": cfg.multicast,
        "CUPYGEMM_INTERLEAVE_K": int(cfg.interleave_k),
        "CUPYGEMM_SERIAL_M": int(cfg.serial_m),
        "CUPYGEMM_SPLIT_K": cfg.split_k,
        "CUPYGEMM_STREAM_K": int(cfg.stream_k),
        "CUPYGEMM_A_BOX_M": a_box_rows(cfg.kind, cfg.block_m, cfg.multicast),
        "CUPYGEMM_CLUSTER_ATTR": f"__cluster_dims__({cluster_size(cfg)}, 1, 1)" if cluster_size(cfg) > 1 else "",
    } | ({"CUPYGEMM_SPLIT_CLUSTER": 1} if cfg.split_cluster else {}) | (
        {"CUPYGEMM_TWO_ACC_SETS": 1} if cfg.two_acc_sets else {})


# --- per-problem launch values ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TmaSpec:
    """A TMA map's layout over one operand (innermost dimension first); the base address comes with each call."""

    dtype: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]  # bytes, outer dimensions
    box: tuple[int, ...]
    swizzle: int

    def encode(self, ptr: int) -> bytes:
        return tma.encode_tiled(self.dtype, ptr, self.dims, self.strides, self.box, self.swizzle)


@dataclass(frozen=True)
class LaunchContract:
    """The launch of one config on one problem, less the loaded kernel and the device pointers."""

    threads: int
    smem_bytes: int
    sfa_m_pad: int  # SFA is read M-major: [G][ceil(K/128)][sfa_m_pad] float32
    tmaps: tuple[TmaSpec, TmaSpec, TmaSpec, TmaSpec, TmaSpec]  # A, A's tail, B, SFA, D
    scalars: tuple[int, int, int, int]  # shape_m, num_groups, ld_d (elements), b_evict_first
    scratch_floats: int  # FP32 partial tiles (0: none)
    scratch_counters: int  # uint32 tile counters, zero at launch (0: none)


def tma_specs(cfg: GemmConfig, m: int, n: int, k: int, num_groups: int, a_strides: tuple[int, ...],
              b_strides: tuple[int, ...], d_strides: tuple[int, ...]
              ) -> tuple[TmaSpec, TmaSpec, TmaSpec, TmaSpec, TmaSpec]:
    """The maps over A [G][M][K] (G only when masked) twice, B [G][N][K], SFA (M-major, padded to 16 bytes) and D
    [G][M][N]; strides in bytes, outermost first. Boxes: a K block of the CTA's A rows and B columns (half the tile
    of the operand a multicast pair shares), one scale per row of the tile, and D in slabs of the swizzle's width
    over one math warpgroup's rows. The second A map's box has the M % box rows of A's last box (a whole box when
    none), so that no A box reaches past M: TMA's zero fill of rows past the tensor was slow (benchmarks/NOTES.md,
    "A tail box")."""
    g_a = num_groups if cfg.kind == KIND_MASKED else 1
    kb = ceil_div(k, BLOCK_K)
    lda, ldb, ldd = a_strides[-2], b_strides[-2], d_strides[-2]
    a_group = a_strides[0] if len(a_strides) == 3 else lda * m
    b_group = b_strides[0] if len(b_strides) == 3 else ldb * n
    d_group = d_strides[0] if len(d_strides) == 3 else ldd * m
    m_pad = sfa_m_pad(m)
    # Interleaved K: both warpgroups hold all rows of the tile; otherwise each stores its own rows.
    wg_m = cfg.block_m if cfg.interleave_k else cfg.block_m // cfg.num_math_wg
    slab = cfg.block_n if cfg.swizzle_d == 0 else cfg.swizzle_d // 2
    box_n = cfg.block_n // 2 if cfg.multicast == 2 else cfg.block_n
    b_spec = (packed_b_spec(cfg, num_groups, side_box_rows(cfg)) if cfg.sides
              else TmaSpec(tma.UINT8, (k, n, num_groups), (ldb, b_group), (BLOCK_K, box_n, 1), 128))
    a_box = a_box_rows(cfg.kind, cfg.block_m, cfg.multicast)
    return (
        TmaSpec(tma.UINT8, (k, m, g_a), (lda, a_group), (BLOCK_K, a_box, 1), 128),
        TmaSpec(tma.UINT8, (k, m, g_a), (lda, a_group), (BLOCK_K, m % a_box or a_box, 1), 128),
        b_spec,
        TmaSpec(tma.FLOAT32, (m, kb, g_a), (4 * m_pad, 4 * m_pad * kb), (cfg.block_m, 1, 1), 0),
        TmaSpec(tma.BFLOAT16, (n, m, g_a), (ldd, d_group), (slab, wg_m, 1), cfg.swizzle_d),
    )


def side_box_rows(cfg: GemmConfig) -> int:
    """Rows per TMA box of packed B (side-aware kernels): the largest of 32, 16, 8 that divides the rows each CTA
    loads, so boxes start on whole swizzle rows and never straddle a 32-row chunk (KernelTraits::kSideBoxRows)."""
    rows = cfg.block_n // 2 if cfg.multicast == 2 else cfg.block_n
    return next(b for b in (32, 16, 8) if rows % b == 0)


def packed_b_spec(cfg: GemmConfig, num_groups: int, box_rows: int) -> TmaSpec:
    """The map over packed B (cupygemm/packing.py): the whole buffer as rows of 128 bytes, stored pre-swizzled
    (so no swizzle here), boxes of ``box_rows`` rows."""
    rows = num_groups * PackedLayout(cfg.shape_n, cfg.shape_k).group_bytes // BLOCK_K
    if rows >= 1 << 31:  # the kernel's TMA row coordinate is an int
        raise ValueError(f"packed weights of {rows * BLOCK_K / 2**30:.0f} GiB: side-aware kernels address at most "
                         f"{(1 << 31) * BLOCK_K / 2**30:.0f} GiB of packed B")
    return TmaSpec(tma.UINT8, (BLOCK_K, rows, 1), (BLOCK_K, rows * BLOCK_K), (BLOCK_K, box_rows, 1), 0)


def sfa_m_pad(m: int) -> int:
    """The M stride (floats) of the A scales the kernel reads: M rounded up to 16 bytes."""
    return round_up(m, 4)


def grid(cfg: GemmConfig, max_clusters: int) -> int:
    """CTAs to launch: the config's persistent grid, with clusters at most those that fit at once (clusters sit
    within one GPC, so GPCs whose free SMs are not a multiple of the cluster size leave some idle)."""
    size = cluster_size(cfg)
    return cfg.num_sms if size == 1 else min(cfg.num_sms, size * max_clusters)


#: The kernel indexes the split-K scratch with 32-bit offsets: at most this many floats (4 GiB).
MAX_PARTIALS = 1 << 30


def scratch_sizes(cfg: GemmConfig, m: int) -> tuple[int, int]:
    """(FP32 partials, uint32 counters) a launch of ``cfg`` on M rows needs; (0, 0) without split-K, stream-K or
    L2 sides. Side-aware kernels' ticket counters are the last :data:`SIDE_TICKET_COUNTERS` counters.

    Stream-K: one partial tile per CTA (its piece of a tail unit) and a counter per tail tile and row group
    (cuda_src/scheduler.cuh). Split-K: a partial tile per split of every tile, and a counter per tile and math
    warpgroup."""
    tickets = SIDE_TICKET_COUNTERS if cfg.sides else 0
    if cfg.stream_k:
        return cfg.num_sms * cfg.block_m * cfg.block_n, cfg.num_sms * cfg.num_math_wg
    if cfg.split_k <= 1 or cfg.split_cluster:  # split-K clusters meet in shared memory
        return 0, tickets
    tiles = ceil_div(m, cfg.block_m) * ceil_div(cfg.shape_n, cfg.block_n)
    n_partials = tiles * cfg.split_k * cfg.block_m * cfg.block_n
    if n_partials > MAX_PARTIALS:
        raise ValueError(f"split_k={cfg.split_k} on M={m}, N={cfg.shape_n} with {cfg.block_m}x{cfg.block_n} tiles "
                         f"needs {n_partials * 4 / 2**30:.1f} GiB of split-K scratch (at most "
                         f"{MAX_PARTIALS * 4 / 2**30:.0f} GiB); use a smaller split_k or none for a problem this large")
    return n_partials, tiles * cfg.num_math_wg + tickets


def side_units(cfg: GemmConfig) -> tuple[int, int]:
    """The n units (n blocks, or pairs of them with A multicast) of half 0 and of half 1 of a side-aware launch:
    half 0 gets the units whose middle row lies in the packed layout's first half (``KernelTraits::kSideUnits0``)."""
    n_blocks = ceil_div(cfg.shape_n, cfg.block_n)
    units = n_blocks // 2 if cfg.multicast == 1 else n_blocks
    unit_rows = cfg.block_n * (2 if cfg.multicast == 1 else 1)
    rows0 = PackedLayout(cfg.shape_n, cfg.shape_k).pairs * CHUNK_ROWS
    units0 = min((rows0 + unit_rows // 2) // unit_rows, units)
    return units0, units - units0


def side_unit_tiles(cfg: GemmConfig, m: int, num_groups: int) -> int:
    """Tiles per n unit of a side-aware launch on ``m`` rows (masked: max_m per group, so an upper bound): its m
    units times the split-K factor, over every group of a masked GEMM."""
    m_units = ceil_div(m, cfg.block_m) // (2 if cfg.multicast == 2 else 1)
    splits = 1 if cfg.split_cluster else cfg.split_k  # a split-K cluster takes a tile's splits at once
    return max(1, m_units) * splits * (num_groups if cfg.kind == KIND_MASKED else 1)


def side_clusters0(cfg: GemmConfig, grid: int, sms_side0: int, num_sms: int, unit_tiles: int) -> int:
    """Clusters of a side-aware launch that work on half 0 of N (the device's SMs draw tickets for their side, see
    cuda_src/l2_sides.cuh). First the fewest rounds of tiles over both halves: a half given fewer clusters than its
    tiles runs twice as long (on an H100 with 70 + 62 SMs per side, 62 CTAs for a half of 64 tiles doubled the
    kernel's time, benchmarks/NOTES.md, "L2-side-aware weights"). Then as close to the launch's share of side-0 SMs as
    that allows, so that most clusters run on their own side. ``unit_tiles``: :func:`side_unit_tiles`."""
    clusters = grid // cluster_size(cfg)
    if clusters < 2:
        return 1
    tiles0, tiles1 = (u * unit_tiles for u in side_units(cfg))
    share = clusters * sms_side0 / num_sms

    def cost(c0: int) -> tuple[int, float]:
        return max(ceil_div(tiles0, c0), ceil_div(tiles1, clusters - c0)), abs(c0 - share)

    return min(range(1, clusters), key=cost)


def launch_contract(cfg: GemmConfig, m: int, n: int, k: int, num_groups: int, a_strides: tuple[int, ...],
                    b_strides: tuple[int, ...], d_strides: tuple[int, ...], b_evict_first: bool) -> LaunchContract:
    """Everything a launch of ``cfg`` on this problem passes besides pointers, the kernel and the grid."""
    floats, counters = scratch_sizes(cfg, m)
    return LaunchContract(
        threads=threads(cfg.num_math_wg), smem_bytes=cfg.smem_bytes, sfa_m_pad=sfa_m_pad(m),
        tmaps=tma_specs(cfg, m, n, k, num_groups, a_strides, b_strides, d_strides),
        scalars=(m, num_groups, d_strides[-2] // 2, int(b_evict_first)),
        scratch_floats=floats, scratch_counters=counters)
