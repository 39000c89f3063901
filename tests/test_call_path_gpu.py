"""The call path on the GPU: the caller's stream orders every call (torch, CuPy, explicit stream=), CUDA graphs
(torch.cuda.graph and CuPy stream capture) capture and replay all three GEMM kinds and the casts, the torch
operators pass opcheck and trace under torch.compile(fullgraph=True), and a call signature's plan is never reused
for other strides or misaligned pointers."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

import cupygemm  # noqa: E402
from cupygemm import gemm as gemm_mod  # noqa: E402
from gpu_helpers import grouped_weights, make_normal, randn_bf16  # noqa: E402

BF16 = cupygemm.tensors.BF16
TRIALS = 20


def _torch():
    return pytest.importorskip("torch")


def t8(torch, x):
    return torch.from_dlpack(x).view(torch.float8_e4m3fn)


def tt(torch, x):
    return torch.from_dlpack(x)


def problems(kind: str, seed: int):
    """(call(a, out=None) -> result, A, want): one problem of ``kind`` on CuPy operands; ``call`` takes A (the
    operand the race test rewrites late) and runs the GEMM with the remaining operands fixed."""
    rng = cp.random.default_rng(seed)
    if kind == "normal":
        a, sfa, b, sfb, _, _ = make_normal(256, 2048, 4096, seed)
        return (lambda A, S, B, SB, L, out: cupygemm.gemm_fp8_fp8_bf16_nt((A, S), (B, SB), out)), \
            (a, sfa, b, sfb, None), (256, 2048)
    g, n, k = 4, 1024, 2048
    b, sfb = grouped_weights(g, n, k, rng)
    if kind == "contiguous":
        a, sfa = cupygemm.per_token_cast_to_fp8(randn_bf16((512, k), rng))
        idx = cp.asarray(np.repeat(np.arange(4, dtype=np.int32), 128))
        return (lambda A, S, B, SB, L, out: cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(
            (A, S), (B, SB), out, L)), (a, sfa, b, sfb, idx), (512, n)
    a = cp.empty((g, 256, k), cp.uint8)
    sfa = cp.empty((g, 256, k // 128), cp.float32)
    for i in range(g):
        a[i], sfa[i] = cupygemm.per_token_cast_to_fp8(randn_bf16((256, k), rng))
    mm = cp.asarray(np.array([256, 100, 0, 200], np.int32))
    return (lambda A, S, B, SB, L, out: cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((A, S), (B, SB), out, L, 128)), \
        (a, sfa, b, sfb, mm), (g, 256, n)


KINDS = ["normal", "contiguous", "masked"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_out", [False, True])
def test_torch_side_stream_orders_the_call(kind, with_out):
    """Inputs finished late on a torch side stream (a long sleep first), then the call and a read on that stream:
    the read must see the finished result, every trial. Launching anywhere but torch's current stream races."""
    torch = _torch()
    call, ops, out_shape = problems(kind, 7)
    a, sfa, b, sfb, lay = ops
    want = cp.zeros(out_shape, BF16)
    call(a, sfa, b, sfb, lay, want)
    cp.cuda.Device().synchronize()
    A_final = tt(torch, a.copy())
    S, B, SB = tt(torch, sfa), t8(torch, b), tt(torch, sfb)
    L = None if lay is None else tt(torch, lay)
    side = torch.cuda.Stream()
    bad = 0
    for _ in range(TRIALS):
        A = torch.zeros_like(A_final)
        out = torch.zeros(out_shape, dtype=torch.bfloat16, device="cuda") if with_out else None
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # the producer is still busy when the call is made
            A.copy_(A_final)
            res = call(A.view(torch.float8_e4m3fn), S, B, SB, L, out)
            seen = res.clone()  # the consumer, on the caller's stream
        torch.cuda.synchronize()
        if with_out:
            assert res is out
        got = cp.from_dlpack(seen.view(torch.int16))
        if kind == "masked":  # rows past masked_m are untouched: compare the computed ones
            ok = all(bool((got[g, :r] == want.view(cp.int16)[g, :r]).all()) for g, r in enumerate([256, 100, 0, 200]))
        else:
            ok = bool((got == want.view(cp.int16)).all())
        bad += not ok
    assert bad == 0, f"{bad} of {TRIALS} reads on the caller's stream saw an unfinished result"


