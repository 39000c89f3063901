// Persistent tile scheduler: which (m block, n block, group) a CTA works on next.
// The producer and every math warpgroup run their own copy and see the same sequence.
#pragma once
#include "l2_sides.cuh"
#include "ptx_common.cuh"

namespace cupygemm {

enum GemmKind : int { kNormal = 0, kGroupedContiguous = 1, kGroupedMasked = 2 };

struct Tile {
  uint32_t m_block;  // block index within the group's rows (masked) or within all rows
  uint32_t n_block;
  uint32_t group;    // B (and for masked, A/D) group index; 0 for normal GEMMs
  // Contiguous 256-row tiles: bit h set = rows [128h, 128h + 128) of the block belong to `group` and are
  // computed (by math warpgroup h). Groups are 128-row aligned, so a 256-row block may hold two groups: it is
  // then scheduled as two tiles, one per half. Every other tile has both bits set.
  uint32_t halves;
  uint32_t rows;  // rows of the group's A and D: the clamped masked_m (masked), else all rows
  uint32_t k_split;  // which K split (split-K) or stream-K piece of the tile this CTA sums
  uint32_t k_begin, k_end;  // the K blocks [k_begin, k_end) this CTA sums for the tile
  // Stream-K tail: the tail unit whose K blocks several clusters share (partial sums, the last one reduces), or
  // kWholeUnit when this CTA sums all of the tile's K blocks itself.
  uint32_t sk_unit;
};

constexpr uint32_t kWholeUnit = ~0u;

// kMulticast: 0 = one CTA per tile; 1 = 2-CTA clusters on neighbouring n blocks (they share A);
// 2 = 2-CTA clusters on neighbouring m blocks (they share B; normal GEMMs only). The host only picks a
// multicast mode when the paired dimension has an even number of blocks, so a pair is always complete.
// kSplitK > 1 (normal GEMMs): every output tile is computed as kSplitK work units, one per split of the K
// blocks, on different CTAs; the units of one tile are consecutive, so they run in the same wave.
// kStreamK (normal and masked GEMMs): the R units of the last, partly filled round (all units, when fewer than
// the clusters) are each split along K into s = min(G / R, K blocks, kMaxSplit) equal pieces, one piece per
// cluster, so the tail takes about 1/s of a round instead of a whole one. Piece j of every tail unit covers the
// same K blocks, and the pieces run side by side, so they share A and B tiles in L2 as a full round does (a
// stream-K split into contiguous K ranges per cluster loses that sharing and measures slower). Each piece stores
// FP32 partial sums in its cluster's slot; the unit's last piece to arrive adds all s in K order. The host's model
// weighs it (the config's stream_k): the read-back runs on one SM, so it pays where the tail's pieces save more
// than that.
// kWarpWide: all 32 lanes of a warp call next() together (math warpgroups). Values read from the group layout are
// then broadcast from lane 0, so the compiler knows the tile loop's branches are warp-uniform and keeps the K loop's
// descriptors and stage counters in uniform registers (with per-lane loads it moves them through R2UR every block).
// kSides (side-aware weights, l2_sides.cuh): the n units are cut into two halves, and this cluster runs the units of
// its half with the half's other clusters (its SideWork), as if the half were the whole GEMM.
template <int kKind, uint32_t SHAPE_N, uint32_t BLOCK_M, uint32_t BLOCK_N, uint32_t kRasterN, int kMulticast,
          uint32_t kSplitK, bool kStreamK, uint32_t kNumKBlocks, bool kWarpWide, bool kSides = false,
          bool kSplitCluster = false>
struct TileScheduler {
  static_assert(kSplitK == 1 || kKind == kNormal, "split-K across CTAs: normal GEMMs only");
  static_assert(!kSides || !kStreamK, "side-aware: no stream-K tail");
  static_assert(!kStreamK || (kSplitK == 1 && kKind != kGroupedContiguous), "stream-K tail: normal or masked");
  static constexpr uint32_t kMaxSplit = 8;  // pieces per tail unit, at most (the last one reads them all back)
  static constexpr uint32_t kNumNBlocks = ceil_div(SHAPE_N, BLOCK_N);
  static constexpr uint32_t kCluster = kMulticast ? 2 : kSplitCluster ? kSplitK : 1;
  // Units a cluster takes at once: split-K clusters take a tile's kSplitK units (unit = tile * kSplitK + split),
  // rank r its split r.
  static constexpr uint32_t kClusterUnits = kSplitCluster ? kSplitK : 1;
  // Scheduling units along N and (for kMulticast == 2) M: a unit is a pair of blocks when clustered.
  static constexpr uint32_t kNumNUnits = kMulticast == 1 ? kNumNBlocks / 2 : kNumNBlocks;
  static constexpr uint32_t kNotLoaded = ~0u;
  static constexpr uint32_t kGroupAlign = 128;  // contiguous: every group's rows start on a multiple of this

