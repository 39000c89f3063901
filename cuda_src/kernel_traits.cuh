// The GEMM kernel's compile-time constants: the ones the host chooses (template parameters, rendered from
// cupygemm's config as CUPYGEMM_* macros) and everything derived from them, with the rules that tie them together
// as static_asserts. Every other part of the kernel reads its shapes from here, so a config the host cannot build
// fails to compile in one place.
#pragma once
#include "ptx_common.cuh"
#include "named_barriers.cuh"
#include "l2_sides.cuh"
#include "scheduler.cuh"

namespace cupygemm {

constexpr uint32_t kBlockK = 128;  // = the scaling granularity along K; one promotion per block

template <uint32_t SHAPE_N_, uint32_t SHAPE_K_, uint32_t BLOCK_M_, uint32_t BLOCK_N_, uint32_t WGMMA_N_,
          uint32_t kNumStages_, uint32_t kNumMathWG_, uint32_t kMathRegs_, uint32_t kProducerRegs_,
          uint32_t kSwizzleD_, uint32_t kRasterN_, int kKind_, int kMulticast_, bool kInterleaveK_, bool kSerialM_,
          uint32_t kSplitK_, bool kStreamK_, uint32_t A_BOX_M_, bool kPdl_ = false, bool kSides_ = false,
          bool kSplitCluster_ = false, bool kTwoAccSets_ = false, uint32_t kBPrefetchBytes_ = 0>
struct KernelTraits {
  static constexpr uint32_t SHAPE_N = SHAPE_N_, SHAPE_K = SHAPE_K_, BLOCK_M = BLOCK_M_, BLOCK_N = BLOCK_N_;
  static constexpr uint32_t WGMMA_N = WGMMA_N_, kNumStages = kNumStages_, kNumMathWG = kNumMathWG_;
  static constexpr uint32_t kMathRegs = kMathRegs_, kProducerRegs = kProducerRegs_, kSwizzleD = kSwizzleD_;
  static constexpr uint32_t kRasterN = kRasterN_, kSplitK = kSplitK_, A_BOX_M = A_BOX_M_;
  static constexpr int kKind = kKind_, kMulticast = kMulticast_;
  static constexpr bool kInterleaveK = kInterleaveK_, kSerialM = kSerialM_, kStreamK = kStreamK_;
  // Programmatic dependent launch: the kernel may start while the previous one on its stream is finishing, so it
  // waits for that grid before touching global memory, and lets the next one start once its own tiles are done.
  static constexpr bool kPdl = kPdl_;
  // L2-side-aware weights (l2_sides.cuh): B is read packed, by bulk copies, and each cluster computes the tiles of
  // the half of N that lies on its SMs' L2 side.
  static constexpr bool kSides = kSides_;
  // Weights before the wait (b_prefetch.cuh): under PDL, up to this many bytes of B's first K blocks are fetched
  // into L2 before griddepcontrol.wait. Only for weights the previous kernel cannot write (the host decides).
  static constexpr uint32_t kBPrefetchBytes = kPdl ? kBPrefetchBytes_ : 0u;

  // ---- threads ----
  static constexpr uint32_t kNumMathThreads = kNumMathWG * 128;  // the producer warpgroup follows them
  // setmaxnreg: the producer drops to kProducerRegs so the math warpgroups can rise to kMathRegs.
  static_assert(kNumMathWG == 1 || kProducerRegs * 128 + kMathRegs * kNumMathThreads <= 64 * 1024,
                "setmaxnreg budget exceeds the register file");
  // kInterleaveK: two math warpgroups share all BLOCK_M rows and take alternate K blocks, two MMA/promotion chains
  // for tiles too small to give each warpgroup rows of its own.
  static_assert(!kInterleaveK || (kNumMathWG == 2 && BLOCK_M == 64), "interleave_k: two warpgroups, 64 rows");
  // With an odd stage count a stage would alternate between the warpgroups, and a parity wait two phases on would
  // pass while the other warpgroup's phase in between is still loading.
  static_assert(!kInterleaveK || kNumStages % 2 == 0,
                "interleave_k: an even stage count, so each stage has one reader");
  static constexpr uint32_t kRowGroups = kInterleaveK ? 1 : kNumMathWG;  // warpgroups that own different rows
  static constexpr uint32_t kConsumersPerStage = kNumMathWG / (kInterleaveK ? 2 : 1);

