// The producer: one thread of the last warpgroup streams each tile's A, B and A-scale blocks into the pipeline's
// stages with TMA, cluster multicast halving the operand traffic of paired CTAs, and an L2 eviction hint on B
// tiles read by one CTA (pair) only. Side-aware kernels read B packed (l2_sides.cuh), a TMA box per piece of a
// 4 KiB chunk.
#pragma once
#include "kernel_traits.cuh"
#include "ptx_mbarrier.cuh"
#include "ptx_tma.cuh"

namespace cupygemm {

template <class T> struct Producer {
  const TmaDescriptor& tmap_a;
  const TmaDescriptor& tmap_a_tail;  // A's box ending at A's last row (contract.py, tma_specs)
  const TmaDescriptor& tmap_b;
  const TmaDescriptor& tmap_sfa;
  const SharedStorage<T>& smem;

  // A's boxes of K offset k for a tile starting at row a_row into `stage` (A multicast: this CTA's half of the
  // boxes, into both CTAs of the pair). `a_tail`: the last box reaches past A's rows and loads tmap_a_tail's.
  __device__ __forceinline__ void load_a(uint32_t stage, int k, int a_row, int a_group, uint32_t a_boxes,
                                         bool a_tail, uint32_t rank) const {
#pragma unroll
    for (uint32_t i = 0; i < T::kABoxesPerCta; ++i) {
      const uint32_t box = (T::kMulticast == 1 ? rank * T::kABoxesPerCta : 0) + i;
      if (box >= a_boxes) break;
      uint8_t* dst = smem.a + stage * T::SMEM_A + box * T::A_BOX_M * kBlockK;
      const int row = a_row + static_cast<int>(box * T::A_BOX_M);
      const TmaDescriptor* map = a_tail && box == a_boxes - 1 ? &tmap_a_tail : &tmap_a;
      if constexpr (T::kMulticast == 1)
        tma_load_3d_multicast(dst, map, &smem.full_bar[stage], 0b11, k, row, a_group);
      else
        tma_load_3d(dst, map, &smem.full_bar[stage], k, row, a_group);
    }
  }

  // Side-aware kernels: packed B as TMA boxes over the packed buffer (tmap_b maps it as rows of 128 bytes), one box
  // per piece of a 32-row chunk, each from the slot its pair's side picks. The sides come from the hash and the
  // page bits, as parameters (kSidePageParams) or in shared memory, so no load waits on global memory (a swap bit
  // loaded per chunk, or the whole warp issuing, cost the loop 10-25 %: benchmarks/NOTES.md, "L2-side-aware weights";
  // the shared-memory load up to 25 % on the H200: benchmarks/NOTES.md, "L2-side-aware weights"). `row0`: this CTA's
  // first row (B multicast: each CTA of the pair loads its half into both).
  __device__ __forceinline__ void load_packed_b(uint32_t stage, uint32_t kb, uint32_t b_group, uint32_t n0,
                                               uint32_t row0, bool b_first, uint64_t b_policy,
                                               const PageSides& pages,
                                               const typename T::ParamSides& param_pages) const {
    using L = typename T::PackedLayout;
    constexpr uint32_t kBox = T::kSideBoxRows;  // rows per TMA box: pieces never straddle a chunk
    static_assert(L::kChunkRows % kBox == 0 && T::kSideCtaRows % kBox == 0, "boxes tile the chunks and the rows");
    const uint32_t rows_end = cmin(row0 + T::kSideCtaRows, L::kPaddedRows);
#pragma unroll
    for (uint32_t r = 0; r < T::kSideCtaRows; r += kBox) {
      const uint32_t row = row0 + r;
      if (row >= rows_end) break;
      int y;  // the box's TMA row: rows of 128 bytes from the buffer's start
      if constexpr (T::kSidePageParams) {
        const uint32_t pair = L::pair_index(b_group, kb, row);
        const uint32_t slot = (row / L::kChunkRows >= L::kChunks0 ? 1u : 0u) ^ param_pages.side_of_pair(pair);
        y = static_cast<int>(pair * (L::kPairBytes / kBlockK) + slot * (L::kSlotBytes / kBlockK) + row % L::kChunkRows);
      } else {
        const uint64_t pair = L::pair_offset(b_group, kb, row);
        y = static_cast<int>((pair + L::slot_of(pages, pair, row) * L::kSlotBytes) / kBlockK) +
            static_cast<int>(row % L::kChunkRows);
      }
      uint8_t* dst = smem.b + stage * T::SMEM_B + (row - n0) * kBlockK;
      if constexpr (T::kMulticast == 2) {
        if (!b_first) tma_load_3d_multicast(dst, &tmap_b, &smem.full_bar[stage], 0b11, 0, y, 0);
        else tma_load_3d_multicast_hint(dst, &tmap_b, &smem.full_bar[stage], 0b11, 0, y, 0, b_policy);
      } else {
        if (!b_first) tma_load_3d(dst, &tmap_b, &smem.full_bar[stage], 0, y, 0);
        else tma_load_3d_hint(dst, &tmap_b, &smem.full_bar[stage], 0, y, 0, b_policy);
      }
    }
  }

  // Called by the producer warpgroup's first warp, which builds the scheduler (scheduler.cuh: a whole warp may
  // share the work of planning); then one thread loads the K blocks [tile.k_begin, tile.k_end) of every tile the
  // scheduler hands this CTA (into `tile`) into the ring of stages, and waits until the consumers released them
  // all. Side-aware kernels wait for the page bits first (unless they came as parameters) and load packed B
  // (load_packed_b). The loop's instructions bound one-row-block GEMMs, and keep_one_lane() takes the loops over
  // active lanes around each TMA copy out of it (up to 5 % faster there, benchmarks/NOTES.md, "Producer on one lane").
  __device__ __forceinline__ void run(uint32_t shape_m, uint32_t num_groups, const int* grouped_layout,
                                      uint32_t b_evict_first, const SideWork& side, const PageSides& pages,
                                      const typename T::ParamSides& param_pages, Tile& tile) const {
    typename T::ProducerScheduler scheduler(shape_m, num_groups, grouped_layout, side);
    keep_one_lane();
    if constexpr (T::kSides && !T::kSidePageParams) mbarrier_wait(smem.page_bar, 0);
    uint32_t stage = 0, phase = 0;
    while (scheduler.next(tile)) {
      const int a_row = static_cast<int>(tile.m_block * T::BLOCK_M);
      const int a_group = T::kKind == kGroupedMasked ? static_cast<int>(tile.group) : 0;
      const int b_row = static_cast<int>(tile.n_block * T::BLOCK_N);
      const int b_group = T::kKind == kNormal ? 0 : static_cast<int>(tile.group);
      // A boxes wholly past the tile's valid rows are not loaded: masked tiles use 64-row boxes, since rows past
      // masked_m lie inside the tensor and would otherwise be read from memory for nothing. (The stale rows left in
      // shared memory only feed output rows that are never stored.) Packed B rows past the packed rows are not
      // loaded either: they only feed output columns past N, which are never stored.
      const uint32_t a_boxes = cmin(T::kABoxes, ceil_div(tile.rows - tile.m_block * T::BLOCK_M, T::A_BOX_M));
      // A box reaching past A's last row (shape_m; per group when masked) would be zero-filled by TMA, and such
      // boxes ran up to 40 % slower than whole ones (80x2112x7168 on 128-row tiles, 16x4096x7168 on 64-row tiles:
      // benchmarks/NOTES.md, "A tail box"). That box loads tmap_a_tail's, which ends at the last row; the rows after it
      // keep stale data that only feeds output rows past shape_m, which are never stored.
      const bool a_tail = tile.m_block * T::BLOCK_M + a_boxes * T::A_BOX_M > shape_m;
      const uint32_t a_rows = a_boxes * T::A_BOX_M - (a_tail ? T::A_BOX_M - shape_m % T::A_BOX_M : 0u);
      const uint32_t tx_bytes =
          a_rows * kBlockK +
          (T::kSides ? T::BLOCK_M * 4 + (cmin(b_row + T::BLOCK_N, T::PackedLayout::kPaddedRows) - b_row) * kBlockK
                     : T::kStageTxBytesNoA);
      // B tiles read by this CTA (or the pair sharing them) alone, when the rows fit one m block (pair), may go into
      // L2 as first to evict (where the host allows it: cupygemm.config.b_evict_first). Streamed with the normal
      // priority, they push out other data, dirty lines too, whose write-backs then compete for memory bandwidth
      // with this GEMM's loads. Other B tiles take the plain load: the cache-hint form with an
      // evict_normal policy kept less of B in L2 across calls.
      const bool b_first = b_evict_first != 0 && ceil_div(tile.rows, T::BLOCK_M) <= (T::kMulticast == 2 ? 2u : 1u);
      const uint64_t b_policy = l2_evict_first_policy();
#pragma unroll 1
      for (uint32_t kb = tile.k_begin; kb < tile.k_end; ++kb) {
        mbarrier_wait(&smem.empty_bar[stage], phase ^ 1);
        mbarrier_arrive_expect_tx(&smem.full_bar[stage], tx_bytes);
        const int k = static_cast<int>(kb * kBlockK);
        load_a(stage, k, a_row, a_group, a_boxes, a_tail, scheduler.rank);
        if constexpr (T::kSides) {
          load_packed_b(stage, kb, b_group, b_row, b_row + (T::kMulticast == 2 ? scheduler.rank * T::kSideCtaRows : 0),
                        b_first, b_policy, pages, param_pages);
        } else {
          // B multicast: each CTA of the pair loads its half of the tile's rows into both.
          uint8_t* b_dst = smem.b + stage * T::SMEM_B + (T::kMulticast == 2 ? scheduler.rank * (T::SMEM_B / 2) : 0);
          const int b_row_cta = b_row + static_cast<int>(T::kMulticast == 2 ? scheduler.rank * T::BLOCK_N / 2 : 0);
          if constexpr (T::kMulticast == 2) {
            if (!b_first)
              tma_load_3d_multicast(b_dst, &tmap_b, &smem.full_bar[stage], 0b11, k, b_row_cta, b_group);
            else
              tma_load_3d_multicast_hint(b_dst, &tmap_b, &smem.full_bar[stage], 0b11, k, b_row_cta, b_group, b_policy);
          } else {
            if (!b_first)
              tma_load_3d(b_dst, &tmap_b, &smem.full_bar[stage], k, b_row_cta, b_group);
            else
              tma_load_3d_hint(b_dst, &tmap_b, &smem.full_bar[stage], k, b_row_cta, b_group, b_policy);
          }
        }
        tma_load_3d(reinterpret_cast<uint8_t*>(smem.sfa) + stage * T::SMEM_SFA, &tmap_sfa, &smem.full_bar[stage], a_row,
                    static_cast<int>(kb), a_group);
        if (++stage == T::kNumStages) stage = 0, phase ^= 1;
      }
    }
    if constexpr (T::kStageSharers > 1) {
      // The peer's consumers arrive remotely on this CTA's empty barriers, so the producer stays until both CTAs'
      // consumers have released every stage.
      for (uint32_t i = 0; i < T::kNumStages; ++i) {
        mbarrier_wait(&smem.empty_bar[stage], phase ^ 1);
        if (++stage == T::kNumStages) stage = 0, phase ^= 1;
      }
    }
  }
};

}  // namespace cupygemm
