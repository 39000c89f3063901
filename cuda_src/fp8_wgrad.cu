// FP8 (e4m3) weight-gradient GEMMs with 1D1D scaling on Hopper: D[m, n] += sum_k A[m, k] B[n, k] sa[m, k/128]
// sb[n, k/128], both operands scaled per 1x128 along K, FP32 promotion every 128 of K, FP32 D accumulated in place
// (or, dense with CUPYGEMM_WGRAD_STORE, stored: D = A B^T).
// Two kinds: dense (one D; N and K compile-time, M at run time) and k-grouped (G groups of one M x N shape, each
// with its own K from the device: the MoE weight gradient, D[g] += A_g B_g^T, one launch over all groups).
//
// One persistent, warp-specialized kernel: warpgroups 0..kNumMathWG-1 do the math, the last warpgroup is the TMA
// producer; they meet at the pipeline's full/empty mbarriers. This file is the skeleton: the warp roles and the
// persistent tile loop. The parts are in their own headers (cuda_src/README.md): wgrad_traits.cuh (constants,
// shared memory), wgrad_scheduler.cuh, wgrad_producer.cuh, mainloop_1d1d.cuh, epilogue_f32.cuh; the k-grouped
// kind's per-group TMA maps come from k_grouped_prep.cu through k_grouped_workspace.cuh. The JIT prepends the
// CUPYGEMM_* constants that instantiate it (cupygemm/contract_wgrad.py states its whole host contract).
#include "epilogue_f32.cuh"
#include "k_grouped_workspace.cuh"
#include "mainloop_1d1d.cuh"
#include "wgrad_producer.cuh"
#include "wgrad_scheduler.cuh"
#include "wgrad_traits.cuh"

namespace cupygemm {

template <class T>
__device__ __forceinline__ void fp8_wgrad(const TmaDescriptor& tmap_a, const TmaDescriptor& tmap_b,
                                          const TmaDescriptor& tmap_sfa, const TmaDescriptor& tmap_sfb,
                                          const TmaDescriptor& tmap_d, uint8_t* workspace, uint32_t shape_m,
                                          uint32_t num_groups) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const WgradSmem<T> smem(smem_raw);
  const KGroupedWorkspace ws{workspace, num_groups};

  // Broadcast from lane 0 so the compiler knows it is warp-uniform.
  const uint32_t warpgroup = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  if (threadIdx.x == T::kNumMathThreads) {
    if constexpr (!T::kKGrouped) {
      tma_prefetch_descriptor(&tmap_a);
      tma_prefetch_descriptor(&tmap_b);
    }
    tma_prefetch_descriptor(&tmap_sfa);
    tma_prefetch_descriptor(&tmap_sfb);
    tma_prefetch_descriptor(&tmap_d);
    for (uint32_t s = 0; s < T::kNumStages; ++s) {
      mbarrier_init(&smem.full_bar[s], 1);
      mbarrier_init(&smem.empty_bar[s], T::kNumMathWG * 4 * T::kCluster);  // one per consuming warp of each CTA
    }
    mbarrier_init_fence();
  }
  // Clustered: the peer multicasts into our shared memory and arrives on our barriers, so it must see them
  // initialised.
  if constexpr (T::kCluster > 1) cluster_sync(); else __syncthreads();

  if (warpgroup == T::kNumMathWG) {
    // ---------------- producer warpgroup: one thread issues every TMA load ----------------
    if constexpr (T::kNumMathWG > 1) regs_dealloc<T::kProducerRegs>();
    if (threadIdx.x / 32 != T::kNumMathThreads / 32) return;
    const WgradProducer<T> producer{tmap_a, tmap_b, tmap_sfa, tmap_sfb, tmap_d, smem};
    producer.run(shape_m, ws);
    return;
  }

  // ---------------- math warpgroups: K loop and reduce-add epilogue per tile ----------------
  if constexpr (T::kNumMathWG > 1) regs_alloc<T::kMathRegs>();
  WgradScheduler<T, true> scheduler(shape_m, ws);
  const MathThread th = make_wgrad_thread<T>(warpgroup, smem);
  const EpilogueF32<T> epilogue{tmap_d, th, shape_m};
  Mainloop1D1D<T> mainloop(smem, th);
  typename Mainloop1D1D<T>::Acc wgmma_acc;  // one wgmma batch's result, promoted into sums
  typename Mainloop1D1D<T>::Sums sums;
  WgradTile tile;
  while (scheduler.next(tile)) {
    Mainloop1D1D<T>::clear(sums);
    mainloop.run(sums, wgmma_acc, tile.num_kb);
    epilogue.store(sums, tile);
  }
  mainloop.finish();
  epilogue.finish();
}

}  // namespace cupygemm

#ifdef CUPYGEMM_WGRAD_KIND
#ifndef CUPYGEMM_PINGPONG
#define CUPYGEMM_PINGPONG 0
#endif
#ifndef CUPYGEMM_WGRAD_STORE
#define CUPYGEMM_WGRAD_STORE 0
#endif
#ifndef CUPYGEMM_B_WHOLE
#define CUPYGEMM_B_WHOLE 0
#endif
#ifndef CUPYGEMM_WGRAD_D_PREFETCH
#define CUPYGEMM_WGRAD_D_PREFETCH 0
#endif
// Entry point with a fixed C name, instantiated from the constants the JIT defines. cupygemm/contract_wgrad.py states
// its whole host contract: the template constants, these parameters, the TMA maps, shared memory size and grid.
// Dense: tmap_a/tmap_b map A and B, workspace is unused (null), num_groups is 1. K-grouped: tmap_a/tmap_b are the
// templates the prep kernel edited (unused here), workspace is the prep kernel's output, shape_m is SHAPE_M.
extern "C" __global__ void __launch_bounds__(128 * (CUPYGEMM_NUM_MATH_WG + 1), 1) CUPYGEMM_CLUSTER_ATTR
    cupygemm_fp8_wgrad(const __grid_constant__ cupygemm::TmaDescriptor tmap_a,
                       const __grid_constant__ cupygemm::TmaDescriptor tmap_b,
                       const __grid_constant__ cupygemm::TmaDescriptor tmap_sfa,
                       const __grid_constant__ cupygemm::TmaDescriptor tmap_sfb,
                       const __grid_constant__ cupygemm::TmaDescriptor tmap_d, uint8_t* workspace, uint32_t shape_m,
                       uint32_t num_groups) {
  using Traits = cupygemm::WgradTraits<CUPYGEMM_WGRAD_KIND, CUPYGEMM_SHAPE_M, CUPYGEMM_SHAPE_N, CUPYGEMM_SHAPE_K,
                                       CUPYGEMM_BLOCK_M, CUPYGEMM_BLOCK_N, CUPYGEMM_NUM_STAGES, CUPYGEMM_NUM_MATH_WG,
                                       CUPYGEMM_MATH_REGS, CUPYGEMM_PRODUCER_REGS, CUPYGEMM_SWIZZLE_D,
                                       CUPYGEMM_STAGED_SLABS, CUPYGEMM_RASTER_N, CUPYGEMM_MULTICAST,
                                       CUPYGEMM_TWO_ACC_SETS, CUPYGEMM_PINGPONG, CUPYGEMM_WGRAD_STORE,
                                       CUPYGEMM_B_WHOLE, CUPYGEMM_WGRAD_D_PREFETCH>;
  cupygemm::fp8_wgrad<Traits>(tmap_a, tmap_b, tmap_sfa, tmap_sfb, tmap_d, workspace, shape_m, num_groups);
}
#endif
