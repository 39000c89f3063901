// The arithmetic every FP8 cast kernel shares (quantize.cu, cast_transpose.cu), so that all of them round alike.
//
// Bit-exact with cupygemm.reference (DeepGEMM 03d0be3 casts):
//   amax   = max |x| over the group, in FP32, clamped below at 1e-4
//   factor = 448 / amax          (IEEE division, round to nearest)
//   q      = e4m3(x * factor)    (FP32 multiply, round to nearest even, saturate to +-448)
//   scale  = amax / 448          (IEEE division, round to nearest)
// Elements past the end of the tensor count as zeros (the reference pads with zeros) and are not stored.
//
// The includer defines CUPYGEMM_QUANT_IN_KIND: 0 = float32, 1 = bfloat16, 2 = float16. 16-bit inputs are read as
// raw bits and widened exactly to FP32 here (no cuda_bf16.h / cuda_fp16.h under NVRTC).
//
// The few PTX instructions (conversions, streaming loads, vector stores) are defined for the device only. A host
// compiler (the CPU emulation of the cast kernels in tests/cuda_emu.py, nothing else) gets declarations, and the
// includer defines them with the same semantics.
#pragma once
#include "ptx_common.cuh"

#ifndef CUPYGEMM_QUANT_IN_KIND
#error "CUPYGEMM_QUANT_IN_KIND must be defined (0 = float32, 1 = bfloat16, 2 = float16)"
#endif

namespace cupygemm {
namespace quant {

constexpr int kGroup = 128;           // quantization group width (and block height)
constexpr float kFp8Max = 448.0f;     // largest finite e4m3fn value
constexpr float kMinAmax = 1e-4f;     // amax clamp

#if defined(__CUDACC_RTC__) || defined(__CUDA_ARCH__)
// f16 bits -> f32 (exact).
__device__ __forceinline__ float f16_bits_to_f32(uint16_t v) {
  float f;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(v));
  return f;
}

// Two FP32 values -> two e4m3fn bytes (RNE, saturating); `lo` lands in the low byte.
__device__ __forceinline__ uint16_t f32x2_to_e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// 16 bytes of an input read once: through the non-coherent path, not kept in L1.
__device__ __forceinline__ uint4 ld_stream_v4(const void* ptr) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(ptr));
  return v;
}

// 16-, 8- and 4-byte stores (the compiler may split a plain vector assignment into narrower stores).
__device__ __forceinline__ void st_v4(void* ptr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(ptr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
__device__ __forceinline__ void st_v2(void* ptr, uint32_t a, uint32_t b) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};\n" ::"l"(ptr), "r"(a), "r"(b) : "memory");
}
__device__ __forceinline__ void st_u32(void* ptr, uint32_t a) {
  asm volatile("st.global.u32 [%0], %1;\n" ::"l"(ptr), "r"(a) : "memory");
}
#else
__device__ __forceinline__ float f16_bits_to_f32(uint16_t v);
__device__ __forceinline__ uint16_t f32x2_to_e4m3x2(float lo, float hi);
__device__ __forceinline__ uint4 ld_stream_v4(const void* ptr);
__device__ __forceinline__ void st_v4(void* ptr, uint32_t a, uint32_t b, uint32_t c, uint32_t d);
__device__ __forceinline__ void st_v2(void* ptr, uint32_t a, uint32_t b);
__device__ __forceinline__ void st_u32(void* ptr, uint32_t a);
#endif

#if CUPYGEMM_QUANT_IN_KIND == 0
typedef float in_t;
__device__ __forceinline__ float to_f32(in_t v) { return v; }
#elif CUPYGEMM_QUANT_IN_KIND == 1
typedef uint16_t in_t;
__device__ __forceinline__ float to_f32(in_t v) {
  return __uint_as_float(static_cast<uint32_t>(v) << 16);  // bf16 -> f32 is exact
}
#elif CUPYGEMM_QUANT_IN_KIND == 2
typedef uint16_t in_t;
__device__ __forceinline__ float to_f32(in_t v) { return f16_bits_to_f32(v); }  // f16 -> f32 is exact
#else
#error "unsupported CUPYGEMM_QUANT_IN_KIND"
#endif

// Two 16-bit values in a word at once: |v| of each, and the larger of each pair (a NaN loses to a number, as in
// fmaxf). Exact, like any |.| and max, so they give the amax a widened FP32 reduction would.
#if CUPYGEMM_QUANT_IN_KIND != 0
#if defined(__CUDACC_RTC__) || defined(__CUDA_ARCH__)
#if CUPYGEMM_QUANT_IN_KIND == 1
#define CUPYGEMM_QUANT_X2 "bf16x2"
#else
#define CUPYGEMM_QUANT_X2 "f16x2"
#endif
__device__ __forceinline__ uint32_t abs_x2(uint32_t v) {
  uint32_t r;
  asm("abs." CUPYGEMM_QUANT_X2 " %0, %1;\n" : "=r"(r) : "r"(v));
  return r;
}
__device__ __forceinline__ uint32_t max_x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("max." CUPYGEMM_QUANT_X2 " %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
#undef CUPYGEMM_QUANT_X2
#else
__device__ __forceinline__ uint32_t abs_x2(uint32_t v);
__device__ __forceinline__ uint32_t max_x2(uint32_t a, uint32_t b);
#endif
#endif

// The clamped amax of a group -> the factor its values are multiplied by, and the scale stored for it.
__device__ __forceinline__ float clamp_amax(float amax) { return fmaxf(amax, kMinAmax); }
__device__ __forceinline__ float quant_factor(float clamped_amax) { return __fdiv_rn(kFp8Max, clamped_amax); }
__device__ __forceinline__ float quant_scale(float clamped_amax) { return __fdiv_rn(clamped_amax, kFp8Max); }

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

}  // namespace quant
}  // namespace cupygemm
