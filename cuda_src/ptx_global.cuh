// Global memory shared between the CTAs that compute K slices of one output tile: their FP32 partial sums and the
// per-tile arrival counter that tells the last of them to reduce.
#pragma once
#include "ptx_common.cuh"

namespace cupygemm {

// Partial sums go to and come from L2 only (.cg): the reading CTA runs on another SM, whose L1 is not coherent.
__device__ __forceinline__ void st_global_cg_v4(float* ptr, float a, float b, float c, float d) {
  asm volatile("st.global.cg.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(ptr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ void ld_global_cg_v4(const float* ptr, float& a, float& b, float& c, float& d) {
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(a), "=f"(b), "=f"(c), "=f"(d) : "l"(ptr) : "memory");
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
