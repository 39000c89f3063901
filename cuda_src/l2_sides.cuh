// L2-side-aware weights. An H100/H200's L2 is two halves, and an SM reads its near half faster than the far one:
// when every SM streams B (decode-sized M), the traffic between the halves limits the GEMM. Which half holds a
// 4 KiB chunk depends on its physical address (cupygemm/l2.py probes the hash and each page), so the weights are
// packed once (cupygemm/packing.py) with the rows of N's half h on L2 side h, and the side-aware kernel gives the
// tiles of half h to CTAs running on side-h SMs. Which CTA runs where is only known on the device: each cluster
// draws a ticket on its SM's side, so every tile is computed exactly once wherever the CTAs land (a cluster on a
// side that already has its share works on the other half, from the far side).
#pragma once
#include "ptx_common.cuh"

namespace cupygemm {

// Which L2 side each SM is near: bit i % 32 of word i / 32 for SM i. Passed by value (the constant bank).
struct SideMap {
  uint32_t bits[8];
};

// The packed layout of one group of B [N, K]. N is cut into 32-row chunks of one K block (32 x 128 bytes = 4 KiB,
// the L2 hash's granularity), each row stored as a 128-byte-swizzled TMA box would leave it in shared memory, so
// a bulk copy lands ready for wgmma. Chunks [0, kChunks0) are half 0 of N, the rest half 1. Chunk j of half 0 and
// chunk j of half 1 of a K block share the 8 KiB pair kb * kPairs + j, whose two 4 KiB slots lie on opposite L2
// sides; half h sits in slot h ^ swap, the swap bit chosen at packing time so that half h lies on side h. The
// group's swap bits follow its pairs, bit j * kKBlocks + kb for pair (kb, j): one word serves a chunk for 32 K
// blocks. The next group starts 8 KiB-aligned after them.
template <uint32_t SHAPE_N, uint32_t SHAPE_K> struct PackedB {
  static constexpr uint32_t kChunkRows = 32, kSlotBytes = 4096, kPairBytes = 8192;
  static constexpr uint32_t kChunks = ceil_div(SHAPE_N, kChunkRows);
  static constexpr uint32_t kChunks0 = ceil_div(kChunks, 2u);
  static constexpr uint32_t kRows0 = kChunks0 * kChunkRows;  // rows of half 0
  static constexpr uint32_t kPaddedRows = kChunks * kChunkRows;
  static constexpr uint32_t kPairs = kChunks0;  // per K block
  static constexpr uint32_t kKBlocks = ceil_div(SHAPE_K, 128u);
  static constexpr uint64_t kDataBytes = uint64_t(kKBlocks) * kPairs * kPairBytes;
  static constexpr uint64_t kSwapBytes = round_up(uint64_t(ceil_div(kKBlocks * kPairs, 32u)) * 4, uint64_t(kPairBytes));
  static constexpr uint64_t kGroupBytes = kDataBytes + kSwapBytes;

  static __device__ __forceinline__ const uint8_t* group_at(const uint8_t* packed, uint32_t g) {
    return packed + g * kGroupBytes;
  }
  static __device__ __forceinline__ const uint32_t* swap_words(const uint8_t* group) {
    return reinterpret_cast<const uint32_t*>(group + kDataBytes);
  }
  // Where row `row` (of N) of K block kb starts, given the swap bit of its pair; rows up to the end of its chunk
  // follow it.
  static __device__ __forceinline__ const uint8_t* row_at(const uint8_t* group, uint32_t kb, uint32_t row,
                                                         uint32_t swap) {
    const uint32_t chunk = row / kChunkRows, half = chunk >= kChunks0 ? 1u : 0u;
    const uint32_t pair = kb * kPairs + chunk - half * kChunks0;
    return group + uint64_t(pair) * kPairBytes + (half ^ swap) * kSlotBytes + (row % kChunkRows) * 128u;
  }
  // The pair index j of a row's chunk within its K block.
  static __device__ __forceinline__ uint32_t pair_of_row(uint32_t row) {
    const uint32_t chunk = row / kChunkRows;
    return chunk >= kChunks0 ? chunk - kChunks0 : chunk;
  }
};

// What a side-aware launch passes besides the usual parameters.
struct SideArgs {
  const SideMap* map;  // the __grid_constant__ parameter (indexed by SM: read in place, not copied)
  const uint8_t* packed_b;  // B packed as PackedB describes
  uint32_t* tickets;        // [3] uint32, zero at launch (scratch on the launch's stream)
  uint32_t clusters0;       // clusters that work on half 0 (the rest work on half 1)
};

// The part of the schedule a cluster runs: the n units of one half, shared with that half's other clusters.
struct SideWork {
  uint32_t index;         // this cluster among the half's
  uint32_t clusters;      // the half's clusters
  uint32_t n_unit_begin;  // the half's n units
  uint32_t n_units;
};

__device__ __forceinline__ uint32_t atomic_add_u32(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// tickets[h]: clusters that took half h so far; tickets[2]: clusters done. A cluster takes its SM's side; if that
// half already has its clusters0 (resp. clusters - clusters0), the other half, which then has room: every cluster
// takes one ticket, and the two shares add up to the clusters launched.
__device__ __forceinline__ void draw_side_ticket(const SideArgs& s, uint32_t clusters, uint32_t& half,
                                                 uint32_t& index) {
  uint32_t smid;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(smid));
  half = (s.map->bits[(smid / 32) % 8] >> (smid % 32)) & 1u;
  index = atomic_add_u32(s.tickets + half, 1u);
  if (index >= (half ? clusters - s.clusters0 : s.clusters0)) {
    half ^= 1u;
    index = atomic_add_u32(s.tickets + half, 1u);
  }
}

// Called once per cluster after its draw: the last one resets the counters for the next launch on the stream.
__device__ __forceinline__ void release_side_ticket(const SideArgs& s, uint32_t clusters) {
  __threadfence();
  if (atomic_add_u32(s.tickets + 2, 1u) == clusters - 1) {
    asm volatile("st.relaxed.gpu.global.u32 [%0], 0;\n" ::"l"(s.tickets) : "memory");
    asm volatile("st.relaxed.gpu.global.u32 [%0], 0;\n" ::"l"(s.tickets + 1) : "memory");
    asm volatile("st.relaxed.gpu.global.u32 [%0], 0;\n" ::"l"(s.tickets + 2) : "memory");
  }
}

}  // namespace cupygemm