  // ---- the math warpgroup's tile ----
  static constexpr uint32_t WG_M = BLOCK_M / kRowGroups;  // rows owned by one math warpgroup
  static constexpr uint32_t kNumMSub = WG_M / 64;          // m64 sub-tiles (wgmma row blocks) per warpgroup
  static constexpr uint32_t kNumNSub = BLOCK_N / WGMMA_N;  // wgmma column blocks, accumulated one after the other
  static constexpr uint32_t kAccPerSub = WGMMA_N / 2;      // accumulator registers per thread and m64 x WGMMA_N
  static constexpr uint32_t kNumKBlocks = ceil_div(SHAPE_K, kBlockK);
  static_assert(BLOCK_M % (64 * kRowGroups) == 0, "each math warpgroup owns whole m64 sub-tiles");
  static_assert(BLOCK_N % WGMMA_N == 0 && WGMMA_N % 8 == 0 && WGMMA_N <= 256, "bad wgmma N");
  static_assert(BLOCK_N <= 256 && BLOCK_M <= 256, "TMA boxes are at most 256 rows");
  // kSerialM: a warpgroup owning several m64 sub-tiles runs them one after the other through one temporary
  // accumulator (MMA, wait, promote per sub-tile), so 256-row tiles fit in registers; the other math warpgroup's
  // MMAs keep the tensor cores busy meanwhile.
  static_assert(!kSerialM || kNumMSub > 1, "serial_m: several m64 sub-tiles");
  static constexpr uint32_t kAccSubTiles = kSerialM ? 1 : kNumMSub;  // m64 sub-tiles in the temporary accumulator
  // Contiguous 256-row tiles whose block holds two groups run as two 128-row half tiles. Both warpgroups work on
  // a half, one m64 sub-tile each (warpgroup w: the half's rows [64w, 64w + 64)), so neither idles while the other
  // runs both sub-tiles.
  static constexpr bool kSplitHalves = kKind == kGroupedContiguous && BLOCK_M == 256;
  static_assert(kKind != kGroupedContiguous || BLOCK_M != 256 || (kRowGroups == 2 && WG_M == 128),
                "contiguous 256-row tiles: one 128-row half per warpgroup");

  // Two wgmma accumulator sets in the whole-tile K loop (mainloop.cuh, k_loop_two_sets): one batch of wgmmas, all
  // sub-tiles, one column block, no interleaved K or stream-K pieces; the second set fits the registers up to 128
  // columns with one math warpgroup (255 registers) and 96 with two (232; contract.py, TWO_ACC_SETS_MAX_N).
  static constexpr bool kTwoAccSets = kTwoAccSets_;
  static_assert(!kTwoAccSets || (!kInterleaveK && !kStreamK && kNumNSub == 1 && kAccSubTiles == kNumMSub &&
                                 WGMMA_N <= (kNumMathWG == 1 ? 128 : 96)),
                "two accumulator sets: one unsplit wgmma batch per K block, at most 128 columns on one math "
                "warpgroup and 96 on two");

  // ---- K splits across CTAs ----
  // kSplitK > 1: each CTA sums one split of a tile's K blocks into FP32 partial sums in global memory; the last of
  // the tile's CTAs to arrive adds them and stores the tile. kStreamK: the last round's units are split along K over
  // all clusters (scheduler.cuh); their pieces meet in global memory the same way.
  static_assert(kSplitK >= 1 && kSplitK <= kNumKBlocks, "every K split needs at least one K block");
  // kSplitCluster: a tile's K splits run as one cluster (CTA rank = split) and meet in the leader's shared memory
  // instead (reduction.cuh, ClusterSplit), with no round trip through L2.
  static constexpr bool kSplitCluster = kSplitCluster_;
  static_assert(!kSplitCluster || (kSplitK == 2 && kKind == kNormal && !kMulticast && !kStreamK && kRowGroups <= 2),
                "split-K clusters: a normal GEMM's two splits, without multicast or stream-K");
  static_assert(!kStreamK || (!kInterleaveK && kSplitK == 1), "stream-K tail: one accumulator set per row group");

