// The 1D1D (wgrad) kernel's compile-time constants: those the host chooses (rendered from cupygemm/contract_wgrad.py
// as CUPYGEMM_* macros) and what follows from them, with the rules that tie them together as static_asserts, and
// the kernel's shared-memory layout. Both operands are scaled per 1x128 along K and the FP32 output is accumulated
// in place, so this kernel has its own traits rather than a kind inside KernelTraits; it reuses the pipeline
// position, the math thread's fragment place and the named barriers of kernel_traits.cuh.
#pragma once
#include "kernel_traits.cuh"
#include "ptx_common.cuh"

namespace cupygemm {

enum WgradKind : int { kWgradDense = 0, kWgradKGrouped = 1 };

template <int kKind_, uint32_t SHAPE_M_, uint32_t SHAPE_N_, uint32_t SHAPE_K_, uint32_t BLOCK_M_, uint32_t BLOCK_N_,
          uint32_t kNumStages_, uint32_t kNumMathWG_, uint32_t kMathRegs_, uint32_t kProducerRegs_,
          uint32_t kSwizzleD_, uint32_t kStagedSlabs_, uint32_t kRasterN_, int kMulticast_, bool kTwoAccSets_,
          bool kPingPong_ = false, bool kStore_ = false, bool kBWhole_ = false, uint32_t kDPrefetch_ = 0>
struct WgradTraits {
  static constexpr int kKind = kKind_;
  static constexpr bool kKGrouped = kKind == kWgradKGrouped;
  // Dense: N and K are compile-time (the K loop has constant bounds), M is a launch argument. K-grouped: M and N are
  // compile-time (every group has the same D shape), each group's K comes from the device at run time.
  static constexpr uint32_t SHAPE_M = SHAPE_M_, SHAPE_N = SHAPE_N_, SHAPE_K = SHAPE_K_;
  static constexpr uint32_t BLOCK_M = BLOCK_M_, BLOCK_N = BLOCK_N_, kNumStages = kNumStages_;
  static constexpr uint32_t kNumMathWG = kNumMathWG_, kMathRegs = kMathRegs_, kProducerRegs = kProducerRegs_;
  static constexpr uint32_t kSwizzleD = kSwizzleD_, kStagedSlabs = kStagedSlabs_, kRasterN = kRasterN_;
  static constexpr int kMulticast = kMulticast_;
  static constexpr bool kTwoAccSets = kTwoAccSets_;
  // Ping-pong: the two math warpgroups take turns issuing each K block's wgmmas (mainloop_1d1d.cuh), so the tensor
  // cores run them one after the other and each warpgroup promotes while the other's wgmmas run.
  static constexpr bool kPingPong = kPingPong_;
  static_assert(!kPingPong || (kNumMathWG_ == 2 && !kTwoAccSets_), "ping-pong: two math warpgroups, one set each");
  // Store: D = A B^T, the epilogue's TMA stores replacing its reduce-adds, so D needs no zeros first (a fresh
  // gradient). Dense only: a k-grouped group without tokens writes nothing, which only accumulation makes right.
  static constexpr bool kStore = kStore_;
  static_assert(!kStore || !kKGrouped, "store: dense only");
  static_assert(kKGrouped ? (SHAPE_M > 0 && SHAPE_K == 0) : (SHAPE_M == 0 && SHAPE_K > 0),
                "dense: SHAPE_K given, M at run time; k-grouped: SHAPE_M given, K per group at run time");

  // ---- threads: the math warpgroups, then the producer warpgroup ----
  static constexpr uint32_t kNumMathThreads = kNumMathWG * 128;
  static_assert(kNumMathWG == 1 || kNumMathWG == 2, "one or two math warpgroups");
  static_assert(kNumMathWG == 1 || kProducerRegs * 128 + kMathRegs * kNumMathThreads <= 64 * 1024,
                "setmaxnreg budget exceeds the register file");

  // ---- the math warpgroup's tile: 64 rows (one m64 wgmma row block), all BLOCK_N columns in one wgmma batch ----
  // Per thread: BLOCK_N / 2 sums, BLOCK_N / 2 wgmma accumulators (twice with two sets), BLOCK_N / 4 B scales.
  static constexpr uint32_t WG_M = BLOCK_M / kNumMathWG;
  static_assert(WG_M == 64, "each math warpgroup owns 64 rows");
  static_assert(BLOCK_N % 8 == 0 && BLOCK_N >= 16 && BLOCK_N <= 256, "BLOCK_N: a multiple of 8 up to 256");
  static constexpr uint32_t kAcc = BLOCK_N / 2;
  static constexpr uint32_t kNumNGroups = BLOCK_N / 8;  // 8-column groups: one float2 of B scales each
  static constexpr uint32_t kNumKBlocks = ceil_div(SHAPE_K, kBlockK);  // dense
  static constexpr uint32_t kNumMBlocksGrouped = ceil_div(SHAPE_M, BLOCK_M);  // k-grouped
  static constexpr uint32_t kNumNBlocks = ceil_div(SHAPE_N, BLOCK_N);

