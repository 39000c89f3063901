// The k-grouped wgrad's prep kernel: from the group sizes on the device (batch_sizes, int32 [G]), it writes the
// workspace the GEMM reads (k_grouped_workspace.cuh): each group's K blocks and first scale row, the list of groups
// with work, and each such group's A and B TMA maps, copies of the host-encoded templates with the group's global
// address, K extent and row stride (K) replaced. Launched on the GEMM's stream just before it, so a CUDA graph (or
// a jitted JAX function) with new sizes needs no host round trip.
//
// Two layouts of A and B. Flat (row strides 0): group g's [rows][k_g] matrix is its own block, back to back, at
// element rows * (k_0 + ... + k_{g-1}). Columns (row strides > 0): one [rows][K] matrix per operand (a MoE layer's
// transposed dY and X) whose consecutive column ranges are the groups; a group must then start on a 128-column
// boundary, so that the 1x128 scale blocks of the whole matrix are its own (its first scale row is its first column
// / 128).
//
// Every CTA scans all G sizes (a few hundred cycles per 256 groups) and then writes what belongs to its own
// kGroupsPerCta groups, one group per warp: the maps of G groups are built in parallel, and no CTA waits for
// another. A group is computed iff k > 0, k % 16 == 0 (TMA row strides), the sizes before it sum to a multiple of 16
// (16-byte aligned A and B; in the columns layout, of 128), it ends within the operands (k_capacity) and its scale
// rows within the scales (scale_rows). Groups failing that (other than k = 0) are counted in the header's
// num_invalid and left untouched, like empty ones; the host may read the count.
#include "k_grouped_workspace.cuh"
#include "ptx_tensormap.cuh"

namespace cupygemm {

constexpr uint32_t kPrepThreads = 256;
constexpr uint32_t kPrepWarps = kPrepThreads / 32;
constexpr uint32_t kGroupsPerCta = kPrepWarps;

struct PrepCounts {
  uint64_t k;        // tokens
  uint32_t kb;       // scale rows (K blocks)
  uint32_t active;   // groups computed
  uint32_t invalid;  // groups skipped for bad sizes

  __device__ __forceinline__ void add(const PrepCounts& o) {
    k += o.k, kb += o.kb, active += o.active, invalid += o.invalid;
  }
};

__device__ __forceinline__ PrepCounts shfl_up_counts(const PrepCounts& v, uint32_t d) {
  return PrepCounts{__shfl_up_sync(0xffffffffu, v.k, d), __shfl_up_sync(0xffffffffu, v.kb, d),
                    __shfl_up_sync(0xffffffffu, v.active, d), __shfl_up_sync(0xffffffffu, v.invalid, d)};
}

// Block-wide inclusive sums of `v` over the threads; `total` gets the block's sum. Every thread calls it.
__device__ __forceinline__ PrepCounts block_inclusive_sum(PrepCounts v, PrepCounts* warp_sums, PrepCounts& total) {
  const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (uint32_t d = 1; d < 32; d *= 2) {
    const PrepCounts t = shfl_up_counts(v, d);
    if (lane >= d) v.add(t);
  }
  if (lane == 31) warp_sums[warp] = v;
  __syncthreads();
  PrepCounts before{0, 0, 0, 0};
  total = PrepCounts{0, 0, 0, 0};
#pragma unroll
  for (uint32_t w = 0; w < kPrepWarps; ++w) {
    if (w < warp) before.add(warp_sums[w]);
    total.add(warp_sums[w]);
  }
  __syncthreads();  // warp_sums is reused by the next call
  v.add(before);
  return v;
}

struct OwnGroup {
  uint32_t valid, k, k_prefix, pad;
};

}  // namespace cupygemm

