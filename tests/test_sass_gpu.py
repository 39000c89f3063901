"""GPU smoke test (Hopper only; skipped elsewhere by the ``gpu`` marker): a cubin patched by the interleave pass
loads and computes bit-identical results to the unpatched one (yield/reuse bits change scheduling, not math)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_helpers as H  # noqa: E402

from sass_tools.interleave import find_ffma_runs, interleave_ffma  # noqa: E402
from sass_tools.elf import Cubin  # noqa: E402

PROMOTE_SRC = r'''
extern "C" __global__ void __launch_bounds__(128, 1)
promote_only(const float* __restrict__ acc_in, const float* __restrict__ scales, float* __restrict__ out, int k_iters) {
  float acc[64], final_acc[64];
  const float* src = acc_in + (blockIdx.x * blockDim.x + threadIdx.x) * 64;
  #pragma unroll
  for (int i = 0; i < 64; ++i) { acc[i] = src[i]; final_acc[i] = 0.f; }
  for (int k = 0; k < k_iters; ++k) {
    const float scale = scales[k];
    #pragma unroll
    for (int i = 0; i < 64; ++i) final_acc[i] += scale * acc[i];
    #pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = acc[i] * 0.5f + 1.0f;
  }
  float* dst = out + (blockIdx.x * blockDim.x + threadIdx.x) * 64;
  #pragma unroll
  for (int i = 0; i < 64; ++i) dst[i] = final_acc[i];
}
'''


def _cubins():
    orig = H.compile_cupy(PROMOTE_SRC)
    res = interleave_ffma(orig, fraction=1.0)
    return orig, res


def test_promote_kernel_has_runs_cpu():
    """CPU part: the smoke-test kernel has a long FFMA run and the pass changes it."""
    orig, res = _cubins()
    cb = Cubin.from_bytes(orig)
    assert find_ffma_runs(cb.instructions("promote_only"))
    assert res.changed > 0


@pytest.mark.gpu
def test_patched_cubin_runs_identically(tmp_path):
    import cupy as cp

    orig, res = _cubins()
    rng = np.random.default_rng(0)
    blocks, threads, k_iters = 4, 128, 37
    acc = cp.asarray(rng.standard_normal(blocks * threads * 64, dtype=np.float32))
    scales = cp.asarray(rng.standard_normal(k_iters, dtype=np.float32))
    outs = []
    for name, data in (("orig", orig), ("patched", res.cubin)):
        p = tmp_path / f"{name}.cubin"
        p.write_bytes(data)
        fn = cp.RawModule(path=str(p)).get_function("promote_only")
        out = cp.zeros(blocks * threads * 64, dtype=cp.float32)
        fn((blocks,), (threads,), (acc, scales, out, np.int32(k_iters)))
        cp.cuda.Device().synchronize()
        outs.append(cp.asnumpy(out))
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    assert np.isfinite(outs[0]).all() and np.abs(outs[0]).sum() > 0
