// The k-grouped wgrad's workspace: what k_grouped_prep.cu writes from the device-side group sizes and the GEMM
// (fp8_wgrad.cu) reads, in one global buffer whose layout both take from here (and cupygemm/contract_wgrad.py
// states for the host: workspace_layout). For G groups, from a 128-byte-aligned base:
//
//   [0, 128)                 header: active groups, groups skipped as invalid (uint32 each), then padding
//   [128, 128 + 256 G)       per group, its A and B TMA maps (128 bytes each, 128-byte aligned)
//   then 16 G bytes          per group, GroupInfo
//   then  4 G bytes          the active groups' indices, in group order
//
// Group sizes live only on the device (a CUDA graph replays with new ones, jax.jit traces them), so each launch's
// prep kernel rewrites the whole workspace before the GEMM reads it, on the same stream: one workspace per stream.
#pragma once
#include "ptx_common.cuh"

namespace cupygemm {

struct GroupInfo {
  uint32_t num_kb;      // K blocks of 128 (0: the group computes nothing, D[g] untouched)
  uint32_t scale_row0;  // the group's first row in the stacked scales: sum of ceil(k_h / 128) over h < g
  uint32_t k;           // the group's K (tokens)
  uint32_t k_prefix;    // sum of k_h over h < g: the group's A starts M * k_prefix bytes into the flat A
};
static_assert(sizeof(GroupInfo) == 16, "GroupInfo is read as one 16-byte load");

struct KGroupedWorkspace {
  static constexpr uint32_t kHeaderBytes = 128;
  static constexpr uint32_t kMapBytes = 128;

  uint8_t* base;
  uint32_t num_groups;

  __host__ __device__ static constexpr uint64_t bytes(uint32_t num_groups) {
    return round_up<uint64_t>(kHeaderBytes + uint64_t(num_groups) * (2 * kMapBytes + sizeof(GroupInfo) + 4), 128);
  }
  __device__ __forceinline__ uint32_t* num_active() const { return reinterpret_cast<uint32_t*>(base); }
  __device__ __forceinline__ uint32_t* num_invalid() const { return reinterpret_cast<uint32_t*>(base) + 1; }
  // operand 0: A, 1: B
  __device__ __forceinline__ TmaDescriptor* map(uint32_t group, uint32_t operand) const {
    return reinterpret_cast<TmaDescriptor*>(base + kHeaderBytes + (uint64_t(group) * 2 + operand) * kMapBytes);
  }
  __device__ __forceinline__ GroupInfo* info() const {
    return reinterpret_cast<GroupInfo*>(base + kHeaderBytes + uint64_t(num_groups) * 2 * kMapBytes);
  }
  __device__ __forceinline__ uint32_t* active() const { return reinterpret_cast<uint32_t*>(info() + num_groups); }
};

}  // namespace cupygemm
