// FP8 (e4m3) GEMM with fine-grained scaling on Hopper: D[m, n] = sum_k A[m, k] B[n, k], with A scaled per
// 1x128 (row, K block) and B per 128x128 block, FP32 promotion every 128 of K, BF16 output.
//
// One persistent, warp-specialized kernel serves the normal GEMM and both grouped layouts (the scheduler
// differs). Warpgroups 0..kNumMathWG-1 do the math, the last warpgroup is the TMA producer.
// The JIT (cupygemm/jit/source.py) prepends the CUPYGEMM_* constants that instantiate it.
#include "ptx_common.cuh"
#include "ptx_global.cuh"
#include "ptx_mbarrier.cuh"
#include "ptx_tma.cuh"
#include "ptx_wgmma.cuh"
#include "scheduler.cuh"

namespace cupygemm {

constexpr uint32_t kBlockK = 128;  // = the scaling granularity along K; one promotion per block

// Byte offset of element (row, col) of a BF16 output slab with `kSwizzleBytes`-wide swizzled rows
// (the layout TMA expects for CU_TENSOR_MAP_SWIZZLE_{32,64,128}B; 0 = plain row-major).
template <uint32_t kSwizzleBytes, uint32_t kRowBytes>
__device__ __forceinline__ uint32_t d_slab_offset(uint32_t row, uint32_t col) {
  const uint32_t offset = row * kRowBytes + col * 2;
  if (kSwizzleBytes == 0) return offset;
  return offset ^ (((offset >> 7) & (kSwizzleBytes / 16 - 1)) << 4);
}

template <uint32_t SHAPE_N, uint32_t SHAPE_K, uint32_t BLOCK_M, uint32_t BLOCK_N, uint32_t WGMMA_N,
          uint32_t kNumStages, uint32_t kNumMathWG, uint32_t kMathRegs, uint32_t kProducerRegs, uint32_t kSwizzleD,
          uint32_t kRasterN, int kKind, bool kDoubleAcc, int kMulticast, bool kSplitK, bool kSerialM,
          uint32_t kKSlices, bool kStreamK, uint32_t A_BOX_M>
__device__ __forceinline__ void fp8_gemm_impl(const TmaDescriptor& tmap_a, const TmaDescriptor& tmap_b,
                                              const TmaDescriptor& tmap_sfa, const TmaDescriptor& tmap_d,
                                              const float* __restrict__ sfb, const int* __restrict__ grouped_layout,
                                              uint16_t* __restrict__ d_ptr, float* __restrict__ partials,
                                              uint32_t* __restrict__ tile_counters, uint32_t shape_m,
                                              uint32_t num_groups, uint32_t ld_d, uint32_t b_evict_first) {
  constexpr uint32_t kNumMathThreads = kNumMathWG * 128;
  // setmaxnreg (cupygemm/config.py picks the split): the producer drops to kProducerRegs, the math warpgroups rise.
  static_assert(kNumMathWG == 1 || kProducerRegs * 128 + kMathRegs * kNumMathThreads <= 64 * 1024,
                "setmaxnreg budget exceeds the register file");
  // kSplitK: two math warpgroups share all BLOCK_M rows and take alternate K blocks (two MMA/promotion chains per
  // CTA for small tiles); warpgroup 1 hands its sums to warpgroup 0 through shared memory at the end of a tile.
  static_assert(!kSplitK || (kNumMathWG == 2 && BLOCK_M == 64 && !kDoubleAcc), "split-K: two warpgroups, 64 rows");
  // With an odd stage count a stage would alternate between the warpgroups, and a parity wait two phases on would
  // pass while the other warpgroup's phase in between is still loading.
  static_assert(!kSplitK || kNumStages % 2 == 0, "split-K: an even stage count, so each stage has one reader");
  constexpr uint32_t kRowGroups = kSplitK ? 1 : kNumMathWG;  // warpgroups that own different rows
  constexpr uint32_t kConsumersPerStage = kNumMathWG / (kSplitK ? 2 : 1);
  constexpr uint32_t WG_M = BLOCK_M / kRowGroups;  // rows owned by one math warpgroup
  constexpr uint32_t kNumMSub = WG_M / 64;          // m64 wgmmas per warpgroup
  constexpr uint32_t kNumNSub = BLOCK_N / WGMMA_N;  // N slices accumulated one after the other
  constexpr uint32_t kAccPerSub = WGMMA_N / 2;
  constexpr uint32_t kNumKBlocks = ceil_div(SHAPE_K, kBlockK);
  // kKSlices > 1: split-K across CTAs. Each CTA sums one slice of the K blocks of a tile into FP32 partial sums in
  // global memory (`partials`); the last of the tile's CTAs to arrive (`tile_counters`) adds them and stores the tile.
  static_assert(kKSlices >= 1 && kKSlices <= kNumKBlocks, "every K slice needs at least one K block");
  // kStreamK: the last round's units are split along K over all clusters (scheduler.cuh); their pieces meet in
  // `partials` the same way.
  static_assert(!kStreamK || (!kSplitK && !kDoubleAcc && kKSlices == 1), "stream-K tail: one accumulator set");
  constexpr uint32_t kNumSFBRows = ceil_div(SHAPE_N, kBlockK);
  // B scale blocks (128 columns) one tile touches: one when BLOCK_N divides 128; BLOCK_N / 128 when 128 divides
  // BLOCK_N (tiles start on block boundaries); otherwise a tile may straddle, touching ceil(BLOCK_N/128)+1.
  constexpr bool kAlignedN = BLOCK_N % kBlockK == 0;
  constexpr uint32_t kMaxSFB =
      (kBlockK % BLOCK_N == 0) ? 1 : kAlignedN ? BLOCK_N / kBlockK : ceil_div(BLOCK_N, kBlockK) + 1;
  // Straddling tiles start at n0 % 128 in steps of gcd(BLOCK_N, 128); with few such offsets the K loop is compiled
  // once per offset (code size grows by that factor).
  constexpr uint32_t kOffsetStep = cgcd(BLOCK_N, kBlockK);
  constexpr uint32_t kNumOffsets = kBlockK / kOffsetStep;
  constexpr bool kSpecializeBoundary = kMaxSFB > 1 && !kAlignedN && kNumOffsets <= 8;
  // kSerialM: a warpgroup owning several m64 slices runs them one after the other through one temporary
  // accumulator (MMA, wait, promote per slice), so 256-row tiles fit in registers; the other math warpgroup's
  // MMAs keep the tensor cores busy meanwhile.
  static_assert(!kSerialM || kNumMSub > 1, "serial m64 slices: several slices");
  constexpr uint32_t kAccSlices = kSerialM ? 1 : kNumMSub;  // m64 slices held in the temporary accumulator
  // Contiguous 256-row tiles whose block holds two groups run as two 128-row half tiles. Both warpgroups work on
  // a half, one m64 slice each (warpgroup w: the half's rows [64w, 64w + 64)); one warpgroup running both slices
  // while the other idled made a half cost about 0.6-0.7 of a tile (NOTES section 18a).
  constexpr bool kSplitHalves = kKind == kGroupedContiguous && BLOCK_M == 256 && !kDoubleAcc;
  static_assert(kKind != kGroupedContiguous || BLOCK_M != 256 || (kRowGroups == 2 && WG_M == 128),
                "contiguous 256-row tiles: one 128-row half per warpgroup");
  // Multicast: each CTA of a 2-CTA cluster loads half of the shared tile into both CTAs' shared memory.
  constexpr uint32_t kCluster = kMulticast ? 2 : 1;
  static_assert(kMulticast != 2 || (BLOCK_N % 16 == 0 && kKind == kNormal), "B multicast: halves of whole swizzle atoms");
  static_assert(BLOCK_M % (64 * kRowGroups) == 0, "each math warpgroup owns whole m64 slices");
  static_assert(BLOCK_N % WGMMA_N == 0 && WGMMA_N % 8 == 0 && WGMMA_N <= 256, "bad wgmma N");
  static_assert(BLOCK_N <= 256 && BLOCK_M <= 256, "TMA boxes are at most 256 rows");
  // A arrives in boxes of A_BOX_M rows (with A multicast, each CTA of the pair loads half of them into both). Boxes
  // wholly past the tile's valid rows are not loaded: masked tiles use 64-row boxes, since rows past masked_m lie
  // inside the tensor and would otherwise be read from memory for nothing.
  constexpr uint32_t kABoxes = BLOCK_M / A_BOX_M;
  constexpr uint32_t kABoxesPerCta = kMulticast == 1 ? kABoxes / 2 : kABoxes;
  // (Unloaded boxes leave stale rows in shared memory; they only feed output rows that are never stored.)
  static_assert(BLOCK_M % A_BOX_M == 0 && kABoxesPerCta >= 1, "A boxes tile BLOCK_M");
  static_assert(kMulticast != 1 || kABoxes % 2 == 0, "A multicast: each CTA of the pair loads half of the boxes");

  // Output staging: per math warpgroup, BLOCK_N / kSlabCols slabs of WG_M x kSlabCols BF16.
  constexpr uint32_t kSlabCols = kSwizzleD == 0 ? BLOCK_N : kSwizzleD / 2;
  constexpr uint32_t kSlabBytes = WG_M * kSlabCols * 2;
  constexpr uint32_t kNumSlabs = BLOCK_N / kSlabCols;
  static_assert(BLOCK_N % kSlabCols == 0, "output swizzle must divide BLOCK_N");

  constexpr uint32_t SMEM_D = round_up(BLOCK_M * BLOCK_N * 2u, 1024u);
  constexpr uint32_t SMEM_A = BLOCK_M * kBlockK;
  constexpr uint32_t SMEM_B = BLOCK_N * kBlockK;
  constexpr uint32_t SMEM_SFA = round_up(BLOCK_M * 4u, 128u);
  constexpr uint32_t kStageTxBytesNoA = SMEM_B + BLOCK_M * 4;  // plus the A boxes loaded for the tile

  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* smem_d = smem;
  uint8_t* smem_a = smem + SMEM_D;
  uint8_t* smem_b = smem_a + kNumStages * SMEM_A;
  float* smem_sfa = reinterpret_cast<float*>(smem_b + kNumStages * SMEM_B);
  uint64_t* full_bar = reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(smem_sfa) + kNumStages * SMEM_SFA);
  uint64_t* empty_bar = full_bar + kNumStages;
  // Split-K hand-off buffer: warpgroup 1's final accumulators, one float per (register, thread).
  float* smem_red = reinterpret_cast<float*>(empty_bar + kNumStages);

