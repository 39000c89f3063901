// Persistent tile scheduler: which (m block, n block, group) a CTA works on next.
// The producer and every math warpgroup run their own copy and see the same sequence.
#pragma once
#include "ptx_common.cuh"

namespace cupygemm {

enum GemmKind : int { kNormal = 0, kGroupedContiguous = 1, kGroupedMasked = 2 };

struct Tile {
  uint32_t m_block;  // block index within the group's rows (masked) or within all rows
  uint32_t n_block;
  uint32_t group;    // B (and for masked, A/D) group index; 0 for normal GEMMs
};

// kMulticast: 0 = one CTA per tile; 1 = 2-CTA clusters on neighbouring n blocks (they share A);
// 2 = 2-CTA clusters on neighbouring m blocks (they share B; normal GEMMs only). The host only picks a
// multicast mode when the paired dimension has an even number of blocks, so a pair is always complete.
template <int kKind, uint32_t SHAPE_N, uint32_t BLOCK_M, uint32_t BLOCK_N, uint32_t kRasterN, int kMulticast>
struct TileScheduler {
  static constexpr uint32_t kNumNBlocks = ceil_div(SHAPE_N, BLOCK_N);
  static constexpr uint32_t kCluster = kMulticast ? 2 : 1;
  // Scheduling units along N and (for kMulticast == 2) M: a unit is a pair of blocks when clustered.
  static constexpr uint32_t kNumNUnits = kMulticast == 1 ? kNumNBlocks / 2 : kNumNBlocks;

  uint32_t shape_m;         // rows (normal/contiguous) or max rows per group (masked)
  uint32_t num_groups;
  const int* grouped_layout;  // m_indices (contiguous) or masked_m (masked)
  uint32_t next_tile;
  // Masked: running position over groups (tile indices only grow, so the scan is incremental).
  uint32_t cur_group = 0, cur_group_first_tile = 0;

  uint32_t rank;  // this CTA's place in its cluster
  uint32_t stride;

  __device__ __forceinline__ TileScheduler(uint32_t shape_m_, uint32_t num_groups_, const int* layout)
      : shape_m(shape_m_), num_groups(num_groups_), grouped_layout(layout), next_tile(blockIdx.x / kCluster),
        rank(kMulticast ? cluster_cta_rank() : 0), stride(gridDim.x / kCluster) {}

  // Rasterize in stripes of kRasterN n units: consecutive tiles share A rows, a stripe's B stays in L2.
  __device__ __forceinline__ void rasterize(uint32_t tile, uint32_t num_m_units, Tile& t) const {
    const uint32_t tiles_per_stripe = num_m_units * kRasterN;
    const uint32_t stripe = tile / tiles_per_stripe;
    const uint32_t first_n = stripe * kRasterN;
    const uint32_t stripe_n = cmin(kRasterN, kNumNUnits - first_n);
    const uint32_t in_stripe = tile - stripe * tiles_per_stripe;
    t.m_block = in_stripe / stripe_n;
    t.n_block = first_n + in_stripe % stripe_n;
    if (kMulticast == 1) t.n_block = t.n_block * 2 + rank;
    if (kMulticast == 2) t.m_block = t.m_block * 2 + rank;
  }

  static __device__ __forceinline__ uint32_t clamped_masked_m(const int* masked_m, uint32_t g, uint32_t max_m) {
    const int v = __ldg(masked_m + g);
    return v <= 0 ? 0u : cmin(static_cast<uint32_t>(v), max_m);
  }

  __device__ __forceinline__ bool next(Tile& t) {
    if (kKind == kGroupedMasked) {
      const uint32_t tile = next_tile;
      next_tile += stride;
      while (cur_group < num_groups) {
        const uint32_t m_blocks = ceil_div(clamped_masked_m(grouped_layout, cur_group, shape_m), BLOCK_M);
        const uint32_t tiles = m_blocks * kNumNUnits;
        if (tile < cur_group_first_tile + tiles) {
          rasterize(tile - cur_group_first_tile, m_blocks, t);
          t.group = cur_group;
          return true;
        }
        cur_group_first_tile += tiles;
        ++cur_group;
      }
      return false;
    } else {
      const uint32_t num_m_units = ceil_div(shape_m, BLOCK_M) / (kMulticast == 2 ? 2 : 1);
      const uint32_t num_tiles = num_m_units * kNumNUnits;
      while (next_tile < num_tiles) {
        const uint32_t tile = next_tile;
        next_tile += stride;
        rasterize(tile, num_m_units, t);
        if (kKind == kNormal) {
          t.group = 0;
          return true;
        }
        // Contiguous: the block's group is its first row's m_indices entry; -1 or out-of-range skips the block.
        const int g = __ldg(grouped_layout + t.m_block * BLOCK_M);
        if (g >= 0 && static_cast<uint32_t>(g) < num_groups) {
          t.group = static_cast<uint32_t>(g);
          return true;
        }
      }
      return false;
    }
  }
};

}  // namespace cupygemm
