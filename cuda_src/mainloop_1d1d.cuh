// The wgrad kernel's K loop (1D1D scaling): per K block, wait for the stage, issue the warpgroup's FP8 wgmmas (64
// rows x BLOCK_N, four k32 steps) into a temporary accumulator, and promote the result on the CUDA cores into the
// tile's FP32 sums: out[r][c] += (sa[r] * sb[c]) * acc[r][c], with A's scale per row and B's per column (both per
// 128 of K, from the stage's scale boxes). Each sum costs an FMUL and an FFMA per K block, against the forward
// kernel's FFMA: the scales differ per element. The per-column B scales are read from shared memory as one float2
// per 8-column group (the thread's two columns): the four lanes of a row group read 32 contiguous bytes and the
// other lanes the same ones (broadcast), so the reads are conflict-free.
#pragma once
#include "ptx_mbarrier.cuh"
#include "ptx_wgmma.cuh"
#include "wgrad_traits.cuh"

namespace cupygemm {

template <class T> struct Mainloop1D1D {
  using Acc = float[T::kAcc];    // one wgmma batch's result, before promotion
  using Sums = float[T::kAcc];   // the tile's FP32 sums (this thread's part)
  using BScales = float2[T::kNumNGroups];
  WgradSmem<T> smem;
  MathThread th;
  uint64_t desc_a0, desc_b0;  // stage 0's operand descriptors for this warpgroup's rows
  PipelineState<T::kNumStages> pipe;
  bool turn_passed = false;  // ping-pong: warpgroup 0 has issued a block (so it waits for its turn from now on)

  __device__ __forceinline__ Mainloop1D1D(const WgradSmem<T>& smem_, const MathThread& th_)
      : smem(smem_), th(th_), desc_a0(make_smem_desc_k128_sw128(smem_.a + th_.wg_row0 * kBlockK)),
        desc_b0(make_smem_desc_k128_sw128(smem_.b)) {}

  static __device__ __forceinline__ void clear(Sums& out) {
#pragma unroll
    for (uint32_t j = 0; j < T::kAcc; ++j) out[j] = 0.f;
  }

  // Sums the tile's `num_kb` K blocks into `out` (dense: the compile-time count).
  __device__ __forceinline__ void run(Sums& out, Acc& acc, uint32_t num_kb) {
    const uint32_t n = T::kKGrouped ? num_kb : T::kNumKBlocks;
    if constexpr (T::kTwoAccSets)
      k_loop_two_sets(out, acc, n);
    else if constexpr (T::kAlignedKLoop)
      k_loop_aligned(out, acc, n);
    else
      k_loop(out, acc, n);
  }

  // One K block on stage s of the given phase (one accumulator set): the stage goes back to the producer as soon
  // as the wgmmas are done and both scales are in registers.
  __device__ __forceinline__ void block(Sums& out, Acc& acc, uint32_t s, uint32_t phase) {
    mbarrier_wait(&smem.full_bar[s], phase);
    wait_turn();
    issue(acc, s);
    pass_turn();
    const float2 sa = load_sfa(s);
    BScales sb;
    load_sfb(sb, s);
    wgmma_wait<0>();
    settle(acc);
    release(s);
    promote(out, acc, sa, sb);
  }

  // The K loop in chunks of kNumStages blocks that start on stage 0, singly before the first such block and after
  // the last chunk: inside a chunk each block's stage is a compile-time constant, so its barrier addresses,
  // descriptors and scale offsets are too. A run-time stage and trip count cost a k-grouped block 215 instructions
  // (NVRTC 13.0, 128x152), against 198 in the dense loop and 191-201 here.
  __device__ void k_loop_aligned(Sums& out, Acc& acc, uint32_t num_kb) {
    uint32_t kb = 0;
#pragma unroll 1
    for (; kb < num_kb && pipe.stage != 0; ++kb) {
      block(out, acc, pipe.stage, pipe.phase);
      pipe.advance();
    }
#pragma unroll 1
    for (; kb + T::kNumStages <= num_kb; kb += T::kNumStages) {
      static_for<0, T::kNumStages>([&](auto J) { block(out, acc, decltype(J)::value, pipe.phase); });
      pipe.phase ^= 1;
    }
#pragma unroll 1
    for (; kb < num_kb; ++kb) {
      block(out, acc, pipe.stage, pipe.phase);
      pipe.advance();
    }
  }

  // One accumulator set (dense, and k-grouped where k_loop_aligned is not taken): the other math warpgroup's
  // wgmmas keep the tensor cores busy while this one promotes.
  __device__ void k_loop(Sums& out, Acc& acc, uint32_t num_kb) {
#pragma unroll T::kKLoopUnroll
    for (uint32_t kb = 0; kb < num_kb; ++kb) {
      block(out, acc, pipe.stage, pipe.phase);
      pipe.advance();
    }
  }

  // Ping-pong turns (T::kPingPong): warpgroup 0 issues block j, then warpgroup 1 issues block j, then warpgroup 0
  // block j + 1, ... Each waits for its turn (bar.sync over both warpgroups: its own threads and the other's
  // arrival) and hands it over after issuing (bar.arrive). The tensor cores run the batches in issue order, so one
  // warpgroup's promotion overlaps the other's wgmmas instead of both promoting while the tensor cores idle.
  // Warpgroup 0's first block has no turn to wait for; its hand-overs then pair with warpgroup 1's, and finish()
  // takes warpgroup 1's last one, so no arrival is left pending at exit.
  __device__ __forceinline__ void wait_turn() {
    if constexpr (T::kPingPong) {
      if (th.warpgroup == 1 || turn_passed) named_barrier_sync(NamedBarrier::turn(th.warpgroup), 256);
      turn_passed = true;
    }
  }
  __device__ __forceinline__ void pass_turn() const {
    if constexpr (T::kPingPong) named_barrier_arrive(NamedBarrier::turn(th.warpgroup ^ 1), 256);
  }
  __device__ __forceinline__ void finish() {
    if constexpr (T::kPingPong) {
      if (th.warpgroup == 0 && turn_passed) named_barrier_sync(NamedBarrier::turn(0), 256);
    }
  }

  // Two accumulator sets: K block j + 1's wgmmas are in flight (wgmma_wait<1>) while block j is promoted, in chunks
  // of kTwoSetsChunk blocks whose last one drains. Block j's B scales are read after block j + 1's wgmmas are
  // issued, so only one block's scales are held at a time. The blocks are promoted in order, as in k_loop: the
  // sums are the same bit for bit.
  static constexpr uint32_t kTwoSetsChunk = 4;
  template <uint32_t J> static __device__ __forceinline__ Acc& set_of(Acc& a0, Acc& a1) {
    if constexpr (J % 2 == 0) return a0; else return a1;
  }
  __device__ void k_loop_two_sets(Sums& out, Acc& acc0, uint32_t num_kb) {
    Acc acc1;
    uint32_t kb = 0;
#pragma unroll 1
    for (; kb + kTwoSetsChunk <= num_kb; kb += kTwoSetsChunk) {
      float2 sa[kTwoSetsChunk];
      uint32_t st[kTwoSetsChunk];
      static_for<0, kTwoSetsChunk>([&](auto J) {
        constexpr uint32_t j = decltype(J)::value;
        st[j] = pipe.stage;
        mbarrier_wait(&smem.full_bar[st[j]], pipe.phase);
        issue(set_of<j>(acc0, acc1), st[j]);
        sa[j] = load_sfa(st[j]);
        pipe.advance();
        if constexpr (j > 0) drain_one<1>(out, set_of<j - 1>(acc0, acc1), sa[j - 1], st[j - 1]);
      });
      drain_one<0>(out, set_of<kTwoSetsChunk - 1>(acc0, acc1), sa[kTwoSetsChunk - 1], st[kTwoSetsChunk - 1]);
    }
#pragma unroll 1
    for (; kb < num_kb; ++kb) {
      const uint32_t s = pipe.stage;
      mbarrier_wait(&smem.full_bar[s], pipe.phase);
      issue(acc0, s);
      const float2 sa = load_sfa(s);
      pipe.advance();
      drain_one<0>(out, acc0, sa, s);
    }
  }

  // Waits until at most kInFlight wgmma batches are pending (the oldest one, `acc`, is done), then promotes it.
  template <int kInFlight>
  __device__ __forceinline__ void drain_one(Sums& out, Acc& acc, const float2& sa, uint32_t s) {
    BScales sb;
    load_sfb(sb, s);
    wgmma_wait<kInFlight>();
    settle(acc);
    release(s);
    promote(out, acc, sa, sb);
  }

  // This thread's two rows' A scales (rows r and r + 8 of its warpgroup's 64).
  __device__ __forceinline__ float2 load_sfa(uint32_t s) const {
    const float* sfa = smem.sfa + s * (T::SMEM_SFA / 4) + th.wg_row0 + th.row_in_sub;
    return make_float2(sfa[0], sfa[8]);
  }

  // This thread's B scales: columns g * 8 + col_in_group and the next, for every 8-column group g.
  __device__ __forceinline__ void load_sfb(BScales& sb, uint32_t s) const {
    const float2* sfb = reinterpret_cast<const float2*>(smem.sfb + s * (T::SMEM_SFB / 4) + th.col_in_group);
#pragma unroll
    for (uint32_t g = 0; g < T::kNumNGroups; ++g) sb[g] = sfb[g * 4];
  }

  // The warpgroup's wgmmas of one K block: 64 rows x BLOCK_N, four k32 steps. Descriptors are stage 0's plus
  // compile-time offsets (the 14-bit address field never carries: shared memory < 256 KB).
  __device__ __forceinline__ void issue(Acc& acc, uint32_t s) {
    const uint64_t da = desc_a0 + s * (T::SMEM_A / 16);
    const uint64_t db = desc_b0 + s * (T::SMEM_B / 16);
    wgmma_fence();
#pragma unroll
    for (uint32_t k32 = 0; k32 < kBlockK / 32; ++k32)
      WgmmaFP8<T::BLOCK_N>::mma(da + k32 * 2, db + k32 * 2, acc, k32 > 0);
    wgmma_commit();
  }

  // After the wgmma wait: the accumulators are read only from here on.
  __device__ __forceinline__ void settle(Acc& acc) {
#pragma unroll
    for (uint32_t j = 0; j < T::kAcc; ++j) fence_operand(acc[j]);
  }

  // Promotion on the CUDA cores. Register j of an 8-column group g holds row r (j < 2) or r + 8 (j >= 2), column
  // g * 8 + col_in_group + (j & 1).
  __device__ __forceinline__ void promote(Sums& out, const Acc& acc, const float2& sa, const BScales& sb) const {
#pragma unroll
    for (uint32_t g = 0; g < T::kNumNGroups; ++g) {
      out[g * 4 + 0] += (sa.x * sb[g].x) * acc[g * 4 + 0];
      out[g * 4 + 1] += (sa.x * sb[g].y) * acc[g * 4 + 1];
      out[g * 4 + 2] += (sa.y * sb[g].x) * acc[g * 4 + 2];
      out[g * 4 + 3] += (sa.y * sb[g].y) * acc[g * 4 + 3];
    }
  }

  // Hands the stage back to the producer(s): one arrival per warp (multicast: on both CTAs' barriers, since both
  // producers wrote into it). The __syncwarp orders every lane's reads of the stage's scales before lane 0's arrival.
  __device__ __forceinline__ void release(uint32_t s) const {
    __syncwarp();
    if constexpr (T::kCluster > 1) {
      if (th.lane < T::kCluster) mbarrier_arrive_cluster(&smem.empty_bar[s], th.lane);
    } else {
      if (th.lane == 0) mbarrier_arrive(&smem.empty_bar[s]);
    }
  }
};

}  // namespace cupygemm