  uint32_t shape_m;         // rows (normal/contiguous) or max rows per group (masked)
  uint32_t num_groups;
  const int* grouped_layout;  // m_indices (contiguous) or masked_m (masked)
  uint32_t next_tile;
  // Masked: running position over groups (tile indices only grow, so the scan is incremental); the current
  // group's rows and tiles are read from masked_m once per group.
  uint32_t cur_group = 0, cur_group_first_tile = 0, cur_group_rows = 0, cur_group_tiles = kNotLoaded;
  // Contiguous: the current 256-row block holds two groups and its first half was returned last call.
  bool on_second_half = false;

  uint32_t rank;  // this CTA's place in its cluster
  uint32_t stride;  // units one round of the grid takes: its clusters (side-aware: its half's) times kClusterUnits
  // Side-aware: this cluster's half of the n units. Read as (kSides ? side_n_units : kNumNUnits) where used: behind
  // a member function the grouped kinds' code changes under NVRTC (cuda_src/README.md, "Changing the kernel").
  uint32_t side_n_unit_begin = 0, side_n_units = 0;

  // Stream-K tail: units [0, dp_units) run whole, one per cluster in turn. dp_units is a multiple of the
  // clusters, so cluster c's next index is dp_units + c: below end_units it runs piece c / sk_units of tail unit
  // c % sk_units. Masked without a tail: dp_units and end_units stay ~0u, the group scan ends the schedule.
  uint32_t dp_units = ~0u, end_units = ~0u, sk_units = 0, sk_split = 1;

  // With kStreamK all 32 lanes of the warp construct it (masked: they sum the groups' units together).
  __device__ __forceinline__ TileScheduler(uint32_t shape_m_, uint32_t num_groups_, const int* layout,
                                           const SideWork& side = SideWork{})
      : shape_m(shape_m_), num_groups(num_groups_), grouped_layout(layout),
        rank(kCluster > 1 ? cluster_cta_rank() : 0) {
    next_tile = blockIdx.x / kCluster * kClusterUnits + (kSplitCluster ? rank : 0);
    stride = gridDim.x / kCluster * kClusterUnits;
    if constexpr (kSides) {
      next_tile = side.index * kClusterUnits + (kSplitCluster ? rank : 0), stride = side.clusters * kClusterUnits;
      side_n_unit_begin = side.n_unit_begin, side_n_units = side.n_units;
    }
    if constexpr (kStreamK) plan_tail(total_units());
  }

  __device__ __forceinline__ uint32_t num_m_units() const {
    return ceil_div(shape_m, BLOCK_M) / (kMulticast == 2 ? 2 : 1);
  }
  // Units of the whole launch (masked: summed over the groups' masked_m by the warp's lanes).
  __device__ __forceinline__ uint32_t total_units() const {
    if constexpr (kKind != kGroupedMasked) {
      return num_m_units() * kNumNUnits;
    } else {
      const uint32_t lane = threadIdx.x % 32;
      uint32_t units = 0;
      for (uint32_t g = lane; g < num_groups; g += 32)
        units += ceil_div(clamped_masked_m(grouped_layout, g, shape_m), BLOCK_M) * kNumNUnits;
#pragma unroll
      for (uint32_t d = 16; d > 0; d /= 2) units += __shfl_xor_sync(0xffffffffu, units, d);
      return __shfl_sync(0xffffffffu, units, 0);
    }
  }
  __device__ __forceinline__ void plan_tail(uint32_t units) {
    const uint32_t tail = units % stride;
    const uint32_t split = tail == 0 ? 1 : cmin(cmin(stride / tail, kNumKBlocks), kMaxSplit);
    if (split > 1) sk_units = tail, sk_split = split;
    dp_units = units - sk_units;
    end_units = dp_units + sk_units * sk_split;
  }
  // Tail piece `piece` of unit u: its K blocks, and its partial-sum slot (the cluster that runs it).
  __device__ __forceinline__ uint32_t sk_k_begin(uint32_t piece) const { return piece * kNumKBlocks / sk_split; }
  __device__ __forceinline__ uint32_t sk_slot(uint32_t u, uint32_t piece) const { return piece * sk_units + u; }

  // Rasterize in stripes of kRasterN n units: consecutive tiles share A rows, a stripe's B stays in L2.
  __device__ __forceinline__ void rasterize(uint32_t tile, uint32_t num_m_units, Tile& t) const {
    const uint32_t tiles_per_stripe = num_m_units * kRasterN;
    const uint32_t stripe = tile / tiles_per_stripe;
    const uint32_t first_n = stripe * kRasterN;
    const uint32_t stripe_n = cmin(kRasterN, (kSides ? side_n_units : kNumNUnits) - first_n);
    const uint32_t in_stripe = tile - stripe * tiles_per_stripe;
    t.m_block = in_stripe / stripe_n;
    t.n_block = first_n + in_stripe % stripe_n;
    if constexpr (kSides) t.n_block += side_n_unit_begin;
    if (kMulticast == 1) t.n_block = t.n_block * 2 + rank;
    if (kMulticast == 2) t.m_block = t.m_block * 2 + rank;
  }

