// Tile sums computed in parts: inside the CTA (interleave_k: two warpgroups summed alternate K blocks of the same
// rows), across a cluster (split-K clusters: each CTA summed one split) and across CTAs (split-K: each CTA summed one
// split of the tile's K blocks; stream-K: the last round's tiles were split along K over idle clusters). Either way
// one warpgroup ends up with the whole sum and stores it.
#pragma once
#include "kernel_traits.cuh"
#include "named_barriers.cuh"
#include "ptx_global.cuh"
#include "ptx_mbarrier.cuh"

namespace cupygemm {

// interleave_k: warpgroup 1's sums go through shared memory into warpgroup 0's, which stores the tile. Returns
// whether this warpgroup holds the tile's sums.
template <class T>
__device__ __forceinline__ bool interleave_handoff(typename T::TileAcc& acc, float* handoff, const MathThread& th) {
  if (th.warpgroup == 1) {
#pragma unroll
    for (uint32_t ns = 0; ns < T::kNumNSub; ++ns)
#pragma unroll
      for (uint32_t j = 0; j < T::kAccPerSub; ++j) handoff[(ns * T::kAccPerSub + j) * 128 + th.tid] = acc[0][ns][j];
  }
  named_barrier_sync(NamedBarrier::kInterleavePair, 256);
  if (th.warpgroup == 0) {
#pragma unroll
    for (uint32_t ns = 0; ns < T::kNumNSub; ++ns)
#pragma unroll
      for (uint32_t j = 0; j < T::kAccPerSub; ++j) acc[0][ns][j] += handoff[(ns * T::kAccPerSub + j) * 128 + th.tid];
  }
  named_barrier_sync(NamedBarrier::kInterleavePair, 256);  // the buffer is free again before warpgroup 1 reuses it
  return th.warpgroup != 1;
}

// Split-K clusters of two: the cluster's CTAs computed the two splits of one tile, rank r split r. The partner
// (rank 1) writes its sums into the leader's shared memory with st.async, which completes their bytes on the
// leader's barrier (no fence); the leader (rank 0, the first K split) adds them to its own, as the global-memory
// path adds its pieces (so the result is bit for bit the same), tells the partner its buffer is free again, and
// stores the tile. Per math warpgroup (its row group), so a warpgroup without valid rows, which skips the tile in
// both CTAs, takes no part.
template <class T> struct ClusterSplit {
  static_assert(!T::kSplitCluster || T::kSplitK == 2, "split-K clusters: two splits (one partner buffer)");
  static constexpr uint32_t kPartial = T::WG_M * T::BLOCK_N;  // floats per row group
  const SharedStorage<T>& smem;
  const MathThread& th;
  uint32_t rank;
  uint32_t rounds = 0;  // split tiles this warpgroup met so far: the phase of its barriers

  static __device__ __forceinline__ uint32_t at(uint32_t ms, uint32_t ns, uint32_t j) {
    return ((ms * T::kNumNSub + ns) * T::kAccPerSub + j) * 128;
  }
  __device__ __forceinline__ uint32_t group() const { return T::kInterleaveK ? 0 : th.warpgroup; }
  __device__ __forceinline__ uint64_t* sums_in() const { return smem.split_bar + group(); }       // on the leader
  __device__ __forceinline__ uint64_t* sums_read() const { return smem.split_bar + 2 + group(); }  // on the partner
  __device__ __forceinline__ float* sums() const { return smem.split_sums + group() * kPartial + th.tid; }

  // The barriers, by the thread that initialises the CTA's (before the cluster's first sync).
  static __device__ __forceinline__ void init(const SharedStorage<T>& smem) {
#pragma unroll
    for (uint32_t g = 0; g < T::kRowGroups; ++g) {
      mbarrier_init(smem.split_bar + g, 1);      // the leader's expect_tx; the partner's bytes complete it
      mbarrier_init(smem.split_bar + 2 + g, 4);  // each leader warp arrives once
    }
  }

  // Meets the tile's other split; returns whether this CTA (the leader) holds the tile's sums in `acc`.
  __device__ __forceinline__ bool meet(typename T::TileAcc& acc) {
    const uint32_t parity = rounds & 1;
    ++rounds;
    float* mine = sums();
    if (rank != 0) {
      if (rounds > 1) mbarrier_wait(sums_read(), parity ^ 1);  // the leader read the previous tile's sums
      const uint32_t dst = cluster_smem_addr(mine, 0), bar = cluster_smem_addr(sums_in(), 0);
#pragma unroll
      for (uint32_t ms = 0; ms < T::kNumMSub; ++ms)
#pragma unroll
        for (uint32_t ns = 0; ns < T::kNumNSub; ++ns)
#pragma unroll
          for (uint32_t j = 0; j < T::kAccPerSub; ++j) st_async_f32(dst + 4 * at(ms, ns, j), acc[ms][ns][j], bar);
      return false;
    }
    if (th.tid == 0) mbarrier_arrive_expect_tx(sums_in(), kPartial * 4);
    mbarrier_wait(sums_in(), parity);
#pragma unroll
    for (uint32_t ms = 0; ms < T::kNumMSub; ++ms)
#pragma unroll
      for (uint32_t ns = 0; ns < T::kNumNSub; ++ns)
#pragma unroll
        for (uint32_t j = 0; j < T::kAccPerSub; ++j) acc[ms][ns][j] = (0.f + acc[ms][ns][j]) + mine[at(ms, ns, j)];
    __syncwarp();
    if (th.lane == 0) mbarrier_arrive_cluster(sums_read(), 1);  // our reads are done (CTA-scope release suffices)
    return true;
  }

  // The partner stays until the leader has read its last sums: the leader's arrive lands in its shared memory.
  __device__ __forceinline__ void finish() const {
    if (rank != 0 && rounds > 0) mbarrier_wait(sums_read(), (rounds - 1) & 1);
  }
};

// K splits and stream-K pieces. Each CTA's sums go to global memory register by register, each a coalesced
// 128-float row over the warpgroup's threads (four-register vector stores would pin the accumulators to aligned
// register quads, which slowed every whole tile of the kernel by 2-3 %). The tile's last CTA to arrive adds every
// piece in K order, so the result does not depend on which CTA that is, and stores the tile.
template <class T> struct CrossCtaReduction {
  static constexpr uint32_t kPartial = T::WG_M * T::BLOCK_N;  // floats per piece and row group
  static_assert(T::kAccPerSub % 4 == 0, "partial sums are read back in groups of four registers");
  // Every piece is read back, this CTA's own too, one m64 sub-tile at a time, in passes over as many pieces as 128
  // registers of loads in flight allow (more spill in the two-warpgroup kernels; fewer leave the reads latency
  // bound).
  static constexpr uint32_t kSubTileFloats = T::kNumNSub * T::kAccPerSub;  // this thread's share of one sub-tile
  static constexpr uint32_t kPass =
      cmin(T::kSplitK > 1 ? T::kSplitK : 4u, cmax(1u, 128u / (kSubTileFloats * T::kNumMSub)));
  static constexpr bool kWholePasses = !T::kStreamK && T::kSplitK % kPass == 0;  // every pass reads kPass pieces

  float* partials;
  uint32_t* tile_counters;
  const MathThread& th;

  static __device__ float* at(float* base, uint32_t ms, uint32_t ns, uint32_t j) {
    return base + ((ms * T::kNumNSub + ns) * T::kAccPerSub + j) * 128;
  }

  // Piece i's partial sums (this thread's first float): a K split of the tile, or the tail piece in the slot of
  // the cluster that ran it.
  __device__ __forceinline__ float* piece_sums(const Tile& tile, const typename T::MathScheduler& scheduler,
                                               uint32_t i) const {
    const uint32_t tile_id = tile.m_block * ceil_div(T::SHAPE_N, T::BLOCK_N) + tile.n_block;
    const uint32_t slot = T::kStreamK ? scheduler.sk_slot(tile.sk_unit, i) * T::kCluster + scheduler.rank
                                      : tile_id * T::kSplitK + i;
    return partials + (slot * T::kRowGroups + (T::kInterleaveK ? 0 : th.warpgroup)) * kPartial + th.tid;
  }

  // Stores this CTA's part of the tile and counts it at the tile's counter; returns whether it was the last to
  // arrive (the same answer in every thread of the warpgroup).
  __device__ __forceinline__ int store_and_arrive(const typename T::TileAcc& acc, const Tile& tile,
                                                  const typename T::MathScheduler& scheduler,
                                                  uint32_t*& counter) const {
    const uint32_t tid = th.tid, row_group = T::kInterleaveK ? 0 : th.warpgroup;
    const uint32_t tile_id = tile.m_block * ceil_div(T::SHAPE_N, T::BLOCK_N) + tile.n_block;
    const uint32_t pieces = T::kStreamK ? scheduler.sk_split : T::kSplitK;
    const uint32_t counter_idx = T::kStreamK ? tile.sk_unit * T::kCluster + scheduler.rank : tile_id;
    float* my_sums = piece_sums(tile, scheduler, tile.k_split);
#pragma unroll
    for (uint32_t ms = 0; ms < T::kNumMSub; ++ms)
#pragma unroll
      for (uint32_t ns = 0; ns < T::kNumNSub; ++ns)
#pragma unroll
        for (uint32_t j = 0; j < T::kAccPerSub; ++j) st_global_cg(at(my_sums, ms, ns, j), acc[ms][ns][j]);
    named_barrier_sync(th.barrier, 128);  // every thread's stores precede the release below
    counter = tile_counters + counter_idx * T::kRowGroups + row_group;
    bool arrived_last = tid == 0;  // thread 0 counts for the warpgroup
    if (arrived_last) arrived_last = arrive_counter_acq_rel(counter) == pieces - 1;
    const bool last = named_barrier_vote<true>(th.barrier, 128, arrived_last);
    return __shfl_sync(0xffffffffu, last, 0);
  }

  // The last CTA to arrive: adds every piece, its own too, in K order into `acc`.
  __device__ __forceinline__ void read_back(typename T::TileAcc& acc, const Tile& tile,
                                            const typename T::MathScheduler& scheduler, uint32_t* counter) const {
    const uint32_t pieces = T::kStreamK ? scheduler.sk_split : T::kSplitK;
    if (th.tid == 0) reset_counter(counter);  // ready for the next launch
#pragma unroll
    for (uint32_t ms = 0; ms < T::kNumMSub; ++ms) {
#pragma unroll
      for (uint32_t ns = 0; ns < T::kNumNSub; ++ns)
#pragma unroll
        for (uint32_t j = 0; j < T::kAccPerSub; ++j) acc[ms][ns][j] = 0.f;
#pragma unroll 1
      for (uint32_t first = 0; first < pieces; first += kPass) {
        float* base[kPass];
#pragma unroll
        for (uint32_t i = 0; i < kPass; ++i) base[i] = piece_sums(tile, scheduler, cmin(first + i, pieces - 1));
#pragma unroll
        for (uint32_t ns = 0; ns < T::kNumNSub; ++ns)
#pragma unroll
          for (uint32_t j = 0; j < T::kAccPerSub; j += 4) {
            // Loads unconditional (a short last pass re-reads the last piece, added never): predicated ones are
            // issued one at a time, each waited for before the next (stream-K read-back ~8x slower).
            float p[kPass][4];
#pragma unroll
            for (uint32_t i = 0; i < kPass; ++i)
#pragma unroll
              for (uint32_t e = 0; e < 4; ++e) p[i][e] = ld_global_cg(at(base[i], ms, ns, j + e));
#pragma unroll
            for (uint32_t i = 0; i < kPass; ++i)
              if (kWholePasses || first + i < pieces)
#pragma unroll
                for (uint32_t e = 0; e < 4; ++e) acc[ms][ns][j + e] += p[i][e];
          }
      }
    }
  }
};

}  // namespace cupygemm
