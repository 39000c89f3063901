// FP8 (e4m3fn) quantization kernels: per-token (1x128 groups) and per-block (128x128 tiles).
//
// The arithmetic (bit-exact with cupygemm.reference, the DeepGEMM 03d0be3 casts) is quant_common.cuh's, shared with
// the fused transpose casts of cast_transpose.cu. Elements past the end of the tensor count as zeros (the reference
// pads with zeros) and are not stored.
//
// The renderer defines CUPYGEMM_QUANT_IN_KIND: 0 = float32, 1 = bfloat16, 2 = float16, and may define
// CUPYGEMM_QUANT_KERNEL (0 = per-token only, 1 = per-block only; both entry points when undefined), so that
// each rendered source, and so each cache entry, holds exactly the kernel it is loaded for.
//
// Layouts: x is [m, n] with unit inner stride and a row stride of `ld_x` elements;
// q is uint8 [m, n] row-major (dense); scales are float32 row-major.
#include "quant_common.cuh"

namespace cupygemm {
namespace quant {

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
