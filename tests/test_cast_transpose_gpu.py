"""The fused transpose casts on a Hopper GPU (``-m gpu``; skipped without one).

Bitwise equality with compositions of the NumPy references (``per_token_cast_to_fp8(x.T)``, ``(x)``,
``per_block_cast_to_fp8(x)``, ``(x.T)``) for all input dtypes, ragged and large shapes, strided inputs; with the
existing GPU casts on ``x.T.copy()`` at DeepSeek-V3 sizes; the M-major scale layout (strides, values, padding) and a
GEMM reading it without a copy; stream ordering; torch callers.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

import cupygemm  # noqa: E402
from cast_helpers import assert_equal, expected, make_input  # noqa: E402
from cupygemm import quantization as quant  # noqa: E402
from cupygemm.util import ceil_div, round_up  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
IN_DTYPES = [BF16, np.dtype(np.float32), np.dtype(np.float16)]
FUSED = [quant.TRANSPOSED, quant.TRANSPOSED_ROWWISE, quant.BLOCK_WITH_TRANSPOSE]


def randn_bf16(shape, seed):
    """A CuPy BF16 array (CuPy has no bfloat16 arithmetic: made as bits, viewed)."""
    from cupygemm.bench.inputs import randn_bf16 as make

    return make(shape, cp.random.default_rng(seed))


def transposed_copy(x):
    """x.T.copy() of a CuPy BF16 array, through its bits."""
    return x.view(cp.uint16).T.copy().view(x.dtype)


def cast(entry: str, x, **kw):
    if entry == quant.BLOCK_WITH_TRANSPOSE:
        return cupygemm.per_block_cast_to_fp8(x, with_transpose=True, **kw)
    return cupygemm.per_token_cast_to_fp8_transposed(x, rowwise=entry == quant.TRANSPOSED_ROWWISE, **kw)


def host(results):
    return tuple(cp.asnumpy(r) for r in results)


@pytest.mark.parametrize("entry", FUSED)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1), (1, 128), (128, 1), (127, 129), (129, 127), (128, 128), (300, 200),
                                   (255, 384), (4096 + 64, 256), (256, 4096 + 64), (40, 1000)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_bitwise(dtype, entry, shape):
    x = make_input(shape, dtype, seed=shape[0] * 7 + shape[1])
    got = cast(entry, cp.asarray(x))
    assert all(isinstance(r, cp.ndarray) and r.flags.c_contiguous for r in got)
    assert [r.dtype for r in got] == [np.uint8 if o.dtype.itemsize == 1 else np.float32
                                      for o in quant.fused_cast_outputs(entry, *shape)]
    assert_equal(host(got), expected(entry, x))


@pytest.mark.parametrize("t,d", [(4096, 7168), (4096, 2112), (4096, 512)])
def test_deepseek_sizes_match_the_unfused_casts(t, d):
    """At the recipe's sizes, against the existing GPU casts of x.T.copy() (themselves bit-exact with the reference)."""
    x = randn_bf16((t, d), t + d)
    q_t, s_t, q, s = cupygemm.per_token_cast_to_fp8_transposed(x, rowwise=True)
    want_t = cupygemm.per_token_cast_to_fp8(transposed_copy(x))
    want = cupygemm.per_token_cast_to_fp8(x)
    for got, ref in zip((q_t, s_t, q, s), want_t + want):
        assert got.shape == ref.shape and bool((got.view(cp.uint8) == ref.view(cp.uint8)).all())
    # weights [N, K] of the same size, with their transposed copy
    w = transposed_copy(x[:, : min(d, 2048)])
    q, s, q_t, s_t = cupygemm.per_block_cast_to_fp8(w, with_transpose=True)
    for got, ref in zip((q, s, q_t, s_t),
                        cupygemm.per_block_cast_to_fp8(w) + cupygemm.per_block_cast_to_fp8(transposed_copy(w))):
        assert got.shape == ref.shape and bool((got.view(cp.uint8) == ref.view(cp.uint8)).all())


