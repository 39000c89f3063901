// Global memory accesses the compiler is not left to choose: 16-byte output stores, and what the CTAs that compute
// K splits (or stream-K pieces) of one output tile share: their FP32 partial sums and the per-tile arrival counter
// that tells the last of them to reduce.
#pragma once
#include "ptx_common.cuh"

namespace cupygemm {

// One 16-byte store (the compiler may split a plain uint4 assignment into four 4-byte stores).
__device__ __forceinline__ void st_global_v4(void* ptr, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(ptr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// Partial sums go to and come from L2 only (.cg): the reading CTA runs on another SM, whose L1 is not coherent.
__device__ __forceinline__ void st_global_cg(float* ptr, float v) {
  asm volatile("st.global.cg.f32 [%0], %1;\n" ::"l"(ptr), "f"(v) : "memory");
}
__device__ __forceinline__ float ld_global_cg(const float* ptr) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];\n" : "=f"(v) : "l"(ptr) : "memory");
  return v;
}

// Counts one more arrival at a tile. Release: this CTA's partial-sum stores (ordered before by a barrier) are
// visible to whoever sees the new count; acquire: the last arrival sees every earlier CTA's stores.
__device__ __forceinline__ uint32_t arrive_counter_acq_rel(uint32_t* counter) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(old) : "l"(counter) : "memory");
  return old;
}

__device__ __forceinline__ void reset_counter(uint32_t* counter) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], 0;\n" ::"l"(counter) : "memory");
}

}  // namespace cupygemm
