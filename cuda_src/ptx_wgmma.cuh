// Warpgroup MMA plumbing: fences, commit/wait and shared-memory matrix descriptors.
#pragma once
#include "ptx_common.cuh"
#include "ptx_wgmma_fp8.cuh"

namespace cupygemm {

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving reads of an accumulator across wgmma fences/waits.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Descriptor of a K-major tile whose rows are 128 bytes, written by TMA with 128B swizzle:
// 8-row swizzle atoms of 1024 bytes (SBO), LBO unused, layout code 1 = 128B swizzle.
__device__ __forceinline__ uint64_t make_smem_desc_k128_sw128(const void* tile) {
  const uint64_t addr = smem_u32(tile);
  return ((addr & 0x3FFFFull) >> 4) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

}  // namespace cupygemm
