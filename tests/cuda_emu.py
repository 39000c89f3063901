"""A CPU emulation of cupygemm's cast kernels (cuda_src/cast_transpose.cu), for testing their logic without a GPU.

The kernel source is compiled as host C++ by g++ with a small shim (below): ``__shared__`` variables become statics,
a CTA's threads become fibers (ucontext) that run one at a time and switch only at ``__syncthreads`` and warp
shuffles, so barriers and shuffles have CUDA's semantics (a barrier some thread misses, or a shuffle some lane of
the warp misses, is reported as an error instead of hanging). The handful of PTX instructions the kernel uses
(quant_common.cuh declares them for host compilers) are defined here in portable C++: e4m3 conversion with round
to nearest even and saturation, f16 widening, packed bf16x2/f16x2 |.| and max, and the vector loads and stores,
which also check their alignment. IEEE float division and multiplication are the host's (SSE, no contraction).

What this checks: indexing, tiling, ragged edges, strides, the reductions and the layouts of every output, and
that the vector paths are only taken with aligned addresses. What it cannot: timing, the real PTX instructions
(cvt.rn.satfinite.e4m3x2 and friends are GPU-tested through quantize.cu and the GPU tests), memory-model effects.
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np

from cupygemm.jit.source import cuda_src_dir

#: g++ is what the emulation needs; tests skip without it.
CXX = shutil.which("g++")

KINDS = {"float32": 0, "bfloat16": 1, "float16": 2}
MODES = {"per_token_cast_to_fp8_transposed": 0, "per_token_cast_to_fp8_transposed_rowwise": 1,
         "per_block_cast_to_fp8_with_transpose": 2}

_SHIM = r"""
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>
#include <cmath>
#include <functional>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct uint4 { unsigned x, y, z, w; };
struct float4 { float x, y, z, w; };
struct dim3 { unsigned x, y, z; };
static dim3 threadIdx, blockIdx, blockDim, gridDim;

inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
inline size_t __cvta_generic_to_shared(const void* p) { return reinterpret_cast<size_t>(p); }

namespace emu {
enum State { RUNNABLE, AT_BLOCK_BARRIER, AT_WARP_BARRIER, DONE };
struct Fiber { ucontext_t ctx; State state; };
static std::vector<Fiber> fibers;
static std::vector<char> stacks;
static ucontext_t sched;
static int cur = -1;
static std::function<void()> body;
static uint32_t xchg[2][1024];
static int xphase[1024];
static const char* error = nullptr;
static constexpr size_t kStack = 256 * 1024;
static std::vector<std::pair<uintptr_t, uintptr_t>> ranges;  // the memory a launch may touch: [lo, hi)
// Dynamic shared memory (the launch's bytes, 16-byte aligned), and each thread's cp.async copies: those of its open
// group, then its committed groups oldest first. A copy lands only when a wait retires its group; until then its
// destination holds poison (0x7b bytes: a large finite value in every input format), so a read before the wait
// shows in the results.
struct Copy { void* dst; const void* src; };
static std::vector<uint4> dyn_smem;
static size_t dyn_smem_bytes = 0;
static std::vector<std::vector<Copy>> open_copies;
static std::vector<std::vector<std::vector<Copy>>> groups;
static constexpr uint8_t kPoison = 0x7b;

inline void fail(const char* what) {
  if (!error) error = what;
}
// Vector loads and stores must lie inside one registered buffer (so a wrong predicate cannot write far away).
inline void check_range(const void* p, size_t n, const char* what) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (const auto& r : ranges)
    if (a >= r.first && a + n <= r.second) return;
  fail(what);
}
inline void entry() {
  body();
  fibers[cur].state = DONE;
}
inline void yield(State s) {
  fibers[cur].state = s;
  swapcontext(&fibers[cur].ctx, &sched);
}
// Runs one CTA of `threads` fibers; false (and `error` set) on a barrier or shuffle that not every thread reaches.
inline bool run_block(int threads) {
  fibers.assign(threads, Fiber());
  stacks.resize(static_cast<size_t>(threads) * kStack);
  for (int t = 0; t < threads; ++t) {
    Fiber& f = fibers[t];
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = &stacks[static_cast<size_t>(t) * kStack];
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = &sched;
    makecontext(&f.ctx, entry, 0);
    f.state = RUNNABLE;
    xphase[t] = 0;
  }
  open_copies.assign(threads, std::vector<Copy>());
  groups.assign(threads, std::vector<std::vector<Copy>>());
  memset(dyn_smem.data(), kPoison, dyn_smem.size() * sizeof(uint4));
  for (;;) {
    for (int t = 0; t < threads && !error; ++t) {
      if (fibers[t].state != RUNNABLE) continue;
      cur = t;
      threadIdx = {static_cast<unsigned>(t), 0u, 0u};
      swapcontext(&sched, &fibers[t].ctx);
    }
    if (error) return false;
    int done = 0, at_block = 0;
    for (int t = 0; t < threads; ++t) {
      done += fibers[t].state == DONE;
      at_block += fibers[t].state == AT_BLOCK_BARRIER;
    }
    if (done == threads) {
      for (int t = 0; t < threads; ++t) {
        bool pending = !open_copies[t].empty();
        for (const auto& g : groups[t]) pending = pending || !g.empty();
        if (pending) {
          fail("a thread exits with cp.async copies it never waited for");
          return false;
        }
      }
      return true;
    }
    bool released = false;
    for (int w = 0; w < threads / 32; ++w) {
      int at_warp = 0;
      for (int l = 0; l < 32; ++l) at_warp += fibers[32 * w + l].state == AT_WARP_BARRIER;
      if (at_warp == 32) {
        for (int l = 0; l < 32; ++l) fibers[32 * w + l].state = RUNNABLE;
        released = true;
      } else if (at_warp) {
        fail("a warp shuffle that not every lane of the warp reaches");
        return false;
      }
    }
    if (!released) {
      if (at_block != threads) {
        fail("__syncthreads that not every thread of the CTA reaches");
        return false;
      }
      for (int t = 0; t < threads; ++t) fibers[t].state = RUNNABLE;
    }
  }
}
inline uint32_t shuffle(unsigned mask, uint32_t v, int src_lane) {
  if (mask != 0xffffffffu) fail("a shuffle with a partial mask");
  const int t = cur, p = xphase[t];
  xphase[t] ^= 1;
  xchg[p][t] = v;
  yield(AT_WARP_BARRIER);
  return xchg[p][(t & ~31) | (src_lane & 31)];
}
}  // namespace emu