  // Broadcast from lane 0 so the compiler knows it is warp-uniform (uniform registers for descriptors).
  const uint32_t warpgroup = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  if (threadIdx.x == kNumMathThreads) {
    tma_prefetch_descriptor(&tmap_a);
    tma_prefetch_descriptor(&tmap_b);
    tma_prefetch_descriptor(&tmap_sfa);
    tma_prefetch_descriptor(&tmap_d);
    for (uint32_t s = 0; s < kNumStages; ++s) {
      mbarrier_init(&full_bar[s], 1);
      mbarrier_init(&empty_bar[s], kConsumersPerStage * 4 * kCluster);  // one arrival per consuming warp
    }
    mbarrier_init_fence();
  }
  // Clustered: the peer multicasts into our shared memory and arrives on our barriers, so it must see them
  // initialised.
  if constexpr (kCluster > 1) cluster_sync(); else __syncthreads();

  // The producer runs its scheduler on one thread, the math warpgroups on whole warps.
  using ProducerScheduler =
      TileScheduler<kKind, SHAPE_N, BLOCK_M, BLOCK_N, kRasterN, kMulticast, kKSlices, kStreamK, kNumKBlocks, false>;
  using MathScheduler =
      TileScheduler<kKind, SHAPE_N, BLOCK_M, BLOCK_N, kRasterN, kMulticast, kKSlices, kStreamK, kNumKBlocks, true>;
  Tile tile;