@pytest.mark.parametrize("entry", FUSED)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
def test_any_grid(dtype, entry):
    """The kernel launched over fewer CTAs than tiles (each CTA then runs its ring over many tiles) or more (the extra
    ones have nothing to do): the same bits as the host's launch."""
    shape = (1000, 1100)  # 8 x 9 tiles, ragged in both directions
    x = make_input(shape, dtype, seed=12)
    xg = cp.asarray(x)
    want = expected(entry, x)
    stream = cp.cuda.get_current_stream()
    for grid in (1, 5, 71, 72, 200):
        outs = quant.fused_cast_outputs(entry, *shape)
        bufs = {o.name: cp.full(o.buffer, 0x5A, cp.uint8 if o.dtype.itemsize == 1 else cp.float32) for o in outs}
        args = quant.fused_cast_args(entry, xg.data.ptr, bufs["q_t"].data.ptr, bufs["s_t"].data.ptr,
                                     bufs["q"].data.ptr if "q" in bufs else 0, bufs["s"].data.ptr if "s" in bufs else 0,
                                     *shape, shape[1])
        params = quant._FUSED_CASTS.pack(xg.device.id, args, dtype, entry)  # the current device, not always 0
        quant._FUSED_CASTS.launch(xg.device.id, stream.ptr, grid, quant.fused_cast_threads(dtype),
                                  quant.fused_cast_smem(dtype, entry), params, dtype, entry)
        assert_equal(host(bufs[o.name] for o in outs), want)


@pytest.mark.parametrize("entry", FUSED)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
def test_strided_inputs(dtype, entry):
    wide = make_input((300, 512), dtype, seed=3)
    xg = cp.asarray(wide)
    assert_equal(host(cast(entry, xg[:, 16:272])), expected(entry, wide[:, 16:272]))  # aligned row stride > n
    assert_equal(host(cast(entry, xg[:, 3:203])), expected(entry, wide[:, 3:203]))  # base not 16-byte aligned
    assert_equal(host(cast(entry, xg[::-1, :384])), expected(entry, wide[::-1, :384]))  # negative row stride
    assert_equal(host(cast(entry, xg[::2])), expected(entry, wide[::2]))  # every other row
    bcast = cp.broadcast_to(xg[5], (131, 512))  # zero row stride
    assert_equal(host(cast(entry, bcast)), expected(entry, np.ascontiguousarray(np.broadcast_to(wide[5], (131, 512)))))


