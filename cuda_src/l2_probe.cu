// The L2-side probe of side-aware GEMMs (cuda_src/l2_sides.cuh says why; cupygemm/l2.py drives it).
//
// cupygemm_l2_latency: how long a chain of dependent atomics on an address takes from the SM a block runs on. An
// atomic is performed at the L2 slice that owns the address, so the chain is slower from an SM on the far side of
// the L2 than from one on its near side. Item t measures address t % num_addrs; blocks take items in turns and
// record the SM they ran on. The word measured is restored afterwards.
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