  // ---- B scales ----
  static constexpr uint32_t kNumSFBRows = ceil_div(SHAPE_N, kBlockK);
  // B scale blocks (128 columns) one tile touches: one when BLOCK_N divides 128; BLOCK_N / 128 when 128 divides
  // BLOCK_N (tiles start on block boundaries); otherwise a tile may straddle, touching ceil(BLOCK_N/128)+1.
  static constexpr bool kAlignedN = BLOCK_N % kBlockK == 0;
  static constexpr uint32_t kMaxSFB =
      (kBlockK % BLOCK_N == 0) ? 1 : kAlignedN ? BLOCK_N / kBlockK : ceil_div(BLOCK_N, kBlockK) + 1;
  // Straddling tiles start at n0 % 128 in steps of gcd(BLOCK_N, 128); with few such offsets the K loop is compiled
  // once per offset (code size grows by that factor), so the promotion picks each column's scale without selects.
  static constexpr uint32_t kOffsetStep = cgcd(BLOCK_N, kBlockK);
  static constexpr uint32_t kNumOffsets = kBlockK / kOffsetStep;
  static constexpr bool kSpecializeBoundary = kMaxSFB > 1 && !kAlignedN && kNumOffsets <= 8;
  static constexpr bool kRunTimeScaleSelect = kMaxSFB > 1 && !kAlignedN && !kSpecializeBoundary;
  // Whole tiles unroll the K loop 4x, so the next block's barrier wait and operand setup overlap this block's
  // promotion (ptxas hoists the wait into it). K splits, and one-warpgroup tiles that pick B scales per column at
  // run time, stay rolled: the former gain nothing measurable, the latter spill when unrolled.
  static constexpr bool kRowWarpgroups = kNumMathWG >= 2 && !kInterleaveK;
  static constexpr uint32_t kKLoopUnroll = kSplitK == 1 && (kRowWarpgroups || !kRunTimeScaleSelect) ? 4 : 1;

  // ---- operand loads ----
  // Multicast: each CTA of a 2-CTA cluster loads half of the shared tile into both CTAs' shared memory. Split-K
  // clusters hold a tile's splits instead.
  static constexpr uint32_t kCluster = kMulticast ? 2 : kSplitCluster ? kSplitK : 1;
  static constexpr uint32_t kStageSharers = kMulticast ? 2 : 1;  // CTAs whose consumers release each stage
  static_assert(kMulticast != 2 || (BLOCK_N % 16 == 0 && kKind == kNormal),
                "B multicast: halves of whole swizzle atoms");
  // A arrives in boxes of A_BOX_M rows (with A multicast, each CTA of the pair loads half of them into both).
  static constexpr uint32_t kABoxes = BLOCK_M / A_BOX_M;
  static constexpr uint32_t kABoxesPerCta = kMulticast == 1 ? kABoxes / 2 : kABoxes;
  static_assert(BLOCK_M % A_BOX_M == 0 && kABoxesPerCta >= 1, "A boxes tile BLOCK_M");
  static_assert(kMulticast != 1 || kABoxes % 2 == 0, "A multicast: each CTA of the pair loads half of the boxes");

  // ---- output staging: per math warpgroup, BLOCK_N / kSlabCols slabs of WG_M x kSlabCols BF16 ----
  static constexpr uint32_t kSlabCols = kSwizzleD == 0 ? BLOCK_N : kSwizzleD / 2;
  static constexpr uint32_t kSlabBytes = WG_M * kSlabCols * 2;
  static constexpr uint32_t kNumSlabs = BLOCK_N / kSlabCols;
  static_assert(BLOCK_N % kSlabCols == 0, "output swizzle must divide BLOCK_N");

