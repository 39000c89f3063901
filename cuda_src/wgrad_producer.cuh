// The wgrad kernel's producer: one thread of the last warpgroup streams each tile's A and B blocks and both
// operands' per-128-of-K scales into the ring of stages with TMA, with cluster multicast of A or B where the config
// asks for it. Dense tiles load through the launch's maps; k-grouped tiles through their group's maps, which the prep
// kernel wrote into the workspace (k_grouped_workspace.cuh), acquired once per change of group before the first load
// through them (both CTAs of a pair are in the same group: wgrad_traits.cuh).
#pragma once
#include "k_grouped_workspace.cuh"
#include "ptx_mbarrier.cuh"
#include "ptx_tensormap.cuh"
#include "ptx_tma.cuh"
#include "wgrad_scheduler.cuh"
#include "wgrad_traits.cuh"

namespace cupygemm {

template <class T> struct WgradProducer {
  const TmaDescriptor& tmap_a;  // dense A [M][K]; k-grouped: unused (the group's map is in the workspace)
  const TmaDescriptor& tmap_b;
  const TmaDescriptor& tmap_sfa;  // [scale rows][M] float32, M-major
  const TmaDescriptor& tmap_sfb;  // [scale rows][N]
  const TmaDescriptor& tmap_d;    // D prefetch (T::kDPrefetch): D as the epilogue adds into it
  const WgradSmem<T>& smem;

  // The tile's D boxes into L2, those the epilogue adds into (none wholly past M or N).
  __device__ __forceinline__ void prefetch_d(const WgradTile& tile, uint32_t shape_m) const {
    const uint32_t rows = T::kKGrouped ? T::SHAPE_M : shape_m;
    if (tile.n_block * T::BLOCK_N >= T::SHAPE_N) return;
#pragma unroll
    for (uint32_t wg = 0; wg < T::kNumMathWG; ++wg) {
      const uint32_t first_row = tile.m_block * T::BLOCK_M + wg * T::WG_M;
      if (first_row >= rows) continue;
#pragma unroll
      for (uint32_t slab = 0; slab < T::kNumSlabs; ++slab)
        tma_prefetch_l2_3d(&tmap_d, static_cast<int>(tile.n_block * T::BLOCK_N + slab * T::kSlabCols),
                           static_cast<int>(first_row), static_cast<int>(tile.group));
    }
  }

  // Called by the producer warpgroup's first warp; one lane stays and loads every stage of every tile of this CTA,
  // then (clusters) waits until both CTAs' consumers released every stage, since the peer's arrive on our barriers.
  __device__ __forceinline__ void run(uint32_t shape_m, const KGroupedWorkspace& ws) const {
    keep_one_lane();
    WgradScheduler<T, false> scheduler(shape_m, ws);
    PipelineState<T::kNumStages> pipe;
    const TmaDescriptor* map_a = &tmap_a;
    const TmaDescriptor* map_b = &tmap_b;
    uint32_t cur_group = ~0u;
    WgradTile tile;
    while (scheduler.next(tile)) {
      if constexpr (T::kKGrouped) {
        if (tile.group != cur_group) {
          // The prep kernel released these maps (tensormap.cp_fenceproxy); an earlier launch may have left other
          // contents at the same addresses in the TMA unit's descriptor cache, which the acquire drops.
          cur_group = tile.group;
          map_a = ws.map(cur_group, 0);
          map_b = ws.map(cur_group, 1);
          tensormap_acquire(map_a);
          tensormap_acquire(map_b);
        }
      }
      // A multicast pair over an odd block count runs a second tile past the last block (wgrad_traits.cuh). Its own
      // operand (B with A multicast, A with B multicast) loads from the last block instead, so that no TMA box lies
      // wholly outside its tensor; the tile's sums are never stored (epilogue_f32.cuh), and its half of the shared
      // operand is the peer's real data.
      uint32_t m_block = tile.m_block, n_block = tile.n_block;
      if constexpr (T::kMulticast == 1) n_block = cmin(n_block, T::kNumNBlocks - 1);
      if constexpr (T::kMulticast == 2) m_block = cmin(m_block, ceil_div(shape_m, T::BLOCK_M) - 1);
      const int m0 = static_cast<int>(m_block * T::BLOCK_M);
      const int n0 = static_cast<int>(n_block * T::BLOCK_N);
      // Multicast: this CTA's half of the shared operand, into the same offset of both CTAs.
      const uint32_t a_half = T::kMulticast == 1 ? scheduler.rank : 0u;
      const uint32_t b_half = T::kMulticast == 2 && !T::kBWhole ? scheduler.rank : 0u;
      const uint32_t d_at = tile.num_kb > T::kDPrefetch ? tile.num_kb - T::kDPrefetch : 0;
#pragma unroll 1
      for (uint32_t kb = 0; kb < tile.num_kb; ++kb) {
        if constexpr (T::kDPrefetch > 0) {
          if (kb == d_at) prefetch_d(tile, shape_m);
        }
        const uint32_t s = pipe.stage;
        mbarrier_wait(&smem.empty_bar[s], pipe.phase ^ 1);
        uint64_t* full = &smem.full_bar[s];
        mbarrier_arrive_expect_tx(full, T::kStageTxBytes);
        const int k = static_cast<int>(kb * kBlockK);
        uint8_t* a_dst = smem.a + s * T::SMEM_A + a_half * (T::A_BOX_M * kBlockK);
        uint8_t* b_dst = smem.b + s * T::SMEM_B + b_half * (T::B_BOX_N * kBlockK);
        const int a_row = m0 + static_cast<int>(a_half * T::A_BOX_M);
        const int b_row = n0 + static_cast<int>(b_half * T::B_BOX_N);
        if constexpr (T::kMulticast == 1)
          tma_load_3d_multicast(a_dst, map_a, full, 0b11, k, a_row, 0);
        else
          tma_load_3d(a_dst, map_a, full, k, a_row, 0);
        if constexpr (T::kMulticast == 2) {
          if (!T::kBWhole || scheduler.rank == 0) tma_load_3d_multicast(b_dst, map_b, full, 0b11, k, b_row, 0);
        }
        else
          tma_load_3d(b_dst, map_b, full, k, b_row, 0);
        const int scale_row = static_cast<int>(tile.scale_row0 + kb);
        tma_load_3d(reinterpret_cast<uint8_t*>(smem.sfa) + s * T::SMEM_SFA, &tmap_sfa, full, m0, scale_row, 0);
        tma_load_3d(reinterpret_cast<uint8_t*>(smem.sfb) + s * T::SMEM_SFB, &tmap_sfb, full, n0, scale_row, 0);
        pipe.advance();
      }
    }
    if constexpr (T::kCluster > 1) {
      for (uint32_t i = 0; i < T::kNumStages; ++i) {
        mbarrier_wait(&smem.empty_bar[pipe.stage], pipe.phase ^ 1);
        pipe.advance();
      }
    }
  }
};

}  // namespace cupygemm