def test_torch_casts_follow_the_stream_and_return_fp8():
    torch = _torch()
    x = torch.randn(300, 512, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        y = x * 2
        q, s = cupygemm.per_token_cast_to_fp8(y)
        qb, sb = cupygemm.per_block_cast_to_fp8(y)
        qc, sc = q.clone(), s.clone()
    torch.cuda.synchronize()
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and qb.dtype == torch.float8_e4m3fn
    assert sb.shape == (3, 4) and sb.dtype == torch.float32
    rq, rs = cupygemm.per_token_cast_to_fp8(cp.from_dlpack((x * 2).detach()))
    assert torch.equal(qc.view(torch.uint8).cpu(), torch.from_dlpack(rq).cpu())
    assert torch.equal(sc.cpu(), torch.from_dlpack(rs).cpu())


def test_explicit_stream_argument_forms():
    """stream= as an int handle, a CuPy stream and a torch stream all launch there (the call is ordered after a
    long kernel on that stream and before the read queued after it)."""
    call, ops, out_shape = problems("normal", 3)
    a, sfa, b, sfb, _ = ops
    want = call(a, sfa, b, sfb, None, None)
    s = cp.cuda.Stream(non_blocking=True)
    for form in (s, s.ptr):
        a2 = cp.zeros_like(a)
        cp.cuda.Device().synchronize()  # the zeros are written before s copies A in
        with s:
            cp.cuda.runtime.memcpyAsync(a2.data.ptr, a.data.ptr, a.nbytes, 3, s.ptr)
        # The current stream is the default one: only stream= puts the GEMM behind the copy.
        out = cupygemm.gemm_fp8_fp8_bf16_nt((a2, sfa), (b, sfb), stream=form)
        s.synchronize()
        assert (out.view(cp.uint16) == want.view(cp.uint16)).all()
    torch = pytest.importorskip("torch")
    ts = torch.cuda.Stream()
    with torch.cuda.stream(ts):
        torch.cuda._sleep(20_000_000)
    out = cupygemm.gemm_fp8_fp8_bf16_nt((t8(torch, a), tt(torch, sfa)), (t8(torch, b), tt(torch, sfb)), stream=ts)
    seen = torch.empty_like(out)
    with torch.cuda.stream(ts):
        seen.copy_(out)
    torch.cuda.synchronize()
    assert torch.equal(seen.view(torch.int16).cpu(), torch.from_dlpack(want.view(cp.int16)).cpu())
    with pytest.raises(TypeError, match="stream"):
        cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), stream="default")


def test_mixed_frameworks_are_refused():
    torch = _torch()
    a, sfa, b, sfb, _, _ = make_normal(128, 256, 512, 1)
    with pytest.raises(TypeError, match=r"rhs\[0\] \(B\).*one framework"):
        cupygemm.gemm_fp8_fp8_bf16_nt((t8(torch, a), tt(torch, sfa)), (b, tt(torch, sfb)))


@pytest.mark.parametrize("kind", KINDS)
def test_torch_cuda_graph_capture_and_replay(kind):
    """torch.cuda.graph captures the call (first call of a shape inside the capture: kernels are built before
    launching, scratch comes from the graph's pool); replays compute the GEMM of the inputs' new contents."""
    torch = _torch()
    call, ops, out_shape = problems(kind, 11)
    a, sfa, b, sfb, lay = ops
    A = tt(torch, a.copy())
    S, B, SB = tt(torch, cupygemm.get_col_major_tma_aligned_tensor(sfa)), t8(torch, b), tt(torch, sfb)
    L = None if lay is None else tt(torch, lay.copy())
    out = torch.zeros(out_shape, dtype=torch.bfloat16, device="cuda")
    call(A.view(torch.float8_e4m3fn), S, B, SB, L, out)  # warm-up outside the capture, as torch recommends
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call(A.view(torch.float8_e4m3fn), S, B, SB, L, out)
        res = call(A.view(torch.float8_e4m3fn), S, B, SB, L, None)  # functional form: the graph's pool owns it
    rng = np.random.default_rng(0)
    for step in range(3):
        new_a, new_s = (problems(kind, 100 + step)[1][:2])
        A.copy_(tt(torch, new_a))
        S.copy_(tt(torch, cupygemm.get_col_major_tma_aligned_tensor(new_s)))
        if kind == "masked":
            counts = rng.integers(0, 257, 4).astype(np.int32)
            L.copy_(tt(torch, cp.asarray(counts)))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        want = cp.zeros(out_shape, BF16)
        call(new_a, new_s, b, sfb, None if lay is None else cp.from_dlpack(L), want)
        cp.cuda.Device().synchronize()
        got, got_f = cp.from_dlpack(out.view(torch.int16)), cp.from_dlpack(res.view(torch.int16))
        rows = counts.tolist() if kind == "masked" else None
        for arr in (got, got_f):
            if rows is None:
                assert (arr == want.view(cp.int16)).all(), f"replay {step}"
            else:
                for gi, r in enumerate(rows):
                    assert (arr[gi, :r] == want.view(cp.int16)[gi, :r]).all(), f"replay {step} group {gi}"