@pytest.mark.parametrize("rowwise", [False, True])
@pytest.mark.parametrize("shape", [(4096, 7168), (300, 130), (1000, 4097), (1, 1)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_m_major_scales(shape, rowwise):
    t, d = shape
    x = make_input(shape, BF16, seed=11) if t * d <= 1 << 22 else None
    xg = cp.asarray(x) if x is not None else randn_bf16(shape, 11)
    got = cupygemm.per_token_cast_to_fp8_transposed(xg, rowwise=rowwise, m_major_scales=True)
    s_t = got[1]
    kb, d_pad = ceil_div(t, 128), round_up(d, 4)
    assert s_t.shape == (d, kb) and s_t.dtype == cp.float32
    assert s_t.strides == (4, 4 * d_pad) and s_t.data.ptr % 16 == 0
    row_major = cupygemm.per_token_cast_to_fp8_transposed(xg, rowwise=rowwise)
    helper = cupygemm.get_col_major_tma_aligned_tensor(row_major[1])
    assert helper.shape == s_t.shape and helper.strides == s_t.strides
    assert cupygemm.get_col_major_tma_aligned_tensor(s_t) is s_t  # already in the layout: returned as is
    assert bool((helper.view(cp.uint32) == s_t.view(cp.uint32)).all())
    # the buffer's padding columns are zeros, as in the helper's
    buf = cp.ndarray((kb, d_pad), cp.float32, s_t.data)
    assert bool((buf[:, d:] == 0).all())
    if t * d <= 1 << 22:  # the big shape's values: test_deepseek_sizes_match_the_unfused_casts (no slow host reference)
        assert_equal(host(got), expected(quant.TRANSPOSED_ROWWISE if rowwise else quant.TRANSPOSED, x))
    assert_equal(host(got[:1] + got[2:]), host(row_major[:1] + row_major[2:]))


def test_gemm_reads_m_major_scales_without_a_copy(monkeypatch):
    """wgrad-style: A = q_t [d, T] (K = T, not a multiple of 128) with M-major s_t. The GEMM takes it as is (the SFA
    copy is never called) and its result is bit for bit the one with row-major scales (copied per call)."""
    from cupygemm import gemm as gemm_module

    t, d, n = 1008, 384, 256
    x = randn_bf16((t, d), 1)
    w = randn_bf16((n, t), 2)
    b, sfb = cupygemm.per_block_cast_to_fp8(w)
    q_t, s_row = cupygemm.per_token_cast_to_fp8_transposed(x)
    want = cupygemm.gemm_fp8_fp8_bf16_nt((q_t, s_row), (b, sfb))
    q_t2, s_mm = cupygemm.per_token_cast_to_fp8_transposed(x, m_major_scales=True)
    assert bool((q_t2 == q_t).all())

    def no_copy(*args, **kwargs):
        raise AssertionError("the GEMM copied M-major scales")

    monkeypatch.setattr(gemm_module, "to_m_major", no_copy)
    got = cupygemm.gemm_fp8_fp8_bf16_nt((q_t2, s_mm), (b, sfb))
    assert bool((got.view(cp.uint16) == want.view(cp.uint16)).all())


_SPIN = r"""
extern "C" __global__ void spin_then_copy(const unsigned char* src, unsigned char* dst, long long n, long long cycles) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
  }
  __syncthreads();
  for (long long i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}
"""


@pytest.mark.parametrize("entry", FUSED)
@pytest.mark.parametrize("how", ["argument", "current"])
def test_runs_on_the_given_stream(entry, how):
    """x is written by a slow kernel on a non-blocking stream; a cast ordered on that stream sees the data, one on
    any other stream would read the zeros that are there before."""
    x = make_input((520, 700), BF16, seed=4)
    src = cp.asarray(x.view(np.uint16))
    dst = cp.zeros(src.shape, cp.uint16)
    cp.cuda.Device().synchronize()
    spin = cp.RawKernel(_SPIN, "spin_then_copy")
    stream = cp.cuda.Stream(non_blocking=True)
    spin((1,), (256,), (src, dst, np.int64(src.nbytes), np.int64(100_000_000)), stream=stream)  # ~50 ms
    if how == "argument":
        got = cast(entry, dst.view(BF16), stream=stream)
    else:
        with stream:
            got = cast(entry, dst.view(BF16))
    results = tuple(r.get(stream=stream) for r in got)
    stream.synchronize()
    assert_equal(results, expected(entry, x))


@pytest.mark.parametrize("entry", FUSED)
def test_empty(entry):
    for shape in ((0, 300), (5, 0), (0, 0)):
        got = cast(entry, cp.zeros(shape, BF16))
        outs = quant.fused_cast_outputs(entry, *shape)
        assert [r.shape for r in got] == [o.shape for o in outs]


def test_kernel_memo():
    a = quant._FUSED_CASTS.get(0, BF16, quant.TRANSPOSED)
    assert quant._FUSED_CASTS.get(0, BF16, quant.TRANSPOSED) is a
    assert quant._FUSED_CASTS.get(0, BF16, quant.TRANSPOSED_ROWWISE) is not a
    assert quant._FUSED_CASTS.get(0, np.dtype(np.float32), quant.TRANSPOSED) is not a


@pytest.mark.parametrize("entry", FUSED)
def test_torch_inputs(entry):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        x = torch.randn(300, 260, device="cuda", dtype=torch.float32).to(dtype)
        got = cast(entry, x)
        assert all(isinstance(r, torch.Tensor) and r.is_cuda for r in got)
        assert [r.dtype for r in got] == [torch.float8_e4m3fn if o.dtype.itemsize == 1 else torch.float32
                                          for o in quant.fused_cast_outputs(entry, 300, 260)]
        torch.cuda.synchronize()
        want = expected(entry, x.float().cpu().numpy())
        assert_equal(tuple((r.view(torch.uint8) if r.dtype == torch.float8_e4m3fn else r).cpu().numpy()
                           for r in got), want)
    x = torch.randn(300, 260, device="cuda").to(torch.bfloat16)
    if entry != quant.BLOCK_WITH_TRANSPOSE:
        s_t = cast(entry, x, m_major_scales=True)[1]
        assert s_t.stride() == (1, 260) and s_t.shape == (260, 3)
        assert cupygemm.get_col_major_tma_aligned_tensor(s_t) is s_t


def test_torch_operators_of_the_fused_casts():
    """torch.ops.cupygemm's fused casts: opcheck (schema, fake shapes and strides, the M-major s_t too) and
    torch.compile(fullgraph=True) through the public function."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    import cupygemm.torch  # noqa: F401 - the operators

    x = torch.randn(300, 260, device="cuda").to(torch.bfloat16)
    ops = torch.ops.cupygemm
    torch.library.opcheck(ops.per_token_cast_to_fp8_transposed.default, (x, False, -1))
    torch.library.opcheck(ops.per_token_cast_to_fp8_transposed.default, (x, True, -1))
    torch.library.opcheck(ops.per_token_cast_to_fp8_transposed_rowwise.default, (x, False, -1))
    torch.library.opcheck(ops.per_block_cast_to_fp8_with_transpose.default, (x, -1))

    @torch.compile(fullgraph=True)
    def both(x):
        return cupygemm.per_token_cast_to_fp8_transposed(x, rowwise=True, m_major_scales=True)

    got = both(x)
    want = cupygemm.per_token_cast_to_fp8_transposed(x, rowwise=True, m_major_scales=True)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.stride() == w.stride()
        assert torch.equal(g.view(torch.uint8) if g.dtype == torch.float8_e4m3fn else g,
                           w.view(torch.uint8) if w.dtype == torch.float8_e4m3fn else w)


@pytest.mark.parametrize("shape", [(4096, 7168), (1000, 2112), (77, 300)])
def test_jax_fused_casts_are_the_eager_ones(shape):
    """cupygemm.jax's transposed casts run the fused kernel as one custom call (one pass over x, no XLA transpose)
    and give the eager fused casts' bits, under jit and under vmap (one call per element)."""
    jax = pytest.importorskip("jax")
    try:
        jax.devices("gpu")
    except RuntimeError:
        pytest.skip("JAX has no GPU backend")
    import jax.numpy as jnp

    import cupygemm.jax as cj

    x = randn_bf16(shape, seed=sum(shape))
    jx = jnp.asarray(cp.asnumpy(x.view(cp.uint16))).view(jnp.bfloat16)
    cases = [(cupygemm.per_token_cast_to_fp8_transposed(x, rowwise=True),
              cj.per_token_cast_to_fp8_transposed, dict(rowwise=True)),
             (cupygemm.per_token_cast_to_fp8_transposed(x), cj.per_token_cast_to_fp8_transposed, {}),
             (cupygemm.per_block_cast_to_fp8(x, with_transpose=True), cj.per_block_cast_to_fp8_with_transpose, {})]
    for want, fn, kw in cases:
        got = jax.jit(lambda v: fn(v, **kw))(jx)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert np.array_equal(np.asarray(g).view(np.uint8).reshape(-1),
                                  cp.asnumpy(cp.ascontiguousarray(w)).view(np.uint8).reshape(-1))
        hlo = jax.jit(lambda v: fn(v, **kw)).lower(jx).compile().as_text()  # the CUDA branch only
        assert "transpose(" not in hlo, "an XLA transpose beside the fused cast"
    both = jnp.stack([jx, -jx])
    q_t, s_t, q, s = jax.vmap(lambda v: cj.per_token_cast_to_fp8_transposed(v, rowwise=True))(both)
    want = cupygemm.per_token_cast_to_fp8_transposed(x, rowwise=True)
    assert np.array_equal(np.asarray(q_t[0]).view(np.uint8), cp.asnumpy(want[0]).view(np.uint8))
    assert np.array_equal(np.asarray(s_t[1]), cp.asnumpy(want[1]))
