"""The API from 8 Python threads at once, mixing shapes and kinds: same results as one thread; and from threads on
CuPy's per-thread default stream."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

import cupygemm  # noqa: E402
from gpu_helpers import make_normal, randn_bf16  # noqa: E402


def _jobs():
    jobs = []
    for i, (m, n, k) in enumerate([(64, 512, 1024), (300, 768, 576), (128, 2048, 2048), (1000, 1024, 1024)]):
        a, sfa, b, sfb, _, _ = make_normal(m, n, k, 100 + i)
        jobs.append(("normal", (a, sfa), (b, sfb), None))
    rng = cp.random.default_rng(7)
    g, n, k = 3, 512, 1024
    b = cp.empty((g, n, k), cp.uint8)
    sfb = cp.empty((g, n // 128, k // 128), cp.float32)
    for j in range(g):
        b[j], sfb[j] = cupygemm.per_block_cast_to_fp8(randn_bf16((n, k), rng))
    a, sfa = cupygemm.per_token_cast_to_fp8(randn_bf16((384, k), rng))
    idx = cp.asarray(np.repeat(np.arange(3, dtype=np.int32), 128))
    jobs.append(("contiguous", (a, sfa), (b, sfb), idx))
    a3 = cp.stack([a[:128]] * 3)
    s3 = cp.stack([sfa[:128]] * 3)
    jobs.append(("masked", (a3, s3), (b, sfb), cp.asarray(np.array([128, 5, 77], np.int32))))
    return jobs


def _run(job):
    kind, lhs, rhs, extra = job
    with cp.cuda.Stream(non_blocking=True) as s:
        if kind == "normal":
            out = cupygemm.gemm_fp8_fp8_bf16_nt(lhs, rhs)
        elif kind == "contiguous":
            out = cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(lhs, rhs, None, extra)
        else:
            out = cp.zeros((3, 128, rhs[0].shape[1]), dtype=cupygemm.tensors.BF16)
            cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked(lhs, rhs, out, extra, 64)
        s.synchronize()
    return out.view(cp.uint16).get()


def test_eight_threads_mixed_kinds():
    jobs = _jobs()
    # The inputs are made on the default stream; every _run reads them on a new non-blocking stream.
    cp.cuda.Device().synchronize()
    want = [_run(j) for j in jobs]
    work = [i % len(jobs) for i in range(64)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: _run(jobs[i]), work))
    for i, g in zip(work, got):
        assert np.array_equal(g, want[i]), f"job {i} differs when run from threads"


_PER_THREAD_DEFAULT_STREAM = """
import sys
from concurrent.futures import ThreadPoolExecutor
import cupy as cp
import numpy as np
sys.path.insert(0, sys.argv[1])
import cupygemm
from gpu_helpers import make_normal

assert cp.cuda.get_current_stream().ptr == 2, "not on cudaStreamPerThread"
# Row-major SFA (as the cast returns it): every call copies it into the stream's SFA buffer first; K = 7168 at M = 64
# splits K, so the scratch is used too.
jobs = [make_normal(64, 512, 7168, seed)[:4] for seed in range(8)]
cp.cuda.Device().synchronize()
want = [cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb)).view(cp.uint16).get() for a, sfa, b, sfb in jobs]

def run(i):
    a, sfa, b, sfb = jobs[i]
    bad = 0
    for _ in range(25):
        out = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
        bad += not np.array_equal(out.view(cp.uint16).get(), want[i])  # get() waits for this thread's stream
    return bad

with ThreadPoolExecutor(8) as pool:
    bad = sum(pool.map(run, range(8)))
print("mismatching results:", bad)
sys.exit(1 if bad else 0)
"""


def test_threads_on_the_per_thread_default_stream():
    """CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1: every thread's default stream is the one handle 2, yet another stream;
    a scratch or SFA buffer shared between them would let one thread's kernels overwrite another's (a fresh process:
    the mode is chosen at CuPy's import)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, CUPY_CUDA_PER_THREAD_DEFAULT_STREAM="1")
    r = subprocess.run([sys.executable, "-c", _PER_THREAD_DEFAULT_STREAM, str(Path(__file__).parent)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_thread_whose_first_cuda_work_is_our_launch():
    """A new thread has no CUDA context bound, and its current device still reads as 0, so no device switch binds
    one: the launch itself must (torch's autograd threads are such threads: a backward whose first CUDA work was our
    fused cast failed with CUDA_ERROR_INVALID_CONTEXT on a two-GPU host). Each call runs in a thread of its own with
    nothing before it that binds the context (the GEMMs write given outputs on a given stream, with scales in the
    kernels' layout, so no copy or allocation comes first), and gives the bits it gives on the test's thread."""
    import threading

    a, sfa, b, sfb, x, _ = make_normal(256, 512, 1024, 9)
    sfa_mm = cupygemm.get_col_major_tma_aligned_tensor(sfa)
    stream = cp.cuda.Stream(non_blocking=True)
    out = cp.empty((256, 512), cupygemm.tensors.BF16)
    acc = cp.empty((256, 256), cp.float32)

    def gemm(out):
        cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa_mm), (b, sfb), out, stream=stream.ptr)
        stream.synchronize()
        return out.view(cp.uint16).get()

    def wgrad(acc):  # acc = A @ A.T, K = 1024 along the 1x128 scales (the storing form: no zeros first)
        cupygemm.wgrad_gemm_fp8_fp8_fp32_nt_store((a, sfa_mm), (a, sfa_mm), acc, stream=stream.ptr)
        stream.synchronize()
        return acc.get()

    def cast(fn):
        res = fn(x)
        cp.cuda.Device().synchronize()
        return [r.get() for r in res]

    calls = {"gemm": lambda: gemm(out), "wgrad": lambda: wgrad(acc),
             "cast": lambda: cast(cupygemm.per_token_cast_to_fp8),
             "fused cast": lambda: cast(cupygemm.per_token_cast_to_fp8_transposed)}
    want = {name: call() for name, call in calls.items()}  # on this thread: built, loaded, pools warm
    # Outputs the plans have not seen: the call first encodes their TMA maps, a driver call before the launch's
    # (it failed with CUDA_ERROR_INVALID_CONTEXT).
    out2, acc2 = cp.empty_like(out), cp.empty_like(acc)
    calls.update({"gemm, new out": lambda: gemm(out2), "wgrad, new out": lambda: wgrad(acc2)})
    want.update({"gemm, new out": want["gemm"], "wgrad, new out": want["wgrad"]})

    def run(name, results):
        try:
            results["bound before"] = cp.cuda.driver.ctxGetCurrent()
            results["value"] = calls[name]()
        except Exception as e:  # reported on the test's thread
            results["error"] = e

    for name in calls:
        results = {}
        t = threading.Thread(target=run, args=(name, results))
        t.start()
        t.join()
        assert results["bound before"] == 0, "a new thread should start with no context bound"
        assert "error" not in results, f"{name}: {results.get('error')!r}"
        got = results["value"]
        assert all(np.array_equal(g, w) for g, w in zip(got, want[name])) if isinstance(got, list) else \
            np.array_equal(got, want[name]), name