def _forget_loaded_kernels() -> None:
    """Drop cupygemm's in-process memos of loaded modules and plans (the disk cache stays): the next call of any
    shape loads its module again, as a process's first call does."""
    from cupygemm import gemm, kernels, plan
    from cupygemm.jit import loader

    gemm._calls.clear()
    plan.clear()
    kernels._by_config.clear()
    loader.clear()  # the casts', the SFA copy's (every small kernel's) and the per-source memo


def test_torch_graph_capture_of_first_call_and_casts():
    """A shape never called before, captured directly (kernel build happens before the launch), with the casts
    and a split-K (scratch-using) shape: 64x1536x7168 meets its four splits' partial sums in global memory."""
    torch = _torch()
    x = torch.randn(64, 7168, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1536, 7168, device="cuda", dtype=torch.bfloat16)
    b, sfb = cupygemm.per_block_cast_to_fp8(w)
    torch.cuda.synchronize()
    _forget_loaded_kernels()  # so the capture below loads modules, whatever ran before in this process
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        a, sfa = cupygemm.per_token_cast_to_fp8(x)
        d = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    for _ in range(2):
        x.normal_()
        g.replay()
        torch.cuda.synchronize()
        a2, sfa2 = cupygemm.per_token_cast_to_fp8(x)
        want = cupygemm.gemm_fp8_fp8_bf16_nt((a2, sfa2), (b, sfb))
        assert torch.equal(d.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sfa_layout", ["m-major", "row-major"])
def test_cupy_stream_capture_and_replay(kind, sfa_layout):
    """Captured after one call on the stream; row-major SFA is copied into the stream's SFA buffer, which the
    warm-up made (so nothing is allocated during the capture)."""
    call, ops, out_shape = problems(kind, 21)
    a, sfa, b, sfb, lay = ops
    A = a.copy()
    layout = cupygemm.get_col_major_tma_aligned_tensor if sfa_layout == "m-major" else cp.ascontiguousarray
    S = layout(sfa)
    L = None if lay is None else lay.copy()
    out = cp.zeros(out_shape, BF16)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        call(A, S, b, sfb, L, out)  # warm-up: kernels and per-stream scratch exist before capturing
        s.begin_capture()
        call(A, S, b, sfb, L, out)
        graph = s.end_capture()
    for step in range(2):
        new_a, new_s = problems(kind, 200 + step)[1][:2]
        cp.cuda.Device().synchronize()  # made on the default stream; s is non-blocking
        with s:
            A[...] = new_a
            S[...] = layout(new_s)
            out.view(cp.uint16).fill(0x7FC0)
            graph.launch(s)
        s.synchronize()
        want = cp.zeros(out_shape, BF16)
        call(new_a, new_s, b, sfb, L, want)
        if kind == "masked":
            for gi, r in enumerate(cp.asnumpy(L).tolist()):
                assert (out[gi, :r].view(cp.uint16) == want[gi, :r].view(cp.uint16)).all()
        else:
            assert (out.view(cp.uint16) == want.view(cp.uint16)).all()


def test_opcheck_every_operator():
    torch = _torch()
    import cupygemm.torch as ct

    a, sfa, b, sfb, _, _ = make_normal(128, 256, 512, 2)
    # uint8 bits: opcheck's schema test compares inputs with ops torch lacks for float8_e4m3fn
    A, S, B, SB = tt(torch, a), tt(torch, sfa), tt(torch, b), tt(torch, sfb)
    torch.library.opcheck(ct.ops.gemm_fp8_fp8_bf16_nt.default, (A, S, B, SB, -1))
    torch.library.opcheck(ct.ops.gemm_fp8_fp8_bf16_nt_out.default,
                          (A, S, B, SB, torch.empty(128, 256, dtype=torch.bfloat16, device="cuda"), -1))
    rng = cp.random.default_rng(3)
    gb, gsfb = grouped_weights(2, 256, 512, rng)
    GB, GSB = tt(torch, gb), tt(torch, gsfb)
    idx = tt(torch, cp.asarray(np.array([1] * 100 + [-1] * 28, np.int32)))  # -1 rows come back as zeros
    torch.library.opcheck(ct.ops.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous.default, (A, S, GB, GSB, idx, -1))
    torch.library.opcheck(ct.ops.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_out.default,
                          (A, S, GB, GSB, idx, torch.empty(128, 256, dtype=torch.bfloat16, device="cuda"), -1))
    A3, S3 = A.reshape(2, 64, 512), S.reshape(2, 64, 4)
    mm = torch.tensor([64, 10], dtype=torch.int32, device="cuda")
    out3 = torch.zeros(2, 64, 256, dtype=torch.bfloat16, device="cuda")
    torch.library.opcheck(ct.ops.m_grouped_gemm_fp8_fp8_bf16_nt_masked_out.default, (A3, S3, GB, GSB, mm, 32, out3, -1))
    mm_full = torch.tensor([64, 64], dtype=torch.int32, device="cuda")
    torch.library.opcheck(ct.ops.m_grouped_gemm_fp8_fp8_bf16_nt_masked.default, (A3, S3, GB, GSB, mm_full, 32, -1))
    x = torch.randn(200, 384, device="cuda", dtype=torch.bfloat16)
    torch.library.opcheck(ct.ops.per_token_cast_to_fp8.default, (x, -1))
    torch.library.opcheck(ct.ops.per_block_cast_to_fp8.default, (x, -1))


def test_torch_compile_fullgraph_through_the_public_api():
    torch = _torch()
    x = torch.randn(128, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    b, sfb = cupygemm.per_block_cast_to_fp8(w)

    def layer(x, b, sfb):
        a, sfa = cupygemm.per_token_cast_to_fp8(x)
        return torch.relu(cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))) * 2

    compiled = torch.compile(layer, fullgraph=True)
    got = compiled(x, b, sfb)
    want = layer(x, b, sfb)
    assert torch.equal(got, want)


