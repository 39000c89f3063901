// Basic types and helpers shared by every cupygemm kernel (NVRTC-compatible: no CUDA headers).
#pragma once
#if defined(__CUDACC_RTC__)
// NVRTC ships no C library headers.
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef int int32_t;
#else
#include <stdint.h>
#endif

namespace cupygemm {

// The driver's CUtensorMap is an opaque 128-byte blob. cuda.h is not available under NVRTC,
// so we declare our own; CUDA 13 headers require 128-byte alignment, CUDA 12 64.
#if defined(__CUDACC_VER_MAJOR__) && __CUDACC_VER_MAJOR__ >= 13
struct alignas(128) TmaDescriptor { unsigned long long opaque[16]; };
#else
struct alignas(64) TmaDescriptor { unsigned long long opaque[16]; };
#endif

template <typename T> __host__ __device__ constexpr T ceil_div(T a, T b) { return (a + b - 1) / b; }
template <typename T> __host__ __device__ constexpr T round_up(T a, T b) { return ceil_div(a, b) * b; }
template <typename T> __host__ __device__ constexpr T cmin(T a, T b) { return a < b ? a : b; }
template <typename T> __host__ __device__ constexpr T cmax(T a, T b) { return a < b ? b : a; }
template <typename T> __host__ __device__ constexpr T cgcd(T a, T b) { return b == 0 ? a : cgcd(b, a % b); }

// A compile-time uint32 carried as a type, for dispatching a runtime value to specialized code.
template <uint32_t V> struct UConst {
  static constexpr uint32_t value = V;
};

// Calls f(UConst<v>{}) for the runtime v in [I, N) (the last case takes any larger v).
template <uint32_t I, uint32_t N, typename F>
__device__ __forceinline__ void dispatch_uconst(uint32_t v, F&& f) {
  if constexpr (I + 1 < N) {
    if (v == I) f(UConst<I>{}); else dispatch_uconst<I + 1, N>(v, f);
  } else {
    f(UConst<I>{});
  }
}

// Calls f(UConst<i>{}) for i = I, ..., N - 1: a loop whose index is a compile-time constant in the body.
template <uint32_t I, uint32_t N, typename F> __device__ __forceinline__ void static_for(F&& f) {
  if constexpr (I < N) {
    f(UConst<I>{});
    static_for<I + 1, N>(f);
  }
}

// Programmatic dependent launch (no-ops in a kernel launched without the attribute). wait: until the grids this
// one depends on have completed and their memory is visible. launch_dependents: this CTA no longer holds the next
// grid back (it starts once every CTA has said so or exited).
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void grid_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n"); }

__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// Registers are handed between warpgroups with setmaxnreg; only legal with a register cap at entry.
template <uint32_t kRegs> __device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <uint32_t kRegs> __device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Two floats to packed bf16x2 (round to nearest even); `lo` lands in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// A store into the same shared-memory offset of CTA `cta_rank` of this cluster (published by the next cluster_sync).
__device__ __forceinline__ void st_cluster_u32(const void* local, uint32_t cta_rank, uint32_t v) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\nst.shared::cluster.u32 [remote], %2;\n}\n" ::"r"(
          smem_u32(local)),
      "r"(cta_rank), "r"(v)
      : "memory");
}

// Ends every lane of the warp but one: the code after it runs on one thread, which ptxas then knows (a thread-index
// test does not tell it), so it issues TMA copies without the loop over active lanes it otherwise wraps them in.
__device__ __forceinline__ void keep_one_lane() {
  asm volatile("{\n.reg .pred p;\nelect.sync _|p, 0xffffffff;\n@!p exit;\n}\n" ::: "memory");
}

// The shared::cluster address of `local`'s offset in CTA `cta_rank` of this cluster.
__device__ __forceinline__ uint32_t cluster_smem_addr(const void* local, uint32_t cta_rank) {
  uint32_t remote;
  asm("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_u32(local)), "r"(cta_rank));
  return remote;
}
// A store into another CTA's shared memory (shared::cluster addresses) whose 4 bytes complete on its barrier `bar`.
__device__ __forceinline__ void st_async_f32(uint32_t addr, float v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(addr),
               "r"(__float_as_uint(v)), "r"(bar)
               : "memory");
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}

}  // namespace cupygemm
