"""Programmatic dependent launch on the GPU (``CUPYGEMM_PDL=1``): a GEMM may start while the one before it is
finishing, so it must wait for it before reading. The test chains two GEMMs where the second reads the first one's
output as its FP8 A (the BF16 bytes reinterpreted), with the first output poisoned before each chain, and checks the
second result bit for bit against the same chain run one kernel at a time, eager and replayed from a CUDA graph.

Everything a test queues (inputs, chains, reference copies, fills, comparisons) goes to one non-blocking stream, so
stream order alone orders it: CuPy's legacy default stream is not ordered with a non-blocking stream, and a reference
copied there while the next fill runs on the chain's stream compared wrong whenever the GPU was busy.
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


def _chain_case(stream, seed=0):
    """The chain's operands, made on ``stream`` (where the chain runs), and ``chain(poison, sync_between)``."""
    rng = np.random.default_rng(seed)
    m, n1, k1, n2 = 256, 4096, 4096, 256
    k2 = 2 * n1
    ones = lambda r, c: cupygemm.get_col_major_tma_aligned_tensor(cp.ones((r, c), cp.float32))  # noqa: E731
    with stream:
        a1 = cp.zeros((m, k1), cp.uint8)
        a1[:, :128] = _ternary((m, 128), rng)  # |out1| <= 128: integers whose BF16 bytes are finite as e4m3
        b1 = _ternary((n1, k1), rng)
        b2 = _ternary((n2, k2), rng, density=0.25)
        sfa1, sfb1 = ones(m, k1 // 128), cp.ones((n1 // 128, k1 // 128), cp.float32)
        sfa2, sfb2 = ones(m, k2 // 128), cp.ones((n2 // 128, k2 // 128), cp.float32)
        out1 = cp.empty((m, n1), cp.uint16)
        out2 = cp.empty((m, n2), cp.uint16)

    def chain(poison=0xFFFF, sync_between=False):
        with stream:
            out1.fill(poison)  # what a GEMM that did not wait would read
            cupygemm.gemm_fp8_fp8_bf16_nt((a1, sfa1), (b1, sfb1), out1, stream=stream)
            if sync_between:
                stream.synchronize()
            cupygemm.gemm_fp8_fp8_bf16_nt((out1.view(cp.uint8), sfa2), (b2, sfb2), out2, stream=stream)
    return chain, out1, out2


def test_pdl_variant_is_planned(pdl_on):
    cupygemm.gemm._calls.clear()  # only this test's calls (other tests in the process planned without PDL)
    stream = cp.cuda.Stream(non_blocking=True)
    chain, _, _ = _chain_case(stream)
    chain()
    # Finish before the stream and the operands go: their memory and the stream's handle (and with it the split-K
    # scratch kept per handle) would otherwise pass to the next test while these kernels still run.
    stream.synchronize()
    plans = [p for _, p in cupygemm.gemm._calls.values() if p is not None]
    assert len(plans) == 2 and all(p.pdl for p in plans)


def test_pdl_chain_waits_for_the_previous_gemm(pdl_on):
    stream = cp.cuda.Stream(non_blocking=True)
    chain, out1, out2 = _chain_case(stream, 1)
    chain(sync_between=True)
    with stream:  # copied after this chain and before the next chain's fills, in the stream's order
        want1, want2 = out1.copy(), out2.copy()
        assert int(cp.count_nonzero(want1 == 0xFFFF)) == 0  # the poison is gone: GEMM1 wrote every element
    for _ in range(TRIALS):
        with stream:
            out2.fill(0)
        chain()
        with stream:
            assert cp.array_equal(out1, want1) and cp.array_equal(out2, want2)


def test_pdl_chain_in_a_cuda_graph(pdl_on):
    stream = cp.cuda.Stream(non_blocking=True)
    chain, out1, out2 = _chain_case(stream, 2)
    chain(sync_between=True)  # plans and kernels before the capture; the reference result
    with stream:
        want2 = out2.copy()
        stream.begin_capture()
        chain()
        graph = stream.end_capture()
    for _ in range(TRIALS):
        with stream:
            out2.fill(0)
            graph.launch(stream)
            assert cp.array_equal(out2, want2)
