"""The API from 8 Python threads at once, mixing shapes and kinds: same results as one thread."""
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
