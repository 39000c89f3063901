"""Tests of cupygemm.quantization (GPU FP8 casts) and cuda_src/quantize.cu.

CPU: the kernels compile with NVRTC for every input dtype; argument validation (with host-only "fake" CuPy arrays
that point at no real memory and are never launched on). GPU (``-m gpu``, Hopper only): bitwise equality with
cupygemm.reference for bf16 / f32 / f16 inputs, strided inputs, streams, torch and JAX callers.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import cupygemm
from cupygemm import reference as ref

cupy = pytest.importorskip("cupy")

from cupygemm import quantization as quant  # noqa: E402  (needs cupy for the GPU paths only)
from cupygemm.jit.build import build_cubin  # noqa: E402
from cupygemm.jit.source import render  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
IN_DTYPES = [BF16, np.dtype(np.float32), np.dtype(np.float16)]
ENTRIES = ["per_token_cast_to_fp8", "per_block_cast_to_fp8"]


def _hopper_available() -> bool:
    try:
        return bool(cupy.cuda.is_available()) and cupy.cuda.Device().compute_capability == "90"
    except Exception:
        return False


#: Skip unless a Hopper (sm_90) GPU is usable; combine with ``pytest.mark.gpu``.
requires_hopper = pytest.mark.skipif(not _hopper_available(), reason="needs a Hopper (compute capability 9.0) GPU")


def gpu_test(fn):
    """Mark a test as a GPU test that skips cleanly without a Hopper GPU."""
    return pytest.mark.gpu(requires_hopper(fn))


def _fake_cupy(shape, dtype, strides=None):
    """A CuPy array header over memory that does not exist: enough for argument validation, never launched on."""
    mem = cupy.cuda.memory.UnownedMemory(0x10000000, 1 << 24, None, device_id=0)
    return cupy.ndarray(shape, dtype=dtype, memptr=cupy.cuda.memory.MemoryPointer(mem, 1 << 20), strides=strides)


# ---- CPU: compilation --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
def test_kernel_compiles(dtype, entry, tmp_path, monkeypatch):
    monkeypatch.setenv("CUPYGEMM_CACHE_DIR", str(tmp_path))
    src = quant._kernel_source(dtype, entry)
    assert src.entry == entry
    _, cubin = build_cubin(src, post_process=False)
    assert cubin.startswith(b"\x7fELF")
    assert entry.encode() in cubin
    other = [e for e in ENTRIES if e != entry][0]
    assert other.encode() not in cubin  # one kernel per rendered source (and per cache entry)


@pytest.mark.parametrize("kind", [0, 1, 2])
def test_quantize_cu_compiles_with_both_entries(kind, tmp_path, monkeypatch):
    monkeypatch.setenv("CUPYGEMM_CACHE_DIR", str(tmp_path))
    _, cubin = build_cubin(render("quantize.cu", "per_token_cast_to_fp8", {"CUPYGEMM_QUANT_IN_KIND": kind}),
                           post_process=False)
    assert cubin.startswith(b"\x7fELF")
    assert all(e.encode() in cubin for e in ENTRIES)


def test_kernel_sources_are_distinct():
    digests = {quant._kernel_source(d, e).digest for d in IN_DTYPES for e in ENTRIES}
    assert len(digests) == len(IN_DTYPES) * len(ENTRIES)


def test_kernel_source_rejects_unknown():
    with pytest.raises(TypeError, match="float64"):
        quant._kernel_source(np.float64, "per_token_cast_to_fp8")
    with pytest.raises(ValueError, match="entry"):
        quant._kernel_source(np.float32, "nope")


def test_launch_cast_packs_once_per_argument_set(monkeypatch):
    """The casts launch through their small kernel (one build per input dtype and entry point) with the values
    packed once per argument set: x, q, s as 64-bit pointers, m, n, ld and the groups as 64-bit signed ints."""
    import contextlib

    from cupygemm.jit.loader import PackedParams

    packs, launches = [], []

    class Casts:
        def pack(self, device, values, *variant):
            packs.append((device, values, variant))
            return ("packed", values)

        def launch(self, device, stream, grid, block, smem, params, *variant):
            launches.append((device, stream, grid, block, smem, params, variant))

    monkeypatch.setattr(quant, "_CASTS", Casts())
    monkeypatch.setattr(quant, "_params", PackedParams())
    monkeypatch.setattr(quant, "on_device", lambda device: contextlib.nullcontext())
    token, block = ENTRIES
    for _ in range(2):
        quant.launch_cast(token, BF16, 0x1000, 0x2000, 0x3000, 257, 300, -300, 11, 2)
    quant.launch_cast(block, BF16, 0x1000, 0x2000, 0x3000, 257, 300, 300, 11, 2)
    quant.launch_cast(token, BF16, 0x1000, 0x2000, 0x3000, 0, 300, 300, 11, 2)  # nothing to do: no launch
    token_values, block_values = (0x1000, 0x2000, 0x3000, 257, 300, -300, 3), (0x1000, 0x2000, 0x3000, 257, 300, 300, 3)
    assert packs == [(2, token_values, (BF16, token)), (2, block_values, (BF16, block))]
    assert launches == [(2, 11, 97, 256, 0, ("packed", token_values), (BF16, token))] * 2 + [
        (2, 11, 9, 256, 0, ("packed", block_values), (BF16, block))]  # 257 x 3 groups over 8 warps; 3 x 3 blocks


# ---- CPU: argument validation ------------------------------------------------------------------------------------

class _HostDLPack:
    """A DLPack producer whose data lives in host memory."""

    def __dlpack__(self, stream=None, max_version=None):  # pragma: no cover - never reached
        raise AssertionError("must not be consumed")

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


@pytest.mark.parametrize("fn", [quant.per_token_cast_to_fp8, quant.per_block_cast_to_fp8])
def test_rejects_host_and_foreign_inputs(fn):
    with pytest.raises(TypeError, match="NumPy"):
        fn(np.zeros((4, 128), np.float32))
    with pytest.raises(TypeError, match="DLPack"):
        fn([[1.0, 2.0]])
    with pytest.raises(TypeError, match="GPU"):
        fn(_HostDLPack())


@pytest.mark.parametrize("fn", [quant.per_token_cast_to_fp8, quant.per_block_cast_to_fp8])
def test_rejects_bad_arrays(fn):
    with pytest.raises(ValueError, match="2-D"):
        fn(_fake_cupy((128,), np.float32))
    with pytest.raises(ValueError, match="2-D"):
        fn(_fake_cupy((2, 4, 128), BF16))
    with pytest.raises(TypeError, match="float64"):
        fn(_fake_cupy((4, 128), np.float64))
    with pytest.raises(TypeError, match="FP8"):
        fn(_fake_cupy((4, 128), np.uint8))
    with pytest.raises(ValueError, match="unit stride"):
        fn(_fake_cupy((4, 64), np.float32, strides=(1024, 8)))  # x[:, ::2]
    with pytest.raises(ValueError, match="unit stride"):
        fn(_fake_cupy((4, 64), BF16, strides=(2, 8)))  # transposed
    with pytest.raises(ValueError, match="row stride"):
        fn(_fake_cupy((4, 64), np.float32, strides=(258, 4)))


@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
def test_prepare_row_strides(dtype):
    item = np.dtype(dtype).itemsize
    _, m, n, ld = quant._prepare(_fake_cupy((5, 200), dtype))
    assert (m, n, ld) == (5, 200, 200)
    assert quant._prepare(_fake_cupy((5, 200), dtype, strides=(512 * item, item)))[3] == 512
    assert quant._prepare(_fake_cupy((5, 200), dtype, strides=(-200 * item, item)))[3] == -200
    assert quant._prepare(_fake_cupy((5, 200), dtype, strides=(0, item)))[3] == 0
    assert quant._prepare(_fake_cupy((1, 200), dtype, strides=(3, item)))[3] == 200  # one row: stride unused
    assert quant._prepare(_fake_cupy((5, 1), dtype, strides=(2 * item, 7)))[3] == 2  # one column: inner unused


def test_prepare_empty_arrays_skip_stride_checks():
    assert quant._prepare(_fake_cupy((0, 300), BF16, strides=(0, 0)))[1:] == (0, 300, 300)
    assert quant._prepare(_fake_cupy((5, 0), np.float32, strides=(0, 0)))[1:] == (5, 0, 0)


# ---- GPU ---------------------------------------------------------------------------------------------------------

def _make_input(shape, dtype, seed=0):
    """Host input with varied per-row magnitudes, an all-zero row, a tiny row and exact rounding ties."""
    rng = np.random.default_rng(seed)
    m, n = shape
    x = rng.standard_normal(shape, dtype=np.float32)
    x *= np.exp2(rng.uniform(-12, 8, (m, 1))).astype(np.float32)
    if m > 0 and n >= 8:
        x[0] = rng.standard_normal(n, dtype=np.float32)
        # amax 448 makes the first group's factor exactly 1, so these are exact e4m3 ties / subnormals
        x[0, :8] = [448.0, 1.0625, -1.1875, 3 * 2.0 ** -10, 2.0 ** -10, -2.0 ** -10, 0.0, -0.0]
    if m > 2:
        x[1] = 0.0
        x[2] *= np.float32(1e-4)  # amax below the 1e-4 clamp
    return x.astype(dtype)


def _assert_bitwise(got_q, got_s, want_q, want_s):
    got_q, got_s = cupy.asnumpy(got_q), cupy.asnumpy(got_s)
    assert got_q.dtype == np.uint8 and got_s.dtype == np.float32
    assert got_q.shape == want_q.shape and got_s.shape == want_s.shape
    np.testing.assert_array_equal(got_q, want_q)
    np.testing.assert_array_equal(got_s.view(np.uint32), want_s.view(np.uint32))


_CASTS = [(quant.per_token_cast_to_fp8, ref.per_token_cast_to_fp8_reference),
          (quant.per_block_cast_to_fp8, ref.per_block_cast_to_fp8_reference)]
_CAST_IDS = ["per_token", "per_block"]


@gpu_test
@pytest.mark.parametrize("cast,reference", _CASTS, ids=_CAST_IDS)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 128), (7, 200), (129, 4096), (300, 576), (3, 8), (130, 1)])
def test_gpu_bitwise(cast, reference, dtype, shape):
    x = _make_input(shape, dtype, seed=shape[0] * 7 + shape[1])
    q, s = cast(cupy.asarray(x))
    assert isinstance(q, cupy.ndarray) and isinstance(s, cupy.ndarray)
    assert q.flags.c_contiguous and s.flags.c_contiguous
    _assert_bitwise(q, s, *reference(x))


@gpu_test
@pytest.mark.parametrize("cast,reference", _CASTS, ids=_CAST_IDS)
def test_gpu_bitwise_large(cast, reference):
    x = _make_input((4096, 7168), BF16, seed=42)
    q, s = cast(cupy.asarray(x))
    _assert_bitwise(q, s, *reference(x))


@gpu_test
@pytest.mark.parametrize("cast,reference", _CASTS, ids=_CAST_IDS)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
def test_gpu_strided_inputs(cast, reference, dtype):
    wide = _make_input((150, 400), dtype, seed=3)
    xg = cupy.asarray(wide)
    # row stride larger than n, base pointer offset
    _assert_bitwise(*cast(xg[:, 16:216]), *reference(wide[:, 16:216]))
    # negative row stride
    _assert_bitwise(*cast(xg[::-1, :300]), *reference(wide[::-1, :300]))
    # every other row
    _assert_bitwise(*cast(xg[::2]), *reference(wide[::2]))
    # zero row stride (broadcast row)
    bcast = cupy.broadcast_to(xg[5], (131, 400))
    _assert_bitwise(*cast(bcast), *reference(np.broadcast_to(wide[5], (131, 400))))


@gpu_test
@pytest.mark.parametrize("cast", [quant.per_token_cast_to_fp8, quant.per_block_cast_to_fp8], ids=_CAST_IDS)
def test_gpu_empty(cast):
    q, s = cast(cupy.zeros((0, 300), BF16))
    assert q.shape == (0, 300) and s.shape[1] == 3
    q, s = cast(cupy.zeros((5, 0), np.float32))
    assert q.shape == (5, 0) and s.shape[1] == 0


@gpu_test
@pytest.mark.parametrize("cast,reference", _CASTS, ids=_CAST_IDS)
def test_gpu_on_non_default_stream(cast, reference):
    x = _make_input((257, 1000), BF16, seed=9)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        xg = cupy.asarray(x)
        q, s = cast(xg)
        q_host, s_host = q.get(stream=stream), s.get(stream=stream)
    stream.synchronize()
    _assert_bitwise(q_host, s_host, *reference(x))


@gpu_test
def test_gpu_kernel_memo():
    f1 = quant._get_kernel(BF16, "per_token_cast_to_fp8", 0)
    assert quant._get_kernel(BF16, "per_token_cast_to_fp8", 0) is f1
    assert quant._get_kernel(BF16, "per_block_cast_to_fp8", 0) is not f1
    assert quant._get_kernel(np.dtype(np.float16), "per_token_cast_to_fp8", 0) is not f1


@gpu_test
def test_gpu_roundtrip_accuracy():
    x = _make_input((256, 1024), BF16, seed=11)
    q, s = quant.per_token_cast_to_fp8(cupy.asarray(x))
    assert ref.calc_diff(ref.dequantize_per_token(q, s), x.astype(np.float64)) < 1e-3
    q, s = quant.per_block_cast_to_fp8(cupy.asarray(x))
    assert ref.calc_diff(ref.dequantize_per_block(q, s), x.astype(np.float64)) < 1e-3


@gpu_test
@pytest.mark.parametrize("cast,reference", _CASTS, ids=_CAST_IDS)
def test_gpu_torch_inputs(cast, reference):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        x = torch.randn(133, 300, device="cuda", dtype=torch.float32, generator=gen).to(dtype)
        x[0, :3] = torch.tensor([448.0, 1.0625, -1.1875], dtype=dtype, device="cuda")
        q, s = cast(x)
        assert isinstance(q, torch.Tensor) and isinstance(s, torch.Tensor)
        assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and q.is_cuda and s.is_cuda
        torch.cuda.synchronize()
        x_host = x.float().cpu().numpy()  # exact widening; the reference result does not depend on it
        want_q, want_s = reference(x_host)
        np.testing.assert_array_equal(q.view(torch.uint8).cpu().numpy(), want_q)
        np.testing.assert_array_equal(s.cpu().numpy().view(np.uint32), want_s.view(np.uint32))
        np.testing.assert_array_equal(q.float().cpu().numpy(), ref.fp8_to_float32(want_q))
    # strided torch input (row stride > n)
    x = torch.randn(64, 512, device="cuda", generator=gen).to(torch.bfloat16)[:, 100:400]
    q, s = cast(x)
    torch.cuda.synchronize()
    want_q, want_s = reference(x.float().cpu().numpy())
    np.testing.assert_array_equal(q.view(torch.uint8).cpu().numpy(), want_q)
    np.testing.assert_array_equal(s.cpu().numpy(), want_s)


@gpu_test
@pytest.mark.parametrize("cast,reference", _CASTS, ids=_CAST_IDS)
def test_gpu_jax_inputs(cast, reference):
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    try:
        device = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no GPU backend")
    for dtype in (jnp.bfloat16, jnp.float32, jnp.float16):
        x_host = _make_input((70, 260), np.dtype(dtype), seed=13)
        x = jax.device_put(jnp.asarray(x_host), device)
        q, s = cast(x)
        assert isinstance(q, jax.Array) and isinstance(s, jax.Array)
        assert q.dtype == jnp.float8_e4m3fn and s.dtype == jnp.float32
        want_q, want_s = reference(x_host)
        np.testing.assert_array_equal(np.asarray(jax.lax.bitcast_convert_type(q, jnp.uint8)), want_q)
        np.testing.assert_array_equal(np.asarray(s).view(np.uint32), want_s.view(np.uint32))


def test_jax_fused_transpose_casts_are_the_reference_casts_of_x_and_x_t():
    """cupygemm.jax's transposed casts (and the core functions on JAX arrays, through the JAX adapter) give
    per_token_cast_to_fp8(x.T) and per_block_cast_to_fp8 of x and x.T bit for bit."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import cupygemm.jax as cj
    from cupygemm import reference as R

    x = np.random.default_rng(5).standard_normal((200, 300)).astype(np.float32)
    jx = jnp.asarray(x)
    want_t = R.per_token_cast_to_fp8_reference(x.T)
    want = R.per_token_cast_to_fp8_reference(x)
    for got in (cj.per_token_cast_to_fp8_transposed(jx, rowwise=True),
                cupygemm.per_token_cast_to_fp8_transposed(jx, rowwise=True)):
        assert len(got) == 4
        for g, w in zip(got, (*want_t, *want)):
            assert np.array_equal(np.asarray(g).view(np.uint8 if g.dtype.itemsize == 1 else np.uint32),
                                  np.asarray(w).view(np.uint8 if w.dtype.itemsize == 1 else np.uint32))
    q, s, q_t, s_t = cupygemm.per_block_cast_to_fp8(jx, with_transpose=True)
    wq, ws = R.per_block_cast_to_fp8_reference(x.T)
    assert np.array_equal(np.asarray(q_t).view(np.uint8), np.asarray(wq).view(np.uint8))
    assert np.array_equal(np.asarray(s_t), ws)
    with pytest.raises(TypeError, match="stream"):
        cupygemm.per_token_cast_to_fp8_transposed(jx, stream=0)