  // ---- shared memory, in this order (cupygemm's smem_bytes adds the same parts up) ----
  static constexpr uint32_t SMEM_D = round_up(BLOCK_M * BLOCK_N * 2u, 1024u);
  static constexpr uint32_t SMEM_A = BLOCK_M * kBlockK;
  static constexpr uint32_t SMEM_B = BLOCK_N * kBlockK;
  static constexpr uint32_t SMEM_SFA = round_up(BLOCK_M * 4u, 128u);
  static constexpr uint32_t kStageTxBytesNoA = SMEM_B + BLOCK_M * 4;  // plus the A boxes loaded for the tile
  static constexpr uint32_t SMEM_HANDOFF = kInterleaveK ? BLOCK_N * 256 : 0;
  // Split-K clusters: four barriers (two per row group), then one partial tile of FP32 sums (ClusterSplit).
  static constexpr uint32_t SMEM_CLUSTER_SPLIT = kSplitCluster ? 32 + BLOCK_M * BLOCK_N * 4 : 0;
  // Side-aware: the cluster's ticket (half, index), the barrier of the page bits' load, the page bits.
  static constexpr uint32_t SMEM_SIDES = kSides ? 16 + kMaxPageWords * 4 : 0;

  // ---- L2 sides ----
  using PackedLayout = PackedB<SHAPE_N, SHAPE_K>;
  static_assert(!kSides || (!kStreamK && BLOCK_N % (kMulticast == 2 ? 16 : 8) == 0),
                "side-aware: no stream-K tail; whole swizzle rows per CTA");
  // Rows per TMA box of packed B: the largest of 32, 16, 8 dividing the rows a CTA loads, so that boxes start on
  // whole swizzle rows and never straddle a 32-row chunk (cupygemm/contract.py's side_box_rows).
  static constexpr uint32_t kSideCtaRows = kMulticast == 2 ? BLOCK_N / 2 : BLOCK_N;
  static constexpr uint32_t kSideBoxRows = kSideCtaRows % 32 == 0 ? 32 : kSideCtaRows % 16 == 0 ? 16 : 8;
  // Side-aware normal GEMMs whose B spans at most kParamPages pages take its page bits as parameters
  // (ParamPageSides); the others copy them into shared memory.
  static constexpr bool kSidePageParams =
      kSides && kKind == kNormal && PackedLayout::kMaxPagesOneGroup <= kParamPages;
  using ParamSides = ParamPageSides<kSidePageParams ? static_cast<uint32_t>(ceil_div(
                                                          PackedLayout::kMaxPagesOneGroup, uint64_t(32)))
                                                    : 1u>;
  // Half 0 of N gets the n units (n blocks, or pairs of them with A multicast) whose middle row lies in it.
  static constexpr uint32_t kUnitRows = BLOCK_N * (kMulticast == 1 ? 2 : 1);
  static constexpr uint32_t kSideUnits0 =
      cmin((PackedLayout::kRows0 + kUnitRows / 2) / kUnitRows,
           kMulticast == 1 ? ceil_div(SHAPE_N, BLOCK_N) / 2 : ceil_div(SHAPE_N, BLOCK_N));

  // The producer runs its scheduler on one thread, the math warpgroups on whole warps.
  using ProducerScheduler =
      TileScheduler<kKind, SHAPE_N, BLOCK_M, BLOCK_N, kRasterN, kMulticast, kSplitK, kStreamK, kNumKBlocks, false,
                    kSides, kSplitCluster>;
  using MathScheduler =
      TileScheduler<kKind, SHAPE_N, BLOCK_M, BLOCK_N, kRasterN, kMulticast, kSplitK, kStreamK, kNumKBlocks, true,
                    kSides, kSplitCluster>;
  // One math warpgroup's sums over a tile: [m64 sub-tile][wgmma column block][register].
  using TileAcc = float[kNumMSub][kNumNSub][kAccPerSub];
};

// Where the parts of dynamic shared memory start: the output staging tile, the pipeline's A, B and A-scale stages,
// their full/empty barriers, (interleave_k) the buffer through which warpgroup 1 hands its sums to warpgroup 0,
// (split-K clusters) the barriers and buffer of a split's partial sums, and (side-aware) the cluster's side ticket,
// the barrier of the page bits' load and the page bits of packed B.
template <class T> struct SharedStorage {
  uint8_t* d;
  uint8_t* a;
  uint8_t* b;
  float* sfa;
  uint64_t* full_bar;
  uint64_t* empty_bar;
  float* handoff;
  uint64_t* split_bar;  // [2][2 row groups]: the leader's "the partner's sums are in", the partner's "read them"
  float* split_sums;    // on the leader, the partner's partial tile: [kRowGroups][WG_M * BLOCK_N]
  uint32_t* ticket;
  uint64_t* page_bar;
  uint32_t* page_bits;

  __device__ __forceinline__ explicit SharedStorage(uint8_t* base)
      : d(base), a(base + T::SMEM_D), b(a + T::kNumStages * T::SMEM_A),
        sfa(reinterpret_cast<float*>(b + T::kNumStages * T::SMEM_B)),
        full_bar(reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(sfa) + T::kNumStages * T::SMEM_SFA)),
        empty_bar(full_bar + T::kNumStages), handoff(reinterpret_cast<float*>(empty_bar + T::kNumStages)),
        split_bar(reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(handoff) + T::SMEM_HANDOFF)),
        split_sums(reinterpret_cast<float*>(split_bar + 4)),
        ticket(reinterpret_cast<uint32_t*>(reinterpret_cast<uint8_t*>(split_bar) + T::SMEM_CLUSTER_SPLIT)),
        page_bar(reinterpret_cast<uint64_t*>(ticket + 2)), page_bits(ticket + 4) {}
};

