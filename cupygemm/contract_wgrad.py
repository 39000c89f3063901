"""The wgrad kernels' host contract: everything the host must agree on with ``cuda_src/fp8_wgrad.cu`` and
``cuda_src/k_grouped_prep.cu``, in one place (as :mod:`cupygemm.contract` is for the forward GEMM kernel).

The two training GEMM kinds ("1D1D": both operands scaled per 1x128 along K, FP32 D accumulated in place)::

    wgrad            D[M, N]    += A[M, K] . B[N, K]^T                      (N, K compile-time; M at run time)
    k_grouped_wgrad  D[g][M, N] += A_g[M, k_g] . B_g[N, k_g]^T, g < G      (M, N compile-time; k_g on the device)
    k_grouped_wgrad_columns: the same kernel, A_g and B_g the g-th column ranges of one [M, K] and one [N, K] matrix

with ``sum_k A[m, k] B[n, k] sfa[k // 128][m] sfb[k // 128][n]`` per element (FP32 promotion every 128 of K). For a
:class:`WgradConfig` this module states

* the template constants: :func:`defines`, the ``CUPYGEMM_*`` macros that instantiate the GEMM kernel;
* the GEMM's entry point and runtime parameters: :data:`WGRAD_ENTRY`, :data:`WGRAD_PARAM_NAMES`, :data:`WGRAD_PARAMS`;
* the CTA shape and resources: :func:`threads`, :func:`math_regs`, :func:`producer_regs`, :func:`smem_bytes`;
* the TMA maps over A, B, SFA, SFB and D (:func:`tma_specs`) and the grid (:func:`grid`);
* the k-grouped kind's prep kernel (:data:`PREP_ENTRY`, :data:`PREP_PARAMS`, :func:`prep_grid`) and the workspace it
  writes for the GEMM (:func:`workspace_bytes`, :func:`workspace_layout`);
* a first config heuristic, :func:`choose_wgrad_config`.

Layouts the kernels read (elements; strides outermost first):

* dense: A uint8 (e4m3 bits) [M][lda >= K], B [N][ldb >= K] (K-major, row strides multiples of 16 bytes); SFA
  float32 [ceil(K/128)][sfa_ld >= M], SFB [ceil(K/128)][sfb_ld >= N] (M-/N-major, ``sfa_ld`` a multiple of 4:
  16-byte rows for TMA); D float32 [M][ld_d >= N], ``ld_d`` a multiple of 4.
* k-grouped: A one flat uint8 buffer, group g's [M][k_g] matrix at byte ``M * (k_0 + ... + k_{g-1})``; B likewise with
  N; SFA float32 [sum_g ceil(k_g/128)][sfa_ld] (group g's K blocks from row ``sum_{h<g} ceil(k_h/128)``), SFB likewise;
  D float32 [G][M][ld_d] with any group stride (a multiple of 4); ``batch_sizes`` int32 [G] on the device (each k_g a
  multiple of 16, 0 allowed).
* k-grouped, columns layout: A uint8 [M][lda >= K] and B [N][ldb >= K] as dense; group g is columns
  ``[k_0 + ... + k_{g-1}, ... + k_g)``, which must start on a multiple of 128; SFA and SFB are the dense layout's
  (the whole matrix's K blocks, so group g's first scale row is its first column / 128). The prep kernel takes the
  row strides (``a_row_stride``/``b_row_stride``, bytes; 0 for the flat layout).

Nothing here needs a GPU or device pointers.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import tma
from .contract import TmaSpec
from .launch import DESC, PTR, U32
from .util import ceil_div, round_up

#: One K block: the scaling granularity along K and the pipeline stage's K extent.
BLOCK_K = 128
#: Hopper's shared memory per block, and what the kernel's __align__(1024) extern declaration reserves besides.
SMEM_LIMIT = 232448
STATIC_SMEM = 1024
#: A 64-bit unsigned parameter (the launchers' struct format for PTR, which is 8 bytes too).
U64 = PTR

KIND_WGRAD, KIND_K_GROUPED = "wgrad", "k_grouped_wgrad"
KIND_IDS = {KIND_WGRAD: 0, KIND_K_GROUPED: 1}

# --- the GEMM kernel's entry point ---------------------------------------------------------------------------------
WGRAD_FILE, WGRAD_ENTRY = "fp8_wgrad.cu", "cupygemm_fp8_wgrad"
#: cupygemm_fp8_wgrad's parameters in order, and their kinds. Dense: ``workspace`` is 0 and ``num_groups`` 1.
#: K-grouped: ``tmap_a``/``tmap_b`` are the prep kernel's templates (the GEMM does not read them; it reads the
#: per-group maps in ``workspace``) and ``shape_m`` equals the config's shape_m.
WGRAD_PARAM_NAMES = ("tmap_a", "tmap_b", "tmap_sfa", "tmap_sfb", "tmap_d", "workspace", "shape_m", "num_groups")
WGRAD_PARAMS = (DESC,) * 5 + (PTR, U32, U32)

# --- the k-grouped prep kernel -------------------------------------------------------------------------------------
PREP_FILE, PREP_ENTRY = "k_grouped_prep.cu", "cupygemm_k_grouped_prep"
PREP_PARAM_NAMES = ("tmap_a", "tmap_b", "batch_sizes", "a", "b", "workspace", "num_groups", "shape_m", "shape_n",
                    "k_capacity", "scale_rows", "a_row_stride", "b_row_stride")
PREP_PARAMS = (DESC, DESC, PTR, PTR, PTR, PTR, U32, U32, U32, U32, U32, U32, U32)
#: Threads per prep CTA, and groups per CTA (one warp each).
PREP_THREADS = 256
PREP_GROUPS_PER_CTA = PREP_THREADS // 32

# --- the workspace (cuda_src/k_grouped_workspace.cuh) --------------------------------------------------------------
WORKSPACE_ALIGN = 128
_HEADER_BYTES, _MAP_BYTES, _INFO_BYTES = 128, 128, 16

#: Threads of one warpgroup; the CTA is the math warpgroups plus one producer warpgroup.
WARPGROUP_THREADS = 128
_STAGE_BARRIER_BYTES = 16
#: setmaxnreg split with two math warpgroups (128 x 40 + 256 x 232 = 64 K registers); one runs at 255 without it.
PRODUCER_REGS_TWO_WG, MATH_REGS_TWO_WG, MATH_REGS_ONE_WG = 40, 232, 255
#: (producer, math) registers of dense whole-B multicast builds (128x152): 128 x 24 + 256 x 240 <= 64 K. At
#: 40/232 NVRTC 13.0 keeps one loop register of the math warpgroups in local memory (a load and a store per four K
#: blocks) and whole-B ran 0-3 % slower than no multicast; at 24/240 nothing spills and it ran 0.7-2.3 % faster on
#: 2048x7168, 1536x24576x8192 and 7168x4096x8192 (0.8 % slower on 16384x7168x4096). The split alone, without
#: multicast, moved nothing beyond 1 % and k-grouped whole-B builds (no spill) 0.4-1 % slower with it
#: (benchmarks/NOTES.md, "Weight-gradient kernel").
REGS_WHOLE_B_DENSE = (24, 240)
#: The widest tiles whose K loop compiles without spills (NVRTC 12.9 and 13.5, tests/test_wgrad_compile.py): per
#: thread BLOCK_N / 2 sums, BLOCK_N / 2 wgmma accumulators and BLOCK_N / 2 products of the two scales, which ptxas
#: computes while the wgmmas run (so the promotion after the wait is one FFMA per sum). Two math warpgroups (232
#: registers): 152 (with A multicast NVRTC 13.0 keeps one register in local memory, a load and a store per four K
#: blocks; 160 does not fit four stages beside its staging); one (255): 160 (176 spills in the dense loop, 192 in
#: both). A second accumulator set: 96 and 128. Widths are multiples of 8 (16 with B multicast in halves, which must
#: be whole 8-row swizzle atoms; any with ``b_whole``).
MAX_BLOCK_N = {(2, False): 152, (2, True): 96, (1, False): 160, (1, True): 128}
#: The chooser's widths: steps of 16, and 152 (two math warpgroups, its FP32 staging one unswizzled slab), costed at
#: 0.98 of a tile's cycles: without multicast it ran 0-4 % faster per column and round than 128 or 144 with B
#: multicast on six DeepGEMM wgrad shapes on an H100, and on the k-grouped kernel's stage-aligned K loop 2-5 % faster
#: than its 128 and 144 picks with multicast on four DeepGEMM k-grouped shapes. 152-wide tiles share B over pairs of
#: m blocks, the pair's first CTA loading the whole tile (its halves are not whole swizzle atoms): k-grouped always
#: (0.6-3 % faster on the six DeepGEMM k-grouped shapes), dense where the cost model prefers it to none (with
#: REGS_WHOLE_B_DENSE: 0.7-2.3 % faster on four of five shapes) (benchmarks/NOTES.md, "Weight-gradient kernel").
_WIDE_BLOCK_N, _WIDE_TILE_COST = 152, 0.98
#: Dense kernels of at most D_PREFETCH_MAX_KB K blocks prefetch their tile's D into L2 D_PREFETCH_BLOCKS K blocks
#: before the tile's K loop ends, so that the epilogue's reduce-adds find it there. Alternated with no prefetch on
#: DeepGEMM's 18 shapes (H100, bitwise equal): the six dense 4096-token shapes 0.2-4.6 % faster (2048x7168 143.4 ->
#: 137.2 us, 7168x2112 142.8 -> 136.3); the 8192-token ones from 0.9 % faster to 1.5 % slower, k-grouped from 1 %
#: faster to 0.3 % slower; 3, 4 and 6 blocks ahead gained less, 64 (a whole 4096-token tile) lost 2-8 %
#: (benchmarks/NOTES.md, "Weight-gradient kernel").
D_PREFETCH_BLOCKS, D_PREFETCH_MAX_KB = 2, 32


def workspace_bytes(num_groups: int) -> int:
    """Bytes of the k-grouped workspace for ``num_groups`` groups (its base 128-byte aligned)."""
    return round_up(_HEADER_BYTES + num_groups * (2 * _MAP_BYTES + _INFO_BYTES + 4), WORKSPACE_ALIGN)


def workspace_layout(num_groups: int) -> dict[str, tuple[int, int]]:
    """(offset, bytes) of the workspace's parts: ``header`` (uint32 active groups, uint32 groups skipped as invalid),
    ``maps`` (per group its A map then its B map, 128 bytes each), ``info`` (per group uint32 K blocks, first scale
    row, K, K prefix), ``active`` (uint32 indices of the groups with work, in order)."""
    g = num_groups
    maps = (_HEADER_BYTES, 2 * _MAP_BYTES * g)
    info = (maps[0] + maps[1], _INFO_BYTES * g)
    active = (info[0] + info[1], 4 * g)
    return {"header": (0, _HEADER_BYTES), "maps": maps, "info": info, "active": active}


def prep_grid(num_groups: int) -> int:
    """CTAs of the prep kernel: one warp per group (every CTA scans all sizes)."""
    return max(1, ceil_div(num_groups, PREP_GROUPS_PER_CTA))


# --- configs -------------------------------------------------------------------------------------------------------

def math_warpgroups(block_m: int) -> int:
    """Math warpgroups of a tile: one per 64 rows."""
    return block_m // 64


def threads(num_math_wg: int) -> int:
    return WARPGROUP_THREADS * (num_math_wg + 1)


def math_regs(num_math_wg: int, spare_producer: bool = False) -> int:
    if num_math_wg == 1:
        return MATH_REGS_ONE_WG
    return REGS_WHOLE_B_DENSE[1] if spare_producer else MATH_REGS_TWO_WG


def producer_regs(num_math_wg: int, spare_producer: bool = False) -> int:
    return REGS_WHOLE_B_DENSE[0] if spare_producer and num_math_wg > 1 else PRODUCER_REGS_TWO_WG


def smem_per_stage(block_m: int, block_n: int) -> int:
    """One pipeline stage: the A and B tiles, A's and B's scales for one K block (each 128-byte aligned), and the
    stage's full and empty barriers."""
    return (block_m * BLOCK_K + block_n * BLOCK_K + round_up(block_m * 4, 128) + round_up(block_n * 4, 128)
            + _STAGE_BARRIER_BYTES)