  if (warpgroup == kNumMathWG) {
    // ---------------- TMA producer ----------------
    if (kNumMathWG > 1) regs_dealloc<kProducerRegs>();
    if (threadIdx.x / 32 != kNumMathThreads / 32) return;
    ProducerScheduler scheduler(shape_m, num_groups, grouped_layout);  // by a whole warp (see TileScheduler)
    if (threadIdx.x != kNumMathThreads) return;
    uint32_t stage = 0, phase = 0;
    while (scheduler.next(tile)) {
      const int a_row = static_cast<int>(tile.m_block * BLOCK_M);
      const int a_group = kKind == kGroupedMasked ? static_cast<int>(tile.group) : 0;
      const int b_row = static_cast<int>(tile.n_block * BLOCK_N);
      const int b_group = kKind == kNormal ? 0 : static_cast<int>(tile.group);
      const uint32_t a_boxes = cmin(kABoxes, ceil_div(tile.rows - tile.m_block * BLOCK_M, A_BOX_M));
      const uint32_t tx_bytes = a_boxes * A_BOX_M * kBlockK + kStageTxBytesNoA;
      // B tiles read by this CTA (or the pair sharing them) alone, when the rows fit one m block (pair), may go
      // into L2 as first to evict (the host allows it when B cannot stay in L2 between calls anyway). Streamed with
      // the normal priority, they push out other data, dirty lines too, whose write-backs then compete for memory
      // bandwidth with this GEMM's loads (benchmarks/NOTES.md section 21). Other B tiles take the plain load: the
      // cache-hint form with an evict_normal policy kept less of B in L2 across calls (64x24576x1536 with L2 warm
      // 12.3 vs 15.2 us, section 22).
      const bool b_first = b_evict_first != 0 && ceil_div(tile.rows, BLOCK_M) <= (kMulticast == 2 ? 2u : 1u);
      const uint64_t b_policy = l2_evict_first_policy();
#pragma unroll 1
      for (uint32_t kb = tile.k_begin; kb < tile.k_end; ++kb) {
        mbarrier_wait(&empty_bar[stage], phase ^ 1);
        mbarrier_arrive_expect_tx(&full_bar[stage], tx_bytes);
        const int k = static_cast<int>(kb * kBlockK);
#pragma unroll
        for (uint32_t i = 0; i < kABoxesPerCta; ++i) {
          const uint32_t box = (kMulticast == 1 ? scheduler.rank * kABoxesPerCta : 0) + i;
          if (box >= a_boxes) break;
          uint8_t* dst = smem_a + stage * SMEM_A + box * A_BOX_M * kBlockK;
          const int row = a_row + static_cast<int>(box * A_BOX_M);
          if constexpr (kMulticast == 1)
            tma_load_3d_multicast(dst, &tmap_a, &full_bar[stage], 0b11, k, row, a_group);
          else
            tma_load_3d(dst, &tmap_a, &full_bar[stage], k, row, a_group);
        }
        // B multicast: each CTA of the pair loads its half of the tile's rows into both.
        uint8_t* b_dst = smem_b + stage * SMEM_B + (kMulticast == 2 ? scheduler.rank * (SMEM_B / 2) : 0);
        const int b_row_cta = b_row + static_cast<int>(kMulticast == 2 ? scheduler.rank * BLOCK_N / 2 : 0);
        if constexpr (kMulticast == 2) {
          if (b_first)
            tma_load_3d_multicast_hint(b_dst, &tmap_b, &full_bar[stage], 0b11, k, b_row_cta, b_group, b_policy);
          else
            tma_load_3d_multicast(b_dst, &tmap_b, &full_bar[stage], 0b11, k, b_row_cta, b_group);
        } else {
          if (b_first)
            tma_load_3d_hint(b_dst, &tmap_b, &full_bar[stage], k, b_row_cta, b_group, b_policy);
          else
            tma_load_3d(b_dst, &tmap_b, &full_bar[stage], k, b_row_cta, b_group);
        }
        tma_load_3d(reinterpret_cast<uint8_t*>(smem_sfa) + stage * SMEM_SFA, &tmap_sfa, &full_bar[stage], a_row,
                    static_cast<int>(kb), a_group);
        if (++stage == kNumStages) stage = 0, phase ^= 1;
      }
    }
    if constexpr (kCluster > 1) {
      // Stay alive until both CTAs' consumers released every stage: their remote arrivals target our barriers.
      for (uint32_t i = 0; i < kNumStages; ++i) {
        mbarrier_wait(&empty_bar[stage], phase ^ 1);
        if (++stage == kNumStages) stage = 0, phase ^= 1;
      }
    }
    return;
  }

  // ---------------- math warpgroups ----------------
  if (kNumMathWG > 1) regs_alloc<kMathRegs>();
  MathScheduler scheduler(shape_m, num_groups, grouped_layout);
  const uint32_t tid = threadIdx.x % 128;
  const uint32_t warp = tid / 32, lane = tid % 32;
  const uint32_t row_in_sub = warp * 16 + lane / 4;  // this thread's first row in an m64 slice (+8 for the second)
  const uint32_t col_in_group = (lane % 4) * 2;      // first of this thread's two columns in every 8-column group
  const uint32_t wg_row0 = kSplitK ? 0 : warpgroup * WG_M;
  uint8_t* my_smem_d = smem_d + (kSplitK ? 0 : warpgroup) * (kNumSlabs * kSlabBytes);
  const uint32_t barrier_id = 1 + warpgroup;

  // Scales of one K block: A per row this thread owns, B per 128-column block the tile touches.
  struct Scales {
    float a[kNumMSub][2];
    float b[kMaxSFB];
  };
  float acc0[kAccSlices][kAccPerSub];
  float acc1[kDoubleAcc ? kAccSlices : 1][kDoubleAcc ? kAccPerSub : 1];
  float final_acc[kNumMSub][kNumNSub][kAccPerSub];
  const uint64_t desc_a0 = make_smem_desc_k128_sw128(smem_a + wg_row0 * kBlockK);
  const uint64_t desc_b0 = make_smem_desc_k128_sw128(smem_b);
  uint32_t stage = 0, phase = 0;

