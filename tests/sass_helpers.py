"""Shared helpers for the sass_tools tests: NVRTC discovery/compilation, nvdisasm/cuobjdump discovery and parsing,
and the CUDA test kernels.

Toolchains (all CPU-only, no GPU needed):

* CuPy's NVRTC binding (``cupy_backends.cuda.libs.nvrtc``): whatever libnvrtc CuPy loads (12.x, or 13.x when
  ``nvidia-cuda-nvrtc`` is installed next to cupy-cuda12x). Its ``getCUBIN`` drops the last byte: we append ``b"\\0"``.
* Other NVRTC versions are loaded with ctypes **in a subprocess** (:mod:`sass_tools.nvrtc`, which says where it looks):
  ``libnvrtc.so.13`` from ``nvidia-cuda-nvrtc``, ``libnvrtc.so.12`` from ``nvidia-cuda-nvrtc-cu12``, and those in
  ``CUPYGEMM_NVRTC_DIRS`` or a ``.nvrtc*`` directory next to the checkout.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import pytest

from sass_tools.nvrtc import compile_ctypes, find_nvrtc_libs, site_dirs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVRTC_OPTS = ("-arch=sm_90a", "-std=c++17", "-default-device")


# ----------------------------------------------------------------------------------------------- tool discovery
def find_tool(name: str) -> Optional[str]:
    """nvdisasm / cuobjdump: PATH first, then the pip packages' ``site-packages/nvidia/*/bin``."""
    p = shutil.which(name)
    if p:
        return p
    for d in site_dirs():
        for cand in glob.glob(os.path.join(d, "nvidia", "*", "bin", name)):
            if os.access(cand, os.X_OK):
                return cand
    return None


def require_tool(name: str) -> str:
    p = find_tool(name)
    if p is None:
        pytest.fail(f"{name} not found on PATH or in site-packages/nvidia/*/bin: "
                    f"pip install nvidia-cuda-{name} (part of the project's test extra)")
    return p


def tool_env() -> Dict[str, str]:
    """Environment with nvdisasm's directory on PATH (``cuobjdump -sass`` runs nvdisasm)."""
    env = dict(os.environ)
    d = os.path.dirname(require_tool("nvdisasm"))
    env["PATH"] = d + os.pathsep + env.get("PATH", "")
    return env


# ----------------------------------------------------------------------------------------------- NVRTC
def cupy_nvrtc_version() -> Tuple[int, int]:
    """Version of the NVRTC CuPy's binding loads; fails the test with a clear message if unavailable."""
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as e:  # pragma: no cover
        pytest.fail(f"CuPy is required for the sass_tools tests (pip install cupy-cuda12x): {e}")
    try:
        return tuple(nvrtc.getVersion())  # type: ignore[return-value]
    except Exception as e:  # DynamicLibNotFoundError etc.
        pytest.fail(f"CuPy cannot load NVRTC ({type(e).__name__}: {e}); pip install nvidia-cuda-nvrtc-cu12")


