// FP8 (e4m3) GEMM with fine-grained scaling on Hopper: D[m, n] = sum_k A[m, k] B[n, k], with A scaled per
// 1x128 (row, K block) and B per 128x128 block, FP32 promotion every 128 of K, BF16 output.
//
// One persistent, warp-specialized kernel serves the normal GEMM and both grouped layouts (the tile scheduler
// differs). Warpgroups 0..kNumMathWG-1 do the math, the last warpgroup is the TMA producer; they meet at the
// pipeline's full/empty mbarriers. This file is the skeleton: the warp roles and the persistent tile loop. The
// parts are in their own headers (cuda_src/README.md): kernel_traits.cuh (constants, shared memory), scheduler.cuh,
// producer.cuh, mainloop.cuh, reduction.cuh, epilogue.cuh. The JIT prepends the CUPYGEMM_* constants that
// instantiate it.
#include "b_prefetch.cuh"
#include "epilogue.cuh"
#include "kernel_traits.cuh"
#include "mainloop.cuh"
#include "producer.cuh"
#include "ptx_bulk.cuh"
#include "reduction.cuh"
#include "scheduler.cuh"

namespace cupygemm {

// Side-aware kernels: the cluster's first CTA draws the cluster's ticket (l2_sides.cuh) into both CTAs' shared
// memory, before the barrier that publishes the set-up.
template <class T> __device__ __forceinline__ void take_side_ticket(const SideArgs& sides, const SharedStorage<T>& smem) {
  if (T::kCluster > 1 && cluster_cta_rank() != 0) return;
  uint32_t half, index;
  draw_side_ticket(sides, gridDim.x / T::kCluster, half, index);
  smem.ticket[0] = half;
  smem.ticket[1] = index;
#pragma unroll
  for (uint32_t r = 1; r < T::kCluster; ++r) {
    st_cluster_u32(&smem.ticket[0], r, half);
    st_cluster_u32(&smem.ticket[1], r, index);
  }
}

// Side-aware kernels: every CTA's producer copies the page bits of packed B (l2_sides.cuh, PageSides) into shared
// memory, in flight while the ticket is drawn; the producer waits for them before its first load of B.
template <class T>
__device__ __forceinline__ void load_page_bits(const SideArgs& sides, uint32_t num_groups, const SharedStorage<T>& smem) {
  using L = typename T::PackedLayout;
  const uint32_t bytes = round_up(L::page_words(sides.base_low, num_groups) * 4, 16u);
  mbarrier_arrive_expect_tx(smem.page_bar, bytes);
  bulk_load(smem.page_bits, sides.packed_b + num_groups * L::kGroupBytes, bytes, smem.page_bar);
}

template <class T> __device__ __forceinline__ SideWork side_work(const uint32_t* ticket, uint32_t clusters0) {
  const uint32_t half = ticket[0], clusters = gridDim.x / T::kCluster;
  constexpr uint32_t kUnits = T::kMulticast == 1 ? ceil_div(T::SHAPE_N, T::BLOCK_N) / 2 : ceil_div(T::SHAPE_N, T::BLOCK_N);
  return SideWork{ticket[1], half ? clusters - clusters0 : clusters0, half ? T::kSideUnits0 : 0u,
                  half ? kUnits - T::kSideUnits0 : T::kSideUnits0};
}

template <class T>
__device__ __forceinline__ void fp8_gemm(const TmaDescriptor& tmap_a, const TmaDescriptor& tmap_a_tail,
                                         const TmaDescriptor& tmap_b, const TmaDescriptor& tmap_sfa,
                                         const TmaDescriptor& tmap_d,
                                         const float* __restrict__ sfb, const int* __restrict__ grouped_layout,
                                         uint16_t* __restrict__ d_ptr, float* __restrict__ partials,
                                         uint32_t* __restrict__ tile_counters, uint32_t shape_m, uint32_t num_groups,
                                         uint32_t ld_d, uint32_t b_evict_first, const SideArgs& sides) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const SharedStorage<T> smem(smem_raw);

