// The wgrad kernel's persistent tile scheduler: which (m block, n block, group) and which K blocks a CTA works on
// next. The producer and the math warpgroups each run a copy and see the same sequence.
//
// Dense: the m x n tiles of D (M at run time), in raster stripes of kRasterN n units. K-grouped: the tiles of every
// group with work, group by group (the prep kernel's list of active groups, k_grouped_workspace.cuh), each group's
// tiles in the same raster order; every group has the same M and N, so a group's tile count is a compile-time
// constant and a tile's group is one division away. Tiles of one group run side by side and share its A and B in L2.
// Empty groups have no tiles; each tile sums all of its group's K blocks, so every D element receives exactly one
// TMA reduce-add per launch (bitwise repeatable results).
#pragma once
#include "k_grouped_workspace.cuh"
#include "wgrad_traits.cuh"

namespace cupygemm {

struct WgradTile {
  uint32_t m_block, n_block;
  uint32_t group;       // k-grouped: the group (its maps, its D slice); 0 for dense
  uint32_t num_kb;      // K blocks of 128 the tile sums
  uint32_t scale_row0;  // the group's first row in the stacked scales; 0 for dense
};

// kWarpWide: all 32 lanes of a warp call next() together (math warpgroups); values loaded from the workspace are
// then broadcast from lane 0, so the compiler knows the tile loop's values are warp-uniform.
template <class T, bool kWarpWide> struct WgradScheduler {
  static constexpr uint32_t kNumNUnits = T::kMulticast == 1 ? ceil_div(T::kNumNBlocks, 2u) : T::kNumNBlocks;

  static constexpr uint32_t kMUnitsPerGroup = T::kMulticast == 2 ? T::kNumMBlocksGrouped / 2 : T::kNumMBlocksGrouped;
  static constexpr uint32_t kTilesPerGroup = kMUnitsPerGroup * kNumNUnits;  // scheduling units: pairs with multicast

  KGroupedWorkspace ws;
  uint32_t num_m_units;   // scheduling units along M (pairs of m blocks with B multicast)
  uint32_t num_units;     // of the whole launch (dense)
  uint32_t next_unit, stride, rank;

  __device__ __forceinline__ WgradScheduler(uint32_t shape_m, const KGroupedWorkspace& ws_) : ws(ws_) {
    rank = T::kCluster > 1 ? cluster_cta_rank() : 0;
    next_unit = blockIdx.x / T::kCluster;
    stride = gridDim.x / T::kCluster;
    const uint32_t m_blocks = T::kKGrouped ? T::kNumMBlocksGrouped : ceil_div(shape_m, T::BLOCK_M);
    num_m_units = T::kMulticast == 2 ? ceil_div(m_blocks, 2u) : m_blocks;
    num_units = num_m_units * kNumNUnits;
  }

  // K-grouped: read from the workspace at each tile rather than held through the K loop, where a register for it
  // was one too many for 128x152 tiles (NVRTC 13.0 and 13.5 spilled it: a store and a load per tile).
  __device__ __forceinline__ uint32_t launch_units() const {
    if constexpr (T::kKGrouped) return uniform(__ldg(ws.num_active())) * kTilesPerGroup;
    return num_units;
  }

  template <typename V> static __device__ __forceinline__ V uniform(V v) {
    if constexpr (kWarpWide) return __shfl_sync(0xffffffffu, v, 0);
    return v;
  }

  // Stripes of kRasterN n units swept over all m units: consecutive tiles share A rows, a stripe's B stays in L2.
  __device__ __forceinline__ void rasterize(uint32_t unit, WgradTile& t) const {
    const uint32_t tiles_per_stripe = num_m_units * T::kRasterN;
    const uint32_t stripe = unit / tiles_per_stripe;
    const uint32_t first_n = stripe * T::kRasterN;
    const uint32_t stripe_n = cmin(T::kRasterN, kNumNUnits - first_n);
    const uint32_t in_stripe = unit - stripe * tiles_per_stripe;
    t.m_block = in_stripe / stripe_n;
    t.n_block = first_n + in_stripe % stripe_n;
    if (T::kMulticast == 1) t.n_block = t.n_block * 2 + rank;
    if (T::kMulticast == 2) t.m_block = t.m_block * 2 + rank;
  }

  __device__ __forceinline__ bool next(WgradTile& t) {
    if (next_unit >= launch_units()) return false;
    const uint32_t unit = next_unit;
    next_unit += stride;
    if constexpr (T::kKGrouped) {
      const uint32_t slot = unit / kTilesPerGroup;
      t.group = uniform(__ldg(ws.active() + slot));
      const uint4 info = __ldg(reinterpret_cast<const uint4*>(ws.info() + t.group));
      t.num_kb = uniform(info.x);
      t.scale_row0 = uniform(info.y);
      rasterize(unit - slot * kTilesPerGroup, t);
    } else {
      t.group = 0;
      t.num_kb = T::kNumKBlocks;
      t.scale_row0 = 0;
      rasterize(unit, t);
    }
    return true;
  }
};

}  // namespace cupygemm