def slab_cols(block_n: int, swizzle: int) -> int:
    """Floats per row of a D staging slab: the swizzle span's, or the tile's width when unswizzled (0)."""
    return swizzle // 4 if swizzle else block_n


def staging_bytes(block_m: int, block_n: int, swizzle: int, staged_slabs: int) -> int:
    """The FP32 output staging: per math warpgroup ``staged_slabs`` slabs of 64 rows x :func:`slab_cols` floats."""
    return round_up(math_warpgroups(block_m) * staged_slabs * 64 * 4 * slab_cols(block_n, swizzle), 1024)


def staging_swizzle(block_n: int) -> int:
    """The D staging a width takes: the widest swizzle span dividing its row (128, 64 bytes), else unswizzled (0):
    widths of 8 mod 16 store conflict-free unswizzled and go out in one TMA box (cuda_src/wgrad_traits.cuh)."""
    return 128 if block_n % 32 == 0 else 64 if block_n % 16 == 0 else 0


def smem_bytes(block_m: int, block_n: int, stages: int, swizzle: int, staged_slabs: int) -> int:
    """Dynamic shared memory per CTA (WgradSmem: staging, stages, barriers). The kernel's static 1024 bytes come on
    top (:data:`STATIC_SMEM`)."""
    return staging_bytes(block_m, block_n, swizzle, staged_slabs) + stages * smem_per_stage(block_m, block_n)


