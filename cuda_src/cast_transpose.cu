// Fused FP8 casts that also write the transposed copy: what the backward GEMMs of training read.
//
// x is [m, n] (bf16 / f16 / f32, unit inner stride, a row stride of `ld_x` elements, which may be 0 or negative),
// read once. Modes (CUPYGEMM_CT_MODE, one rendered source and one entry point per mode and input kind):
//   0  per_token_cast_to_fp8_transposed:          q_t [n, m], s_t [n, ceil(m/128)]  = per-token cast of x^T
//   1  per_token_cast_to_fp8_transposed_rowwise:  the same, and q [m, n], s [m, ceil(n/128)] = per-token cast of x
//   2  per_block_cast_to_fp8_with_transpose:      q [m, n], s [ceil(m/128), ceil(n/128)] = per-block cast of x, and
//                                                 q_t [n, m], s_t [ceil(n/128), ceil(m/128)] = per-block cast of x^T
// Every value is bit-exact with the existing casts of the same groups (quant_common.cuh's arithmetic, which
// quantize.cu uses too): amax over the group in FP32 with zeros for elements past the tensor's end, clamped at
// 1e-4; factor = 448 / amax and scale = amax / 448 by IEEE division; q = e4m3(x * factor), RNE, saturating.
//
// Layouts: q_t, q dense row-major uint8. s dense row-major. s_t[c, j] (c a row of x^T, j its 128-group) is at
// s_t[c * st_row_stride + j * st_col_stride]: (ceil(m/128), 1) row-major, or (1, n_pad) M-major with
// n_pad = round_up(n, 4), the TMA-aligned layout the GEMMs read; s_t rows n .. st_rows - 1 (the M-major padding,
// st_rows = n_pad) are written with zeros. In mode 2, s_t = s^T dense: strides (ceil(m/128), 1).
//
// A CTA casts 128 x 128 tiles of x: tiles blockIdx.x, + gridDim.x, ... of the ceil(m/128) * ceil(n/128) (tile t =
// (t % ceil(m/128), t / ceil(m/128)), per-block: (t / ceil(n/128), t % ceil(n/128))). The host launches one CTA per
// tile, or, with a ring (kStages > 0), as many as the SMs hold: the loads of the next kStages tiles are then in
// flight while the CTA reduces and stores one (one CTA per tile starts loading only where a CTA has exited).
// kThreads threads: 128 for 16-bit inputs, 256 for f32. Each thread owns a 16-row x kVec-column piece of the
// tile (kVec = 8 or 4: 16 bytes a row), held in registers from its arrival to the stores. The ring holds only the
// thread's own copies (cp.async, which the thread itself waits for), so the data needs no barrier. Lane l of warp w:
// rows 16 * (l / 4) .. + 15 of the tile, columns w * 4 * kVec + (l % 4) * kVec .. + kVec - 1. So
//   - a load instruction reads 8 rows x 64 contiguous bytes (four lanes side by side),
//   - a q_t store instruction writes 4 rows of q_t x 128 contiguous bytes (eight lanes down the rows), 16 B a lane,
//   - a column's 128 rows are one warp's: its amax is a 3-step shuffle butterfly (lanes ^4, ^8, ^16),
//   - a row's 128 columns span all warps: per-warp partials (lanes ^1, ^2) meet in shared memory, and one thread
//     per row makes the row's factor and scale (mode 1); mode 2 reduces the whole tile the same way.
// With 16-byte aligned rows (x's, q_t's, and q's kVec-byte rows), loads and stores are vectors, predicated off past
// the edges of x (zeros are loaded instead); odd sizes, strides or addresses take element-wise paths with bounds
// checks. Either way, elements past the end count as zeros.
//
// Host contract (cupygemm/quantization.py, fused_cast_defines / _threads / _smem / _grid): the CUPYGEMM_* constants
// below, kThreads threads a CTA, kRingBytes of dynamic shared memory, any number of CTAs.
#include "ptx_cp_async.cuh"
#include "quant_common.cuh"