inline void __syncthreads() { emu::yield(emu::AT_BLOCK_BARRIER); }

namespace cupygemm {
template <int kL2Prefetch> inline void cp_async_16(void* dst, const void* src) {
  static_assert(kL2Prefetch == 0 || kL2Prefetch == 128 || kL2Prefetch == 256, "L2 prefetch size");
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst), lo = reinterpret_cast<uintptr_t>(emu::dyn_smem.data());
  if (d % 16 || reinterpret_cast<uintptr_t>(src) % 16) emu::fail("a misaligned cp.async");
  if (d < lo || d + 16 > lo + emu::dyn_smem_bytes) emu::fail("a cp.async outside the dynamic shared memory");
  emu::check_range(src, 16, "a cp.async from outside the input");
  if (emu::error) return;
  memset(dst, emu::kPoison, 16);
  emu::open_copies[emu::cur].push_back({dst, src});
}
inline void cp_async_commit() {
  emu::groups[emu::cur].push_back(std::move(emu::open_copies[emu::cur]));
  emu::open_copies[emu::cur].clear();
}
template <int N> inline void cp_async_wait() {
  auto& g = emu::groups[emu::cur];
  while (g.size() > static_cast<size_t>(N)) {
    for (const auto& c : g.front()) memcpy(c.dst, c.src, 16);
    g.erase(g.begin());
  }
}
}  // namespace cupygemm
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  static_assert(sizeof(T) == 4, "32-bit shuffles only");
  uint32_t b;
  memcpy(&b, &v, 4);
  b = emu::shuffle(mask, b, (emu::cur & 31) ^ lane_mask);
  memcpy(&v, &b, 4);
  return v;
}
template <class T> inline T __shfl_sync(unsigned mask, T v, int src_lane) {
  static_assert(sizeof(T) == 4, "32-bit shuffles only");
  uint32_t b;
  memcpy(&b, &v, 4);
  b = emu::shuffle(mask, b, src_lane);
  memcpy(&v, &b, 4);
  return v;
}
"""

_PRIMITIVES = r"""
// e4m3fn, round to nearest even, saturating to +-448 (cvt.rn.satfinite.e4m3x2.f32 on one value).
inline uint8_t emu_e4m3(float f) {
  const uint8_t sign = (__float_as_uint(f) >> 24) & 0x80;
  if (std::isnan(f)) return 0x7f;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;
  if (a < 0.015625f) return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));  // subnormals: 2^-9 steps
  int e;
  std::frexp(a, &e);
  int exp = e - 1;                                                  // a = 1.m * 2^exp, exp in [-6, 8]
  int mant = static_cast<int>(std::nearbyint((std::ldexp(a, -exp) - 1.0f) * 8.0f));
  if (mant == 8) mant = 0, ++exp;
  const int code = ((exp + 7) << 3) | mant;
  return sign | static_cast<uint8_t>(code > 0x7e ? 0x7e : code);
}