// A math thread's place: its warpgroup, and where its accumulator registers sit in an m64 x N wgmma result
// (thread t of the warpgroup holds rows 16 * (t / 32) + (t % 32) / 4 and 8 more, two adjacent columns of every
// 8-column group).
struct MathThread {
  uint32_t warpgroup;
  uint32_t tid;           // in the warpgroup
  uint32_t lane;
  uint32_t row_in_sub;    // first row in an m64 sub-tile (+8 for the second)
  uint32_t col_in_group;  // first of the two columns in every 8-column group
  uint32_t wg_row0;       // first tile row of this warpgroup's rows (interleave_k: both start at 0)
  uint8_t* smem_d;        // this warpgroup's output staging slabs
  uint32_t barrier;       // this warpgroup's named barrier (named_barriers.cuh)

  template <class T>
  static __device__ __forceinline__ MathThread make(uint32_t warpgroup, const SharedStorage<T>& smem) {
    MathThread th;
    th.warpgroup = warpgroup;
    th.tid = threadIdx.x % 128;
    const uint32_t warp = th.tid / 32;
    th.lane = th.tid % 32;
    th.row_in_sub = warp * 16 + th.lane / 4;
    th.col_in_group = (th.lane % 4) * 2;
    th.wg_row0 = T::kInterleaveK ? 0 : warpgroup * T::WG_M;
    th.smem_d = smem.d + (T::kInterleaveK ? 0 : warpgroup) * (T::kNumSlabs * T::kSlabBytes);
    th.barrier = NamedBarrier::warpgroup(warpgroup);
    return th;
  }
};

// The rows of a tile one math warpgroup computes: its first row, and how many of its m64 sub-tiles hold valid rows
// (all of them, except in a tile reaching past the last row: the last m block, a masked group's last block).
struct WarpgroupRows {
  bool half_tile;   // a contiguous 256-row block's half (scheduler.cuh), one m64 sub-tile per warpgroup
  uint32_t row0;    // first tile row (wg_row0, but in a half tile)
  uint32_t first;   // first row in the group's rows (A, D)
  uint32_t active;  // m64 sub-tiles with valid rows; 0: the warpgroup only steps through the tile's stages

  template <class T>
  static __device__ __forceinline__ WarpgroupRows make(const Tile& tile, const MathThread& th) {
    WarpgroupRows r;
    r.half_tile = T::kSplitHalves && tile.halves != 0b11;
    r.row0 = r.half_tile ? (tile.halves == 0b10 ? 128u : 0u) + th.warpgroup * 64 : th.wg_row0;
    const uint32_t max_sub = r.half_tile ? 1 : T::kNumMSub;
    r.first = tile.m_block * T::BLOCK_M + r.row0;
    r.active = tile.rows > r.first ? cmin(max_sub, ceil_div(tile.rows - r.first, 64u)) : 0;
    return r;
  }
};

// Position in the ring of pipeline stages; the phase flips each time the ring wraps (mbarrier parity).
template <uint32_t kNumStages> struct PipelineState {
  uint32_t stage = 0, phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kNumStages) stage = 0, phase ^= 1;
  }
};

}  // namespace cupygemm