  // Broadcast from lane 0 so the compiler knows it is warp-uniform (uniform registers for descriptors).
  const uint32_t warpgroup = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  if (threadIdx.x == T::kNumMathThreads) {
    tma_prefetch_descriptor(&tmap_a);
    tma_prefetch_descriptor(&tmap_a_tail);
    tma_prefetch_descriptor(&tmap_b);
    tma_prefetch_descriptor(&tmap_sfa);
    tma_prefetch_descriptor(&tmap_d);
    if constexpr (T::kBPrefetchBytes > 0) prefetch_b_window<T>(sides.packed_b, num_groups);
    for (uint32_t s = 0; s < T::kNumStages; ++s) {
      mbarrier_init(&smem.full_bar[s], 1);
      mbarrier_init(&smem.empty_bar[s], T::kConsumersPerStage * 4 * T::kStageSharers);  // one per consuming warp
    }
    if constexpr (T::kSplitCluster) ClusterSplit<T>::init(smem);
    if constexpr (T::kSides) mbarrier_init(smem.page_bar, 1);
    mbarrier_init_fence();
    // The page bits are part of the packed weights, constant until repacked: read before any PDL wait.
    if constexpr (T::kSides && !T::kSidePageParams) load_page_bits<T>(sides, num_groups, smem);
    if constexpr (T::kSides) {
      if (!T::kPdl || sides.tickets_before_wait) take_side_ticket<T>(sides, smem);
    }
  }
  // Clustered: the peer multicasts into our shared memory and arrives on our barriers, so it must see them
  // initialised.
  if constexpr (T::kCluster > 1) cluster_sync(); else __syncthreads();
  // Everything above overlaps the previous kernel's tail; from here on global memory is read and written.
  if constexpr (T::kPdl) grid_dependency_wait();
  if constexpr (T::kSides && T::kPdl) {  // counters the previous kernel may still be resetting: drawn after the wait
    if (!sides.tickets_before_wait) {
      if (threadIdx.x == T::kNumMathThreads) take_side_ticket<T>(sides, smem);
      if constexpr (T::kCluster > 1) cluster_sync(); else __syncthreads();
    }
  }
  const SideWork side = T::kSides ? side_work<T>(smem.ticket, sides.clusters0) : SideWork{};

  // The tile record both roles fill from their schedulers; it lives here, not in the roles' functions, because
  // where values live changes NVRTC's code (cuda_src/README.md, "Changing the kernel").
  Tile tile;
  if (warpgroup == T::kNumMathWG) {
    // ---------------- producer warpgroup: one thread issues every TMA load ----------------
    if (T::kNumMathWG > 1) regs_dealloc<T::kProducerRegs>();
    if (threadIdx.x / 32 != T::kNumMathThreads / 32) return;
    const Producer<T> producer{tmap_a, tmap_a_tail, tmap_b, tmap_sfa, smem};
    const PageSides pages{smem.page_bits, sides.base_low, sides.hash};
    const uint32_t* w = sides.page_words;
    const typename T::ParamSides param_pages{{w[0], w[1], w[2], w[3]}, sides.base_low, sides.hash};
    producer.run(shape_m, num_groups, grouped_layout, b_evict_first, side, pages, param_pages, tile);
    if constexpr (T::kSides) {
      if (T::kCluster == 1 || cluster_cta_rank() == 0)  // the producer's one thread (Producer::run)
        release_side_ticket(sides, gridDim.x / T::kCluster);
    }
    return;
  }

  // ---------------- math warpgroups: K loop, partial-sum reduction, epilogue per tile ----------------
  if (T::kNumMathWG > 1) regs_alloc<T::kMathRegs>();
  typename T::MathScheduler scheduler(shape_m, num_groups, grouped_layout, side);
  const MathThread th = MathThread::make<T>(warpgroup, smem);
  const Epilogue<T> epilogue{tmap_d, d_ptr, grouped_layout, shape_m, ld_d, th};
  const CrossCtaReduction<T> cross_cta{partials, tile_counters, th};
  ClusterSplit<T> cluster_split{smem, th, T::kSplitCluster ? cluster_cta_rank() : 0};
  typename Mainloop<T>::Acc wgmma_acc;  // one wgmma batch's result, promoted into acc (mainloop.cuh: why apart)
  typename T::TileAcc acc;
  Mainloop<T> mainloop(smem, th);

  while (scheduler.next(tile)) {
    const uint32_t n0 = tile.n_block * T::BLOCK_N;
    // A piece of a stream-K tail unit: part of the tile's K blocks, partial sums met in global memory.
    const bool sk_piece = T::kStreamK && tile.sk_unit != kWholeUnit;
    const BScaleRows<T> sfb_rows(sfb, tile, n0);
    const uint32_t scale_boundary = kBlockK - n0 % kBlockK;  // tile column where the B scale block changes
    Mainloop<T>::clear(acc);
    const WarpgroupRows rows = WarpgroupRows::make<T>(tile, th);
    if (rows.active == 0) {
      mainloop.skip(tile);
      continue;
    }
    typename Epilogue<T>::RowGroups row_groups;
    epilogue.read_row_groups(row_groups, tile, rows);

    Scales<T> cur, next;  // of the K block being promoted and the next; per tile, in this loop (README)
    mainloop.run(acc, wgmma_acc, tile, n0, rows, sfb_rows, scale_boundary, sk_piece, cur, next);

    if constexpr (T::kInterleaveK) {
      if (!interleave_handoff<T>(acc, smem.handoff, th)) continue;
    }
    if constexpr (T::kSplitCluster) {
      if (!cluster_split.meet(acc)) continue;
    } else if (T::kSplitK > 1 || sk_piece) {
      uint32_t* counter;  // the tile's arrival counter, which the CTA that reduces resets
      if (!cross_cta.store_and_arrive(acc, tile, scheduler, counter)) continue;
      cross_cta.read_back(acc, tile, scheduler, counter);
    }
    epilogue.store(acc, tile, n0, rows, row_groups);
  }
  // After the last tile's math: the next kernel's launch and set-up overlap our last stores (it waits for them).
  if constexpr (T::kPdl) grid_launch_dependents();
  epilogue.finish();
  if constexpr (T::kSplitCluster) cluster_split.finish();
}

}  // namespace cupygemm