namespace cupygemm {
namespace quant {
inline float f16_bits_to_f32(uint16_t v) {
  _Float16 h;
  memcpy(&h, &v, 2);
  return static_cast<float>(h);
}
inline uint16_t f32x2_to_e4m3x2(float lo, float hi) {
  return static_cast<uint16_t>(emu_e4m3(lo) | (emu_e4m3(hi) << 8));
}
inline uint4 ld_stream_v4(const void* p) {
  if (reinterpret_cast<uintptr_t>(p) % 16) emu::fail("a misaligned 16-byte load");
  emu::check_range(p, 16, "a 16-byte load outside the input");
  uint4 v;
  memcpy(&v, p, 16);
  return v;
}
inline void st_v4(void* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  if (reinterpret_cast<uintptr_t>(p) % 16) emu::fail("a misaligned 16-byte store");
  emu::check_range(p, 16, "a 16-byte store outside the outputs");
  if (emu::error) return;
  const uint32_t v[4] = {a, b, c, d};
  memcpy(p, v, 16);
}
inline void st_v2(void* p, uint32_t a, uint32_t b) {
  if (reinterpret_cast<uintptr_t>(p) % 8) emu::fail("a misaligned 8-byte store");
  emu::check_range(p, 8, "an 8-byte store outside the outputs");
  if (emu::error) return;
  const uint32_t v[2] = {a, b};
  memcpy(p, v, 8);
}
inline void st_u32(void* p, uint32_t a) {
  if (reinterpret_cast<uintptr_t>(p) % 4) emu::fail("a misaligned 4-byte store");
  emu::check_range(p, 4, "a 4-byte store outside the outputs");
  if (emu::error) return;
  memcpy(p, &a, 4);
}
#if CUPYGEMM_QUANT_IN_KIND != 0
inline bool emu_is_nan16(uint32_t h) {
  return CUPYGEMM_QUANT_IN_KIND == 1 ? (h & 0x7fffu) > 0x7f80u : (h & 0x7fffu) > 0x7c00u;
}
inline float emu_widen16(uint32_t h) {
  return CUPYGEMM_QUANT_IN_KIND == 1 ? __uint_as_float(h << 16) : f16_bits_to_f32(static_cast<uint16_t>(h));
}
inline uint32_t abs_x2(uint32_t v) { return v & 0x7fff7fffu; }
inline uint32_t max_x2(uint32_t a, uint32_t b) {  // per half: a NaN loses to a number; two NaNs give the canonical
  uint32_t r = 0;
  for (int k = 0; k < 2; ++k) {
    const uint32_t x = (a >> (16 * k)) & 0xffffu, y = (b >> (16 * k)) & 0xffffu;
    uint32_t z;
    if (emu_is_nan16(x) && emu_is_nan16(y)) z = 0x7fffu;
    else if (emu_is_nan16(x)) z = y;
    else if (emu_is_nan16(y)) z = x;
    else z = emu_widen16(x) >= emu_widen16(y) ? x : y;
    r |= z << (16 * k);
  }
  return r;
}
#endif
}  // namespace quant
}  // namespace cupygemm

uint4* cupygemm::cast_t::ring() { return emu::dyn_smem.data(); }

extern "C" int emu_threads() { return cupygemm::cast_t::kThreads; }
extern "C" uint8_t emu_e4m3_of(float f) { return emu_e4m3(f); }
extern "C" const char* emu_error() { return emu::error; }
extern "C" void emu_clear_ranges() { emu::ranges.clear(); }
extern "C" void emu_add_range(const void* p, unsigned long long n) {
  emu::ranges.emplace_back(reinterpret_cast<uintptr_t>(p), reinterpret_cast<uintptr_t>(p) + n);
}

