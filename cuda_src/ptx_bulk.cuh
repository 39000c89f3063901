// Bulk copies (cp.async.bulk, not the tensor form): a contiguous run of bytes from global into shared memory, with
// completion counted on an mbarrier like a TMA tile load. Addresses 16-byte aligned, size a multiple of 16.
#pragma once
#include "ptx_common.cuh"

namespace cupygemm {

__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

// A contiguous run of bytes fetched into L2 only (no shared memory, no barrier): 16-byte aligned, a multiple of 16.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(reinterpret_cast<uint64_t>(src)), "r"(bytes)
               : "memory");
}

}  // namespace cupygemm
