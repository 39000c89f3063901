// The epilogue: a math warpgroup's FP32 tile sums become BF16 rows of D. Three ways out, chosen per tile by which
// rows may be written:
//  - every row of the warpgroup's part: staged in swizzled shared memory, then one TMA store per slab, which
//    overlaps the next tile's K loop;
//  - masked tiles past the group's masked_m: staged the same way, then only the valid rows copied out in 16-byte
//    pieces (the rows past them lie inside D and must stay untouched, so no TMA store);
//  - contiguous tiles with rows of other groups or padding: direct 4-byte stores from the accumulators, row by row.
#pragma once
#include "kernel_traits.cuh"
#include "named_barriers.cuh"
#include "ptx_global.cuh"
#include "ptx_tma.cuh"

namespace cupygemm {

// Byte offset of element (row, col) of a BF16 output slab with `kSwizzleBytes`-wide swizzled rows
// (the layout TMA expects for CU_TENSOR_MAP_SWIZZLE_{32,64,128}B; 0 = plain row-major).
template <uint32_t kSwizzleBytes, uint32_t kRowBytes>
__device__ __forceinline__ uint32_t d_slab_offset(uint32_t row, uint32_t col) {
  const uint32_t offset = row * kRowBytes + col * 2;
  if (kSwizzleBytes == 0) return offset;
  return offset ^ (((offset >> 7) & (kSwizzleBytes / 16 - 1)) << 4);
}

template <class T> struct Epilogue {
  // Contiguous: the group of each row this thread owns, (m64 sub-tile, +8) -> m_indices entry.
  struct RowGroups {
    int g[T::kNumMSub][2];
  };

  const TmaDescriptor& tmap_d;
  uint16_t* d_ptr;
  const int* grouped_layout;
  uint32_t shape_m, ld_d;
  const MathThread& th;

  // Contiguous: reads the m_indices entries of this thread's rows, before the K loop so the latency hides behind
  // it (only the tile group's rows are written).
  __device__ __forceinline__ void read_row_groups(RowGroups& rg, const Tile& tile, const WarpgroupRows& rows) const {
    if constexpr (T::kKind == kGroupedContiguous) {
#pragma unroll
      for (uint32_t ms = 0; ms < T::kNumMSub; ++ms)
#pragma unroll
        for (uint32_t h = 0; h < 2; ++h) {
          const uint32_t r = rows.first + ms * 64 + th.row_in_sub + 8 * h;
          rg.g[ms][h] = r < shape_m ? __ldg(grouped_layout + r) : static_cast<int>(tile.group);
        }
    }
  }

  __device__ __forceinline__ void store(typename T::TileAcc& acc, const Tile& tile, uint32_t n0,
                                        const WarpgroupRows& rows, const RowGroups& rg) const {
    const uint32_t barrier = th.barrier;
    bool rows_ok = true;  // every row of this warpgroup's part may be written by a TMA store
    if constexpr (T::kKind == kGroupedContiguous) {
#pragma unroll
      for (uint32_t ms = 0; ms < T::kNumMSub; ++ms)
#pragma unroll
        for (uint32_t h = 0; h < 2; ++h) rows_ok &= rg.g[ms][h] == static_cast<int>(tile.group);
      rows_ok &= !rows.half_tile;  // a TMA store covers the warpgroup's 128 rows; a half tile's warpgroup owns 64
      rows_ok = __shfl_sync(0xffffffffu, named_barrier_vote<false>(barrier, 128, rows_ok), 0);  // uniform, provably
    } else if (T::kKind == kGroupedMasked) {
      rows_ok = rows.first + T::WG_M <= tile.rows;  // uniform across the warpgroup
    }
    // Masked tiles stage even when some rows are past masked_m: per-thread 4-byte stores straight from the
    // accumulators cost more than staging and 16-byte copies of the valid rows.
    constexpr bool kStagedRows = T::kKind == kGroupedMasked;
    if (rows_ok || kStagedRows) {
      stage(acc, barrier);
      if (rows_ok)
        tma_store(tile, n0, rows, barrier);
      else
        copy_valid_rows(tile, n0, rows, barrier);
    } else {
      store_direct(acc, tile, n0, rows, rg);
    }
  }

  // Into swizzled shared memory, after this warpgroup's previous TMA store has read it.
  __device__ __forceinline__ void stage(typename T::TileAcc& acc, uint32_t barrier) const {
    if (th.tid == 0) tma_store_wait_read<0>();
    named_barrier_sync(barrier, 128);
#pragma unroll
    for (uint32_t ms = 0; ms < T::kNumMSub; ++ms)
#pragma unroll
      for (uint32_t ns = 0; ns < T::kNumNSub; ++ns)
#pragma unroll
        for (uint32_t g = 0; g < T::WGMMA_N / 8; ++g)
#pragma unroll
          for (uint32_t h = 0; h < 2; ++h) {
            const uint32_t col = ns * T::WGMMA_N + g * 8 + th.col_in_group;
            const uint32_t row = ms * 64 + th.row_in_sub + 8 * h;
            const uint32_t slab = col / T::kSlabCols;
            const uint32_t addr = smem_u32(th.smem_d + slab * T::kSlabBytes) +
                                  d_slab_offset<T::kSwizzleD, T::kSlabCols * 2>(row, col % T::kSlabCols);
            st_shared_u32(addr, pack_bf16x2(acc[ms][ns][g * 4 + 2 * h], acc[ms][ns][g * 4 + 2 * h + 1]));
          }
  }

  __device__ __forceinline__ void tma_store(const Tile& tile, uint32_t n0, const WarpgroupRows& rows,
                                            uint32_t barrier) const {
    fence_proxy_async_shared();
    named_barrier_sync(barrier, 128);
    if (th.tid == 0) {
      const int d_group = T::kKind == kGroupedMasked ? static_cast<int>(tile.group) : 0;
#pragma unroll
      for (uint32_t slab = 0; slab < T::kNumSlabs; ++slab)
        tma_store_3d(&tmap_d, th.smem_d + slab * T::kSlabBytes, static_cast<int>(n0 + slab * T::kSlabCols),
                     static_cast<int>(rows.first), d_group);
      tma_store_commit();
    }
  }

  // Consecutive threads take consecutive 8-column pieces of a row: whole rows go out coalesced. (The next tile's
  // staging waits at the barrier in stage() until every thread has read its pieces.)
  __device__ __forceinline__ void copy_valid_rows(const Tile& tile, uint32_t n0, const WarpgroupRows& rows,
                                                  uint32_t barrier) const {
    named_barrier_sync(barrier, 128);
    constexpr uint32_t kPiecesPerRow = T::BLOCK_N / 8;
    const uint32_t valid_rows = cmin(T::WG_M, tile.rows - rows.first);
    uint16_t* d_tile = d_ptr + (uint64_t(tile.group) * shape_m + rows.first) * ld_d + n0;
#pragma unroll 4
    for (uint32_t i = th.tid; i < valid_rows * kPiecesPerRow; i += 128) {
      const uint32_t row = i / kPiecesPerRow, col = (i % kPiecesPerRow) * 8;
      const uint32_t addr = smem_u32(th.smem_d + (col / T::kSlabCols) * T::kSlabBytes) +
                            d_slab_offset<T::kSwizzleD, T::kSlabCols * 2>(row, col % T::kSlabCols);
      if (n0 + col < T::SHAPE_N) st_global_v4(d_tile + uint64_t(row) * ld_d + col, ld_shared_v4(addr));
    }
  }

  // Contiguous rows of other groups or padding must stay untouched: direct stores of the group's rows.
  __device__ __forceinline__ void store_direct(typename T::TileAcc& acc, const Tile& tile, uint32_t n0,
                                               const WarpgroupRows& rows, const RowGroups& rg) const {
    // The tile's and rows' fields are read into locals once, before the row loop, as the kernel had them before
    // the split into parts: read through the references inside each row's `&&` chain, NVRTC 13.0 (and 12.8/12.9)
    // branched on each row's checks one by one instead of combining them, which renamed registers through the
    // whole contiguous kernel and, on 256-row tiles, reordered the K loop's stage advance (NVRTC 13.5 made the same
    // code either way; README, "Changing the kernel").
    const uint32_t valid_m = tile.rows, first = rows.first, active = rows.active;
    const int group = static_cast<int>(tile.group);
#pragma unroll
    for (uint32_t ms = 0; ms < T::kNumMSub; ++ms)
#pragma unroll
      for (uint32_t h = 0; h < 2; ++h) {
        const uint32_t r = first + ms * 64 + th.row_in_sub + 8 * h;
        bool ok = r < valid_m;
        if constexpr (T::kKind == kGroupedContiguous)  // (a half tile's second sub-tile is the other warpgroup's)
          ok = ok && rg.g[ms][h] == group && ms < active;
        if (!ok) continue;
        uint16_t* d_row = d_ptr + uint64_t(r) * ld_d;
#pragma unroll
        for (uint32_t ns = 0; ns < T::kNumNSub; ++ns)
#pragma unroll
          for (uint32_t g = 0; g < T::WGMMA_N / 8; ++g) {
            const uint32_t col = n0 + ns * T::WGMMA_N + g * 8 + th.col_in_group;
            if (col < T::SHAPE_N)
              *reinterpret_cast<uint32_t*>(d_row + col) =
                  pack_bf16x2(acc[ms][ns][g * 4 + 2 * h], acc[ms][ns][g * 4 + 2 * h + 1]);
          }
      }
  }

  // Before the CTA exits: its last TMA stores have finished reading shared memory.
  __device__ __forceinline__ void finish() const {
    if (th.tid == 0) tma_store_wait_all<0>();
  }
};

}  // namespace cupygemm
