// cp.async, the per-thread form: 16 bytes from global straight into shared memory (no registers held while they
// are in flight), completed by commit groups that the issuing thread waits for. After its wait, the issuing thread
// reads the bytes; any other thread needs a barrier as well.
//
// Defined for the device only; a host compiler (the CPU emulation of the casts, tests/cuda_emu.py) gets the
// declarations and the includer defines them with the same semantics.
#pragma once
#include "ptx_common.cuh"

namespace cupygemm {

#if defined(__CUDACC_RTC__) || defined(__CUDA_ARCH__)
// Cached in L2 only (.cg). kL2Prefetch (0, 128 or 256): the L2 may fetch the whole 128- or 256-byte block around.
template <int kL2Prefetch>
__device__ __forceinline__ void cp_async_16(void* dst, const void* src) {
  static_assert(kL2Prefetch == 0 || kL2Prefetch == 128 || kL2Prefetch == 256, "L2 prefetch: 0, 128 or 256 bytes");
  if constexpr (kL2Prefetch == 256) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory");
  } else if constexpr (kL2Prefetch == 128) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory");
  }
}

// Closes the thread's current group of copies (an empty group is fine: it completes at once).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most N of the thread's groups are still in flight: the older ones have landed.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#else
template <int kL2Prefetch> __device__ __forceinline__ void cp_async_16(void* dst, const void* src);
__device__ __forceinline__ void cp_async_commit();
template <int N> __device__ __forceinline__ void cp_async_wait();
#endif

}  // namespace cupygemm
