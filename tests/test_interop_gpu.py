"""Framework interop on the GPU: CuPy, torch and JAX x dense, contiguous, masked, quantization; no copies;
results follow the caller's framework; stream ordering with a still-running producer."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

import cupygemm  # noqa: E402
from cupygemm.tensors import read  # noqa: E402
from gpu_helpers import gpu_sleep, grouped_weights, make_normal, randn_bf16  # noqa: E402


def to_torch(x, fp8=False):
    torch = pytest.importorskip("torch")
    t = torch.from_dlpack(x)
    return t.view(torch.float8_e4m3fn) if fp8 else t


def to_jax(x, fp8=False):
    jax = pytest.importorskip("jax")
    j = jax.dlpack.from_dlpack(x)
    return jax.lax.bitcast_convert_type(j, jax.numpy.float8_e4m3fn) if fp8 else j


def ptr(x):
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        return x.data_ptr()
    if mod in ("jax", "jaxlib"):
        return x.unsafe_buffer_pointer()
    return x.data.ptr


FRAMEWORKS = {"cupy": (lambda x, fp8=False: x), "torch": to_torch, "jax": to_jax}


def same_bits(result, ref) -> bool:
    got = cp.from_dlpack(result) if not isinstance(result, cp.ndarray) else result
    return bool((got.view(cp.uint16) == ref.view(cp.uint16)).all())


@pytest.mark.parametrize("fw", list(FRAMEWORKS))
def test_dense_interop(fw):
    conv = FRAMEWORKS[fw]
    a, sfa, b, sfb, _, _ = make_normal(256, 512, 1024, 1)
    ref = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    A, SA, B, SB = conv(a, True), conv(sfa), conv(b, True), conv(sfb)
    va, vb, vsb = read(A, "A"), read(B, "B"), read(SB, "SB")
    if fw != "jax":  # JAX's bitcast makes a new buffer; the FP8 import of that buffer itself is zero-copy
        assert va.ptr == a.data.ptr and vb.ptr == b.data.ptr
    assert va.ptr == ptr(A) and vsb.ptr == ptr(SB)
    out = cupygemm.gemm_fp8_fp8_bf16_nt((A, SA), (B, SB))
    assert type(out).__module__.split(".")[0] == type(A).__module__.split(".")[0]
    assert same_bits(out, ref)


@pytest.mark.parametrize("fw", list(FRAMEWORKS))
def test_grouped_interop(fw):
    conv = FRAMEWORKS[fw]
    rng = cp.random.default_rng(2)
    g, n, k = 2, 256, 512
    b, sfb = grouped_weights(g, n, k, rng)
    a, sfa = cupygemm.per_token_cast_to_fp8(randn_bf16((256, k), rng))
    idx = cp.asarray(np.array([0] * 128 + [1] * 100 + [-1] * 28, np.int32))
    ref = cp.zeros((256, n), dtype=cupygemm.tensors.BF16)
    cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sfa), (b, sfb), ref, idx)
    out = cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((conv(a, True), conv(sfa)), (conv(b, True), conv(sfb)),
                                                             None, conv(idx))
    got = cp.from_dlpack(out) if not isinstance(out, cp.ndarray) else out
    assert (got[:228].view(cp.uint16) == ref[:228].view(cp.uint16)).all()
    a3 = cp.stack([a[:128], a[128:]])
    s3 = cp.stack([sfa[:128], sfa[128:]])
    mm = cp.asarray(np.array([100, 128], np.int32))
    ref3 = cp.zeros((g, 128, n), dtype=cupygemm.tensors.BF16)
    cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a3, s3), (b, sfb), ref3, mm, 128)
    out3 = cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((conv(a3, True), conv(s3)), (conv(b, True), conv(sfb)),
                                                          None, conv(mm), 128)
    got3 = cp.from_dlpack(out3) if not isinstance(out3, cp.ndarray) else out3
    assert (got3[0, :100].view(cp.uint16) == ref3[0, :100].view(cp.uint16)).all()
    assert (got3[1].view(cp.uint16) == ref3[1].view(cp.uint16)).all()


@pytest.mark.parametrize("fw", list(FRAMEWORKS))
def test_quantization_interop(fw):
    conv = FRAMEWORKS[fw]
    x = randn_bf16((200, 384), cp.random.default_rng(3))
    q, s = cupygemm.per_token_cast_to_fp8(x)
    q2, s2 = cupygemm.per_token_cast_to_fp8(conv(x))
    assert type(q2).__module__.split(".")[0] == type(conv(x)).__module__.split(".")[0]
    if fw == "torch":  # torch and JAX callers get their FP8 dtype; CuPy has none and gets the bits
        torch = pytest.importorskip("torch")
        assert q2.dtype == torch.float8_e4m3fn
        q2 = q2.view(torch.uint8)
    elif fw == "jax":
        jax = pytest.importorskip("jax")
        assert q2.dtype == jax.numpy.float8_e4m3fn
        q2 = jax.lax.bitcast_convert_type(q2, jax.numpy.uint8)
    assert (cp.from_dlpack(q2) if not isinstance(q2, cp.ndarray) else q2).tobytes() == q.tobytes()


def test_torch_out_written_in_place():
    torch = pytest.importorskip("torch")
    a, sfa, b, sfb, _, _ = make_normal(128, 256, 512, 4)
    tout = torch.empty((128, 256), dtype=torch.bfloat16, device="cuda")
    res = cupygemm.gemm_fp8_fp8_bf16_nt((to_torch(a, True), to_torch(sfa)), (to_torch(b, True), to_torch(sfb)), tout)
    assert res is tout
    assert same_bits(tout, cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb)))


def test_torch_producer_stream_is_respected():
    """A torch kernel still writing A on torch's current stream must finish before our GEMM reads A."""
    torch = pytest.importorskip("torch")
    a, sfa, b, sfb, _, _ = make_normal(512, 512, 2048, 5)
    ref = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    ta_final = to_torch(a.copy())
    ta = torch.zeros_like(ta_final)  # zeros now; the producer fills it late
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # after ta_final's copy and ta's zeros: side is non-blocking
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # keep the producer busy (~0.1 s)
        ta.copy_(ta_final)
        out = cupygemm.gemm_fp8_fp8_bf16_nt((ta.view(torch.float8_e4m3fn), to_torch(sfa)),
                                            (to_torch(b, True), to_torch(sfb)))
        check = out.clone()  # consumer on torch's stream: must see our finished result
    torch.cuda.synchronize()
    assert same_bits(check, ref)


def test_cupy_stream_is_used():
    """A still finished late on CuPy's current stream (a non-blocking one, behind a long kernel), the call and a read
    there: a call launched on any other stream reads A before it is written."""
    a, sfa, b, sfb, _, _ = make_normal(256, 256, 512, 6)
    ref = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    late = cp.zeros_like(a)
    cp.cuda.Device().synchronize()  # a, ref and the zeros are written on the default stream first
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        gpu_sleep()
        late[...] = a
        out = cupygemm.gemm_fp8_fp8_bf16_nt((late, sfa), (b, sfb))
        seen = out.copy()
    s.synchronize()
    assert (seen.view(cp.uint16) == ref.view(cp.uint16)).all()