// tmap_a / tmap_b: the templates (3-D tile maps over the flat A / B with the GEMM's boxes, cupygemm/contract_wgrad.py);
// a / b: the flat operands; k_capacity: the K the flat operands hold (min over A and B of their bytes / rows);
// scale_rows: the rows the stacked scales hold (min over SFA and SFB); a_row_stride / b_row_stride: 0 for the flat
// layout, else the columns layout's row strides in bytes.
extern "C" __global__ void __launch_bounds__(cupygemm::kPrepThreads, 1)
    cupygemm_k_grouped_prep(const __grid_constant__ cupygemm::TmaDescriptor tmap_a,
                            const __grid_constant__ cupygemm::TmaDescriptor tmap_b, const int* batch_sizes,
                            const uint8_t* a, const uint8_t* b, uint8_t* workspace, uint32_t num_groups,
                            uint32_t shape_m, uint32_t shape_n, uint32_t k_capacity, uint32_t scale_rows,
                            uint32_t a_row_stride, uint32_t b_row_stride) {
  using namespace cupygemm;
  const KGroupedWorkspace ws{workspace, num_groups};
  __shared__ PrepCounts warp_sums[kPrepWarps];
  __shared__ OwnGroup own[kGroupsPerCta];
  __shared__ alignas(128) TmaDescriptor maps[kPrepWarps];
  const uint32_t first_own = blockIdx.x * kGroupsPerCta;

  // ---- the scan over all groups: each group's K prefix, scale rows and slot among the active ones ----
  PrepCounts carry{0, 0, 0, 0};
  for (uint32_t base = 0; base < num_groups; base += kPrepThreads) {
    const uint32_t g = base + threadIdx.x;
    const int raw = g < num_groups ? batch_sizes[g] : 0;
    const uint32_t k = raw > 0 ? static_cast<uint32_t>(raw) : 0u;
    const uint32_t kb = ceil_div(k, 128u);
    PrepCounts total;
    const PrepCounts incl = block_inclusive_sum(PrepCounts{k, kb, 0, 0}, warp_sums, total);
    const uint64_t k_prefix = carry.k + incl.k - k;
    const uint32_t scale_row0 = carry.kb + incl.kb - kb;
    const bool columns = a_row_stride != 0;
    const bool valid = raw > 0 && k % 16 == 0 && k_prefix % (columns ? 128 : 16) == 0 &&
                       k_prefix + k <= k_capacity && uint64_t(scale_row0) + kb <= scale_rows;
    const bool invalid = raw != 0 && !valid;
    PrepCounts flags;
    const PrepCounts slots =
        block_inclusive_sum(PrepCounts{0, 0, valid ? 1u : 0u, invalid ? 1u : 0u}, warp_sums, flags);
    if (g < num_groups && g >= first_own && g < first_own + kGroupsPerCta) {
      ws.info()[g] = GroupInfo{valid ? kb : 0u, scale_row0, k, valid ? static_cast<uint32_t>(k_prefix) : 0u};
      if (valid) ws.active()[carry.active + slots.active - 1] = g;
      own[g - first_own] = OwnGroup{valid ? 1u : 0u, k, static_cast<uint32_t>(k_prefix), 0u};
    }
    carry.add(total);
    carry.active += flags.active, carry.invalid += flags.invalid;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *ws.num_active() = carry.active, *ws.num_invalid() = carry.invalid;
  __syncthreads();  // own[] is complete

  // ---- one warp per own group: its A and B maps ----
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t g = first_own + warp;
  if (g >= num_groups || !own[warp].valid) return;  // warp-uniform
  const uint32_t k = own[warp].k;
  const uint64_t k_prefix = own[warp].k_prefix;
  TmaDescriptor* map = &maps[warp];
#pragma unroll
  for (uint32_t op = 0; op < 2; ++op) {
    const TmaDescriptor& tmpl = op == 0 ? tmap_a : tmap_b;
    const uint32_t rows = op == 0 ? shape_m : shape_n;
    const uint32_t row_stride = op == 0 ? a_row_stride : b_row_stride;
    reinterpret_cast<uint32_t*>(map)[lane] = reinterpret_cast<const uint32_t*>(&tmpl)[lane];
    __syncwarp();
    if (lane == 0) {
      // Flat: the group's own [rows][k] block. Columns: the group's columns of the shared matrix, its K extent
      // clipping the box at the group's end exactly as a flat group's does.
      const uint64_t stride = row_stride ? row_stride : k;  // bytes from one row to the next (e4m3)
      tensormap_replace_address(map, (op == 0 ? a : b) + (row_stride ? k_prefix : rows * k_prefix));
      tensormap_replace_dim<0>(map, k);
      tensormap_replace_stride<0>(map, stride);
      tensormap_replace_stride<1>(map, stride * rows);  // the (unit) group dimension, for consistency
    }
    __syncwarp();
    tensormap_copy_release(ws.map(g, op), map);
    __syncwarp();  // the copy has read `map` before the next operand overwrites it
  }
}