#ifndef CUPYGEMM_CT_MODE
#error "CUPYGEMM_CT_MODE must be defined (0 = transposed, 1 = transposed + row-wise, 2 = per-block with transpose)"
#endif
#if !defined(CUPYGEMM_CT_STAGES) || !defined(CUPYGEMM_CT_L2_PREFETCH)
#error "CUPYGEMM_CT_STAGES and CUPYGEMM_CT_L2_PREFETCH must be defined (cupygemm/quantization.py, fused_cast_defines)"
#endif

namespace cupygemm {
namespace cast_t {

using namespace quant;

constexpr int kMode = CUPYGEMM_CT_MODE;
static_assert(kMode >= 0 && kMode <= 2, "unsupported CUPYGEMM_CT_MODE");
constexpr bool kRowwise = kMode == 1;            // per-token scales along the rows too
constexpr bool kBlock = kMode == 2;              // one scale per 128 x 128 tile
constexpr bool kStoreQ = kMode != 0;             // the row-major copy q is written

constexpr int kTile = kGroup;                    // 128 x 128 tiles
constexpr int kInBytes = static_cast<int>(sizeof(in_t));
constexpr int kVec = 16 / kInBytes;              // columns per thread: one 16-byte load per row (8 or 4)
constexpr int kRows = 16;                        // rows per thread: one 16-byte store per q_t row
constexpr int kRowLanes = kTile / kRows;         // 8 lanes down a warp's 128 rows
constexpr int kColLanes = 32 / kRowLanes;        // 4 lanes across
constexpr int kWarpCols = kColLanes * kVec;      // columns per warp (32 or 16)
constexpr int kWarps = kTile / kWarpCols;        // 4 or 8
constexpr int kThreads = 32 * kWarps;            // 128 or 256
constexpr int kMinBlocks = 512 / kThreads;       // keeps a thread at <= 128 registers: 512 threads an SM at least
static_assert(kRowLanes * kColLanes == 32 && kWarps * kWarpCols == kTile && kVec <= kRowLanes, "tile mapping");

// Tiles whose loads are in flight while the CTA casts another (0: each tile's loads go straight into registers),
// through a ring of kStages tiles in dynamic shared memory that cp.async fills, 16 bytes a copy, each thread its
// own piece. kL2Prefetch: the L2 fetch size those copies ask for (0, 128 or 256 bytes).
constexpr int kStages = CUPYGEMM_CT_STAGES;
constexpr int kL2Prefetch = CUPYGEMM_CT_L2_PREFETCH;
constexpr int kRingBytes = kStages * kTile * kTile * kInBytes;  // the dynamic shared memory a launch passes
static_assert(kStages >= 0 && kStages <= 3, "CUPYGEMM_CT_STAGES: 0 to 3");
static_assert(kRingBytes == kStages * kRows * kThreads * 16, "one 16-byte slot per thread and row of its piece");

// x is read as raw bits.
template <int kBytes> struct Bits;
template <> struct Bits<2> { typedef uint16_t type; };
template <> struct Bits<4> { typedef uint32_t type; };
typedef Bits<kInBytes>::type bits_t;

// Element j (0 or 1) of one 32-bit word of 16-bit values, widened exactly to f32.
template <int j> __device__ __forceinline__ float elem(uint32_t word) {
  return to_f32(static_cast<in_t>(j ? (word >> 16) : (word & 0xffffu)));
}

// Element j (compile-time) of one 16-byte chunk held as four words, widened exactly to f32.
template <int j> __device__ __forceinline__ float elem(const uint32_t (&w)[4]) {
  if constexpr (kInBytes == 4) {
    return __uint_as_float(w[j]);
  } else {
    return elem<j & 1>(w[j / 2]);
  }
}

// As elem, for a value about to be multiplied by a factor whose sign bit is `dep` (0 at run time: factors are
// positive). The widening takes `dep` into its byte selector, so it cannot start before the factor is known: ptxas
// otherwise widened all 16 x kVec values of the piece ahead of the first multiply, which took more than the 128
// registers a thread has.
template <int j> __device__ __forceinline__ float elem_after(const uint32_t (&w)[4], uint32_t dep) {
  if constexpr (kInBytes == 4) {
    return __uint_as_float(w[j]);
  } else if constexpr (CUPYGEMM_QUANT_IN_KIND == 1) {  // bf16: the half into the top of an f32
    return __uint_as_float(__byte_perm(w[j / 2], 0u, ((j & 1) ? 0x3244u : 0x1044u) | dep));
  } else {  // f16: the half into the bottom, then converted
    return to_f32(static_cast<in_t>(__byte_perm(w[j / 2], 0u, ((j & 1) ? 0x4432u : 0x4410u) | dep)));
  }
}

// Four e4m3 bytes of a[0..3] * f, packed little-endian (a[0] in the low byte).
__device__ __forceinline__ uint32_t quant4(float a0, float a1, float a2, float a3, float f) {
  const uint32_t lo = f32x2_to_e4m3x2(__fmul_rn(a0, f), __fmul_rn(a1, f));
  const uint32_t hi = f32x2_to_e4m3x2(__fmul_rn(a2, f), __fmul_rn(a3, f));
  return lo | (hi << 16);
}

// |x| maxima of a piece (its words w), every maximum from 0, a NaN losing to a number as in fmaxf (so as in
// quantize.cu's kernels). camax: the per-token modes, a column's over all 128 rows of the tile (the lanes rl = 0..7
// of one column of lanes, lane bits 2..4). ramax: mode 1, a row's over the warp's columns (the kColLanes lanes of
// one row, lane bits 0..1). tamax: mode 2, the piece's. 16-bit inputs are reduced two at a time in their own format
// (|.| and max are exact in any format) and widened after the shuffles.
__device__ __forceinline__ void piece_amax(const uint32_t (&w)[kRows][4], float (&camax)[kVec], float (&ramax)[kRows],
                                           float& tamax) {
#if CUPYGEMM_QUANT_IN_KIND == 0
#pragma unroll
  for (int j = 0; j < kVec; ++j) camax[j] = 0.0f;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    ramax[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float a = fabsf(__uint_as_float(w[i][j]));
      ramax[i] = fmaxf(ramax[i], a);
      camax[j] = fmaxf(camax[j], a);
    }
  }
  if constexpr (!kBlock) {  // a column's 128 rows are the lanes rl = 0..7 of one column of lanes (lane bits 2..4)
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      camax[j] = fmaxf(camax[j], __shfl_xor_sync(0xffffffffu, camax[j], 4));
      camax[j] = fmaxf(camax[j], __shfl_xor_sync(0xffffffffu, camax[j], 8));
      camax[j] = fmaxf(camax[j], __shfl_xor_sync(0xffffffffu, camax[j], 16));
    }
  }
  if constexpr (kRowwise) {  // a row's columns in this warp: the kColLanes lanes of one row (lane bits 0..1)
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      ramax[i] = fmaxf(ramax[i], __shfl_xor_sync(0xffffffffu, ramax[i], 1));
      ramax[i] = fmaxf(ramax[i], __shfl_xor_sync(0xffffffffu, ramax[i], 2));
    }
  }
  tamax = camax[0];