def compile_cupy(src: str, extra_opts: Sequence[str] = (), name: str = "kernels.cu") -> bytes:
    """Compile with CuPy's NVRTC binding; returns the complete cubin (the missing last byte re-appended)."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(src, name, (), ())
    try:
        try:
            nvrtc.compileProgram(prog, tuple(NVRTC_OPTS) + tuple(extra_opts))
        except Exception as e:
            raise RuntimeError(f"NVRTC compile failed: {e}\n{nvrtc.getProgramLog(prog)}") from e
        return nvrtc.getCUBIN(prog) + b"\x00"  # CuPy strips the last byte ("trailing NUL"): put it back
    finally:
        nvrtc.destroyProgram(prog)


# ----------------------------------------------------------------------------------------------- test kernels
def _wgmma_m64n128k32(n_acc: int = 64) -> str:
    outs = ",".join(f"%{i}" for i in range(n_acc))
    cons = ", ".join(f'"=f"(acc[{i}])' for i in range(n_acc))
    return (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{n_acc + 2}, 0;\\n'
            f'wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {{{outs}}}, %{n_acc}, %{n_acc + 1}, p, 1, 1;\\n}}\\n"\n'
            f'      : {cons}\n      : "l"(desc_a), "l"(desc_b), "r"(0));')


#: Three kernels; compile with -DLB_THREADS=128 (no native interleave) or 384 (native on NVRTC >= 12.9).
GEMM_SRC = r'''
#ifndef LB_THREADS
#define LB_THREADS 128
#endif
#ifndef LB_BLOCKS
#define LB_BLOCKS 1
#endif
#if defined(__CUDACC_VER_MAJOR__) && __CUDACC_VER_MAJOR__ >= 13
struct alignas(128) TmaDesc { unsigned long long v[16]; };
#else
struct alignas(64) TmaDesc { unsigned long long v[16]; };
#endif

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// QGMMA m64n128k32 into 64 FP32 accumulators + per-step promotion final += scale * acc (long FFMA runs).
extern "C" __global__ void __launch_bounds__(LB_THREADS, LB_BLOCKS)
qgmma_promote(const float* __restrict__ scales, float* __restrict__ out,
              unsigned long long desc_a, unsigned long long desc_b, int k_iters) {
  float final_acc[64];
  #pragma unroll
  for (int i = 0; i < 64; ++i) final_acc[i] = 0.f;
  for (int k = 0; k < k_iters; ++k) {
    float acc[64];
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    @WGMMA@
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    const float scale = scales[k];
    #pragma unroll
    for (int i = 0; i < 64; ++i) final_acc[i] += scale * acc[i];
    desc_a += 2; desc_b += 2;
  }
  #pragma unroll
  for (int i = 0; i < 64; ++i) out[threadIdx.x * 64 + i] = final_acc[i];
}

// TMA loads (plain + multicast) and bulk copy into an mbarrier pipeline, setmaxnreg, TMA store; cluster of 2.
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(LB_THREADS, LB_BLOCKS)
tma_pipeline(const __grid_constant__ TmaDesc tmap_in, const __grid_constant__ TmaDesc tmap_out,
             const float* __restrict__ src, int k_iters, float alpha) {
  __shared__ alignas(1024) unsigned char tile[2][128 * 64];
  __shared__ alignas(128) float out_tile[128];
  __shared__ alignas(8) unsigned long long full_bar[2];
  const unsigned tid = threadIdx.x;
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  if (tid == 0) {
    for (int s = 0; s < 2; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(&full_bar[s])), "r"(1));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("prefetch.tensormap [%0];" :: "l"(&tmap_in) : "memory");
  }
  asm volatile("barrier.cluster.arrive.aligned; barrier.cluster.wait.aligned;" ::: "memory");
  if (tid >= 128) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  else asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
  float sum = 0.f;
  for (int k = 0; k < k_iters; ++k) {
    const int s = k & 1;
    const unsigned bar = smem_u32(&full_bar[s]);
    const unsigned dst = smem_u32(&tile[s][0]);
    if (tid == 0) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(128 * 64 + 512) : "memory");
      if (rank == 0)
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                     " [%0], [%1, {%2, %3}], [%4], %5;"
                     :: "r"(dst), "l"(&tmap_in), "r"(k * 128), "r"(0), "r"(bar), "h"((unsigned short)3) : "memory");
      else
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                     " [%0], [%1, {%2, %3}], [%4];"
                     :: "r"(dst), "l"(&tmap_in), "r"(k * 128), "r"(64), "r"(bar) : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 512, [%2];"
                   :: "r"(dst + 8192), "l"(src + k * 128), "r"(bar) : "memory");
    }
    const unsigned phase = (k >> 1) & 1;
    asm volatile("{\n.reg .pred P1;\nWAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
                 "@!P1 bra WAIT;\n}\n" :: "r"(bar), "r"(phase) : "memory");
    const float* t = reinterpret_cast<const float*>(&tile[s][0]);
    sum = fmaf(t[tid], alpha, sum) + t[tid + 128] * 0.5f;
    __syncthreads();
  }
  out_tile[tid & 127] = sum;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  if (tid == 0) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                 :: "l"(&tmap_out), "r"(0), "r"((int)blockIdx.x), "r"(smem_u32(out_tile)) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  }
  asm volatile("barrier.cluster.arrive.aligned; barrier.cluster.wait.aligned;" ::: "memory");
}

// Scalar FP32: FFMA/FADD/FMUL with register, immediate, constant and uniform operands and modifiers.
extern "C" __global__ void __launch_bounds__(LB_THREADS, LB_BLOCKS)
scalar_forms(const float* __restrict__ x, float* __restrict__ y, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = x[i];
  float r = fmaf(v, a, 1.25f);
  r = fmaf(r, 3.0f, v);
  r = r * b + a;
  r = r + b;
  r = r * a;
  r = r * 0.375f;
  r = r + 2.5f;
  r = __fmaf_rz(r, v, b);
  r = fmaf(-fabsf(r), v, -b);
  y[i] = -r;
}
'''.replace("@WGMMA@", _wgmma_m64n128k32())

#: HGMMA / IGMMA / BGMMA / QGMMA with A from registers, stmatrix/ldmatrix, local memory (STL/LDL).
VARIANTS_SRC = r'''
extern "C" __global__ void __launch_bounds__(128, 1)
gmma_variants(float* __restrict__ out, int* __restrict__ iout, unsigned long long da, unsigned long long db,
              unsigned a0, unsigned a1, unsigned a2, unsigned a3) {
  float f[4], g[4]; int s[4], t[4];
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
               : "=f"(f[0]), "=f"(f[1]), "=f"(f[2]), "=f"(f[3]) : "l"(da), "l"(db), "r"(0));
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n8k32.s32.s8.s8 {%0,%1,%2,%3}, %4, %5, p;\n}\n"
               : "=r"(s[0]), "=r"(s[1]), "=r"(s[2]), "=r"(s[3]) : "l"(da), "l"(db), "r"(0));
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n8k256.s32.b1.b1.and.popc {%0,%1,%2,%3}, %4, %5, p;\n}\n"
               : "=r"(t[0]), "=r"(t[1]), "=r"(t[2]), "=r"(t[3]) : "l"(da), "l"(db), "r"(0));
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1;\n}\n"
               : "=f"(g[0]), "=f"(g[1]), "=f"(g[2]), "=f"(g[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(0));
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  __shared__ alignas(128) unsigned short stage[8 * 8 * 4];
  unsigned addr = (unsigned)__cvta_generic_to_shared(&stage[(threadIdx.x & 7) * 8]);
  unsigned packed = __float_as_uint(f[0] + g[0]);
  asm volatile("stmatrix.sync.aligned.m8n8.x1.shared.b16 [%0], {%1};" :: "r"(addr), "r"(packed) : "memory");
  unsigned back;
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(back) : "r"(addr) : "memory");
  const int tid = threadIdx.x;
  float local[32];
  #pragma unroll 1
  for (int i = 0; i < (int)(a0 & 31); ++i) local[(i * 5 + tid) & 31] = f[i & 3] * (float)i + g[(i + 1) & 3];
  out[tid] = local[(tid * 7 + (int)back) & 31];
  iout[tid] = s[0] + s[1] + s[2] + s[3] + t[0] + t[1] + t[2] + t[3];
}
'''

GEMM_KERNELS = ("qgmma_promote", "tma_pipeline", "scalar_forms")


@dataclass
class Build:
    """One compiled cubin of the test sources."""

    tag: str  # e.g. "nvrtc12.9-lb128"
    version: Tuple[int, int]
    launch_threads: Optional[int]
    cubin: bytes
    source: str  # "gemm", "variants" or "cupygemm"


# ----------------------------------------------------------------------------------------------- nvdisasm parsing
@dataclass
class DisLine:
    address: int
    text: str  # without trailing ';'
    lo: int
    hi: int

    @property
    def guard(self) -> str:
        t = self.text.split()
        return t[0] if t and t[0].startswith("@") else ""

    @property
    def body(self) -> str:
        return self.text[len(self.guard):].strip()

    @property
    def mnemonic(self) -> str:
        return self.body.split()[0] if self.body else ""

    @property
    def operand_text(self) -> str:
        b = self.body
        return b[len(self.mnemonic):].strip()


_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*/\*\s*0x([0-9a-f]{16})\s*\*/\s*$")
_HI = re.compile(r"^\s*/\*\s*0x([0-9a-f]{16})\s*\*/\s*$")
_SEC = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")


def parse_nvdisasm(out: str) -> Dict[str, List[DisLine]]:
    """Parse ``nvdisasm -hex`` output into {kernel name (or "" for raw input): [DisLine...]}."""
    res: Dict[str, List[DisLine]] = {}
    cur = ""
    pend = None
    for line in out.splitlines():
        m = _SEC.match(line)
        if m:
            cur = m.group(1)
            res[cur] = []
            continue
        m = _LINE.match(line)
        if m:
            text = m.group(2).strip()
            if text.endswith(";"):
                text = text[:-1].rstrip()
            pend = (int(m.group(1), 16), text, int(m.group(3), 16))
            continue
        m = _HI.match(line)
        if m and pend is not None:
            res.setdefault(cur, []).append(DisLine(pend[0], pend[1], pend[2], int(m.group(1), 16)))
            pend = None
    return res


def nvdisasm_cubin(cubin: bytes) -> Dict[str, List[DisLine]]:
    """Disassemble every kernel of a cubin (``nvdisasm -hex -c``); stderr warnings are ignored, rc must be 0."""
    tool = require_tool("nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        r = subprocess.run([tool, "-hex", "-c", f.name], capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(f.name)
    assert r.returncode == 0, f"nvdisasm failed ({r.returncode}): {r.stderr}"
    return parse_nvdisasm(r.stdout)


def nvdisasm_raw(words: Sequence[Tuple[int, int]]) -> Tuple[Dict[int, str], Dict[int, str]]:
    """Disassemble raw sm_90a words (``nvdisasm -b SM90a``).

    nvdisasm stops at illegal encodings, so these are dropped and the rest re-run. Returns
    ({index: text}, {index: error}) for legal and illegal words.
    """
    tool = require_tool("nvdisasm")
    idx = list(range(len(words)))
    bad: Dict[int, str] = {}
    while idx:
        with tempfile.NamedTemporaryFile(suffix=".bin", delete=False) as f:
            for i in idx:
                f.write(struct.pack("<QQ", *words[i]))
        try:
            r = subprocess.run([tool, "-hex", "-b", "SM90a", f.name], capture_output=True, text=True, timeout=120)
        finally:
            os.unlink(f.name)
        errs = re.findall(r"error\s*:\s*(.*?) at address 0x([0-9a-f]+)", r.stderr)
        if not errs and r.returncode != 0:
            raise AssertionError(f"nvdisasm failed without an address: {r.stderr}")
        if errs:
            drop = {}
            for msg, a in errs:
                drop[int(a, 16) // 16] = msg
            for j, msg in drop.items():
                bad[idx[j]] = msg
            idx = [i for j, i in enumerate(idx) if j not in drop]
            continue
        lines = parse_nvdisasm(r.stdout).get("", [])
        good = {}
        for dl in lines:
            good[idx[dl.address // 16]] = dl.text
        return good, bad
    return {}, bad


def cuobjdump(args: Sequence[str], cubin: bytes) -> str:
    tool = require_tool("cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        r = subprocess.run([tool, *args, f.name], capture_output=True, text=True, env=tool_env(), timeout=120)
    finally:
        os.unlink(f.name)
    # cuobjdump 13.5 warns on stderr for CUDA 12 cubins ("switching to Old format") with rc 0.
    assert r.returncode == 0, f"cuobjdump {args} failed ({r.returncode}): {r.stderr}"
    return r.stdout


def res_usage(cubin: bytes) -> Dict[str, Dict[str, int]]:
    """``cuobjdump -res-usage`` -> {kernel: {"REG": .., "SHARED": .., "STACK": ..}}."""
    out = cuobjdump(["-res-usage"], cubin)
    res: Dict[str, Dict[str, int]] = {}
    cur = None
    for line in out.splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            cur = m.group(1)
            continue
        if cur and "REG:" in line:
            res[cur] = {k: int(v) for k, v in re.findall(r"(\w+(?:\[\d\])?):(\d+)", line)}
            cur = None
    return res


def strip_reuse(text: str) -> str:
    return text.replace(".reuse", "")


# ----------------------------------------------------------------------------------------------- build cache
if REPO not in sys.path:
    try:
        import sass_tools  # noqa: F401
    except ImportError:
        sys.path.insert(0, REPO)

_CACHE: Dict[str, object] = {}


def _gemm_jobs() -> List[Tuple[str, List[str]]]:
    return [(GEMM_SRC, list(NVRTC_OPTS) + [f"-DLB_THREADS={lb}"]) for lb in (128, 384)]


def _builds_from(tag: str, version: Tuple[int, int], cubins: Sequence[bytes]) -> List[Build]:
    return [Build(f"{tag}{version[0]}.{version[1]}-lb{lb}", version, lb, c, "gemm")
            for lb, c in zip((128, 384), cubins)]


def _cupy_builds() -> List[Build]:
    if "cupy" not in _CACHE:
        v = cupy_nvrtc_version()
        cubins = [compile_cupy(GEMM_SRC, [f"-DLB_THREADS={lb}"]) for lb in (128, 384)]
        _CACHE["cupy"] = _builds_from("cupy-nvrtc", v, cubins)
    return _CACHE["cupy"]  # type: ignore[return-value]


def _ctypes_builds(pred, what: str, required: bool, hint: str) -> Optional[List[Build]]:
    key = f"ctypes:{what}"
    if key not in _CACHE:
        libs = sorted((l for l in find_nvrtc_libs() if pred(l.version)), key=lambda l: l.version, reverse=True)
        if not libs:
            _CACHE[key] = None
        else:
            version, cubins = compile_ctypes(libs[0].path, _gemm_jobs())
            _CACHE[key] = _builds_from("nvrtc", version, cubins)
    res = _CACHE[key]
    if res is None and required:
        pytest.fail(f"no {what} found (searched site-packages and $CUPYGEMM_NVRTC_DIRS): {hint}")
    return res  # type: ignore[return-value]


def builds_cuda12() -> List[Build]:
    """CUDA 12.x (ABI 7) cubins, lb 128 and 384; the newest 12.x available (CuPy's own if it is 12.x)."""
    if cupy_nvrtc_version()[0] == 12:
        return _cupy_builds()
    return _ctypes_builds(lambda v: v[0] == 12, "NVRTC 12.x (libnvrtc.so.12)", True,
                          "pip install nvidia-cuda-nvrtc-cu12")  # type: ignore[return-value]


NVRTC13_HINT = "pip install 'cupygemm[test13]' (or nvidia-cuda-nvrtc), which CI installs"


def builds_cuda13(required: bool = True) -> Optional[List[Build]]:
    """CUDA 13.x (ABI 8) cubins, lb 128 and 384. NVRTC 13 comes with the ``test13`` extra, not ``test`` (beside
    cupy-cuda12x it makes CuPy build CUDA 13 cubins, which need a CUDA 13 driver): without it a test that needs
    these builds skips, naming the extra (``required``), and :func:`all_builds` leaves them out."""
    if cupy_nvrtc_version()[0] == 13:
        return _cupy_builds()
    res = _ctypes_builds(lambda v: v[0] == 13, "NVRTC 13.x (libnvrtc.so.13)", False, "")
    if res is None and required:
        pytest.skip(f"no NVRTC 13.x (libnvrtc.so.13) found: {NVRTC13_HINT}")
    return res


def builds_cuda128() -> Optional[List[Build]]:
    """Optional NVRTC 12.8 cubins (no native interleave at any launch bounds), or None."""
    if cupy_nvrtc_version() == (12, 8):
        return _cupy_builds()
    return _ctypes_builds(lambda v: v == (12, 8), "NVRTC 12.8", False, "")


def build_variants() -> Build:
    if "variants" not in _CACHE:
        v = cupy_nvrtc_version()
        _CACHE["variants"] = Build(f"cupy-nvrtc{v[0]}.{v[1]}-variants", v, 128, compile_cupy(VARIANTS_SRC), "variants")
    return _CACHE["variants"]  # type: ignore[return-value]


def cupygemm_builds() -> List[Build]:
    """The library's own GEMM kernels (through its JIT): a two-warpgroup tile and a clustered grouped one."""
    if "cupygemm" not in _CACHE:
        from cupygemm import config as C
        from cupygemm.kernels import compile_gemm

        cfgs = [C.make_config(C.KIND_NORMAL, 7168, 2048, 128, 160, 132),
                C.make_config(C.KIND_MASKED,
                              4096, 7168, 64, 64, 132, multicast=1)]
        v = cupy_nvrtc_version()
        _CACHE["cupygemm"] = [Build(f"cupygemm-nvrtc{v[0]}.{v[1]}-{c.block_m}x{c.block_n}", v, c.threads,
                                    compile_gemm(c), "cupygemm") for c in cfgs]
    return _CACHE["cupygemm"]  # type: ignore[return-value]


def all_builds() -> List[Build]:
    """Every required build (CuPy's, CUDA 12, variants, the library's own GEMM kernels) plus CUDA 13 and 12.8 when
    available; deduplicated."""
    out: List[Build] = []
    seen = set()
    extra = builds_cuda128() or []
    for b in (_cupy_builds() + builds_cuda12() + (builds_cuda13(required=False) or []) + extra + [build_variants()]
              + cupygemm_builds()):
        if id(b) not in seen:
            seen.add(id(b))
            out.append(b)
    return out
