// The math warpgroups' K loop: per K block, wait for the stage, issue the FP8 wgmmas of every m64 sub-tile and
// wgmma column block into a temporary accumulator, and promote each result on the CUDA cores into the tile's FP32
// sums with the block's A (per row) and B (per 128 columns) scales. The promotion every 128 of K is what keeps FP8
// accuracy (the tensor cores' accumulation is narrower than FP32), and it is where a tile's cost beyond the MMAs is.
#pragma once
#include "kernel_traits.cuh"
#include "ptx_mbarrier.cuh"
#include "ptx_wgmma.cuh"

namespace cupygemm {

// Scales of one K block: A per row this thread owns, B per 128-column block the tile touches.
template <class T> struct Scales {
  float a[T::kNumMSub][2];
  float b[T::kMaxSFB];
};

// Where a tile's B scales are: one row of per-K-block scales per 128-column block the tile touches.
template <class T> struct BScaleRows {
  const float* row[T::kMaxSFB];

  __device__ __forceinline__ BScaleRows(const float* sfb, const Tile& tile, uint32_t n0) {
    const uint32_t b_group = T::kKind == kNormal ? 0 : tile.group;
    const float* sfb_tile = sfb + (b_group * T::kNumSFBRows) * T::kNumKBlocks;
#pragma unroll
    for (uint32_t i = 0; i < T::kMaxSFB; ++i)
      row[i] = sfb_tile + cmin(n0 / kBlockK + i, T::kNumSFBRows - 1) * T::kNumKBlocks;
  }
  __device__ void load(Scales<T>& sc, uint32_t kb) const {
#pragma unroll
    for (uint32_t i = 0; i < T::kMaxSFB; ++i) sc.b[i] = __ldg(row[i] + kb);
  }
};

// One math warpgroup's pipeline position and operand descriptors, and the steps of its K loops. The steps are plain
// device functions: NVRTC inlines them all (the SASS has no calls). The accumulators are the caller's arrays, not
// members: an array member indexed in a loop keeps the whole object in memory through NVRTC's early passes, and with
// it the shared-memory pointers, which then stay generic (64-bit) addresses.
template <class T> struct Mainloop {
  using Acc = float[T::kAccSubTiles][T::kAccPerSub];  // one wgmma batch's result, before promotion
  SharedStorage<T> smem;
  MathThread th;
  uint64_t desc_a0, desc_b0;  // stage 0's operand descriptors for this warpgroup's rows
  PipelineState<T::kNumStages> pipe;

  __device__ __forceinline__ Mainloop(const SharedStorage<T>& smem_, const MathThread& th_)
      : smem(smem_), th(th_), desc_a0(make_smem_desc_k128_sw128(smem_.a + th_.wg_row0 * kBlockK)),
        desc_b0(make_smem_desc_k128_sw128(smem_.b)) {}

  static __device__ __forceinline__ void clear(typename T::TileAcc& out) {
#pragma unroll
    for (uint32_t ms = 0; ms < T::kNumMSub; ++ms)
#pragma unroll
      for (uint32_t ns = 0; ns < T::kNumNSub; ++ns)
#pragma unroll
        for (uint32_t j = 0; j < T::kAccPerSub; ++j) out[ms][ns][j] = 0.f;
  }

  // A tile with nothing for this warpgroup to compute: keep the stage count only.
  __device__ __forceinline__ void skip(const Tile& tile) {
#pragma unroll 1
    for (uint32_t kb = tile.k_begin; kb < tile.k_end; ++kb) {
      mbarrier_wait(&smem.full_bar[pipe.stage], pipe.phase);
      release(pipe.stage);
      advance();
    }
  }

  // Sums the tile's K blocks [tile.k_begin, tile.k_end) into `out`, through the wgmma accumulator `acc`. `n0`:
  // the tile's first column; `boundary`: the tile column where the B scale block changes; `piece`: a stream-K tail
  // piece (run-time K bounds); `cur`, `next`: the scales of the K block being promoted and of the one after it.
  // (`boundary` goes by reference: passed by value, NVRTC computes the B scale addresses once per K loop variant.)
  __device__ __forceinline__ void run(typename T::TileAcc& out, Acc& acc, const Tile& tile, uint32_t n0,
                                      const WarpgroupRows& rows, const BScaleRows<T>& sfb, const uint32_t& boundary,
                                      bool piece, Scales<T>& cur, Scales<T>& next) {
    const uint32_t kb0 = tile.k_begin + (T::kInterleaveK ? th.warpgroup : 0);
    if (kb0 < tile.k_end) sfb.load(next, kb0);
    if ((T::kNumMSub > 1 && !T::kInterleaveK && rows.active < T::kNumMSub) || piece) {
      k_loop_partial(out, acc, tile, rows, sfb, boundary, cur, next);
    } else if constexpr (T::kSpecializeBoundary) {
      dispatch_uconst<0, T::kNumOffsets>((n0 % kBlockK) / T::kOffsetStep,
                                         KLoopCase{*this, out, acc, tile, sfb, boundary, cur, next});
    } else {
      k_loop(out, acc, tile, sfb, boundary, cur, next, UConst<0>{});
    }
  }

  // k_loop for a boundary offset known at compile time (dispatch_uconst's callee).
  struct KLoopCase {
    Mainloop& m;
    typename T::TileAcc& out;
    Acc& acc;
    const Tile& tile;
    const BScaleRows<T>& sfb;
    uint32_t boundary;
    Scales<T>& cur;
    Scales<T>& next;
    template <uint32_t kOffset> __device__ __forceinline__ void operator()(UConst<kOffset> c) const {
      m.k_loop(out, acc, tile, sfb, boundary, cur, next, c);
    }
  };

  // The K loop of whole tiles (and K splits), over compile-time bounds where the tile is whole. Where a tile
  // straddles 128-column scale blocks at one of a few offsets, the boundary is a compile-time constant per copy.
  // interleave_k: this warpgroup's blocks are every other one from its own (a loop without per-block branches, so
  // it unrolls); the stage count still steps over the other warpgroup's blocks.
  template <uint32_t kOffset>
  __device__ void k_loop(typename T::TileAcc& out, Acc& acc, const Tile& tile, const BScaleRows<T>& sfb,
                         uint32_t tile_boundary, Scales<T>& cur, Scales<T>& next, UConst<kOffset>) {
    constexpr uint32_t kStep = T::kInterleaveK ? 2 : 1;
    const uint32_t boundary = T::kSpecializeBoundary ? kBlockK - kOffset * T::kOffsetStep : tile_boundary;
    const uint32_t lo = T::kSplitK == 1 ? 0u : tile.k_begin, hi = T::kSplitK == 1 ? T::kNumKBlocks : tile.k_end;
    if constexpr (T::kTwoAccSets) {
      k_loop_two_sets(out, acc, lo, hi, sfb, boundary, next);
      return;
    }
    if (T::kInterleaveK && th.warpgroup == 1) advance();
#pragma unroll T::kKLoopUnroll
    for (uint32_t kb = lo + (T::kInterleaveK ? th.warpgroup : 0); kb < hi; kb += kStep) {
      cur = next;
      if (kb + kStep < hi) sfb.load(next, kb + kStep);  // prefetch: the latency hides behind this block
      wait_stage(cur, pipe.stage, pipe.phase, th.wg_row0, T::kNumMSub);
#pragma unroll
      for (uint32_t ns = 0; ns < T::kNumNSub; ++ns)
#pragma unroll
        for (uint32_t ms = 0; ms < T::kNumMSub; ms += T::kAccSubTiles) {
          issue(acc, pipe.stage, ns, ms, ms + T::kAccSubTiles);
          wgmma_wait<0>();
          settle(acc);
          if (ns == T::kNumNSub - 1 && ms + T::kAccSubTiles == T::kNumMSub) release(pipe.stage);  // stage consumed
          promote(out, acc, cur, ns, ms, ms + T::kAccSubTiles, boundary);
        }
      advance();
      if (T::kInterleaveK && kb + 1 < hi) advance();
    }
  }

  // k_loop on two accumulator sets (kTwoAccSets): K block j + 1's wgmmas run while block j is promoted (one batch
  // stays in flight: wgmma_wait<1>), in chunks of kTwoSetsChunk blocks whose last one drains. The blocks are promoted
  // in the same order as k_loop's, so the sums are the same bit for bit. Where a warpgroup's chain of issue, wait and
  // promotion per K block bounds the tile (128-row split-K clusters: benchmarks/NOTES.md, "Two accumulator sets").
  static constexpr uint32_t kTwoSetsChunk = 4;
  template <uint32_t J> static __device__ __forceinline__ Acc& set_of(Acc& a0, Acc& a1) {
    if constexpr (J % 2 == 0) return a0; else return a1;
  }
  __device__ void k_loop_two_sets(typename T::TileAcc& out, Acc& acc0, uint32_t lo, uint32_t hi,
                                  const BScaleRows<T>& sfb, uint32_t boundary, Scales<T>& next) {
    Acc acc1;
    uint32_t kb = lo;
#pragma unroll 1
    for (; kb + kTwoSetsChunk <= hi; kb += kTwoSetsChunk) {
      Scales<T> sc[kTwoSetsChunk];
      uint32_t st[kTwoSetsChunk];
      static_for<0, kTwoSetsChunk>([&](auto J) {
        constexpr uint32_t j = decltype(J)::value;
        sc[j] = next;
        if (kb + j + 1 < hi) sfb.load(next, kb + j + 1);
        wait_stage(sc[j], pipe.stage, pipe.phase, th.wg_row0, T::kNumMSub);
        st[j] = pipe.stage;
        issue(set_of<j>(acc0, acc1), pipe.stage, 0, 0, T::kAccSubTiles);
        advance();
        if constexpr (j > 0) {
          wgmma_wait<1>();
          settle(set_of<j - 1>(acc0, acc1));
          release(st[j - 1]);
          promote(out, set_of<j - 1>(acc0, acc1), sc[j - 1], 0, 0, T::kAccSubTiles, boundary);
        }
      });
      wgmma_wait<0>();
      settle(set_of<kTwoSetsChunk - 1>(acc0, acc1));
      release(st[kTwoSetsChunk - 1]);
      promote(out, set_of<kTwoSetsChunk - 1>(acc0, acc1), sc[kTwoSetsChunk - 1], 0, 0, T::kAccSubTiles, boundary);
    }
#pragma unroll 1
    for (; kb < hi; ++kb) {
      Scales<T> c = next;
      if (kb + 1 < hi) sfb.load(next, kb + 1);
      wait_stage(c, pipe.stage, pipe.phase, th.wg_row0, T::kNumMSub);
      issue(acc0, pipe.stage, 0, 0, T::kAccSubTiles);
      wgmma_wait<0>();
      settle(acc0);
      release(pipe.stage);
      promote(out, acc0, c, 0, 0, T::kAccSubTiles, boundary);
      advance();
    }
  }

  // The K loop of a warpgroup with some of its m64 sub-tiles past the valid rows (only the first rows.active are
  // issued and promoted), of stream-K tail pieces (run-time K bounds) and of contiguous half tiles (the
  // warpgroup's rows moved by row0 - wg_row0). One copy, neither unrolled nor specialized per boundary: at most one
  // m block per group and the last round's pieces take it.
  __device__ void k_loop_partial(typename T::TileAcc& out, Acc& acc, const Tile& tile, const WarpgroupRows& rows,
                                 const BScaleRows<T>& sfb, const uint32_t& boundary, Scales<T>& cur,
                                 Scales<T>& next) {
    const uint32_t sub_tiles = rows.active;
    const uint64_t a_shift = (static_cast<uint64_t>(rows.row0) - th.wg_row0) * (kBlockK / 16);  // may wrap: moves up
#pragma unroll 1
    for (uint32_t kb = tile.k_begin; kb < tile.k_end; ++kb) {
      cur = next;
      if (kb + 1 < tile.k_end) sfb.load(next, kb + 1);
      wait_stage(cur, pipe.stage, pipe.phase, rows.row0, sub_tiles);
#pragma unroll
      for (uint32_t ns = 0; ns < T::kNumNSub; ++ns)
#pragma unroll
        for (uint32_t ms = 0; ms < T::kNumMSub; ms += T::kAccSubTiles) {
          if (ms >= sub_tiles) break;
          const uint32_t hi = cmin(ms + T::kAccSubTiles, sub_tiles);
          issue(acc, pipe.stage, ns, ms, hi, a_shift);
          wgmma_wait<0>();
          settle(acc);
          if (ns == T::kNumNSub - 1 && hi == sub_tiles) release(pipe.stage);
          promote(out, acc, cur, ns, ms, hi, boundary);
        }
      advance();
    }
  }

  // Waits for the stage's TMA data, then reads this thread's A scales from it: `sub_tiles` m64 sub-tiles from tile
  // row `row0`.
  __device__ void wait_stage(Scales<T>& sc, uint32_t s, uint32_t ph, uint32_t row0, uint32_t sub_tiles) const {
    mbarrier_wait(&smem.full_bar[s], ph);
    const float* sfa = smem.sfa + s * (T::SMEM_SFA / 4) + row0;
#pragma unroll
    for (uint32_t ms = 0; ms < T::kNumMSub; ++ms) {
      if (T::kSplitHalves && ms >= sub_tiles) break;  // a moved sub-tile's successor may lie past the stage's rows
      sc.a[ms][0] = sfa[ms * 64 + th.row_in_sub];
      sc.a[ms][1] = sfa[ms * 64 + th.row_in_sub + 8];
    }
  }

  // Issues the wgmmas of m64 sub-tiles [ms_lo, ms_hi) (sub-tile ms accumulates into acc[ms - ms_lo]). Descriptors
  // are stage 0's plus compile-time offsets: the 14-bit address field never carries (shared memory < 256 KB).
  // `a_shift`: descriptor units (16 bytes) added to A's address, for a contiguous half tile's moved rows.
  __device__ void issue(Acc& acc, uint32_t s, uint32_t ns, uint32_t ms_lo, uint32_t ms_hi, uint64_t a_shift = 0) {
    const uint64_t da = desc_a0 + a_shift + s * (T::SMEM_A / 16);
    const uint64_t db = desc_b0 + (s * T::SMEM_B + ns * T::WGMMA_N * kBlockK) / 16;
    wgmma_fence();
#pragma unroll
    for (uint32_t k32 = 0; k32 < kBlockK / 32; ++k32)
#pragma unroll
      for (uint32_t ms = 0; ms < T::kNumMSub; ++ms)
        if (ms >= ms_lo && ms < ms_hi)
          WgmmaFP8<T::WGMMA_N>::mma(da + (ms * 64 * kBlockK + k32 * 32) / 16, db + (k32 * 32) / 16, acc[ms - ms_lo],
                                    k32 > 0);
    wgmma_commit();
  }

  // After the wgmma wait: the accumulators are read only from here on.
  __device__ void settle(Acc& acc) {
#pragma unroll
    for (uint32_t ms = 0; ms < T::kAccSubTiles; ++ms)
#pragma unroll
      for (uint32_t j = 0; j < T::kAccPerSub; ++j) fence_operand(acc[ms][j]);
  }

  // Promotion on the CUDA cores: out += (scale_a(row) * scale_b(block)) * acc.
  __device__ void promote(typename T::TileAcc& out, const Acc& acc, const Scales<T>& sc, uint32_t ns, uint32_t ms_lo,
                          uint32_t ms_hi, uint32_t boundary) const {
#pragma unroll
    for (uint32_t ms = 0; ms < T::kNumMSub; ++ms) {
      if (ms < ms_lo || ms >= ms_hi) continue;
      float p[T::kMaxSFB][2];
#pragma unroll
      for (uint32_t i = 0; i < T::kMaxSFB; ++i) p[i][0] = sc.a[ms][0] * sc.b[i], p[i][1] = sc.a[ms][1] * sc.b[i];
#pragma unroll
      for (uint32_t g = 0; g < T::WGMMA_N / 8; ++g) {
        const uint32_t col = ns * T::WGMMA_N + g * 8;
        float s0 = p[0][0], s1 = p[0][1];
        if (T::kMaxSFB > 1) {
          // Aligned tiles know their block per column at compile time; others compare with the boundary (a
          // compile-time constant too when the K loop is specialized per boundary).
          const uint32_t idx = T::kAlignedN ? col / kBlockK : (col >= boundary) + (col >= boundary + kBlockK);
#pragma unroll
          for (uint32_t i = 1; i < T::kMaxSFB; ++i)
            if (idx == i) s0 = p[i][0], s1 = p[i][1];
        }
        out[ms][ns][g * 4 + 0] += s0 * acc[ms - ms_lo][g * 4 + 0];
        out[ms][ns][g * 4 + 1] += s0 * acc[ms - ms_lo][g * 4 + 1];
        out[ms][ns][g * 4 + 2] += s1 * acc[ms - ms_lo][g * 4 + 2];
        out[ms][ns][g * 4 + 3] += s1 * acc[ms - ms_lo][g * 4 + 3];
      }
    }
  }

  __device__ void advance() { pipe.advance(); }

  // Hands the stage back to the producer(s): with multicast both CTAs' producers wrote into it.
  __device__ void release(uint32_t s) const {
    if constexpr (T::kStageSharers > 1) {
      if (th.lane < T::kStageSharers) mbarrier_arrive_cluster(&smem.empty_bar[s], th.lane);
    } else {
      if (th.lane == 0) mbarrier_arrive(&smem.empty_bar[s]);
    }
  }
};

}  // namespace cupygemm
