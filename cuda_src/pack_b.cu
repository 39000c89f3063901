// The weight packing of side-aware GEMMs (cuda_src/l2_sides.cuh says why; cupygemm/packing.py drives it).
//
// cupygemm_pack_b (rendered with CUPYGEMM_PACK_N / CUPYGEMM_PACK_K): B [G][N][K] (row stride ld_b bytes, group
// stride group_b bytes) into the packed layout of PackedB<N, K>, whose page bits the host has already written.
#include "l2_sides.cuh"

// One block per (pair, group): 512 threads, thread t moves 16 bytes of row t % 256 / 8 of the pair's half t / 256.
extern "C" __global__ void __launch_bounds__(512) cupygemm_pack_b(const uint8_t* b, unsigned long long ld_b,
                                                                   unsigned long long group_b, uint8_t* packed,
                                                                   uint32_t base_low, uint32_t hash) {
  using namespace cupygemm;
  using L = PackedB<CUPYGEMM_PACK_N, CUPYGEMM_PACK_K>;
  const uint32_t pair = blockIdx.x, g = blockIdx.y;
  const uint32_t kb = pair / L::kPairs, j = pair % L::kPairs;
  const uint32_t half = threadIdx.x / 256, r = threadIdx.x % 256 / 8, unit = threadIdx.x % 8;
  const uint32_t row = ((half ? L::kChunks0 : 0u) + j) * L::kChunkRows + r;
  const uint32_t col = kb * 128 + unit * 16;
  uint4 v = make_uint4(0, 0, 0, 0);
  if (row < CUPYGEMM_PACK_N && col < CUPYGEMM_PACK_K)
    v = *reinterpret_cast<const uint4*>(b + g * group_b + row * ld_b + col);
  const PageSides sides{reinterpret_cast<const uint32_t*>(packed + gridDim.y * L::kGroupBytes), base_low, hash};
  const uint64_t pair_off = L::pair_offset(g, kb, row);
  // The 16-byte unit lands where a 128-byte-swizzled TMA box puts it: unit ^ (row % 8) (chunks start on 8 rows).
  *reinterpret_cast<uint4*>(packed + pair_off + L::slot_of(sides, pair_off, row) * L::kSlotBytes + r * 128u +
                            ((unit ^ (r % 8)) * 16u)) = v;
}