#ifdef CUPYGEMM_SHAPE_N
#ifndef CUPYGEMM_PDL
#define CUPYGEMM_PDL 0
#endif
#ifndef CUPYGEMM_SIDES
#define CUPYGEMM_SIDES 0
#endif
#ifndef CUPYGEMM_SPLIT_CLUSTER
#define CUPYGEMM_SPLIT_CLUSTER 0
#endif
#ifndef CUPYGEMM_TWO_ACC_SETS
#define CUPYGEMM_TWO_ACC_SETS 0
#endif
#ifndef CUPYGEMM_B_PREFETCH
#define CUPYGEMM_B_PREFETCH 0
#endif
// Entry point with a fixed C name, instantiated from the constants the JIT defines. cupygemm/contract.py states its
// whole host contract: the template constants, these parameters, the TMA maps, shared memory size and grid.
extern "C" __global__ void __launch_bounds__(128 * (CUPYGEMM_NUM_MATH_WG + 1), 1) CUPYGEMM_CLUSTER_ATTR
    cupygemm_fp8_gemm(const __grid_constant__ cupygemm::TmaDescriptor tmap_a,
                      const __grid_constant__ cupygemm::TmaDescriptor tmap_a_tail,
                      const __grid_constant__ cupygemm::TmaDescriptor tmap_b,
                      const __grid_constant__ cupygemm::TmaDescriptor tmap_sfa,
                      const __grid_constant__ cupygemm::TmaDescriptor tmap_d, const float* sfb,
                      const int* grouped_layout, uint16_t* d_ptr, float* partials, uint32_t* tile_counters,
                      uint32_t shape_m, uint32_t num_groups, uint32_t ld_d, uint32_t b_evict_first
#if CUPYGEMM_SIDES
                      , const __grid_constant__ cupygemm::SideMap sm_sides, const uint8_t* packed_b,
                      uint32_t* side_tickets, uint32_t side_clusters0, uint32_t side_base_low, uint32_t side_hash,
                      uint32_t side_page_w0, uint32_t side_page_w1, uint32_t side_page_w2, uint32_t side_page_w3,
                      uint32_t side_tickets_before_wait
#endif
                      ) {
  using Traits = cupygemm::KernelTraits<CUPYGEMM_SHAPE_N, CUPYGEMM_SHAPE_K, CUPYGEMM_BLOCK_M, CUPYGEMM_BLOCK_N,
                                        CUPYGEMM_WGMMA_N, CUPYGEMM_NUM_STAGES, CUPYGEMM_NUM_MATH_WG,
                                        CUPYGEMM_MATH_REGS, CUPYGEMM_PRODUCER_REGS, CUPYGEMM_SWIZZLE_D,
                                        CUPYGEMM_RASTER_N, CUPYGEMM_KIND, CUPYGEMM_MULTICAST, CUPYGEMM_INTERLEAVE_K,
                                        CUPYGEMM_SERIAL_M, CUPYGEMM_SPLIT_K, CUPYGEMM_STREAM_K, CUPYGEMM_A_BOX_M,
                                        CUPYGEMM_PDL, CUPYGEMM_SIDES, CUPYGEMM_SPLIT_CLUSTER,
                                        CUPYGEMM_TWO_ACC_SETS, CUPYGEMM_B_PREFETCH>;
#if CUPYGEMM_SIDES
  static_assert(Traits::kSideBoxRows == CUPYGEMM_SIDE_BOX_ROWS, "tmap_b's box (contract.py) fits the producer's");
  const cupygemm::SideArgs sides{&sm_sides, packed_b, side_tickets, side_tickets_before_wait, side_clusters0,
                                 side_base_low, side_hash, {side_page_w0, side_page_w1, side_page_w2, side_page_w3}};
#else
  const cupygemm::SideArgs sides{};
#endif
  cupygemm::fp8_gemm<Traits>(tmap_a, tmap_a_tail, tmap_b, tmap_sfa, tmap_d, sfb, grouped_layout, d_ptr, partials,
                             tile_counters, shape_m, num_groups, ld_d, b_evict_first, sides);
}
#endif