  // ---- operand loads ----
  // Multicast: 1 = 2-CTA clusters on neighbouring n blocks, each CTA loads half of the A tile into both; 2 = on
  // neighbouring m blocks, sharing B halves. Dense: a pair whose second block lies past the last one still runs it
  // (the peer needs its half of the shared operand), loading its own operand from the last block and storing
  // nothing, so odd block counts stay correct (the host pairs even counts only: the extra tile is waste).
  // K-grouped: even counts only, so that both tiles of a pair are real and in the same group (the same K, the same
  // maps): a group's tiles are whole pairs.
  static_assert(kMulticast >= 0 && kMulticast <= 2, "multicast: 0, 1 (share A) or 2 (share B)");
  static_assert(!kKGrouped || kMulticast != 1 || kNumNBlocks % 2 == 0, "k-grouped A multicast: even n blocks");
  static_assert(!kKGrouped || kMulticast != 2 || kNumMBlocksGrouped % 2 == 0, "k-grouped B multicast: even m blocks");
  static constexpr uint32_t kCluster = kMulticast ? 2 : 1;
  static constexpr uint32_t A_BOX_M = kMulticast == 1 ? BLOCK_M / 2 : BLOCK_M;
  // Whole-B multicast: the pair's first CTA loads the whole B tile into both (widths of 8 mod 16, whose halves are
  // not whole swizzle atoms).
  static constexpr bool kBWhole = kBWhole_;
  static_assert(!kBWhole || kMulticast == 2, "whole-B multicast: with B multicast");
  static constexpr uint32_t B_BOX_N = kMulticast == 2 && !kBWhole ? BLOCK_N / 2 : BLOCK_N;
  // B tiles are 128-byte swizzled in 8-row atoms: a multicast half must be whole atoms.
  static_assert(kMulticast != 2 || kBWhole || BLOCK_N % 16 == 0, "B multicast: halves of whole swizzle atoms");

  // ---- FP32 output staging: per math warpgroup, kStagedSlabs slabs of 64 rows x kSlabCols floats ----
  // A slab is one TMA reduce box; its rows are kSwizzleD bytes, swizzled as the D map says. BLOCK_N / kSlabCols
  // slabs make the tile; with fewer staged slabs than that the epilogue reuses them in rounds (less shared memory
  // for stages, a wait for the previous round's reads). kSwizzleD == 0: one unswizzled slab the tile's width, for
  // widths of 8 mod 16 (136, 152) that no 64- or 128-byte span divides: rows of BLOCK_N floats start 8 banks apart
  // (mod 32), so a warp's 8-byte stores (8 rows x 4 lanes) still take the minimum two wavefronts, and the tile goes
  // out in one reduce instead of BLOCK_N / 8.
  static_assert(kSwizzleD == 128 || kSwizzleD == 64 || kSwizzleD == 32 || kSwizzleD == 0,
                "D staging rows: a swizzle span, or 0 (unswizzled)");
  static constexpr uint32_t kSlabCols = kSwizzleD == 0 ? BLOCK_N : kSwizzleD / 4;
  static_assert(kSwizzleD != 0 || BLOCK_N % 4 == 0, "unswizzled D rows: whole 16-byte units (a TMA box row)");
  static_assert(BLOCK_N % kSlabCols == 0, "D slabs tile BLOCK_N (a partial slab would add into the next tile)");
  static constexpr uint32_t kNumSlabs = BLOCK_N / kSlabCols;
  static_assert(kStagedSlabs >= 1 && kStagedSlabs <= kNumSlabs, "staged slabs: 1 .. BLOCK_N / slab columns");
  static constexpr uint32_t kSlabRowBytes = kSlabCols * 4;
  static constexpr uint32_t kSlabBytes = WG_M * kSlabRowBytes;
  static constexpr uint32_t kRounds = ceil_div(kNumSlabs, kStagedSlabs);
  // D prefetch: kDPrefetch K blocks before a tile's K loop ends, the producer prefetches the tile's D into L2, so that
  // the epilogue's reduce-adds find it there instead of reading DRAM after the K loop (0: off).
  static constexpr uint32_t kDPrefetch = kDPrefetch_;
  static_assert(kDPrefetch == 0 || !kStore, "D prefetch: accumulating kernels (the storing one reads no D)");