def _pairs_even(multicast: int, m: int, n: int, block_m: int, block_n: int) -> bool:
    """Whether a multicast pair's partner dimension (n blocks for A multicast, m blocks for B) has an even count."""
    return (ceil_div(n, block_n) if multicast == 1 else ceil_div(m, block_m)) % 2 == 0


def max_stages(block_m: int, block_n: int, swizzle: int, staged_slabs: int, smem_limit: int = SMEM_LIMIT) -> int:
    budget = smem_limit - STATIC_SMEM - staging_bytes(block_m, block_n, swizzle, staged_slabs)
    return max(0, budget // smem_per_stage(block_m, block_n))


@dataclass(frozen=True)
class WgradConfig:
    """One wgrad kernel: its kind, compile-time shape, tile, pipeline and schedule. See the module docstring.

    ``shape_m``: k-grouped only (0 for dense); ``shape_k``: dense only (0 for k-grouped). ``multicast``: 0, 1 (2-CTA
    clusters on neighbouring n blocks share A), 2 (on neighbouring m blocks, share B); k-grouped: only where those
    blocks are an even count. ``swizzle``: bytes per row of a D staging slab (128: 32 floats, 64: 16, 32: 8; it must
    divide BLOCK_N's bytes), or 0: one unswizzled slab of BLOCK_N floats (conflict-free for widths of 8 mod 16).
    ``staged_slabs``: slabs staged at once per math warpgroup (0: the whole tile). ``raster``: n units per raster
    stripe. ``two_acc_sets``: the K loop keeps one K block's wgmmas in flight while promoting the previous one.
    ``b_whole`` (with multicast 2): the pair's first CTA loads the whole B tile into both (widths of 8 mod 16).
    ``d_prefetch``: K blocks before each tile's K loop ends, the producer prefetches the tile's D into L2 for the
    reduce-adds (0: off; not with ``store``).
    ``store`` (dense only): D = A B^T, the epilogue stores its tiles instead of adding them into D. ``num_sms``: the
    persistent grid's CTAs at most (the chooser's dense configs: the fewest that keep their rounds)."""

    kind: str
    shape_m: int
    shape_n: int
    shape_k: int
    block_m: int
    block_n: int
    num_stages: int
    multicast: int = 0
    swizzle: int = 128
    staged_slabs: int = 0
    raster: int = 16
    two_acc_sets: bool = False
    num_sms: int = 132
    pingpong: bool = False
    store: bool = False
    b_whole: bool = False
    d_prefetch: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KIND_IDS:
            raise ValueError(f"kind: expected one of {list(KIND_IDS)}, got {self.kind!r}")
        if self.kind == KIND_WGRAD:
            if self.shape_m != 0 or self.shape_k <= 0 or self.shape_k % 16:
                raise ValueError(f"wgrad: shape_k must be a positive multiple of 16 and shape_m 0 (M is a launch "
                                 f"argument), got shape_m={self.shape_m}, shape_k={self.shape_k}")
        else:
            if self.shape_m <= 0 or self.shape_k != 0:
                raise ValueError(f"k_grouped_wgrad: shape_m must be positive and shape_k 0 (K is per group, on the "
                                 f"device), got shape_m={self.shape_m}, shape_k={self.shape_k}")
            if self.store:
                raise ValueError("k_grouped_wgrad: no store (empty groups must keep D)")
            if self.multicast and not _pairs_even(self.multicast, self.shape_m, self.shape_n, self.block_m,
                                                  self.block_n):
                raise ValueError(f"k_grouped_wgrad: multicast {self.multicast} pairs neighbouring "
                                 f"{'n' if self.multicast == 1 else 'm'} blocks, so their count must be even "
                                 f"(a group's tiles whole pairs), got M={self.shape_m} N={self.shape_n} with "
                                 f"{self.block_m}x{self.block_n} tiles")
        if self.shape_n <= 0:
            raise ValueError(f"shape_n must be positive, got {self.shape_n}")
        if self.block_m not in (64, 128):
            raise ValueError(f"block_m: 64 (one math warpgroup) or 128 (two), got {self.block_m}")
        wg = math_warpgroups(self.block_m)
        limit = MAX_BLOCK_N[(wg, self.two_acc_sets)]
        halves = self.multicast == 2 and not self.b_whole
        if self.block_n % 8 or not 16 <= self.block_n <= limit or (halves and self.block_n % 16):
            raise ValueError(f"block_n: a multiple of 8 (16 with B multicast in halves) up to {limit} for "
                             f"block_m={self.block_m}"
                             f"{' with two accumulator sets' if self.two_acc_sets else ''} (registers), "
                             f"got {self.block_n}")
        if self.multicast not in (0, 1, 2):
            raise ValueError(f"multicast: 0, 1 (share A) or 2 (share B), got {self.multicast}")
        if self.b_whole and self.multicast != 2:
            raise ValueError(f"b_whole: the pair's first CTA loading the whole B tile needs multicast 2, got "
                             f"{self.multicast}")
        if self.d_prefetch < 0 or (self.d_prefetch and self.store):
            raise ValueError(f"d_prefetch: K blocks ahead (0: off), and only where the epilogue adds into D (not "
                             f"with store), got d_prefetch={self.d_prefetch}, store={self.store}")
        if self.swizzle not in (0, 32, 64, 128) or (self.swizzle and (self.block_n * 4) % self.swizzle):
            raise ValueError(f"swizzle: 32, 64 or 128 bytes dividing block_n * 4 = {self.block_n * 4}, or 0 "
                             f"(unswizzled), got {self.swizzle}")
        if not 0 <= self.staged_slabs <= self.num_slabs:
            raise ValueError(f"staged_slabs: 0 (all) to {self.num_slabs}, got {self.staged_slabs}")
        if self.pingpong and (math_warpgroups(self.block_m) != 2 or self.two_acc_sets):
            raise ValueError("pingpong: two math warpgroups (block_m 128) with one accumulator set each")
        if self.two_acc_sets and self.num_stages < 2:
            raise ValueError("two accumulator sets need at least two stages")
        if self.raster < 1:
            raise ValueError(f"raster must be positive, got {self.raster}")
        if self.num_sms < self.cluster_size or self.num_sms % self.cluster_size:
            raise ValueError(f"num_sms={self.num_sms} must be a positive multiple of the cluster size "
                             f"{self.cluster_size}")
        if self.num_stages < 1 or self.smem_bytes + STATIC_SMEM > SMEM_LIMIT:
            raise ValueError(f"{self.block_m}x{self.block_n} with {self.num_stages} stages and {self.staged}-slab "
                             f"staging needs {self.smem_bytes + STATIC_SMEM} B of shared memory, more than "
                             f"{SMEM_LIMIT}")

    @property
    def num_math_wg(self) -> int:
        return math_warpgroups(self.block_m)

    @property
    def slab_cols(self) -> int:
        return slab_cols(self.block_n, self.swizzle)

    @property
    def num_slabs(self) -> int:
        return self.block_n // self.slab_cols

    @property
    def staged(self) -> int:
        """Slabs staged at once (the whole tile when ``staged_slabs`` is 0)."""
        return self.staged_slabs or self.num_slabs

    @property
    def cluster_size(self) -> int:
        return 2 if self.multicast else 1

    @property
    def smem_bytes(self) -> int:
        return smem_bytes(self.block_m, self.block_n, self.num_stages, self.swizzle, self.staged)

    @property
    def threads(self) -> int:
        return threads(self.num_math_wg)

    @property
    def math_regs(self) -> int:
        return math_regs(self.num_math_wg, self._spare_producer_regs)

    @property
    def producer_regs(self) -> int:
        return producer_regs(self.num_math_wg, self._spare_producer_regs)

    @property
    def _spare_producer_regs(self) -> bool:
        """Dense whole-B builds give the math warpgroups 8 more registers (REGS_WHOLE_B_DENSE)."""
        return self.kind == KIND_WGRAD and self.b_whole

    def describe(self) -> str:
        shape = (f"N={self.shape_n} K={self.shape_k}" if self.kind == KIND_WGRAD
                 else f"M={self.shape_m} N={self.shape_n}")
        return (f"{self.kind} {shape}: {self.block_m}x{self.block_n} {self.num_stages} stages, "
                f"{self.staged}/{self.num_slabs} slabs of {self.slab_cols} floats, multicast {self.multicast}, "
                f"raster {self.raster}{', two acc sets' if self.two_acc_sets else ''}"
                f"{', ping-pong' if self.pingpong else ''}{', whole B' if self.b_whole else ''}"
                f"{f', D prefetch {self.d_prefetch}' if self.d_prefetch else ''}"
                f"{', store' if self.store else ''}, {self.num_sms} SMs")


def defines(cfg: WgradConfig) -> dict[str, object]:
    """The CUPYGEMM_* constants that instantiate cuda_src/fp8_wgrad.cu (the grid size is not one of them)."""
    return {
        "CUPYGEMM_WGRAD_KIND": KIND_IDS[cfg.kind],
        "CUPYGEMM_SHAPE_M": cfg.shape_m,
        "CUPYGEMM_SHAPE_N": cfg.shape_n,
        "CUPYGEMM_SHAPE_K": cfg.shape_k,
        "CUPYGEMM_BLOCK_M": cfg.block_m,
        "CUPYGEMM_BLOCK_N": cfg.block_n,
        "CUPYGEMM_NUM_STAGES": cfg.num_stages,
        "CUPYGEMM_NUM_MATH_WG": cfg.num_math_wg,
        "CUPYGEMM_MATH_REGS": cfg.math_regs,
        "CUPYGEMM_PRODUCER_REGS": cfg.producer_regs,
        "CUPYGEMM_SWIZZLE_D": cfg.swizzle,
        "CUPYGEMM_STAGED_SLABS": cfg.staged,
        "CUPYGEMM_RASTER_N": cfg.raster,
        "CUPYGEMM_MULTICAST": cfg.multicast,
        "CUPYGEMM_TWO_ACC_SETS": int(cfg.two_acc_sets),
        "CUPYGEMM_CLUSTER_ATTR": f"__cluster_dims__({cfg.cluster_size}, 1, 1)" if cfg.cluster_size > 1 else "",
    } | ({"CUPYGEMM_PINGPONG": 1} if cfg.pingpong else {}) | ({"CUPYGEMM_WGRAD_STORE": 1} if cfg.store else {}) \
      | ({"CUPYGEMM_B_WHOLE": 1} if cfg.b_whole else {}) \
      | ({"CUPYGEMM_WGRAD_D_PREFETCH": cfg.d_prefetch} if cfg.d_prefetch else {})


# --- per-problem launch values -------------------------------------------------------------------------------------

def sf_ld(rows: int) -> int:
    """The default row stride (floats) of the M- or N-major scales: the rows rounded up to 16 bytes."""
    return round_up(rows, 4)


def tma_specs(cfg: WgradConfig, m: int, *, lda: int = 0, ldb: int = 0, sfa_ld: int = 0, sfb_ld: int = 0,
              ld_d: int = 0, d_group_stride: int = 0, num_groups: int = 1, sfa_rows: int = 0, sfb_rows: int = 0
              ) -> tuple[TmaSpec, TmaSpec, TmaSpec, TmaSpec, TmaSpec]:
    """The maps over A, B, SFA, SFB and D, all 3-D tile maps (innermost first; strides in bytes, outer dimensions).

    Dense (``m`` rows): A [M][lda] and B [N][ldb] e4m3 (lda/ldb in bytes, default K) in boxes of one K block and the
    CTA's rows (half the tile of the operand a multicast pair shares), 128-byte swizzle; SFA [ceil(K/128)][sfa_ld] and
    SFB [ceil(K/128)][sfb_ld] float32 (defaults: rows rounded up to 4) in boxes of the tile's rows of one K block; D
    [M][ld_d] float32 (default N) in slabs of ``cfg.slab_cols`` x 64 rows with the staging's swizzle.

    K-grouped (``m`` = cfg.shape_m): A and B are the templates the prep kernel edits per group (a K extent of one
    block with a 128-byte row stride here; its base address is the flat operand's); SFA/SFB have ``sfa_rows`` /
    ``sfb_rows`` rows (the stacked scales' row count); D [G][M][ld_d] with ``d_group_stride`` floats between groups
    (default M * ld_d).
    """
    n = cfg.shape_n
    dense = cfg.kind == KIND_WGRAD
    a_box = cfg.block_m // 2 if cfg.multicast == 1 else cfg.block_m
    b_box = cfg.block_n // 2 if cfg.multicast == 2 and not cfg.b_whole else cfg.block_n
    if dense:
        k = cfg.shape_k
        kb = ceil_div(k, BLOCK_K)
        lda, ldb = lda or k, ldb or k
        a = TmaSpec(tma.UINT8, (k, m, 1), (lda, lda * m), (BLOCK_K, a_box, 1), 128)
        b = TmaSpec(tma.UINT8, (k, n, 1), (ldb, ldb * n), (BLOCK_K, b_box, 1), 128)
        sfa_rows, sfb_rows, g = kb, kb, 1
    else:
        a = TmaSpec(tma.UINT8, (BLOCK_K, m, 1), (BLOCK_K, BLOCK_K * m), (BLOCK_K, a_box, 1), 128)
        b = TmaSpec(tma.UINT8, (BLOCK_K, n, 1), (BLOCK_K, BLOCK_K * n), (BLOCK_K, b_box, 1), 128)
        g = num_groups
        if sfa_rows <= 0 or sfb_rows <= 0:
            raise ValueError("k_grouped_wgrad: sfa_rows and sfb_rows (the stacked scales' rows) are required")
    sfa_ld, sfb_ld, ld_d = sfa_ld or sf_ld(m), sfb_ld or sf_ld(n), ld_d or n
    d_group_stride = d_group_stride or ld_d * m
    sfa = TmaSpec(tma.FLOAT32, (m, sfa_rows, 1), (4 * sfa_ld, 4 * sfa_ld * sfa_rows), (cfg.block_m, 1, 1), 0)
    sfb = TmaSpec(tma.FLOAT32, (n, sfb_rows, 1), (4 * sfb_ld, 4 * sfb_ld * sfb_rows), (cfg.block_n, 1, 1), 0)
    d = TmaSpec(tma.FLOAT32, (n, m, g), (4 * ld_d, 4 * d_group_stride), (cfg.slab_cols, 64, 1), cfg.swizzle)
    return a, b, sfa, sfb, d


def grid(cfg: WgradConfig, max_clusters: int = 0) -> int:
    """CTAs to launch: the config's persistent grid, with clusters at most those that fit at once."""
    if cfg.cluster_size == 1:
        return cfg.num_sms
    fit = cfg.cluster_size * max_clusters if max_clusters else cfg.num_sms
    return min(cfg.num_sms, fit)


# --- a first config heuristic --------------------------------------------------------------------------------------

# Rough per-SM rates of an H100 SXM: FP8 wgmma multiply-adds per clock, and L2 -> shared memory bytes per clock.
_MAC_PER_CLK = 4096
_L2_BYTES_PER_CLK = 64
# Cycles of a tile's epilogue (staging and reductions) not hidden behind the next tile, a K block's fixed cost
# (barrier waits, wgmma issue and the promotion's tail, partly exposed), and a one-warpgroup tile's efficiency (its
# promotion overlaps only its own second accumulator set).
_EPILOGUE_CLK = 1500
_BLOCK_OVERHEAD_CLK = 64
_ONE_WG_EFFICIENCY = 0.8


def _tile_cycles(block_m: int, block_n: int, multicast: int, num_kb: float) -> float:
    mma = block_m * block_n * BLOCK_K / _MAC_PER_CLK
    a = block_m * (0.5 if multicast == 1 else 1.0)
    b = block_n * (0.5 if multicast == 2 else 1.0)
    load = (a + b) * BLOCK_K / _L2_BYTES_PER_CLK
    per_block = (max(mma, load) + _BLOCK_OVERHEAD_CLK) / (1.0 if block_m == 128 else _ONE_WG_EFFICIENCY)
    return num_kb * per_block + _EPILOGUE_CLK


def _staging_and_stages(block_m: int, block_n: int, swizzle: int, num_kb: int, smem_limit: int,
                        max_stages_cap: int = 8) -> tuple[int, int]:
    """(staged slabs, stages): the whole tile staged when that leaves 4 stages or more, else fewer slabs."""
    num_slabs = block_n // slab_cols(block_n, swizzle)
    want = max(2, min(max_stages_cap, num_kb))
    best = (num_slabs, min(max_stages(block_m, block_n, swizzle, num_slabs, smem_limit), max_stages_cap))
    for slabs in range(num_slabs, 0, -1):
        stages = min(max_stages(block_m, block_n, swizzle, slabs, smem_limit), max_stages_cap)
        if stages >= min(4, want):
            return slabs, stages
        if stages > best[1]:
            best = (slabs, stages)
    return best


def _fewest_ctas(tiles: int, ctas: int, cluster: int) -> int:
    """The fewest CTAs (whole clusters) that run ``tiles`` in as many rounds as ``ctas`` do. Idle SMs leave the
    others more of the power budget: dense wgrad ran 0.6-1.7 % faster on 126-131 CTAs than on 132 in as many rounds
    (H100), k-grouped no faster (benchmarks/NOTES.md, "Weight-gradient kernel")."""
    units, slots = ceil_div(tiles, cluster), ctas // cluster
    rounds = ceil_div(units, slots)
    return ceil_div(units, rounds) * cluster


def choose_wgrad_config(kind: str, m: int, n: int, k_or_expected: int, num_groups: int = 1, num_sms: int = 132,
                        smem_limit: int = SMEM_LIMIT, store: bool = False) -> WgradConfig:
    """A config for one problem: dense ``m x n x k``, or k-grouped ``num_groups`` groups of ``m x n`` with about
    ``k_or_expected`` tokens each (only the choice depends on it).

    A first heuristic, to be replaced by a measured cost model: tile candidates 128 x {64 ... 144} and 128 x 152
    at 0.98 of its modelled cost (two math warpgroups; B shared whole over pairs of m blocks where their count is
    even: k-grouped always, dense against no multicast), and 64 x {64 ... 160} (one, with two
    accumulator sets up to 128 wide), multicast of the operand whose partner dimension has an even number of blocks;
    each candidate's time is the rounds of tiles over the SMs times a tile's cycles (max of the wgmma and L2-load rates
    per K block plus a fixed cost, and an epilogue); the fastest wins (ties: fewer, larger tiles). Stages: as many as
    fit, up to 8, with the whole tile staged when 4 or more stages remain. Dense grids: the fewest CTAs that keep the
    rounds (:func:`_fewest_ctas`). Dense kernels of at most ``D_PREFETCH_MAX_KB`` K blocks prefetch D
    (``D_PREFETCH_BLOCKS``). ``store``: the dense kernel that stores D (the tile choice is the same).
    """
    if kind not in KIND_IDS:
        raise ValueError(f"kind: expected one of {list(KIND_IDS)}, got {kind!r}")
    if min(m, n, k_or_expected, num_groups, num_sms) <= 0:
        raise ValueError(f"m, n, k, num_groups and num_sms must be positive, got "
                         f"{(m, n, k_or_expected, num_groups, num_sms)}")
    num_kb = ceil_div(k_or_expected, BLOCK_K)
    groups = num_groups if kind == KIND_K_GROUPED else 1
    best = None
    for block_m in (128, 64):
        wg = math_warpgroups(block_m)
        # Widths in steps of 16, and 152 (_WIDE_BLOCK_N); the kernel takes any multiple of 8 for tuning
        # (benchmarks/NOTES.md, "Weight-gradient kernel").
        wide_ok = wg == 2
        widths = list(range(64, MAX_BLOCK_N[(wg, False)] + 1, 16)) + ([_WIDE_BLOCK_N] if wide_ok else [])
        for block_n in widths:
            wide = block_n == _WIDE_BLOCK_N and wide_ok
            two = wg == 1 and block_n <= MAX_BLOCK_N[(1, True)]
            m_blocks, n_blocks = ceil_div(m, block_m), ceil_div(n, block_n)
            options = [0]
            # Pairs over an even block count only: the dense kernel runs a pair's second tile past the last block
            # correctly (loads from the last block, no writes), but that is work for nothing; the k-grouped kernel
            # takes whole pairs only.
            pairs_m = num_sms >= 2 and m_blocks >= 2 and _pairs_even(2, m, n, block_m, block_n)
            if num_sms >= 2 and not wide:
                if n_blocks >= 2 and _pairs_even(1, m, n, block_m, block_n):
                    options.append(1)
                if pairs_m and block_n % 16 == 0:
                    options.append(2)
            elif wide and pairs_m:
                # whole-B multicast (_WIDE_BLOCK_N): k-grouped always, dense where the cost model says
                options = [2] if kind == KIND_K_GROUPED else [0, 2]
            for mc in options:
                sms = num_sms - num_sms % 2 if mc else num_sms
                tiles = m_blocks * n_blocks * groups
                rounds = ceil_div(tiles, sms)
                cycles = rounds * _tile_cycles(block_m, block_n, mc, num_kb) * (_WIDE_TILE_COST if wide else 1.0)
                key = (round(cycles, 3), tiles, -mc)
                if best is None or key < best[0]:
                    best = (key, block_m, block_n, mc, two, sms)
    _, block_m, block_n, mc, two, sms = best
    if kind == KIND_WGRAD:
        sms = _fewest_ctas(ceil_div(m, block_m) * ceil_div(n, block_n), sms, 2 if mc else 1)
    swizzle = staging_swizzle(block_n)
    slabs, stages = _staging_and_stages(block_m, block_n, swizzle, num_kb, smem_limit)
    num_slabs = block_n // slab_cols(block_n, swizzle)
    n_units = ceil_div(ceil_div(n, block_n), 2) if mc == 1 else ceil_div(n, block_n)
    raster = max(1, min(16 // (2 if mc == 1 else 1), n_units))
    return WgradConfig(kind, m if kind == KIND_K_GROUPED else 0, n, k_or_expected if kind == KIND_WGRAD else 0,
                       block_m, block_n, stages, mc, swizzle, 0 if slabs == num_slabs else slabs, raster, two, sms,
                       store=store, b_whole=mc == 2 and block_n % 16 != 0,
                       d_prefetch=D_PREFETCH_BLOCKS if kind == KIND_WGRAD and not store and num_kb <= D_PREFETCH_MAX_KB
                       else 0)
