// TMA descriptors edited on the device: a copy of a host-encoded map in shared memory gets a new global address,
// extent and row stride (tensormap.replace, sm_90a), is copied into global memory with a release of the tensormap
// proxy (tensormap.cp_fenceproxy), and a later reader acquires it before its first TMA through it. This is the
// sequence of the CUDA programming guide's "modifying a tensor map in device code"; PTX ISA 8.3.
//
// What ptxas makes of it (NVRTC 12.9 and 13.5, checked in the SASS): the replacements are plain shared-memory
// loads and stores of the descriptor's fields (an extent is stored minus one, a stride shifted right by 4: the
// instruction takes bytes, as CUTLASS passes them since CUDA 12.5), the copy is 32 strong 4-byte stores at GPU
// scope, one per lane, and the acquire is UTMACCTL.IV, which drops the descriptor from the TMA unit's cache: a
// reader that saw the old contents at the same address (a CUDA graph replayed with new sizes) loads the new ones.
#pragma once
#include "ptx_common.cuh"

namespace cupygemm {

// Replacements in a 128-byte-aligned shared-memory copy of a tile-mode tensor map. Dimension `ord` counts from the
// innermost (0); a global stride's `ord` counts the outer dimensions (0 = the stride of dimension 1), in bytes.
__device__ __forceinline__ void tensormap_replace_address(const TmaDescriptor* smem_map, const void* global_address) {
  asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;\n" ::"r"(smem_u32(smem_map)),
               "l"(reinterpret_cast<uint64_t>(global_address))
               : "memory");
}
template <int kOrd>
__device__ __forceinline__ void tensormap_replace_dim(const TmaDescriptor* smem_map, uint32_t extent) {
  asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], %1, %2;\n" ::"r"(smem_u32(smem_map)),
               "n"(kOrd), "r"(extent)
               : "memory");
}
template <int kOrd>
__device__ __forceinline__ void tensormap_replace_stride(const TmaDescriptor* smem_map, uint64_t stride_bytes) {
  asm volatile("tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], %1, %2;\n" ::"r"(smem_u32(smem_map)),
               "n"(kOrd), "l"(stride_bytes)
               : "memory");
}

// The shared-memory map into global memory, released to the tensormap proxy at GPU scope. All 32 lanes of the warp
// execute it (.sync.aligned), after the lane that edited the copy and a __syncwarp().
__device__ __forceinline__ void tensormap_copy_release(TmaDescriptor* global_map, const TmaDescriptor* smem_map) {
  asm volatile(
      "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [%0], [%1], 128;\n" ::"l"(
          reinterpret_cast<uint64_t>(global_map)),
      "r"(smem_u32(smem_map))
      : "memory");
}

// Before this thread's first TMA through a map another kernel wrote: the tensormap proxy sees those writes.
__device__ __forceinline__ void tensormap_acquire(const TmaDescriptor* global_map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(reinterpret_cast<uint64_t>(global_map))
               : "memory");
}

}  // namespace cupygemm
