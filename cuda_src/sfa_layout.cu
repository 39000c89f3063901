// A's scales into the GEMM kernels' layout: SFA given with any strides ([G][m][kb], e.g. the casts' row-major
// [m, ceil(K/128)]) copied to [G][kb][m_pad] (M-major, each K block's m_pad-row column 16-byte aligned for TMA).
// Padding rows are left as they are: the GEMM never uses them. A GEMM call launches this when its SFA is not
// M-major already; it is one driver launch, where CuPy's strided copy cost the call 20-25 us of host time
// (benchmarks/NOTES.md, "Row-major A scales").
#include "ptx_common.cuh"

extern "C" __global__ void __launch_bounds__(256)
sfa_to_m_major(const float* __restrict__ src, float* __restrict__ dst, uint64_t group_stride, uint64_t row_stride,
               uint64_t col_stride, uint32_t m, uint32_t kb, uint32_t m_pad, uint32_t groups) {
  // Consecutive threads take consecutive rows of one K block: the writes are contiguous.
  const uint64_t per_group = static_cast<uint64_t>(kb) * m, total = per_group * groups;
  for (uint64_t t = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint64_t g = t / per_group, r = t - g * per_group;
    const uint64_t j = r / m, i = r - j * m;
    dst[(g * kb + j) * m_pad + i] = src[g * group_stride + i * row_stride + j * col_stride];
  }
}