#pragma unroll
  for (int j = 1; j < kVec; ++j) tamax = fmaxf(tamax, camax[j]);
#else
  uint32_t cacc[4] = {0u, 0u, 0u, 0u}, racc[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    racc[i] = 0u;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t a = abs_x2(w[i][k]);
      racc[i] = max_x2(racc[i], a);
      cacc[k] = max_x2(cacc[k], a);
    }
  }
  if constexpr (!kBlock) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      cacc[k] = max_x2(cacc[k], __shfl_xor_sync(0xffffffffu, cacc[k], 4));
      cacc[k] = max_x2(cacc[k], __shfl_xor_sync(0xffffffffu, cacc[k], 8));
      cacc[k] = max_x2(cacc[k], __shfl_xor_sync(0xffffffffu, cacc[k], 16));
    }
  }
  if constexpr (kRowwise) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      racc[i] = max_x2(racc[i], __shfl_xor_sync(0xffffffffu, racc[i], 1));
      racc[i] = max_x2(racc[i], __shfl_xor_sync(0xffffffffu, racc[i], 2));
    }
  }
  static_for<0, kVec>([&](auto jc) {
    constexpr int j = decltype(jc)::value;
    camax[j] = elem<j>(cacc);
  });
#pragma unroll
  for (int i = 0; i < kRows; ++i) ramax[i] = fmaxf(elem<0>(racc[i]), elem<1>(racc[i]));
  const uint32_t t = max_x2(max_x2(cacc[0], cacc[1]), max_x2(cacc[2], cacc[3]));
  tamax = fmaxf(elem<0>(t), elem<1>(t));