  // ---- shared memory, in this order (cupygemm/contract_wgrad.py smem_bytes adds the same parts up) ----
  static constexpr uint32_t SMEM_D = round_up(kNumMathWG * kStagedSlabs * kSlabBytes, 1024u);
  static constexpr uint32_t SMEM_A = BLOCK_M * kBlockK;
  static constexpr uint32_t SMEM_B = BLOCK_N * kBlockK;
  static constexpr uint32_t SMEM_SFA = round_up(BLOCK_M * 4u, 128u);
  static constexpr uint32_t SMEM_SFB = round_up(BLOCK_N * 4u, 128u);
  static_assert(SMEM_A % 1024 == 0 && SMEM_B % 1024 == 0, "stages keep the 1024-byte swizzle-atom alignment");
  // Every box counts whole towards the stage's transaction bytes, zero-filled rows past the tensor included.
  static constexpr uint32_t kStageTxBytes = SMEM_A + SMEM_B + BLOCK_M * 4 + BLOCK_N * 4;

  // ---- the K loop ----
  // Dense tiles run the K loop over compile-time bounds, unrolled so that the next block's barrier wait and
  // operand setup overlap this block's promotion. K-grouped tiles run their group's K blocks (a run-time count) in
  // chunks of kNumStages blocks that start on stage 0 (mainloop_1d1d.cuh, k_loop_aligned): on 128-row tiles of
  // up to 4 stages (those measured; a chunk is that many blocks unrolled, and 64x160 on 6 stages spills) 6-8 %
  // faster on the 7168x4096 groups than unrolled twice, while dense tiles ran 1-3 % slower that way
  // (benchmarks/NOTES.md, "Weight-gradient kernel"). Other k-grouped tiles: unrolled twice (with a remainder).
  static constexpr uint32_t kKLoopUnroll = kKGrouped ? 2 : 4;
  static constexpr bool kAlignedKLoop = kKGrouped && kNumMathWG == 2 && kNumStages <= 4 && !kTwoAccSets &&
                                        !kPingPong;
  // Two accumulator sets: block j + 1's wgmmas run while block j is promoted. A one-warpgroup tile needs it to keep
  // the tensor cores busy; with two warpgroups the other warpgroup's wgmmas fill the promotion. The second set
  // costs BLOCK_N / 2 registers: up to 128 columns with one math warpgroup (255 registers), 96 with two (232).
  static_assert(!kTwoAccSets || BLOCK_N <= (kNumMathWG == 1 ? 128u : 96u),
                "two accumulator sets: at most 128 columns on one math warpgroup, 96 on two");
  // Block j + 1's stage must fill while block j's is still held.
  static_assert(!kTwoAccSets || kNumStages >= 2, "two accumulator sets: at least two stages");
};

// Where the parts of dynamic shared memory start: the FP32 output staging slabs, the pipeline's A, B, A-scale and
// B-scale stages, then the stages' full and empty barriers.
template <class T> struct WgradSmem {
  uint8_t* d;
  uint8_t* a;
  uint8_t* b;
  float* sfa;
  float* sfb;
  uint64_t* full_bar;
  uint64_t* empty_bar;

  __device__ __forceinline__ explicit WgradSmem(uint8_t* base)
      : d(base), a(base + T::SMEM_D), b(a + T::kNumStages * T::SMEM_A),
        sfa(reinterpret_cast<float*>(b + T::kNumStages * T::SMEM_B)),
        sfb(reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(sfa) + T::kNumStages * T::SMEM_SFA)),
        full_bar(reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(sfb) + T::kNumStages * T::SMEM_SFB)),
        empty_bar(full_bar + T::kNumStages) {}
};

// A math thread's place (kernel_traits.cuh, MathThread) in this kernel's layout: its warpgroup's 64 rows and its
// staging slabs.
template <class T>
__device__ __forceinline__ MathThread make_wgrad_thread(uint32_t warpgroup, const WgradSmem<T>& smem) {
  MathThread th;
  th.warpgroup = warpgroup;
  th.tid = threadIdx.x % 128;
  th.lane = th.tid % 32;
  th.row_in_sub = (th.tid / 32) * 16 + th.lane / 4;
  th.col_in_group = (th.lane % 4) * 2;
  th.wg_row0 = warpgroup * T::WG_M;
  th.smem_d = smem.d + warpgroup * (T::kStagedSlabs * T::kSlabBytes);
  th.barrier = NamedBarrier::warpgroup(warpgroup);
  return th;
}

}  // namespace cupygemm
