// FP8 (e4m3fn) quantization kernels: per-token (1x128 groups) and per-block (128x128 tiles).
//
// Bit-exact with cupygemm.reference (DeepGEMM 03d0be3 casts):
//   amax   = max |x| over the group, in FP32, clamped below at 1e-4
//   factor = 448 / amax          (IEEE division, round to nearest)
//   q      = e4m3(x * factor)    (FP32 multiply, round to nearest even, saturate to +-448)
//   scale  = amax / 448          (IEEE division, round to nearest)
// Elements past the end of the tensor count as zeros (the reference pads with zeros) and are not stored.
//
// The renderer defines CUPYGEMM_QUANT_IN_KIND: 0 = float32, 1 = bfloat16, 2 = float16, and may define
// CUPYGEMM_QUANT_KERNEL (0 = per-token only, 1 = per-block only; both entry points when undefined), so that
// each rendered source, and so each cache entry, holds exactly the kernel it is loaded for.
// 16-bit inputs are read as raw bits and widened exactly to FP32 here (no cuda_bf16.h / cuda_fp16.h under NVRTC).
//
// Layouts: x is [m, n] with unit inner stride and a row stride of `ld_x` elements;
// q is uint8 [m, n] row-major (dense); scales are float32 row-major.
#include "ptx_common.cuh"

#ifndef CUPYGEMM_QUANT_IN_KIND
#error "CUPYGEMM_QUANT_IN_KIND must be defined (0 = float32, 1 = bfloat16, 2 = float16)"
#endif

namespace cupygemm {
namespace quant {

constexpr int kGroup = 128;           // quantization group width (and block height)
constexpr float kFp8Max = 448.0f;     // largest finite e4m3fn value
constexpr float kMinAmax = 1e-4f;     // amax clamp

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
__device__ __forceinline__ float to_f32(in_t v) {
  float f;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(v));  // f16 -> f32 is exact
  return f;
}
#else
#error "unsupported CUPYGEMM_QUANT_IN_KIND"
#endif

// Two FP32 values -> two e4m3fn bytes (RNE, saturating); `lo` lands in the low byte.
__device__ __forceinline__ uint16_t f32x2_to_e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Quantize 4 consecutive values of one row starting at column `col0`, storing only columns < n.
__device__ __forceinline__ void store_q4(uint8_t* q_row, long long col0, long long n, const float (&v)[4], float factor) {
  const uint16_t p01 = f32x2_to_e4m3x2(__fmul_rn(v[0], factor), __fmul_rn(v[1], factor));
  const uint16_t p23 = f32x2_to_e4m3x2(__fmul_rn(v[2], factor), __fmul_rn(v[3], factor));
  const uint8_t b[4] = {static_cast<uint8_t>(p01 & 0xffu), static_cast<uint8_t>(p01 >> 8),
                        static_cast<uint8_t>(p23 & 0xffu), static_cast<uint8_t>(p23 >> 8)};
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (col0 + j < n) q_row[col0 + j] = b[j];
}

__device__ __forceinline__ void load4(const in_t* x_row, long long col0, long long n, float (&v)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = (col0 + j < n) ? to_f32(x_row[col0 + j]) : 0.0f;
}

}  // namespace quant
}  // namespace cupygemm

#if !defined(CUPYGEMM_QUANT_KERNEL) || CUPYGEMM_QUANT_KERNEL == 0
// Per-token (1x128) cast. One warp per (row, 128-column group); each lane handles 4 consecutive columns.
// Launch: block = (256,) (any multiple of 32 up to 256 works), grid = (ceil(m * num_groups / 8),) for 256 threads.
// q: [m, n] dense uint8; s: [m, num_groups] dense float32, num_groups = ceil(n / 128).
extern "C" __global__ void __launch_bounds__(256) per_token_cast_to_fp8(
    const void* __restrict__ x_ptr, uint8_t* __restrict__ q, float* __restrict__ s,
    long long m, long long n, long long ld_x, long long num_groups) {
  using namespace cupygemm::quant;
  const in_t* x = static_cast<const in_t*>(x_ptr);
  const long long warps_per_block = blockDim.x / 32;
  const long long item = static_cast<long long>(blockIdx.x) * warps_per_block + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (item >= m * num_groups) return;  // whole warp exits together
  const long long row = item / num_groups;
  const long long group = item % num_groups;
  const long long col0 = group * kGroup + lane * 4;

  float v[4];
  load4(x + row * ld_x, col0, n, v);
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  amax = fmaxf(warp_max(amax), kMinAmax);
  const float factor = __fdiv_rn(kFp8Max, amax);
  store_q4(q + row * n, col0, n, v, factor);
  if (lane == 0) s[row * num_groups + group] = __fdiv_rn(amax, kFp8Max);
}
#endif

#if !defined(CUPYGEMM_QUANT_KERNEL) || CUPYGEMM_QUANT_KERNEL == 1
// Per-block (128x128) cast. One block of exactly 256 threads per tile: lane l handles columns 4l..4l+3, warp w rows
// w, w+8, ..., w+120 of the tile, keeping its 64 values in registers between the reduction and the cast.
// Launch: block = (256,), grid = (ceil(m / 128) * ceil(n / 128),), tile t = (t / num_col_blocks, t % num_col_blocks).
// q: [m, n] dense uint8; s: [ceil(m / 128), ceil(n / 128)] dense float32 (so s[t] is tile t's scale).
extern "C" __global__ void __launch_bounds__(256) per_block_cast_to_fp8(
    const void* __restrict__ x_ptr, uint8_t* __restrict__ q, float* __restrict__ s,
    long long m, long long n, long long ld_x, long long num_col_blocks) {
  using namespace cupygemm::quant;
  constexpr int kThreads = 256;
  constexpr int kWarps = kThreads / 32;
  constexpr int kRowsPerThread = kGroup / kWarps;  // 16
  __shared__ float warp_amax[kWarps];

  const in_t* x = static_cast<const in_t*>(x_ptr);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const long long tile = blockIdx.x;
  const long long row_base = (tile / num_col_blocks) * kGroup + warp;
  const long long col0 = (tile % num_col_blocks) * kGroup + lane * 4;

  float v[kRowsPerThread][4];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const long long row = row_base + i * kWarps;
    if (row < m) {
      load4(x + row * ld_x, col0, n, v[i]);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[i][j] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) amax = fmaxf(amax, fabsf(v[i][j]));
  }
  amax = warp_max(amax);
  if (lane == 0) warp_amax[warp] = amax;
  __syncthreads();
  amax = warp_amax[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) amax = fmaxf(amax, warp_amax[w]);
  amax = fmaxf(amax, kMinAmax);

  const float factor = __fdiv_rn(kFp8Max, amax);
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const long long row = row_base + i * kWarps;
    if (row < m) store_q4(q + row * n, col0, n, v[i], factor);
  }
  if (threadIdx.x == 0) s[tile] = __fdiv_rn(amax, kFp8Max);
}
#endif