#endif
}

// The 16 q_t bytes of column j of a piece: its rows 0..15 times factor f, row 0 in the low byte of o[0].
template <int j>
__device__ __forceinline__ void column_bytes(const uint32_t (&w)[kRows][4], float f, uint32_t (&o)[4]) {
  const uint32_t dep = __float_as_uint(f) >> 31;
#pragma unroll
  for (int k = 0; k < 4; ++k)
    o[k] = quant4(elem_after<j>(w[4 * k], dep), elem_after<j>(w[4 * k + 1], dep), elem_after<j>(w[4 * k + 2], dep),
                  elem_after<j>(w[4 * k + 3], dep), f);
}

// The kVec q bytes of one row of a piece times factor f, column 0 in the low byte of o[0].
__device__ __forceinline__ void row_bytes(const uint32_t (&w_row)[4], float f, uint32_t (&o)[kVec / 4]) {
  const uint32_t dep = __float_as_uint(f) >> 31;
  static_for<0, kVec / 4>([&](auto kc) {
    constexpr int k = decltype(kc)::value;
    o[k] = quant4(elem_after<4 * k>(w_row, dep), elem_after<4 * k + 1>(w_row, dep), elem_after<4 * k + 2>(w_row, dep),
                  elem_after<4 * k + 3>(w_row, dep), f);
  });
}

// The ring (dynamic shared memory, kRingBytes).
#if defined(__CUDACC_RTC__) || defined(__CUDA_ARCH__)
__device__ __forceinline__ uint4* ring() {
  extern __shared__ uint4 ring_smem[];
  return ring_smem;
}
#else
__device__ __forceinline__ uint4* ring();  // the CPU emulation's
#endif

// Tile -> (row block tb, column block db). The per-token casts go down the row blocks first: the CTAs in flight
// then write whole rows of q_t together, and the slowest shapes (n = 32768) went from 0.67-0.72x to 0.72-0.78x of a
// copy. The per-block cast, whose scales are per tile, ran 3 % slower that way and keeps the order along the
// columns (benchmarks/NOTES.md, "Training casts").
__device__ __forceinline__ void tile_coords(long long tile, long long row_tiles, long long col_tiles, long long& tb,
                                            long long& db) {
  if constexpr (kBlock) {
    tb = tile / col_tiles, db = tile % col_tiles;
  } else {
    tb = tile % row_tiles, db = tile / row_tiles;
  }
}

