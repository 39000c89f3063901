// The wgrad kernel's epilogue: a math warpgroup's FP32 tile sums are added into D (FP32, in place) by TMA
// reductions. The sums are staged in shared memory in slabs of 64 rows x kSlabCols floats (rows of kSwizzleD bytes,
// swizzled as the D map says, or one unswizzled slab of a width 8 mod 16: either way the 8-byte stores of a warp
// hit every bank twice, two wavefronts, the minimum),
// and each slab is added into L2 with one cp.reduce.async.bulk.tensor. The reductions overlap the next tile's K
// loop; elements past M or N are not written (the map's extents), nor the rows' padding up to ld_d. Every element
// gets one add per launch, so results are repeatable bit for bit. With T::kStore the slabs are stored instead (D =
// A B^T, the same sums), by the same bulk-group TMA path.
//
// With fewer staged slabs than the tile has (kStagedSlabs < kNumSlabs), the tile goes out in rounds through the
// same buffer, each round waiting for the previous one's reads: less shared memory, more stages.
#pragma once
#include "named_barriers.cuh"
#include "ptx_tma.cuh"
#include "ptx_tma_reduce.cuh"
#include "wgrad_scheduler.cuh"
#include "wgrad_traits.cuh"

namespace cupygemm {

// Byte offset of float (row, col) in a slab with kRowBytes-wide rows, swizzled for TMA when kSwizzleBytes is a span
// (CU_TENSOR_MAP_SWIZZLE_{32,64,128}B: the 16-byte chunk index XORed with the row's place in the swizzle pattern;
// the rows are then the span wide), plain row-major when it is 0.
template <uint32_t kSwizzleBytes, uint32_t kRowBytes>
__device__ __forceinline__ uint32_t f32_slab_offset(uint32_t row, uint32_t col) {
  const uint32_t offset = row * kRowBytes + col * 4;
  if constexpr (kSwizzleBytes == 0) return offset;
  return offset ^ (((offset >> 7) & (kSwizzleBytes / 16 - 1)) << 4);
}

template <class T> struct EpilogueF32 {
  const TmaDescriptor& tmap_d;  // D [G][M][ld_d] float32 as (N, M, G), boxes of kSlabCols x 64 x 1
  const MathThread& th;
  uint32_t shape_m;

  __device__ __forceinline__ void store(const float (&out)[T::kAcc], const WgradTile& tile) const {
    const uint32_t first_row = tile.m_block * T::BLOCK_M + th.wg_row0;
    // A warpgroup's rows wholly past M (M < 128, or the second tile of a multicast pair over an odd block count)
    // or a tile wholly past N: nothing to add, and no TMA box wholly outside the tensor.
    if (first_row >= (T::kKGrouped ? T::SHAPE_M : shape_m) || tile.n_block * T::BLOCK_N >= T::SHAPE_N) return;
    const int row0 = static_cast<int>(first_row);
    const int n0 = static_cast<int>(tile.n_block * T::BLOCK_N);
    const int group = static_cast<int>(tile.group);
    const uint32_t staging = smem_u32(th.smem_d);
#pragma unroll
    for (uint32_t round = 0; round < T::kRounds; ++round) {
      const uint32_t slab0 = round * T::kStagedSlabs;
      // The buffer is free once the reductions that read it (the previous round's or tile's) have read it.
      if (th.tid == 0) tma_store_wait_read<0>();
      named_barrier_sync(th.barrier, 128);
#pragma unroll
      for (uint32_t g = 0; g < T::kNumNGroups; ++g) {
        const uint32_t slab = g * 8 / T::kSlabCols;  // compile-time per (round, g)
        if (slab < slab0 || slab >= slab0 + T::kStagedSlabs) continue;
        const uint32_t col = g * 8 % T::kSlabCols + th.col_in_group;  // in the slab
#pragma unroll
        for (uint32_t h = 0; h < 2; ++h) {
          const uint32_t addr = staging + (slab - slab0) * T::kSlabBytes +
                                f32_slab_offset<T::kSwizzleD, T::kSlabRowBytes>(th.row_in_sub + 8 * h, col);
          st_shared_f32x2(addr, out[g * 4 + 2 * h], out[g * 4 + 2 * h + 1]);
        }
      }
      fence_proxy_async_shared();  // the stores are visible to the TMA unit
      named_barrier_sync(th.barrier, 128);
      if (th.tid == 0) {
#pragma unroll
        for (uint32_t i = 0; i < T::kStagedSlabs; ++i) {
          const uint32_t slab = slab0 + i;
          if (slab >= T::kNumSlabs) break;
          const int col = n0 + static_cast<int>(slab * T::kSlabCols);
          if constexpr (T::kStore) {
            tma_store_3d(&tmap_d, th.smem_d + i * T::kSlabBytes, col, row0, group);
          } else {
            tma_reduce_add_3d(&tmap_d, th.smem_d + i * T::kSlabBytes, col, row0, group);
          }
        }
        tma_store_commit();
      }
    }
  }

  // Before the CTA exits: its last reductions have completed (and read shared memory).
  __device__ __forceinline__ void finish() const {
    if (th.tid == 0) tma_store_wait_all<0>();
  }

  static __device__ __forceinline__ void st_shared_f32x2(uint32_t addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
  }
};

}  // namespace cupygemm
