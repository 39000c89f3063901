// Named barriers (bar.sync with an id and a thread count): the math warpgroups synchronise among themselves
// without stopping the producer warpgroup, which never reaches them.
#pragma once
#include "ptx_common.cuh"

namespace cupygemm {

// The kernel's barrier ids. 0 is __syncthreads. Each math warpgroup has its own (1 + warpgroup, up to three
// warpgroups) for its epilogue and partial sums; interleave_k's two warpgroups share one more for their hand-off
// (only two math warpgroups there, so it cannot meet a third warpgroup's id).
struct NamedBarrier {
  static __device__ __forceinline__ uint32_t warpgroup(uint32_t wg) { return 1 + wg; }
  static constexpr uint32_t kInterleavePair = 3;
  // The wgrad kernel's ping-pong turns (mainloop_1d1d.cuh): warpgroup w waits on turn(w) before issuing.
  static __device__ __forceinline__ uint32_t turn(uint32_t wg) { return 4 + wg; }
};

// Named barrier among `count` threads.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Arrival at a named barrier of `count` threads without waiting (the others bar.sync on it).
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Named barrier that also reduces a predicate over the participating threads: all of them (kAny = false) or any
// (= not all of the negations).
template <bool kAny>
__device__ __forceinline__ bool named_barrier_vote(uint32_t id, uint32_t count, bool pred) {
  uint32_t result;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\n"
      "bar.red.and.pred q, %2, %3, p;\nselp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(result)
      : "r"(static_cast<uint32_t>(pred != kAny)), "r"(id), "r"(count)
      : "memory");
  return (result != 0) != kAny;
}

}  // namespace cupygemm