// Starts the copies of the thread's piece of `tile` into its slots `dst` (stride kThreads), for the pieces the
// vector path reads (vec_x, columns not straddling n) and their rows inside x; nothing past the last tile.
__device__ __forceinline__ void prefetch_piece(uint4* dst, const bits_t* x, long long tile, long long tiles,
                                               long long row_tiles, long long col_tiles, int r0, int c0, long long m,
                                               long long n, long long ld_x, bool vec_x) {
  if (tile >= tiles) return;
  long long tb, db;
  tile_coords(tile, row_tiles, col_tiles, tb, db);
  const long long row0 = tb * kTile + r0, col0 = db * kTile + c0;
  if (!vec_x || col0 >= n || n < col0 + kVec) return;
  const bits_t* p = x + row0 * ld_x + col0;
#pragma unroll
  for (int i = 0; i < kRows; ++i)
    if (row0 + i < m) cp_async_16<kL2Prefetch>(dst + i * kThreads, p + i * ld_x);
}

}  // namespace cast_t
}  // namespace cupygemm

#if CUPYGEMM_CT_MODE == 0
#define CUPYGEMM_CT_ENTRY per_token_cast_to_fp8_transposed
#elif CUPYGEMM_CT_MODE == 1
#define CUPYGEMM_CT_ENTRY per_token_cast_to_fp8_transposed_rowwise
#else
#define CUPYGEMM_CT_ENTRY per_block_cast_to_fp8_with_transpose
#endif