  while (scheduler.next(tile)) {
    const uint32_t n0 = tile.n_block * BLOCK_N;
    const uint32_t kb_first = tile.k_begin, kb_end = tile.k_end;
    // A piece of a stream-K tail unit: part of the tile's K blocks, partial sums met in global memory.
    const bool sk_piece = kStreamK && tile.sk_unit != kWholeUnit;
    const uint32_t b_group = kKind == kNormal ? 0 : tile.group;
    const float* sfb_tile = sfb + (b_group * kNumSFBRows) * kNumKBlocks;
    const float* sfb_ptr[kMaxSFB];
#pragma unroll
    for (uint32_t i = 0; i < kMaxSFB; ++i) sfb_ptr[i] = sfb_tile + cmin(n0 / kBlockK + i, kNumSFBRows - 1) * kNumKBlocks;
    // Tile column at which the B scale block changes (only used when a tile can straddle blocks).
    const uint32_t tile_boundary = kBlockK - n0 % kBlockK;

#pragma unroll
    for (uint32_t ms = 0; ms < kNumMSub; ++ms)
#pragma unroll
      for (uint32_t ns = 0; ns < kNumNSub; ++ns)
#pragma unroll
        for (uint32_t j = 0; j < kAccPerSub; ++j) final_acc[ms][ns][j] = 0.f;

    auto load_b_scales = [&](Scales& sc, uint32_t kb) {
#pragma unroll
      for (uint32_t i = 0; i < kMaxSFB; ++i) sc.b[i] = __ldg(sfb_ptr[i] + kb);
    };
    // Waits for the stage's TMA data, then reads this thread's A scales from it: `slices` m64 slices from tile row
    // `row0` (this warpgroup's rows, unless a contiguous half tile moved them).
    auto wait_stage = [&](Scales& sc, uint32_t s, uint32_t ph, uint32_t row0, uint32_t slices) {
      mbarrier_wait(&full_bar[s], ph);
      const float* sfa = smem_sfa + s * (SMEM_SFA / 4) + row0;
#pragma unroll
      for (uint32_t ms = 0; ms < kNumMSub; ++ms) {
        if (kSplitHalves && ms >= slices) break;  // a moved slice's successor may lie past the stage's rows
        sc.a[ms][0] = sfa[ms * 64 + row_in_sub];
        sc.a[ms][1] = sfa[ms * 64 + row_in_sub + 8];
      }
    };
    // Issues the wgmmas of m64 slices [ms_lo, ms_hi) (slice ms accumulates into acc[ms - ms_lo]). Descriptors are
    // stage 0's plus compile-time offsets: the 14-bit address field never carries (shared memory < 256 KB).
    // `a_shift`: descriptor units (16 bytes) added to A's address, for a contiguous half tile's moved rows.
    auto issue = [&](float (&acc)[kAccSlices][kAccPerSub], uint32_t s, uint32_t ns, uint32_t ms_lo, uint32_t ms_hi,
                     uint64_t a_shift = 0) {
      const uint64_t da = desc_a0 + a_shift + s * (SMEM_A / 16);
      const uint64_t db = desc_b0 + (s * SMEM_B + ns * WGMMA_N * kBlockK) / 16;
      wgmma_fence();
#pragma unroll
      for (uint32_t k32 = 0; k32 < kBlockK / 32; ++k32)
#pragma unroll
        for (uint32_t ms = 0; ms < kNumMSub; ++ms)
          if (ms >= ms_lo && ms < ms_hi)
            WgmmaFP8<WGMMA_N>::mma(da + (ms * 64 * kBlockK + k32 * 32) / 16, db + (k32 * 32) / 16, acc[ms - ms_lo],
                                   k32 > 0);
      wgmma_commit();
    };
    auto settle = [&](float (&acc)[kAccSlices][kAccPerSub]) {
#pragma unroll
      for (uint32_t ms = 0; ms < kAccSlices; ++ms)
#pragma unroll
        for (uint32_t j = 0; j < kAccPerSub; ++j) fence_operand(acc[ms][j]);
    };
    // Promotion on CUDA cores: final += (scale_a(row) * scale_b(block)) * partial.
    auto promote = [&](const float (&acc)[kAccSlices][kAccPerSub], const Scales& sc, uint32_t ns, uint32_t ms_lo,
                       uint32_t ms_hi, uint32_t boundary) {
#pragma unroll
      for (uint32_t ms = 0; ms < kNumMSub; ++ms) {
        if (ms < ms_lo || ms >= ms_hi) continue;
        float p[kMaxSFB][2];
#pragma unroll
        for (uint32_t i = 0; i < kMaxSFB; ++i) p[i][0] = sc.a[ms][0] * sc.b[i], p[i][1] = sc.a[ms][1] * sc.b[i];
#pragma unroll
        for (uint32_t g = 0; g < WGMMA_N / 8; ++g) {
          const uint32_t col = ns * WGMMA_N + g * 8;
          float s0 = p[0][0], s1 = p[0][1];
          if (kMaxSFB > 1) {
            // Aligned tiles know their block per column at compile time; others compare with the boundary (a
            // compile-time constant too when the K loop is specialized per boundary).
            const uint32_t idx = kAlignedN ? col / kBlockK : (col >= boundary) + (col >= boundary + kBlockK);
#pragma unroll
            for (uint32_t i = 1; i < kMaxSFB; ++i)
              if (idx == i) s0 = p[i][0], s1 = p[i][1];
          }
          final_acc[ms][ns][g * 4 + 0] += s0 * acc[ms - ms_lo][g * 4 + 0];
          final_acc[ms][ns][g * 4 + 1] += s0 * acc[ms - ms_lo][g * 4 + 1];
          final_acc[ms][ns][g * 4 + 2] += s1 * acc[ms - ms_lo][g * 4 + 2];
          final_acc[ms][ns][g * 4 + 3] += s1 * acc[ms - ms_lo][g * 4 + 3];
        }
      }
    };
    auto release = [&](uint32_t s) {
      if constexpr (kCluster > 1) {
        if (lane < kCluster) mbarrier_arrive_cluster(&empty_bar[s], lane);  // both CTAs' producers wrote it
      } else {
        if (lane == 0) mbarrier_arrive(&empty_bar[s]);
      }
    };
    auto advance = [&]() {
      if (++stage == kNumStages) stage = 0, phase ^= 1;
    };

    const bool half_tile = kSplitHalves && tile.halves != 0b11;
    // This warpgroup's first row in the tile (wg_row0 but in a half tile) and how many m64 slices it may own.
    const uint32_t my_row0 = half_tile ? (tile.halves == 0b10 ? 128u : 0u) + warpgroup * 64 : wg_row0;
    const uint32_t max_slices = half_tile ? 1 : kNumMSub;
    // m64 slices of this warpgroup that hold valid rows: all of them, except in a tile reaching past the last row
    // (the last m block, a masked group's last block). Their MMAs and promotions are skipped.
    const uint32_t tile_row0 = tile.m_block * BLOCK_M + my_row0;
    uint32_t active_slices = tile.rows > tile_row0 ? cmin(max_slices, ceil_div(tile.rows - tile_row0, 64u)) : 0;
    if constexpr (kKind == kGroupedContiguous && BLOCK_M == 256 && kDoubleAcc) {
      if (!((tile.halves >> warpgroup) & 1)) active_slices = 0;  // the half's rows belong to another group
    }
    if (active_slices == 0) {
      // Nothing to compute: keep the stage count only.
#pragma unroll 1
      for (uint32_t kb = kb_first; kb < kb_end; ++kb) {
        mbarrier_wait(&full_bar[stage], phase);
        release(stage);
        advance();
      }
      continue;
    }

    // Rows this thread owns: (ms, h) -> tile row my_row0 + ms*64 + row_in_sub + 8h. Contiguous: their m_indices
    // entries are read now, so the latency hides behind the K loop (the epilogue writes only the group's rows).
    int row_group[kNumMSub][2];
    if constexpr (kKind == kGroupedContiguous) {
#pragma unroll
      for (uint32_t ms = 0; ms < kNumMSub; ++ms)
#pragma unroll
        for (uint32_t h = 0; h < 2; ++h) {
          const uint32_t r = tile_row0 + ms * 64 + row_in_sub + 8 * h;
          row_group[ms][h] = r < shape_m ? __ldg(grouped_layout + r) : static_cast<int>(tile.group);
        }
    }

    Scales cur, next;
    constexpr uint32_t kStep = kSplitK ? 2 : 1;  // split-K: this warpgroup takes K blocks warpgroup, +2, ...
    const uint32_t kb0 = kb_first + (kSplitK ? warpgroup : 0);
    if (kb0 < kb_end) load_b_scales(next, kb0);
    // The K loop, with the scale-block boundary as a compile-time constant where a tile straddles 128-column
    // blocks at one of a few offsets (then the promotion picks each column's B scale without selects).
    // Whole tiles unroll the K loop 4x, so the next block's barrier wait and operand setup overlap this block's
    // promotion (ptxas hoists the wait into it): 2-6 % on 256-row tiles (M = 4096, contiguous), 4-10 % on 128-row
    // ones (benchmarks/NOTES.md section 12); one-warpgroup kernels 3-7 % with L2 warm, split-K ones 0-1 % (section 22).
    // Those two pick B scales per column at run time on some widths, and stay rolled there: unrolled, they spilled.
    constexpr bool kRunTimeScaleSelect = kMaxSFB > 1 && !kAlignedN && !kSpecializeBoundary;
    constexpr bool kRowWarpgroups = kNumMathWG >= 2 && !kSplitK;
    constexpr uint32_t kKLoopUnroll = kKSlices == 1 && (kRowWarpgroups || !kRunTimeScaleSelect) ? 4 : 1;
    auto k_loop = [&](auto offset_case) {
      const uint32_t boundary = kSpecializeBoundary ? kBlockK - decltype(offset_case)::value * kOffsetStep
                                                    : tile_boundary;
      // Whole tiles (no K slices) loop over compile-time bounds.
      const uint32_t lo = kKSlices == 1 ? 0u : kb_first, hi = kKSlices == 1 ? kNumKBlocks : kb_end;
      // Split-K: this warpgroup's blocks are every other one from lo + warpgroup (a loop without per-block branches,
      // so it unrolls); the stage count still steps over the other warpgroup's blocks.
      if (kSplitK && warpgroup == 1) advance();
#pragma unroll kKLoopUnroll
      for (uint32_t kb = lo + (kSplitK ? warpgroup : 0); kb < hi; kb += kStep) {
        cur = next;
        if (kb + kStep < hi) load_b_scales(next, kb + kStep);  // prefetch: latency hides behind this block
        wait_stage(cur, stage, phase, wg_row0, kNumMSub);
#pragma unroll
        for (uint32_t ns = 0; ns < kNumNSub; ++ns)
#pragma unroll
          for (uint32_t ms = 0; ms < kNumMSub; ms += kAccSlices) {
            issue(acc0, stage, ns, ms, ms + kAccSlices);
            wgmma_wait<0>();
            settle(acc0);
            if (ns == kNumNSub - 1 && ms + kAccSlices == kNumMSub) release(stage);  // stage consumed: hand it back
            promote(acc0, cur, ns, ms, ms + kAccSlices, boundary);
          }
        advance();
        if (kSplitK && kb + 1 < hi) advance();
      }
    };
    // A warpgroup with some of its m64 slices past the valid rows: only the first `slices` are issued and promoted.
    // Also the pieces of stream-K tail units (run-time K bounds). One copy of the loop, not unrolled or specialized
    // per boundary: at most one m block per group and the last round's pieces take it.
    // Contiguous half tiles take it too, with the warpgroup's rows moved by my_row0 - wg_row0.
    auto k_loop_partial = [&](uint32_t slices) {
      const uint64_t a_shift = (static_cast<uint64_t>(my_row0) - wg_row0) * (kBlockK / 16);  // may wrap: a negative move
#pragma unroll 1
      for (uint32_t kb = kb_first; kb < kb_end; ++kb) {
        cur = next;
        if (kb + 1 < kb_end) load_b_scales(next, kb + 1);
        wait_stage(cur, stage, phase, my_row0, slices);
#pragma unroll
        for (uint32_t ns = 0; ns < kNumNSub; ++ns)
#pragma unroll
          for (uint32_t ms = 0; ms < kNumMSub; ms += kAccSlices) {
            if (ms >= slices) break;
            const uint32_t hi = cmin(ms + kAccSlices, slices);
            issue(acc0, stage, ns, ms, hi, a_shift);
            wgmma_wait<0>();
            settle(acc0);
            if (ns == kNumNSub - 1 && hi == slices) release(stage);
            promote(acc0, cur, ns, ms, hi, tile_boundary);
          }
        advance();
      }
    };
    if constexpr (!kDoubleAcc) {
      if ((kNumMSub > 1 && !kSplitK && active_slices < kNumMSub) || sk_piece)
        k_loop_partial(active_slices);
      else if constexpr (kSpecializeBoundary)
        dispatch_uconst<0, kNumOffsets>((n0 % kBlockK) / kOffsetStep, k_loop);
      else
        k_loop(UConst<0>{});
    } else {
      static_assert(!kStreamK && !kSplitK, "two accumulator sets: no stream-K pieces, no split over warpgroups");
      // Two accumulator sets: the MMA batches of a K block (one per N slice and m64 slice group: its "units") and
      // of the next run back to back, each batch's promotion overlapping the next batch's wgmmas. The K loop goes
      // in chunks compiled straight through, nothing in flight across the loop's back edge: a wgmma pending there
      // made ptxas serialize every wgmma of the kernel (C7514, NOTES sections 2 and 17).
      constexpr uint32_t kUnitsPerNSub = kNumMSub / kAccSlices, kUnits = kNumNSub * kUnitsPerNSub;
      static_assert(kNumStages >= 2, "the next block's stage is waited for before this one is released");
      Scales sc[2];
      uint32_t st[2];
      auto acc_of = [&](auto parity) -> float (&)[kAccSlices][kAccPerSub] {
        if constexpr (decltype(parity)::value == 0) return acc0; else return acc1;
      };
      // Block kb (chunk-local j): its scales, its stage's data; the stage is released after its last unit.
      auto start_block = [&](uint32_t j, uint32_t kb) {
        sc[j % 2] = next;
        if (kb + 1 < kb_end) load_b_scales(next, kb + 1);
        wait_stage(sc[j % 2], stage, phase, wg_row0, kNumMSub);
        st[j % 2] = stage;
        advance();
      };
      auto issue_unit = [&](auto g_c) {
        constexpr uint32_t g = decltype(g_c)::value, u = g % kUnits;
        constexpr uint32_t ns = u / kUnitsPerNSub, ms = (u % kUnitsPerNSub) * kAccSlices;
        issue(acc_of(UConst<g % 2>{}), st[(g / kUnits) % 2], ns, ms, ms + kAccSlices);
      };
      auto chunk = [&](uint32_t kb, auto len_c, uint32_t boundary) {
        constexpr uint32_t kLen = decltype(len_c)::value * kUnits;  // units in the chunk
        start_block(0, kb);
        issue_unit(UConst<0>{});
        static_for<0, kLen>([&](auto g_c) {
          constexpr uint32_t g = decltype(g_c)::value, j = g / kUnits, u = g % kUnits;
          constexpr uint32_t ns = u / kUnitsPerNSub, ms = (u % kUnitsPerNSub) * kAccSlices;
          if constexpr (g + 1 < kLen) {
            if constexpr ((g + 1) % kUnits == 0) start_block(j + 1, kb + j + 1);
            issue_unit(UConst<g + 1>{});
            wgmma_wait<1>();
          } else {
            wgmma_wait<0>();
          }
          auto& acc = acc_of(UConst<g % 2>{});
          settle(acc);
          if constexpr (u == kUnits - 1) release(st[j % 2]);
          promote(acc, sc[j % 2], ns, ms, ms + kAccSlices, boundary);
        });
      };
      constexpr uint32_t kChunk = 8;  // K blocks per chunk: one batch's promotion in 8 * kUnits is not overlapped
      auto k_loop_double = [&](auto offset_case) {
        const uint32_t boundary = kSpecializeBoundary ? kBlockK - decltype(offset_case)::value * kOffsetStep
                                                      : tile_boundary;
        if constexpr (kKSlices == 1) {  // whole tiles: compile-time bounds
          constexpr uint32_t kFull = kNumKBlocks / kChunk, kRest = kNumKBlocks % kChunk;
#pragma unroll 1
          for (uint32_t c = 0; c < kFull; ++c) chunk(c * kChunk, UConst<kChunk>{}, boundary);
          if constexpr (kRest > 0) chunk(kFull * kChunk, UConst<kRest>{}, boundary);
        } else {  // a K slice: the remainder in chunks of two and one (a dispatch over eight lengths became a call)
          uint32_t kb = kb_first;
#pragma unroll 1
          for (; kb + kChunk <= kb_end; kb += kChunk) chunk(kb, UConst<kChunk>{}, boundary);
#pragma unroll 1
          for (; kb + 2 <= kb_end; kb += 2) chunk(kb, UConst<2>{}, boundary);
          if (kb < kb_end) chunk(kb, UConst<1>{}, boundary);
        }
      };
      if constexpr (kSpecializeBoundary)
        dispatch_uconst<0, kNumOffsets>((n0 % kBlockK) / kOffsetStep, k_loop_double);
      else
        k_loop_double(UConst<0>{});
    }

    if constexpr (kSplitK) {
      // Hand-off: warpgroup 1's sums go through shared memory into warpgroup 0's, which stores the tile.
      constexpr uint32_t kSplitBarrier = 3;  // named barrier of the 256 math threads (1, 2: per warpgroup)
      if (warpgroup == 1) {
#pragma unroll
        for (uint32_t ns = 0; ns < kNumNSub; ++ns)
#pragma unroll
          for (uint32_t j = 0; j < kAccPerSub; ++j) smem_red[(ns * kAccPerSub + j) * 128 + tid] = final_acc[0][ns][j];
      }
      named_barrier_sync(kSplitBarrier, 256);
      if (warpgroup == 0) {
#pragma unroll
        for (uint32_t ns = 0; ns < kNumNSub; ++ns)
#pragma unroll
          for (uint32_t j = 0; j < kAccPerSub; ++j) final_acc[0][ns][j] += smem_red[(ns * kAccPerSub + j) * 128 + tid];
      }
      named_barrier_sync(kSplitBarrier, 256);  // the buffer is free again before warpgroup 1 reuses it
      if (warpgroup == 1) continue;
    }

    if (kKSlices > 1 || sk_piece) {
      // This CTA's sums go to global memory register by register, each a coalesced 128-float row over the
      // warpgroup's threads (four-register vector stores would pin the accumulators to aligned register quads, which
      // slowed every whole tile of the kernel by 2-3 %, NOTES section 19). The tile's last CTA to arrive adds every
      // piece (K slice, or stream-K piece) in K order, so the result does not depend on which CTA that is, and stores
      // the tile.
      constexpr uint32_t kPartial = WG_M * BLOCK_N;  // floats per piece and row group
      static_assert(kAccPerSub % 4 == 0, "partial sums are read back in groups of four registers");
      const uint32_t row_group_idx = kSplitK ? 0 : warpgroup;
      // Piece i's partial sums (this thread's first float): a K slice of the tile, or the tail piece in the slot of
      // the cluster that ran it; how many pieces there are, which is this CTA's, and the tile's arrival counter.
      const uint32_t tile_id = tile.m_block * ceil_div(SHAPE_N, BLOCK_N) + tile.n_block;
      auto piece_sums = [&](uint32_t i) -> float* {
        const uint32_t slot =
            kStreamK ? scheduler.sk_slot(tile.sk_unit, i) * kCluster + scheduler.rank : tile_id * kKSlices + i;
        return partials + (slot * kRowGroups + row_group_idx) * kPartial + tid;
      };
      const uint32_t pieces = kStreamK ? scheduler.sk_split : kKSlices;
      const uint32_t mine = tile.k_slice;
      const uint32_t counter_idx = kStreamK ? tile.sk_unit * kCluster + scheduler.rank : tile_id;
      auto at = [](float* base, uint32_t ms, uint32_t ns, uint32_t j) {
        return base + ((ms * kNumNSub + ns) * kAccPerSub + j) * 128;
      };
      float* my_sums = piece_sums(mine);
#pragma unroll
      for (uint32_t ms = 0; ms < kNumMSub; ++ms)
#pragma unroll
        for (uint32_t ns = 0; ns < kNumNSub; ++ns)
#pragma unroll
          for (uint32_t j = 0; j < kAccPerSub; ++j) st_global_cg(at(my_sums, ms, ns, j), final_acc[ms][ns][j]);
      named_barrier_sync(barrier_id, 128);  // every thread's stores precede the release below
      uint32_t* counter = tile_counters + counter_idx * kRowGroups + row_group_idx;
      const bool last = named_barrier_vote<true>(
          barrier_id, 128, tid == 0 && arrive_counter_acq_rel(counter) == pieces - 1);
      if (!__shfl_sync(0xffffffffu, last, 0)) continue;
      if (tid == 0) reset_counter(counter);  // ready for the next launch
      // Every piece is read back, this CTA's own too, one m64 slice at a time, in passes over as many pieces as 128
      // registers of loads in flight allow (more spill in the two-warpgroup kernels; fewer leave the reads latency
      // bound).
      constexpr uint32_t kSliceFloats = kNumNSub * kAccPerSub;  // this thread's share of one m64 slice
      constexpr uint32_t kPass = cmin(kKSlices > 1 ? kKSlices : 4u, cmax(1u, 128u / (kSliceFloats * kNumMSub)));
      constexpr bool kWholePasses = !kStreamK && kKSlices % kPass == 0;  // every pass reads kPass pieces
#pragma unroll
      for (uint32_t ms = 0; ms < kNumMSub; ++ms) {
#pragma unroll
        for (uint32_t ns = 0; ns < kNumNSub; ++ns)
#pragma unroll
          for (uint32_t j = 0; j < kAccPerSub; ++j) final_acc[ms][ns][j] = 0.f;
#pragma unroll 1
        for (uint32_t first = 0; first < pieces; first += kPass) {
          float* base[kPass];
#pragma unroll
          for (uint32_t i = 0; i < kPass; ++i) base[i] = piece_sums(cmin(first + i, pieces - 1));
#pragma unroll
          for (uint32_t ns = 0; ns < kNumNSub; ++ns)
#pragma unroll
            for (uint32_t j = 0; j < kAccPerSub; j += 4) {
              // Loads unconditional (a short last pass re-reads the last piece, added never): predicated ones
              // were issued one at a time, each waited for before the next (stream-K read-back ~8x slower).
              float p[kPass][4];
#pragma unroll
              for (uint32_t i = 0; i < kPass; ++i)
#pragma unroll
                for (uint32_t e = 0; e < 4; ++e) p[i][e] = ld_global_cg(at(base[i], ms, ns, j + e));
#pragma unroll
              for (uint32_t i = 0; i < kPass; ++i)
                if (kWholePasses || first + i < pieces)
#pragma unroll
                  for (uint32_t e = 0; e < 4; ++e) final_acc[ms][ns][j + e] += p[i][e];
            }
        }
      }
    }

    // ---------------- epilogue ----------------
    bool rows_ok = true;  // every row of this warpgroup's slice may be written by a TMA store
    if constexpr (kKind == kGroupedContiguous) {
#pragma unroll
      for (uint32_t ms = 0; ms < kNumMSub; ++ms)
#pragma unroll
        for (uint32_t h = 0; h < 2; ++h) rows_ok &= row_group[ms][h] == static_cast<int>(tile.group);
      rows_ok &= !half_tile;  // a TMA store covers the warpgroup's 128 rows; a half tile's warpgroup owns 64
      rows_ok = __shfl_sync(0xffffffffu, named_barrier_vote<false>(barrier_id, 128, rows_ok), 0);  // uniform, provably
    } else if (kKind == kGroupedMasked) {
      rows_ok = tile_row0 + WG_M <= tile.rows;  // uniform across the warpgroup
    }

    // Masked tiles past masked_m stage too, then copy their valid rows out in 16-byte pieces (the rows past them lie
    // inside D and must stay untouched, so no TMA store): per-thread 4-byte stores straight from the accumulators cost
    // about 0.7 us more on 1x1006x4096x7168 (NOTES section 19).
    constexpr bool kStagedRows = kKind == kGroupedMasked;
    if (rows_ok || kStagedRows) {
      // Stage through swizzled shared memory, then one TMA store per slab (overlaps the next tile).
      if (tid == 0) tma_store_wait_read<0>();
      named_barrier_sync(barrier_id, 128);
#pragma unroll
      for (uint32_t ms = 0; ms < kNumMSub; ++ms)
#pragma unroll
        for (uint32_t ns = 0; ns < kNumNSub; ++ns)
#pragma unroll
          for (uint32_t g = 0; g < WGMMA_N / 8; ++g)
#pragma unroll
            for (uint32_t h = 0; h < 2; ++h) {
              const uint32_t col = ns * WGMMA_N + g * 8 + col_in_group;
              const uint32_t row = ms * 64 + row_in_sub + 8 * h;
              const uint32_t slab = col / kSlabCols;
              const uint32_t addr = smem_u32(my_smem_d + slab * kSlabBytes) +
                                    d_slab_offset<kSwizzleD, kSlabCols * 2>(row, col % kSlabCols);
              st_shared_u32(addr, pack_bf16x2(final_acc[ms][ns][g * 4 + 2 * h], final_acc[ms][ns][g * 4 + 2 * h + 1]));
            }
      if (rows_ok) {
        fence_proxy_async_shared();
        named_barrier_sync(barrier_id, 128);
        if (tid == 0) {
          const int d_group = kKind == kGroupedMasked ? static_cast<int>(tile.group) : 0;
#pragma unroll
          for (uint32_t slab = 0; slab < kNumSlabs; ++slab)
            tma_store_3d(&tmap_d, my_smem_d + slab * kSlabBytes, static_cast<int>(n0 + slab * kSlabCols),
                         static_cast<int>(tile_row0), d_group);
          tma_store_commit();
        }
      } else {
        // Consecutive threads take consecutive 8-column pieces of a row: whole rows go out coalesced. (The next
        // tile's staging waits at the barrier above until every thread has read its pieces.)
        named_barrier_sync(barrier_id, 128);
        constexpr uint32_t kPiecesPerRow = BLOCK_N / 8;
        const uint32_t valid_rows = cmin(WG_M, tile.rows - tile_row0);
        uint16_t* d_tile = d_ptr + (uint64_t(tile.group) * shape_m + tile_row0) * ld_d + n0;
#pragma unroll 4
        for (uint32_t i = tid; i < valid_rows * kPiecesPerRow; i += 128) {
          const uint32_t row = i / kPiecesPerRow, col = (i % kPiecesPerRow) * 8;
          const uint32_t addr = smem_u32(my_smem_d + (col / kSlabCols) * kSlabBytes) +
                                d_slab_offset<kSwizzleD, kSlabCols * 2>(row, col % kSlabCols);
          if (n0 + col < SHAPE_N) st_global_v4(d_tile + uint64_t(row) * ld_d + col, ld_shared_v4(addr));
        }
      }
    } else {
      // Contiguous rows of other groups or padding must stay untouched: direct stores from the accumulators.
      const uint32_t valid_m = tile.rows;
#pragma unroll
      for (uint32_t ms = 0; ms < kNumMSub; ++ms)
#pragma unroll
        for (uint32_t h = 0; h < 2; ++h) {
          const uint32_t r = tile_row0 + ms * 64 + row_in_sub + 8 * h;
          bool ok = r < valid_m;
          if constexpr (kKind == kGroupedContiguous)  // (a half tile's second slice is the other warpgroup's)
            ok = ok && row_group[ms][h] == static_cast<int>(tile.group) && ms < active_slices;
          if (!ok) continue;
          uint16_t* d_row = d_ptr + uint64_t(r) * ld_d;
#pragma unroll
          for (uint32_t ns = 0; ns < kNumNSub; ++ns)
#pragma unroll
            for (uint32_t g = 0; g < WGMMA_N / 8; ++g) {
              const uint32_t col = n0 + ns * WGMMA_N + g * 8 + col_in_group;
              if (col < SHAPE_N)
                *reinterpret_cast<uint32_t*>(d_row + col) =
                    pack_bf16x2(final_acc[ms][ns][g * 4 + 2 * h], final_acc[ms][ns][g * 4 + 2 * h + 1]);
            }
        }
    }
  }
  if (tid == 0) tma_store_wait_all<0>();
}

}  // namespace cupygemm

