// Microbenchmark of the math warpgroups' chain (wgmma batch -> wait -> promote) on one SM, in clock cycles per K block
// of 128, against the tensor pipe's ideal. Operands stay in shared memory (no TMA) unless TX > 0, when a producer
// warp bulk-copies TX bytes per K block from L2 into a 3-buffer ring the math warpgroups wait on, like the GEMM's
// pipeline. Defines: NWG (math warpgroups), SL (m64 sub-tiles per warpgroup, run one after the other), WN (wgmma N),
// PROMOTE (FP32 promotion of every accumulator, else a token add), TX, ITER, SKEW (warpgroup w starts w * SKEW
// cycles late), ALT (warpgroups issue their batches in strict turns), KB (warpgroup 1 issues a block's first batch
// only after warpgroup 0's first batch of that block completed). It isolates what the FP32 promotion between batches
// costs the tensor pipe, per tile shape and warpgroup schedule, without the GEMM's loads and epilogue.
#include "ptx_common.cuh"
#include "ptx_mbarrier.cuh"
#include "ptx_wgmma.cuh"
using namespace cupygemm;

__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}

extern "C" __global__ void __launch_bounds__(128 * (NWG + (TX ? 1 : 0)), 1)
wgmma_chain(const uint8_t* src, float* out, long long* cycles) {
  extern __shared__ __align__(1024) uint8_t smem[];
  constexpr uint32_t A_BYTES = NWG * SL * 64 * 128;
  constexpr uint32_t B_BYTES = WN * 128;
  uint8_t* sa = smem;
  uint8_t* sb = smem + A_BYTES;
  uint8_t* sx = sb + B_BYTES;  // bulk-copy landing zone: 2 buffers of TX
  uint64_t* bars = reinterpret_cast<uint64_t*>(sx + 3 * (TX ? TX : 16));
  uint64_t* tick = bars;       // [3] math -> producer (buffer free)
  uint64_t* done = bars + 3;   // [3] copy completion
  uint64_t* lead = bars + 6;   // [3] WG0's first batch of the block done (KB mode)
  const uint32_t wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  if (threadIdx.x == 0) {
    for (int i = 0; i < 3; ++i) {
      mbarrier_init(&tick[i], NWG);
      mbarrier_init(&done[i], 1);
      mbarrier_init(&lead[i], 4);
    }
    mbarrier_init_fence();
  }
  // fill operands with small finite e4m3 values (0x38 = 1.0)
  for (uint32_t i = threadIdx.x; i < (A_BYTES + B_BYTES) / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(smem)[i] = 0x30303030u;
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  if (TX && wg == NWG) {
    regs_dealloc<24>();
    if (threadIdx.x != NWG * 128) return;
    for (uint32_t it = 0; it < ITER; ++it) {
      const uint32_t b = it % 3;
      if (it >= 3) mbarrier_wait(&tick[b], ((it / 3) - 1) & 1);  // every math WG released this buffer
      mbarrier_arrive_expect_tx(&done[b], TX ? TX : 16);
      bulk_g2s(sx + b * TX, src + (size_t(blockIdx.x) * 3 + b) * TX, TX ? TX : 16, &done[b]);
    }
    return;
  }
  if (TX) regs_alloc<NWG == 1 ? 240 : NWG == 2 ? 240 : NWG == 3 ? 160 : 120>();
  const uint32_t tid = threadIdx.x % 128;
  float acc[WN / 2];
  float fin[SL][WN / 2];
#pragma unroll
  for (int s = 0; s < SL; ++s)
#pragma unroll
    for (int j = 0; j < WN / 2; ++j) fin[s][j] = 0.f;
  const uint64_t da0 = make_smem_desc_k128_sw128(sa + wg * SL * 64 * 128);
  const uint64_t db = make_smem_desc_k128_sw128(sb);
  float scale = 1.0f + tid * 1e-7f;
  if (SKEW && wg > 0) {
    const long long ts = clock64();
    while (clock64() - ts < SKEW * wg) {}
  }
  const long long t0 = clock64();
#pragma unroll 1
  for (uint32_t it = 0; it < ITER; ++it) {
#pragma unroll
    if (TX) mbarrier_wait(&done[it % 3], (it / 3) & 1);
#pragma unroll
    for (int s = 0; s < SL; ++s) {
      if (ALT) {
        // round robin over warpgroups: wait for warpgroup (wg-1)'s batch of this step to finish
        if (wg > 0) named_barrier_sync(1 + wg, 256);
        else if (it > 0 || s > 0) named_barrier_sync(1 + 0, 256);
      }
      if (KB && s == 0 && wg == 1) mbarrier_wait(&lead[it % 3], (it / 3) & 1);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) WgmmaFP8<WN>::mma(da0 + (s * 64 * 128 + k * 32) / 16, db + k * 2, acc, k > 0);
      wgmma_commit();
      wgmma_wait<0>();
      if (KB && s == 0 && wg == 0 && (tid % 32) == 0) mbarrier_arrive(&lead[it % 3]);
      if (ALT) asm volatile("bar.arrive %0, %1;\n" ::"r"(1 + (wg + 1) % NWG), "r"(256) : "memory");
      if (s == SL - 1 && TX && tid == 0) mbarrier_arrive(&tick[it % 3]);
#pragma unroll
      for (int j = 0; j < WN / 2; ++j) fence_operand(acc[j]);
      if (PROMOTE) {
#pragma unroll
        for (int j = 0; j < WN / 2; ++j) fin[s][j] += scale * acc[j];
      } else {
#pragma unroll
        for (int j = 0; j < WN / 2; j += 16) fin[s][j] += acc[j];
      }
    }
    scale *= 1.0000001f;
  }
  const long long t1 = clock64();
  if (ALT && wg == 0) named_barrier_sync(1, 256);  // the last warpgroup's final signal
  float sum = 0.f;
#pragma unroll
  for (int s = 0; s < SL; ++s)
#pragma unroll
    for (int j = 0; j < WN / 2; ++j) sum += fin[s][j];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
  if (tid == 0) cycles[blockIdx.x * 4 + wg] = t1 - t0;
}
