// Weights before the wait: under PDL a kernel is resident while the kernel before it drains, and its B (weights)
// cannot depend on that kernel when the caller declared them constant (packed weights). So the producer fetches the
// first K blocks of B into L2 before griddepcontrol.wait, and the pipeline's first loads hit L2 instead of starting
// from DRAM after the previous grid has finished. A and its scales still wait: they are the previous kernel's output.
//
// What is fetched: for every group and every K split's first block, the first K blocks of all of B's rows, the
// whole budget (kBPrefetchBytes) shared evenly among those starts; every CTA fetches its 1/gridDim slice of each.
// Which tile a CTA will run is not known yet (side-aware kernels draw it after the wait), and need not be: the
// slices are what the grid as a whole reads first. Packed B is group-major, then K-block-major (l2_sides.cuh,
// PackedB), so a K block of all rows is one run of bytes.
#pragma once
#include "kernel_traits.cuh"
#include "ptx_bulk.cuh"

namespace cupygemm {

template <class T> __device__ __forceinline__ void prefetch_b_window(const uint8_t* packed_b, uint32_t num_groups) {
  static_assert(T::kSides, "only packed weights are constant until repacked (cupygemm/plan.py, b_prefetch)");
  using L = typename T::PackedLayout;
  constexpr uint32_t kStarts = T::kSplitK;  // the K block where each split begins (scheduler.cuh)
  constexpr uint32_t kBlockBytes = L::kPairs * L::kPairBytes;
  const uint32_t window = cmin(round_up(T::kBPrefetchBytes / (num_groups * kStarts), 16u),
                               kBlockBytes * cmin(T::kNumStages, ceil_div(T::kNumKBlocks, kStarts)));
  const uint32_t piece = round_up(ceil_div(window, gridDim.x), 16u);
  const uint32_t offset = blockIdx.x * piece;
  if (offset >= window) return;
  const uint32_t bytes = cmin(piece, window - offset);
  for (uint32_t g = 0; g < num_groups; ++g)
    for (uint32_t s = 0; s < kStarts; ++s) {
      const uint32_t kb = s * T::kNumKBlocks / kStarts;
      bulk_prefetch_l2(packed_b + g * L::kGroupBytes + uint64_t(kb) * kBlockBytes + offset, bytes);
    }
}

}  // namespace cupygemm