#ifdef CUPYGEMM_SHAPE_N
// Entry point with a fixed C name, instantiated from the constants the JIT defines.
extern "C" __global__ void __launch_bounds__(128 * (CUPYGEMM_NUM_MATH_WG + 1), 1) CUPYGEMM_CLUSTER_ATTR
    cupygemm_fp8_gemm(const __grid_constant__ cupygemm::TmaDescriptor tmap_a,
                      const __grid_constant__ cupygemm::TmaDescriptor tmap_b,
                      const __grid_constant__ cupygemm::TmaDescriptor tmap_sfa,
                      const __grid_constant__ cupygemm::TmaDescriptor tmap_d, const float* sfb,
                      const int* grouped_layout, uint16_t* d_ptr, float* partials, uint32_t* tile_counters,
                      uint32_t shape_m, uint32_t num_groups, uint32_t ld_d, uint32_t b_evict_first) {
  cupygemm::fp8_gemm_impl<CUPYGEMM_SHAPE_N, CUPYGEMM_SHAPE_K, CUPYGEMM_BLOCK_M, CUPYGEMM_BLOCK_N, CUPYGEMM_WGMMA_N,
                          CUPYGEMM_NUM_STAGES, CUPYGEMM_NUM_MATH_WG, CUPYGEMM_MATH_REGS, CUPYGEMM_PRODUCER_REGS,
                          CUPYGEMM_SWIZZLE_D, CUPYGEMM_RASTER_N, CUPYGEMM_KIND, CUPYGEMM_DOUBLE_ACC,
                          CUPYGEMM_MULTICAST, CUPYGEMM_SPLIT_K, CUPYGEMM_SERIAL_M, CUPYGEMM_K_SLICES,
                          CUPYGEMM_STREAM_K, CUPYGEMM_A_BOX_M>(
      tmap_a, tmap_b, tmap_sfa, tmap_d, sfb, grouped_layout, d_ptr, partials, tile_counters, shape_m, num_groups, ld_d,
      b_evict_first);
}
#endif