  static __device__ __forceinline__ uint32_t clamped_masked_m(const int* masked_m, uint32_t g, uint32_t max_m) {
    const int v = __ldg(masked_m + g);
    return v <= 0 ? 0u : cmin(static_cast<uint32_t>(v), max_m);
  }

  // m_indices entry of a row (-1 past the last row), as loaded by this lane; see uniform().
  __device__ __forceinline__ int raw_group(uint32_t row) const {
    return row < shape_m ? __ldg(grouped_layout + row) : -1;
  }
  template <typename T> static __device__ __forceinline__ T uniform(T v) {
    if constexpr (kWarpWide) return __shfl_sync(0xffffffffu, v, 0);
    return v;
  }
  // The group a 128-row block computes for, or -1 when it is skipped (padding, out-of-range entries).
  __device__ __forceinline__ int valid_group(int raw) const {
    return raw >= 0 && static_cast<uint32_t>(raw) < num_groups ? raw : -1;
  }

  // Unit `tile` of the masked groups into `t`; units must be asked for in increasing order.
  __device__ __forceinline__ bool masked_unit(uint32_t tile, Tile& t) {
    while (cur_group < num_groups) {
      if (cur_group_tiles == kNotLoaded) {
        cur_group_rows = uniform(clamped_masked_m(grouped_layout, cur_group, shape_m));
        cur_group_tiles = ceil_div(cur_group_rows, BLOCK_M) * (kSides ? side_n_units : kNumNUnits);
      }
      if (tile < cur_group_first_tile + cur_group_tiles) {
        rasterize(tile - cur_group_first_tile, ceil_div(cur_group_rows, BLOCK_M), t);
        t.group = cur_group;
        t.rows = cur_group_rows;
        t.halves = 0b11;
        return true;
      }
      cur_group_first_tile += cur_group_tiles;
      ++cur_group;
      cur_group_tiles = kNotLoaded;
    }
    return false;
  }

  // Unit `unit` of a normal GEMM or the masked groups into `t` (its K range, k_split and sk_unit are set by the
  // caller).
  __device__ __forceinline__ bool unit_tile(uint32_t unit, Tile& t) {
    if constexpr (kKind == kGroupedMasked) return masked_unit(unit, t);
    rasterize(unit, num_m_units(), t);
    t.halves = 0b11;
    t.rows = shape_m;
    t.group = 0;
    return true;
  }

  // The next tile of this CTA into `t`; false when there is none.
  __device__ __forceinline__ bool next(Tile& t) {
    if constexpr (kStreamK || kKind == kGroupedMasked) {
      // Whole units and tail pieces take one path through here, with selects for the difference: a separate
      // return path for the pieces costs the K loop its uniform-register descriptors (R2UR 9 -> ~290).
      if (next_tile >= end_units) return false;
      const uint32_t index = next_tile;
      next_tile += stride;
      const bool piece = kStreamK && index >= dp_units;
      const uint32_t u = piece ? (index - dp_units) % sk_units : 0, j = piece ? (index - dp_units) / sk_units : 0;
      t.k_begin = piece ? sk_k_begin(j) : 0, t.k_end = piece ? sk_k_begin(j + 1) : kNumKBlocks;
      t.k_split = j;
      t.sk_unit = piece ? u : kWholeUnit;
      return unit_tile(piece ? dp_units + u : index, t);
    }
    const uint32_t num_tiles = num_m_units() * (kSides ? side_n_units : kNumNUnits) * kSplitK;
    while (next_tile < num_tiles) {
      rasterize(next_tile / kSplitK, num_m_units(), t);
      t.k_split = next_tile % kSplitK;
      // The K blocks of this split: balanced, never empty.
      t.k_begin = t.k_split * kNumKBlocks / kSplitK, t.k_end = (t.k_split + 1) * kNumKBlocks / kSplitK;
      t.sk_unit = kWholeUnit;
      t.halves = 0b11;
      t.rows = shape_m;
      if (kKind == kNormal) {
        t.group = 0;
        next_tile += stride;
        return true;
      }
      // Contiguous: a kGroupAlign-row block's group is its first row's m_indices entry.
      const uint32_t row0 = t.m_block * BLOCK_M;
      const int g0 = valid_group(uniform(raw_group(row0)));
      const int g1 = BLOCK_M > kGroupAlign ? valid_group(uniform(raw_group(row0 + kGroupAlign))) : g0;
      // A 256-row block holding two groups runs as two tiles, its first half then (the same block again) its
      // second. No separate early return for the pending half: one costs the K loop its uniform registers.
      const bool two_groups = g0 >= 0 && g1 >= 0 && g0 != g1;
      const bool second = two_groups && on_second_half;  // this call returns the block's second half
      on_second_half = two_groups && !on_second_half;    // the next call does
      if (!on_second_half) next_tile += stride;
      if (g0 < 0 && g1 < 0) continue;
      const bool upper = second || g0 < 0;  // only rows [128, 256) of the block
      t.group = static_cast<uint32_t>(upper ? g1 : g0);
      t.halves = g0 == g1 ? 0b11 : upper ? 0b10 : 0b01;
      return true;
    }
    return false;
  }
};

}  // namespace cupygemm
