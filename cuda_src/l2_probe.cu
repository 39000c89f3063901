// The L2-side probes and the weight packing of side-aware GEMMs (cuda_src/l2_sides.cuh says why; cupygemm/l2.py and
// cupygemm/packing.py drive them).
//
// cupygemm_l2_latency: how long a chain of dependent atomics on an address takes from the SM a block runs on. An
// atomic is performed at the L2 slice that owns the address, so the chain is slower from an SM on the far side of
// the L2 than from one on its near side. Item t measures address t % num_addrs; blocks take items in turns and
// record the SM they ran on. The word measured is restored afterwards.
//
// cupygemm_pack_b (rendered with CUPYGEMM_PACK_N / CUPYGEMM_PACK_K): B [G][N][K] (row stride ld_b bytes, group
// stride group_b bytes) into the packed layout of PackedB<N, K>, whose page bits the host has already written.
#include "l2_sides.cuh"

namespace cupygemm {

constexpr uint32_t kLatencyChain = 32;  // dependent atomics per measurement

__device__ __forceinline__ uint32_t atomic_exch_u32(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.global.exch.b32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

__device__ __forceinline__ uint64_t clock_u64() {
  uint64_t c;
  asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(c)::"memory");
  return c;
}

}  // namespace cupygemm

extern "C" __global__ void cupygemm_l2_latency(const unsigned long long* addrs, uint32_t num_addrs, uint32_t items,
                                               uint32_t* latency, uint32_t* sm_of_item) {
  using namespace cupygemm;
  if (threadIdx.x != 0) return;
  uint32_t smid;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(smid));
  for (uint32_t t = blockIdx.x; t < items; t += gridDim.x) {
    uint32_t* p = reinterpret_cast<uint32_t*>(addrs[t % num_addrs]);
    // Blocks start apart, so few chains meet at one slice at once.
    __nanosleep((smid % 16) * 256);
    const uint32_t saved = atomic_exch_u32(p, 0);  // also brings the line into L2
    const uint64_t start = clock_u64();
    uint32_t step = 0;
#pragma unroll 1
    for (uint32_t i = 0; i < kLatencyChain; ++i) {
      const uint32_t v = atomic_add_u32(p + step, 1u);
      step = v > 0x40000000u ? 1u : 0u;  // never taken, but the next address waits for this atomic's value
    }
    const uint64_t cycles = clock_u64() - start;
    atomic_exch_u32(p + step, saved);
    latency[t] = static_cast<uint32_t>(cycles);
    sm_of_item[t] = smid;
  }
}

#ifdef CUPYGEMM_PACK_N
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
#endif
