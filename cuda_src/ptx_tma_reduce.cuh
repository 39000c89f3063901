// TMA reductions (cp.reduce.async.bulk.tensor, PTX ISA 8.0, sm_90): a shared-memory box added element-wise into a
// global tensor in L2 (FP32 maps: FP32 adds). Elements of the box outside the map's extents are not written, so a
// tile reaching past the last row or column leaves those elements alone. Completes like a TMA store: commit the
// bulk group, then wait for its reads of shared memory before reusing the buffer (ptx_tma.cuh). SASS: UTMAREDG.
#pragma once
#include "ptx_common.cuh"

namespace cupygemm {

__device__ __forceinline__ void tma_reduce_add_3d(const TmaDescriptor* desc, const void* src, int c0, int c1, int c2) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(desc)),
      "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

}  // namespace cupygemm