def test_changed_strides_get_their_own_plan():
    """A padded-stride view of the same shape, a transposed SFA and a misaligned pointer never reuse a plan made
    for other strides: each is validated afresh (results right, or the clear error)."""
    m, n, k = 200, 512, 1024
    a, sfa, b, sfb, _, _ = make_normal(m, n, k, 5)
    ref = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    key_count = len(gemm_mod._calls)
    a_pad = cp.zeros((m, k + 64), cp.uint8)[:, :k]
    a_pad[...] = a
    out = cupygemm.gemm_fp8_fp8_bf16_nt((a_pad, sfa), (b, sfb))
    assert (out.view(cp.uint16) == ref.view(cp.uint16)).all()
    col = cupygemm.get_col_major_tma_aligned_tensor(sfa)
    out = cupygemm.gemm_fp8_fp8_bf16_nt((a, col), (b, sfb))
    assert (out.view(cp.uint16) == ref.view(cp.uint16)).all()
    assert len(gemm_mod._calls) >= key_count + 2
    # Same shape and strides as a seen signature, but a base 8 bytes off: the fast path must not launch it.
    buf = cp.zeros((m * (k + 64) + 64,), cp.uint8)
    shifted = buf[8:8 + m * (k + 64)].reshape(m, k + 64)[:, :k]
    assert shifted.strides == a_pad.strides
    with pytest.raises(ValueError, match="16-byte aligned base"):
        cupygemm.gemm_fp8_fp8_bf16_nt((shifted, sfa), (b, sfb))
