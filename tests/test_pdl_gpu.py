"""Programmatic dependent launch on the GPU (``CUPYGEMM_PDL=1``): a GEMM may start while the one before it is
finishing, so it must wait for it before reading. The test chains two GEMMs where the second reads the first one's
output as its FP8 A (the BF16 bytes reinterpreted), with the first output poisoned before each chain, and checks the
second result bit for bit against the same chain run one kernel at a time, eager and replayed from a CUDA graph.
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

import cupygemm  # noqa: E402

TRIALS = 10
E4M3 = {-1: 0xB8, 0: 0x00, 1: 0x38}  # e4m3fn bytes of -1, 0, 1


def _ternary(shape, rng, density=1.0):
    """FP8 bytes of a random matrix of -1/0/1 (products and sums stay exact small integers)."""
    v = rng.integers(-1, 2, size=shape)
    if density < 1:
        v[rng.random(shape) >= density] = 0
    return cp.asarray(np.select([v == -1, v == 1], [E4M3[-1], E4M3[1]], 0).astype(np.uint8))


@pytest.fixture
def pdl_on(monkeypatch):
    monkeypatch.setenv("CUPYGEMM_PDL", "1")


def _chain_case(seed=0):
    rng = np.random.default_rng(seed)
    m, n1, k1, n2 = 256, 4096, 4096, 256
    a1 = cp.zeros((m, k1), cp.uint8)
    a1[:, :128] = _ternary((m, 128), rng)  # |out1| <= 128: integers whose BF16 bytes are finite as e4m3
    b1 = _ternary((n1, k1), rng)
    k2 = 2 * n1
    b2 = _ternary((n2, k2), rng, density=0.25)
    ones = lambda r, c: cupygemm.get_col_major_tma_aligned_tensor(cp.ones((r, c), cp.float32))  # noqa: E731
    sfa1, sfb1 = ones(m, k1 // 128), cp.ones((n1 // 128, k1 // 128), cp.float32)
    sfa2, sfb2 = ones(m, k2 // 128), cp.ones((n2 // 128, k2 // 128), cp.float32)
    out1 = cp.empty((m, n1), cp.uint16)
    out2 = cp.empty((m, n2), cp.uint16)

    def chain(stream, poison=0xFFFF, sync_between=False):
        with stream:
            out1.fill(poison)  # what a GEMM that did not wait would read
            cupygemm.gemm_fp8_fp8_bf16_nt((a1, sfa1), (b1, sfb1), out1, stream=stream)
            if sync_between:
                stream.synchronize()
            cupygemm.gemm_fp8_fp8_bf16_nt((out1.view(cp.uint8), sfa2), (b2, sfb2), out2, stream=stream)
    return chain, out1, out2


def test_pdl_variant_is_planned(pdl_on):
    cupygemm.gemm._calls.clear()  # only this test's calls (other tests in the process planned without PDL)
    chain, _, _ = _chain_case()
    chain(cp.cuda.Stream(non_blocking=True))
    plans = [p for _, p in cupygemm.gemm._calls.values() if p is not None]
    assert len(plans) == 2 and all(p.pdl for p in plans)


def test_pdl_chain_waits_for_the_previous_gemm(pdl_on):
    chain, out1, out2 = _chain_case(1)
    stream = cp.cuda.Stream(non_blocking=True)
    chain(stream, sync_between=True)
    stream.synchronize()
    want1, want2 = out1.copy(), out2.copy()
    assert int(cp.count_nonzero(want1 == 0xFFFF)) == 0  # the poison is gone: GEMM1 wrote every element
    for _ in range(TRIALS):
        with stream:
            out2.fill(0)
        chain(stream)
        stream.synchronize()
        assert cp.array_equal(out1, want1) and cp.array_equal(out2, want2)


def test_pdl_chain_in_a_cuda_graph(pdl_on):
    chain, out1, out2 = _chain_case(2)
    stream = cp.cuda.Stream(non_blocking=True)
    chain(stream, sync_between=True)  # plans and kernels before the capture; the reference result
    stream.synchronize()
    want2 = out2.copy()
    with stream:
        stream.begin_capture()
        chain(stream)
        graph = stream.end_capture()
    for _ in range(TRIALS):
        with stream:
            out2.fill(0)
        graph.launch(stream)
        stream.synchronize()
        assert cp.array_equal(out2, want2)