// q and s are unused (may be null) in mode 0; st_rows is unused in mode 2. Launched with kRingBytes of dynamic
// shared memory, over any number of CTAs (each takes tiles blockIdx.x, + gridDim.x, ...).
extern "C" __global__ void __launch_bounds__(cupygemm::cast_t::kThreads, cupygemm::cast_t::kMinBlocks)
CUPYGEMM_CT_ENTRY(const void* __restrict__ x_ptr, uint8_t* __restrict__ q_t, float* __restrict__ s_t,
                  uint8_t* __restrict__ q, float* __restrict__ s, long long m, long long n, long long ld_x,
                  long long st_row_stride, long long st_col_stride, long long st_rows) {
  using namespace cupygemm;
  using namespace cupygemm::cast_t;
  typedef unsigned long long uptr;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32;
  const int rl = lane / kColLanes, cl = lane % kColLanes;  // lane down the rows, across the columns
  const int r0 = rl * kRows;                               // this thread's first row in the tile
  const int c0 = warp * kWarpCols + cl * kVec;             // ... and first column

  const long long col_tiles = (n + kTile - 1) / kTile, row_tiles = (m + kTile - 1) / kTile;
  const long long tiles = row_tiles * col_tiles;
  const bits_t* x = static_cast<const bits_t*>(x_ptr);
  // 16-byte loads where x's rows are 16-byte aligned, except for a piece whose columns straddle the end of the rows
  // (only when n % kVec != 0): that one, like all of an unaligned x, is read element by element.
  const bool vec_x = reinterpret_cast<uptr>(x_ptr) % 16 == 0 && (ld_x * kInBytes) % 16 == 0;

  // The thread's slots of the ring: stage s, row i of its piece at slot[(s * kRows + i) * kThreads] (a warp's 32
  // slots of one row are 512 contiguous bytes: no bank conflicts). Only the thread itself writes and reads them.
  uint4* const slot = ring() + tid;
  if constexpr (kStages > 0) {
#pragma unroll 1
    for (int st = 0; st < kStages; ++st) {
      prefetch_piece(slot + st * kRows * kThreads, x, blockIdx.x + static_cast<long long>(st) * gridDim.x, tiles,
                     row_tiles, col_tiles, r0, c0, m, n, ld_x, vec_x);
      cp_async_commit();
    }
  }

  int stage = 0, parity = 0;
#pragma unroll 1
  for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    long long tb, db;  // row block, column block
    tile_coords(tile, row_tiles, col_tiles, tb, db);
    const long long m0 = tb * kTile, n0 = db * kTile;
    const long long row0 = m0 + r0, col0 = n0 + c0;  // the piece's first row and column in x

    // ---- the thread's 16 x kVec piece (raw bits: 16 bytes a row) ----
    uint32_t w[kRows][4];
    if constexpr (kStages > 0) cp_async_wait<kStages - 1>();  // this tile's group (each iteration commits one)
    if (vec_x && !(col0 < n && n < col0 + kVec)) {
      const bool cols_in = col0 < n;  // all kVec columns, or none
      if constexpr (kStages > 0) {
        const uint4* src = slot + stage * kRows * kThreads;
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
          uint4 v = {0u, 0u, 0u, 0u};
          if (cols_in && row0 + i < m) v = src[i * kThreads];
          w[i][0] = v.x, w[i][1] = v.y, w[i][2] = v.z, w[i][3] = v.w;
        }
      } else {
        const bits_t* p = x + row0 * ld_x + col0;
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
          uint4 v = {0u, 0u, 0u, 0u};
          if (cols_in && row0 + i < m) v = ld_stream_v4(p + i * ld_x);
          w[i][0] = v.x, w[i][1] = v.y, w[i][2] = v.z, w[i][3] = v.w;
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const long long row = row0 + i;
#pragma unroll
        for (int k = 0; k < 4; ++k) w[i][k] = 0u;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const long long col = col0 + j;
          if (row < m && col < n) {
            const uint32_t b = static_cast<uint32_t>(x[row * ld_x + col]);
            if constexpr (kInBytes == 4) w[i][j] = b;
            else w[i][j / 2] |= b << (16 * (j & 1));
          }
        }
      }
    }

    float camax[kVec], ramax[kRows], tamax;
    piece_amax(w, camax, ramax, tamax);

    // The stage is read (its values are in the maxima): refill it with the tile kStages ahead, whose loads are then
    // in flight while this one is scaled and stored.
    if constexpr (kStages > 0) {
      prefetch_piece(slot + stage * kRows * kThreads, x, tile + static_cast<long long>(kStages) * gridDim.x, tiles,
                     row_tiles, col_tiles, r0, c0, m, n, ld_x, vec_x);
      cp_async_commit();
      stage = stage + 1 == kStages ? 0 : stage + 1;
    }

    float col_factor[kVec];  // each column's factor (per-block: the tile's in every entry)
    float row_factor[kRows];
    if constexpr (!kBlock) {
      // Lane rl makes column rl's factor and scale (rl < kVec), then every lane takes its kVec factors.
      float mine = camax[0];
#pragma unroll
      for (int j = 1; j < kVec; ++j) mine = rl == j ? camax[j] : mine;
      const float clamped = clamp_amax(mine);
      const float factor = quant_factor(clamped);
      if (rl < kVec) {
        const long long c = col0 + rl;  // a row of x^T
        if (c < st_rows) s_t[c * st_row_stride + tb * st_col_stride] = c < n ? quant_scale(clamped) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kVec; ++j) col_factor[j] = __shfl_sync(0xffffffffu, factor, j * kColLanes + cl);
    }

    if constexpr (kRowwise) {
      // A row's 128 columns: the warps' partial maxima meet in shared memory. One copy of each array is enough
      // across tiles: a thread writes partial of the next tile only after the second barrier (every read of it
      // is before), and factors only after the next tile's first barrier (every read of it is before).
      alignas(16) __shared__ float partial[kWarps][kTile];
      alignas(16) __shared__ float factors[kTile];
      if (cl == 0) {
#pragma unroll
        for (int i = 0; i < kRows; i += 4) {
          float4 v;
          v.x = ramax[i], v.y = ramax[i + 1], v.z = ramax[i + 2], v.w = ramax[i + 3];
          *reinterpret_cast<float4*>(&partial[warp][r0 + i]) = v;
        }
      }
      __syncthreads();
      if (tid < kTile) {  // one thread per row of the tile
        float a = partial[0][tid];
#pragma unroll
        for (int k = 1; k < kWarps; ++k) a = fmaxf(a, partial[k][tid]);
        const float clamped = clamp_amax(a);
        factors[tid] = quant_factor(clamped);
        const long long row = m0 + tid;
        if (row < m) s[row * col_tiles + db] = quant_scale(clamped);
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kRows; i += 4) {
        const float4 f = *reinterpret_cast<const float4*>(&factors[r0 + i]);
        row_factor[i] = f.x, row_factor[i + 1] = f.y, row_factor[i + 2] = f.z, row_factor[i + 3] = f.w;
      }
    }

    if constexpr (kBlock) {
      // Two copies, alternating by tile: with one barrier per tile, a warp may write the next tile's maximum while
      // another still reads this tile's.
      __shared__ float partial[2][kWarps];
      float a = warp_max(tamax);
      if (lane == 0) partial[parity][warp] = a;
      __syncthreads();
      a = partial[parity][0];
#pragma unroll
      for (int k = 1; k < kWarps; ++k) a = fmaxf(a, partial[parity][k]);
      parity ^= 1;
      const float clamped = clamp_amax(a);
      const float factor = quant_factor(clamped);
      if (tid == 0) {
        const float scale = quant_scale(clamped);
        s[tb * col_tiles + db] = scale;
        s_t[db * st_row_stride + tb * st_col_stride] = scale;
      }
#pragma unroll
      for (int j = 0; j < kVec; ++j) col_factor[j] = factor;
#pragma unroll
      for (int i = 0; i < kRows; ++i) row_factor[i] = factor;
    }

    // ---- q_t: column j of the piece is 16 consecutive bytes of row col0 + j of q_t ----
    // 16-byte stores where q_t's rows are 16-byte aligned (m % 16 == 0: then a piece's 16 rows are all in x or all
    // past its end); byte by byte otherwise.
    if (m % 16 == 0 && reinterpret_cast<uptr>(q_t) % 16 == 0) {
      const bool rows_in = row0 < m;
      uint8_t* dst = q_t + col0 * m + row0;
      static_for<0, kVec>([&](auto jc) {
        constexpr int j = decltype(jc)::value;
        uint32_t o[4];
        column_bytes<j>(w, col_factor[j], o);
        if (rows_in && col0 + j < n) st_v4(dst + j * m, o[0], o[1], o[2], o[3]);
      });
    } else {
      static_for<0, kVec>([&](auto jc) {
        constexpr int j = decltype(jc)::value;
        uint32_t o[4];
        column_bytes<j>(w, col_factor[j], o);
        const long long c = col0 + j;
        if (c < n) {
#pragma unroll
          for (int i = 0; i < kRows; ++i)
            if (row0 + i < m) q_t[c * m + (row0 + i)] = static_cast<uint8_t>(o[i / 4] >> (8 * (i % 4)));
        }
      });
    }

    // ---- q: row i of the piece is kVec consecutive bytes of row row0 + i of q ----
    // kVec-byte stores where q's rows are kVec-byte aligned (n % kVec == 0: then a piece's columns are all in x or
    // all past the end of its rows); byte by byte otherwise.
    if constexpr (kStoreQ) {
      if (n % kVec == 0 && reinterpret_cast<uptr>(q) % kVec == 0) {
        const bool cols_in = col0 < n;
        uint8_t* dst = q + row0 * n + col0;
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
          uint32_t o[kVec / 4];
          row_bytes(w[i], row_factor[i], o);
          if (cols_in && row0 + i < m) {
            if constexpr (kVec == 8) st_v2(dst + i * n, o[0], o[1]);
            else st_u32(dst + i * n, o[0]);
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
          uint32_t o[kVec / 4];
          row_bytes(w[i], row_factor[i], o);
          const long long row = row0 + i;
          if (row < m) {
#pragma unroll
            for (int j = 0; j < kVec; ++j)
              if (col0 + j < n) q[row * n + (col0 + j)] = static_cast<uint8_t>(o[j / 4] >> (8 * (j % 4)));
          }
        }
      }
    }
  }
}
