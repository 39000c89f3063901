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

// Where the packed weights' slots lie. A 4 KiB chunk's L2 side is the parity of its address's hash bits (below
// 2 MiB, where virtual and physical addresses agree) xor one bit per 2 MiB page, both measured when the weights were
// packed. The layout is fixed by the address the buffer had then (its offset in its first page, `base_low`) and
// those bits, all kept with the weights: a copy of the buffer elsewhere computes the same results, only from the
// wrong sides.
struct PageSides {
  const uint32_t* bits;  // bit i: the side of page i's chunks whose hash parity is 0
  uint32_t base_low;     // the buffer's address at packing, modulo 2 MiB
  uint32_t hash;         // the side hash bits (below 2 MiB)

  // The side of the 4 KiB chunk `offset` bytes into the buffer.
  __device__ __forceinline__ uint32_t side_of(uint64_t offset) const {
    const uint64_t at = base_low + offset;
    const uint32_t page = static_cast<uint32_t>(at >> 21);
    return ((bits[page / 32] >> (page % 32)) ^ __popc(static_cast<uint32_t>(at) & hash)) & 1u;
  }
};

// The page bits of weights that span at most kParamPages pages (one group of a normal GEMM's B up to 256 MiB),
// passed as kernel parameters: the side of a chunk then needs no memory load. A shared-memory load per box in the
// producer's K loop (a load, its move to a uniform register) and the copy of the bits into shared memory before
// the first load of B made the producer the packed kernels' bottleneck on the H200 (benchmarks/NOTES.md, "L2-side-aware
// weights").
constexpr uint32_t kParamPageWords = 4, kParamPages = 32 * kParamPageWords;
// kWords: the words the weights' pages need (1 to kParamPageWords), so that weights on up to 32 pages (64 MiB)
// select no word at all.
template <uint32_t kWords> struct ParamPageSides {
  static_assert(kWords >= 1 && kWords <= kParamPageWords, "page words in the parameters");
  uint32_t words[kParamPageWords];  // the buffer's first kParamPages page bits (PageSides::bits)
  uint32_t base_low;
  uint32_t hash;

  // PageSides::side_of for the first slot of pair `pair` (offset pair * 8 KiB), in 32-bit arithmetic: fewer steps
  // in the producer's chain than the 64-bit offset's, which bound the packed kernels' K loop (benchmarks/NOTES.md,
  // "Producer on one lane").
  __device__ __forceinline__ uint32_t side_of_pair(uint32_t pair) const {
    const uint32_t at = base_low + (pair << 13);  // below 2 MiB + kParamPages pages: no overflow
    const uint32_t page = at >> 21;
    uint32_t word = words[0];
#pragma unroll
    for (uint32_t i = 1; i < kWords; ++i) word = page >= 32 * i ? words[i] : word;
    return ((word >> (page % 32)) ^ __popc(at & hash & ((1u << 21) - 1))) & 1u;
  }
};

// Page bits a side-aware kernel holds in shared memory: pages of at most 16 GiB of packed weights.
constexpr uint32_t kMaxPageWords = 256;

// The packed layout of B [G][N, K]. N is cut into 32-row chunks of one K block (32 x 128 bytes = 4 KiB, the L2
// hash's granularity), each row stored as a 128-byte-swizzled TMA box would leave it in shared memory. Chunks
// [0, kChunks0) are half 0 of N, the rest half 1. Chunk j of half 0 and chunk j of half 1 of a K block share the
// 8 KiB pair kb * kPairs + j, whose two 4 KiB slots lie on opposite L2 sides; half h sits in slot h ^ swap, where
// swap is the side of the pair's first slot, so that half h lies on side h. Group g starts at g * kGroupBytes; the
// page bits (PageSides) follow the last group.
template <uint32_t SHAPE_N, uint32_t SHAPE_K> struct PackedB {
  static constexpr uint32_t kChunkRows = 32, kSlotBytes = 4096, kPairBytes = 8192;
  static constexpr uint32_t kChunks = ceil_div(SHAPE_N, kChunkRows);
  static constexpr uint32_t kChunks0 = ceil_div(kChunks, 2u);
  static constexpr uint32_t kRows0 = kChunks0 * kChunkRows;  // rows of half 0
  static constexpr uint32_t kPaddedRows = kChunks * kChunkRows;
  static constexpr uint32_t kPairs = kChunks0;  // per K block
  static constexpr uint32_t kKBlocks = ceil_div(SHAPE_K, 128u);
  static constexpr uint64_t kGroupBytes = uint64_t(kKBlocks) * kPairs * kPairBytes;

  // The page bits' words after `num_groups` groups (cupygemm/packing.py writes as many).
  static __device__ __forceinline__ uint32_t page_words(uint32_t base_low, uint32_t num_groups) {
    return ceil_div(static_cast<uint32_t>(ceil_div(base_low + num_groups * kGroupBytes, uint64_t(1) << 21)), 32u);
  }
  // The byte offset of the pair holding row `row` (of N) of K block kb of group g.
  static __device__ __forceinline__ uint64_t pair_offset(uint32_t g, uint32_t kb, uint32_t row) {
    const uint32_t chunk = row / kChunkRows;
    const uint32_t pair = kb * kPairs + (chunk >= kChunks0 ? chunk - kChunks0 : chunk);
    return g * kGroupBytes + uint64_t(pair) * kPairBytes;
  }
  // The slot of row `row`'s half in its pair.
  static __device__ __forceinline__ uint32_t slot_of(const PageSides& sides, uint64_t pair_off, uint32_t row) {
    return (row / kChunkRows >= kChunks0 ? 1u : 0u) ^ sides.side_of(pair_off);
  }
  // The index of the pair holding row `row` of K block kb of group g (pair_offset / kPairBytes; below 2^21 for
  // 16 GiB of pairs).
  static __device__ __forceinline__ uint32_t pair_index(uint32_t g, uint32_t kb, uint32_t row) {
    const uint32_t chunk = row / kChunkRows;
    return g * (kKBlocks * kPairs) + kb * kPairs + (chunk >= kChunks0 ? chunk - kChunks0 : chunk);
  }
  // Pages one group spans at most, whatever its base_low (8 KiB-aligned, below 2 MiB).
  static constexpr uint64_t kMaxPagesOneGroup = (kGroupBytes + (uint64_t(2) << 21) - kPairBytes - 1) >> 21;
};

// What a side-aware launch passes besides the usual parameters.
struct SideArgs {
  const SideMap* map;  // the __grid_constant__ parameter (indexed by SM: read in place, not copied)
  const uint8_t* packed_b;  // B packed as PackedB describes (the kernel reads its page bits; B itself via tmap_b)
  uint32_t* tickets;        // [3] uint32, zero at launch and left zero by the launch's last cluster
  // 1: the kernel before this one on the stream cannot be using `tickets` (the host alternates two sets per
  // stream, and a PDL kernel starts only after the one before its predecessor has finished), so a PDL kernel
  // draws before its grid dependency wait; 0: they may be, it draws after the wait (cupygemm/workspace.py).
  uint32_t tickets_before_wait;
  uint32_t clusters0;       // clusters that work on half 0 (the rest work on half 1)
  uint32_t base_low;        // PageSides of the packed weights
  uint32_t hash;
  uint32_t page_words[kParamPageWords];  // their first page bits (ParamPageSides)
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
