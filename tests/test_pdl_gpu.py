"""Programmatic dependent launch on the GPU (``CUPYGEMM_PDL=1``): a GEMM may start while the kernel before it is
finishing, so it must wait for it before reading. Checked here:

* two GEMMs where the second reads the first one's output as its FP8 A (the BF16 bytes reinterpreted), with the first
  output poisoned before each chain, bit for bit against the same chain run one kernel at a time, eager and replayed
  from a CUDA graph;
* a GEMM whose weights (B and SFB) the kernel just before it rewrites in place, that kernel letting a PDL launch
  behind it start at once and writing only after a pause: the GEMM must compute with the new weights (dense and
  masked, PDL on and off);
* packed weights packed again after B and SFB changed: the new results;
* a short decode chain with PDL off and on, on plain and packed weights, eager and from a CUDA graph: the same bits.

Everything a test queues (inputs, chains, reference copies, fills, comparisons) goes to one non-blocking stream, so
stream order alone orders it: CuPy's legacy default stream is not ordered with a non-blocking stream, and a reference
copied there while the next fill runs on the chain's stream compared wrong whenever the GPU was busy.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

import cupygemm  # noqa: E402
from cupygemm import config as C  # noqa: E402

from gpu_helpers import grouped_weights, plain_like_packed, randn_bf16  # noqa: E402

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


# ---- weights the kernel just before rewrites; packed weights packed again; a decode chain's bits --------------------

GROUPS = 4  # masked cases: groups of max_m = M rows, masked_m drawn in 1..M, expected_m M / 2

# Rewrites B and SFB in place, after a pause. It first lets a PDL launch queued behind it start (a no-op for any other
# launch): such a GEMM then sets up while the old bytes are still there, and only its griddepcontrol.wait keeps its
# loads of B and SFB behind these writes.
_LATE_COPY_SRC = r"""
extern "C" __global__ void cupygemm_test_late_copy(const uint4* b_src, uint4* b, long long b_vecs,
                                                   const float* s_src, float* s, long long scales, long long cycles) {
    asm volatile("griddepcontrol.launch_dependents;");
    long long start = clock64();
    while (clock64() - start < cycles) { }
    long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x, stride = (long long)gridDim.x * blockDim.x;
    for (long long i = first; i < b_vecs; i += stride) b[i] = b_src[i];
    for (long long i = first; i < scales; i += stride) s[i] = s_src[i];
}
"""
LATE_COPY_CYCLES = 2_000_000  # about 1 ms: time enough for a GEMM started early to reach its loads
_late_copy_kernel = None


def _late_copy(src, dst):
    """Queue on the current stream: after the pause, the weights ``src`` (B, SFB) copied into ``dst`` in place. 16
    CTAs, so that most SMs are free for a GEMM started beside it."""
    global _late_copy_kernel
    if _late_copy_kernel is None:
        _late_copy_kernel = cp.RawKernel(_LATE_COPY_SRC, "cupygemm_test_late_copy")
    (b_src, s_src), (b, s) = src, dst
    assert b.flags.c_contiguous and b.size % 16 == 0 and s.flags.c_contiguous and b_src.shape == b.shape
    _late_copy_kernel((16,), (256,), (b_src, b, np.int64(b.size // 16), s_src, s, np.int64(s.size),
                                      np.int64(LATE_COPY_CYCLES)))


def _gemm_case(kind, m, n, k, stream, seed):
    """One GEMM's A, made on the current stream, and two weight sets: (gemm(rhs, out) on ``stream``, [(B, SFB),
    (B, SFB)], the output's shape). ``kind``: "normal" (M x N x K) or "masked" (GROUPS groups of max_m = M)."""
    rng = cp.random.default_rng(seed)
    if kind == "normal":
        a, sfa = cupygemm.per_token_cast_to_fp8(randn_bf16((m, k), rng))
        weights = [cupygemm.per_block_cast_to_fp8(randn_bf16((n, k), rng)) for _ in range(2)]
        fn, extra, out_shape = cupygemm.gemm_fp8_fp8_bf16_nt, (), (m, n)
    else:
        a, sfa = cupygemm.per_token_cast_to_fp8(randn_bf16((GROUPS * m, k), rng))
        a, sfa = a.reshape(GROUPS, m, k), sfa.reshape(GROUPS, m, -1)
        weights = [grouped_weights(GROUPS, n, k, rng) for _ in range(2)]
        masked_m = cp.asarray(np.random.default_rng(seed).integers(1, m + 1, size=GROUPS).astype(np.int32))
        fn, extra, out_shape = cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked, (masked_m, m // 2), (GROUPS, m, n)
    # A's scales M-major, as the kernels read them: no scale-copy kernel between the weights' writer and the GEMM
    lhs = (a, cupygemm.get_col_major_tma_aligned_tensor(sfa))

    def gemm(rhs, out):
        fn(lhs, rhs, out, *extra, stream=stream)

    return gemm, weights, out_shape


def _plain_like_packed(kind, m, n, k):
    """:func:`gpu_helpers.plain_like_packed` for a :func:`_gemm_case`."""
    if kind == "normal":
        return plain_like_packed(C.KIND_NORMAL, m, n, k)
    return plain_like_packed(C.KIND_MASKED, m, n, k, GROUPS, expected_m=m // 2)


# One DeepSeek-V3 decode (N, K) per kind (q and kv down-projection; experts' gate/up) and a small one.
REWRITE_CASES = [("normal", 2112, 7168), ("normal", 256, 512), ("masked", 4096, 7168), ("masked", 256, 512)]


@pytest.mark.parametrize("pdl", ["1", "0"])
@pytest.mark.parametrize("m", [64, 128])
@pytest.mark.parametrize("kind,n,k", REWRITE_CASES)
def test_gemm_reads_the_weights_the_kernel_before_it_wrote(kind, n, k, m, pdl, monkeypatch):
    """GEMM, a kernel rewriting B and SFB in place, the GEMM again, queued on one stream with no synchronization:
    the first result is the old weights', the second the new weights' (bit for bit a GEMM on copies of each)."""
    monkeypatch.setenv("CUPYGEMM_PDL", pdl)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        gemm, weights, out_shape = _gemm_case(kind, m, n, k, stream, seed=m + n + k)
        wants = []
        for b, sfb in weights:  # each set's result, on copies that nothing rewrites
            wants.append(cp.zeros(out_shape, cp.uint16))
            gemm((b.copy(), sfb.copy()), wants[-1])
        assert not cp.array_equal(wants[0], wants[1])
        b, sfb = weights[0][0].copy(), weights[0][1].copy()  # the weights rewritten in place, set 0 first
        before, after = cp.zeros(out_shape, cp.uint16), cp.zeros(out_shape, cp.uint16)
        for t in range(TRIALS):
            old, new = t % 2, (t + 1) % 2
            before.fill(0)  # masked rows past masked_m stay zero, as in the references
            after.fill(0)
            gemm((b, sfb), before)
            _late_copy(weights[new], (b, sfb))
            gemm((b, sfb), after)
            assert cp.array_equal(before, wants[old]), t
            assert cp.array_equal(after, wants[new]), t


@pytest.mark.parametrize("pdl", ["1", "0"])
@pytest.mark.parametrize("kind,m,n,k", [("normal", 64, 2112, 7168), ("normal", 128, 256, 512),
                                        ("masked", 64, 4096, 7168), ("masked", 128, 256, 512)])
def test_packing_changed_weights_again_gives_the_new_results(kind, m, n, k, pdl, monkeypatch):
    """B and SFB rewritten in place, then packed again: the GEMM on the new pack gives the plain GEMM's bits for the
    new weights (the plain kernel on the packed plan's tile), pack after pack. Each pack is dropped before the next
    is made, so the pool may put the next one where it was: nothing kept per address may carry over."""
    monkeypatch.setenv("CUPYGEMM_PDL", pdl)
    monkeypatch.setenv("CUPYGEMM_L2_SIDES", "1")  # pack wherever two L2 sides are measured (auto: H100s only)
    with _plain_like_packed(kind, m, n, k):
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            gemm, weights, out_shape = _gemm_case(kind, m, n, k, stream, seed=m + n + k + 1)
            wants = []
            for w in weights:
                wants.append(cp.zeros(out_shape, cp.uint16))
                gemm(w, wants[-1])
            b, sfb = weights[0][0].copy(), weights[0][1].copy()
            out = cp.zeros(out_shape, cp.uint16)
            for t in range(4):
                cur = t % 2
                b[...], sfb[...] = weights[cur]
                packed = cupygemm.pack_weights(b, sfb, stream=stream)
                assert packed.side_aware
                out.fill(0)
                gemm(packed, out)
                assert cp.array_equal(out, wants[cur]), t
                del packed


# Short decode chains: DeepSeek-V3 shapes and a small one.
CHAINS = {"normal": [(2112, 7168), (256, 512), (7168, 2048)], "masked": [(4096, 7168), (256, 512)]}


@pytest.mark.parametrize("m", [64, 128])
@pytest.mark.parametrize("kind", ["normal", "masked"])
def test_decode_chain_bits_with_pdl_packed_weights_and_graphs(kind, m, monkeypatch):
    """A decode chain with PDL off and on, on plain and packed weights, eager and replayed from a CUDA graph: every
    mode's outputs are the plain, PDL-off, eager chain's, bit for bit (the plain kernels on the packed plans' tiles,
    so that both sum in the same order)."""
    monkeypatch.setenv("CUPYGEMM_L2_SIDES", "1")
    with contextlib.ExitStack() as overrides:
        for n, k in CHAINS[kind]:
            overrides.enter_context(_plain_like_packed(kind, m, n, k))
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            cases = [_gemm_case(kind, m, n, k, stream, seed=m + n + k + 2) for n, k in CHAINS[kind]]
            rhs = {"plain": [w[0] for _, w, _ in cases]}
            rhs["packed"] = [cupygemm.pack_weights(b, sfb, stream=stream) for b, sfb in rhs["plain"]]
            assert all(p.side_aware for p in rhs["packed"])
            got = {}
            for pdl in ("0", "1"):
                monkeypatch.setenv("CUPYGEMM_PDL", pdl)
                for weights in ("plain", "packed"):
                    outs = [cp.zeros(shape, cp.uint16) for _, _, shape in cases]
                    calls = list(zip([gemm for gemm, _, _ in cases], rhs[weights], outs))
                    for gemm, r, o in calls:  # eager; also plans, kernels and scratch before the capture
                        gemm(r, o)
                    got[pdl, weights, "eager"] = [o.copy() for o in outs]
                    for o in outs:
                        o.fill(0)
                    stream.begin_capture()
                    for gemm, r, o in calls:
                        gemm(r, o)
                    graph = stream.end_capture()
                    graph.launch(stream)
                    got[pdl, weights, "graph"] = [o.copy() for o in outs]
            want = got["0", "plain", "eager"]
            for mode, outs in got.items():
                assert all(cp.array_equal(o, w) for o, w in zip(outs, want)), mode


@pytest.mark.parametrize("threads", [1, 2])
def test_packed_launches_back_to_back_on_one_stream(threads, monkeypatch):
    """Side-aware PDL launches queued back to back on one stream draw their tickets before their waits, from the
    stream's two sets in turn (cupygemm/workspace.py): dozens in a row, of two plans with different grids, from one
    thread or from two at once; every output is the lone call's, bit for bit."""
    import threading

    monkeypatch.setenv("CUPYGEMM_PDL", "1")
    monkeypatch.setenv("CUPYGEMM_L2_SIDES", "1")
    repeats = 16
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        cases = []
        for m, n, k in [(64, 2112, 7168), (64, 7168, 2048)]:
            gemm, weights, shape = _gemm_case("normal", m, n, k, stream, seed=m + n + k + 3)
            packed = cupygemm.pack_weights(*weights[0], stream=stream)
            assert packed.side_aware
            want = cp.zeros(shape, cp.uint16)
            gemm(packed, want)
            stream.synchronize()  # the lone call: nothing before it on the stream is still running
            outs = [[cp.full(shape, 0xFFFF, cp.uint16) for _ in range(repeats)] for _ in range(threads)]
            cases.append((gemm, packed, want, outs))
        stream.synchronize()

    def queue(t):
        for r in range(repeats):
            for gemm, packed, _, outs in cases:
                gemm(packed, outs[t][r])

    workers = [threading.Thread(target=queue, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stream.synchronize()
    for i, (_, _, want, outs) in enumerate(cases):
        for t in range(threads):
            for r in range(repeats):
                assert cp.array_equal(outs[t][r], want), (i, t, r)