// One launch of the kernel over `grid` CTAs with `smem` bytes of dynamic shared memory, run one after another.
extern "C" int emu_launch(unsigned grid, unsigned long long smem, const void* x, uint8_t* q_t, float* s_t, uint8_t* q,
                          float* s, long long m, long long n, long long ld, long long st_row_stride,
                          long long st_col_stride, long long st_rows) {
  emu::error = nullptr;
  emu::dyn_smem.assign((smem + 15) / 16, uint4{0u, 0u, 0u, 0u});
  emu::dyn_smem_bytes = smem;
  blockDim = {static_cast<unsigned>(cupygemm::cast_t::kThreads), 1u, 1u};
  gridDim = {grid, 1u, 1u};
  emu::body = [&] { CUPYGEMM_CT_ENTRY(x, q_t, s_t, q, s, m, n, ld, st_row_stride, st_col_stride, st_rows); };
  for (unsigned b = 0; b < grid; ++b) {
    blockIdx = {b, 0u, 0u};
    if (!emu::run_block(cupygemm::cast_t::kThreads)) return -1;
  }
  return 0;
}
"""


class EmulatedKernel:
    """One (input kind, mode) of cast_transpose.cu compiled for the host, launched like the GPU kernel."""

    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        self.lib.emu_launch.restype = ctypes.c_int
        self.lib.emu_launch.argtypes = [ctypes.c_uint, ctypes.c_ulonglong] + [ctypes.c_void_p] * 5 + \
            [ctypes.c_longlong] * 6
        self.lib.emu_error.restype = ctypes.c_char_p
        self.lib.emu_e4m3_of.restype = ctypes.c_uint8
        self.lib.emu_e4m3_of.argtypes = [ctypes.c_float]
        self.lib.emu_add_range.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong]
        self.threads = self.lib.emu_threads()

    def launch(self, grid: int, smem: int, x: int, q_t: int, s_t: int, q: int, s: int, m: int, n: int, ld: int,
               st_row_stride: int, st_col_stride: int, st_rows: int,
               ranges: list[tuple[int, int]] | None = None) -> None:
        """One launch over ``grid`` CTAs with ``smem`` bytes of dynamic shared memory; ``ranges``: (address, bytes)
        of the buffers its vector loads, copies and stores may touch (the input's whole allocation and each
        output's); a vector access outside all of them fails the launch."""
        self.lib.emu_clear_ranges()
        for ptr, size in ranges or []:
            self.lib.emu_add_range(ptr, size)
        rc = self.lib.emu_launch(grid, smem, x, q_t, s_t, q, s, m, n, ld, st_row_stride, st_col_stride, st_rows)
        if rc:
            raise AssertionError(f"emulated kernel: {self.lib.emu_error().decode()}")

    def e4m3(self, values: np.ndarray) -> np.ndarray:
        return np.array([self.lib.emu_e4m3_of(float(v)) for v in np.asarray(values, np.float32).ravel()], np.uint8)


def build(kind: str, mode: str, out_dir: Path, defines: dict[str, object] | None = None) -> EmulatedKernel:
    """Compile cast_transpose.cu for input ``kind`` (float32, bfloat16, float16) and ``mode`` (its entry point)
    with ``defines`` (the CUPYGEMM_* constants the host renders it with: ``quantization.fused_cast_defines``)."""
    if CXX is None:
        raise RuntimeError("g++ is not installed")
    defines = dict(defines or {})
    defines.update(CUPYGEMM_QUANT_IN_KIND=KINDS[kind], CUPYGEMM_CT_MODE=MODES[mode])
    tag = "_".join(str(v) for k, v in sorted(defines.items()) if k not in ("CUPYGEMM_QUANT_IN_KIND",
                                                                            "CUPYGEMM_CT_MODE"))
    out_dir = out_dir / f"{kind}_{mode}_{tag}"  # a directory per build: builds may run in parallel
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "cuda_emu_shim.h").write_text(_SHIM)
    tu = out_dir / f"emu_{kind}_{mode}.cpp"
    lines = "".join(f"#define {k} {v}\n" for k, v in defines.items())
    tu.write_text(f'#include "cuda_emu_shim.h"\n{lines}#include "cast_transpose.cu"\n{_PRIMITIVES}')
    lib = out_dir / f"emu_{kind}_{mode}.so"
    cmd = [CXX, "-std=c++17", "-O1", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC", "-w",
           "-I", str(out_dir), "-I", str(cuda_src_dir()), "-x", "c++", str(tu), "-o", str(lib)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"g++ failed:\n{res.stderr[-4000:]}")
    return EmulatedKernel(lib)
