"""Tests of cupygemm.layout: integer helpers (CPU), the col-major TMA-aligned layout (CPU with NumPy and
host-only CuPy array headers; GPU with real CuPy / torch arrays)."""
from __future__ import annotations

import numpy as np
import pytest

from cupygemm import layout
from cupygemm.layout import (
    ceil_div,
    get_col_major_tma_aligned_tensor,
    get_m_alignment_for_contiguous_layout,
    get_tma_aligned_size,
    is_col_major_tma_aligned,
)

try:
    import cupy
except ImportError:  # pragma: no cover
    cupy = None


def _hopper_available() -> bool:
    try:
        return cupy is not None and bool(cupy.cuda.is_available()) and cupy.cuda.Device().compute_capability == "90"
    except Exception:
        return False


#: Skip unless a Hopper (sm_90) GPU is usable; combine with ``pytest.mark.gpu``.
requires_hopper = pytest.mark.skipif(not _hopper_available(), reason="needs a Hopper (compute capability 9.0) GPU")
requires_cupy = pytest.mark.skipif(cupy is None, reason="needs CuPy installed (no GPU needed)")


def gpu_test(fn):
    """Mark a test as a GPU test that skips cleanly without a Hopper GPU."""
    return pytest.mark.gpu(requires_hopper(fn))


def _fake_cupy(shape, dtype=np.float32, strides=None, offset=0):
    """A CuPy array header over memory that does not exist (validation and stride logic only, no GPU)."""
    mem = cupy.cuda.memory.UnownedMemory(0x10000000, 1 << 24, None, device_id=0)
    return cupy.ndarray(shape, dtype=dtype, memptr=cupy.cuda.memory.MemoryPointer(mem, (1 << 20) + offset),
                        strides=strides)


# ---- integer helpers ---------------------------------------------------------------------------------------------

def test_ceil_div():
    assert [ceil_div(a, 128) for a in (0, 1, 127, 128, 129, 7168)] == [0, 1, 1, 1, 2, 56]
    assert ceil_div(np.int64(200), 128) == 2
    assert ceil_div(-1, 128) == 0
    with pytest.raises(ValueError, match="b"):
        ceil_div(5, 0)
    with pytest.raises(TypeError, match="a"):
        ceil_div(5.0, 2)
    with pytest.raises(TypeError, match="b"):
        ceil_div(5, True)


@pytest.mark.parametrize("x,size,want", [
    (0, 4, 0), (1, 4, 4), (4, 4, 4), (5, 4, 8), (4096, 4, 4096), (4097, 4, 4100), (7, 4, 8),
    (7, 2, 8), (9, 2, 16), (1, 1, 16), (17, 1, 32), (3, 8, 4), (5, 16, 5),
])
def test_get_tma_aligned_size(x, size, want):
    got = get_tma_aligned_size(x, size)
    assert got == want
    assert (got * size) % 16 == 0 and got >= x and got - x < 16 // size


def test_get_tma_aligned_size_validation():
    with pytest.raises(ValueError, match="element_size"):
        get_tma_aligned_size(4, 3)
    with pytest.raises(ValueError, match="element_size"):
        get_tma_aligned_size(4, 32)
    with pytest.raises(ValueError, match="element_size"):
        get_tma_aligned_size(4, 0)
    with pytest.raises(ValueError, match="x"):
        get_tma_aligned_size(-1, 4)
    with pytest.raises(TypeError, match="x"):
        get_tma_aligned_size(4.0, 4)


def test_m_alignment_for_contiguous_layout():
    assert get_m_alignment_for_contiguous_layout() == 128


# ---- layout semantics with NumPy (the same code path CuPy uses) --------------------------------------------------

@pytest.mark.parametrize("shape", [(5, 3), (128, 56), (4, 1), (1, 7), (130, 2), (2, 5, 3), (3, 129, 4), (1, 1, 1)])
def test_col_major_copy_semantics(shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    out = layout._col_major_tma_aligned_copy(x, np)
    m, kb = shape[-2], shape[-1]
    m_pad = get_tma_aligned_size(m, 4)
    assert out.shape == x.shape and out.dtype == np.float32
    np.testing.assert_array_equal(out, x)
    want = (4, 4 * m_pad) if len(shape) == 2 else (4 * kb * m_pad, 4, 4 * m_pad)
    assert out.strides == want
    assert is_col_major_tma_aligned(out)
    # the padding rows of the underlying buffer are zeros
    base = out.base
    while base.base is not None:
        base = base.base
    assert base.size == (shape[0] if len(shape) == 3 else 1) * kb * m_pad
    buf = base.reshape(-1, kb, m_pad)
    assert not buf[:, :, m:].any()


def test_col_major_copy_of_strided_input():
    x = np.arange(60, dtype=np.float32).reshape(6, 10)[:, ::3]  # [6, 4], non-contiguous
    out = layout._col_major_tma_aligned_copy(x, np)
    np.testing.assert_array_equal(out, x)
    assert out.strides == (4, 4 * 8)


def test_is_col_major_tma_aligned_numpy():
    assert not is_col_major_tma_aligned(np.zeros((5, 3), np.float32))           # row-major
    assert not is_col_major_tma_aligned(np.zeros((5, 3), np.float32, order="F"))  # col-major, unpadded (5 -> 8)
    assert is_col_major_tma_aligned(np.zeros((8, 3), np.float32, order="F"))      # col-major, 8 already aligned
    assert not is_col_major_tma_aligned(np.zeros((1, 1), np.float32))            # strides (4, 4) != (4, 16)
    assert not is_col_major_tma_aligned(np.zeros(8, np.float32))
    assert not is_col_major_tma_aligned(np.zeros((2, 8, 3, 1), np.float32))
    x3 = np.zeros((2, 3, 8), np.float32).transpose(0, 2, 1)                      # [2, 8, 3], M-major per group
    assert is_col_major_tma_aligned(x3)


# ---- CPU with host-only CuPy headers -----------------------------------------------------------------------------

@requires_cupy
def test_already_aligned_returned_unchanged_without_gpu():
    for shape, strides in (((5, 3), (4, 32)), ((8, 2), (4, 32)), ((2, 5, 3), (96, 4, 32))):
        x = _fake_cupy(shape, strides=strides)
        assert is_col_major_tma_aligned(x)
        assert get_col_major_tma_aligned_tensor(x) is x  # no kernel, no allocation


@requires_cupy
def test_is_col_major_tma_aligned_cupy_headers():
    assert not is_col_major_tma_aligned(_fake_cupy((5, 3)))                          # row-major
    assert not is_col_major_tma_aligned(_fake_cupy((5, 3), strides=(4, 20)))        # M stride not padded
    assert not is_col_major_tma_aligned(_fake_cupy((5, 3), strides=(4, 32), offset=4))  # base not 16-B aligned
    assert not is_col_major_tma_aligned(_fake_cupy((2, 5, 3), strides=(128, 4, 32)))  # group stride off


@requires_cupy
def test_col_major_validation():
    with pytest.raises(TypeError, match="NumPy"):
        get_col_major_tma_aligned_tensor(np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match="2-D"):
        get_col_major_tma_aligned_tensor(_fake_cupy((4,)))
    with pytest.raises(ValueError, match="3-D"):
        get_col_major_tma_aligned_tensor(_fake_cupy((1, 2, 4, 2)))
    with pytest.raises(TypeError, match="float32"):
        get_col_major_tma_aligned_tensor(_fake_cupy((4, 2), np.float64))


# ---- GPU ---------------------------------------------------------------------------------------------------------

@gpu_test
@pytest.mark.parametrize("shape", [(5, 3), (4096, 56), (129, 1), (1, 7), (4, 2, 3), (3, 257, 17)])
def test_gpu_col_major(shape):
    rng = np.random.default_rng(1)
    host = rng.standard_normal(shape).astype(np.float32)
    x = cupy.asarray(host)
    out = get_col_major_tma_aligned_tensor(x)
    assert isinstance(out, cupy.ndarray) and out is not x
    m, kb = shape[-2], shape[-1]
    m_pad = get_tma_aligned_size(m, 4)
    want = (4, 4 * m_pad) if len(shape) == 2 else (4 * kb * m_pad, 4, 4 * m_pad)
    assert out.shape == x.shape and out.strides == want
    np.testing.assert_array_equal(cupy.asnumpy(out), host)
    assert is_col_major_tma_aligned(out)
    assert get_col_major_tma_aligned_tensor(out) is out  # idempotent, no copy


@gpu_test
def test_gpu_col_major_from_strided_and_transposed_inputs():
    rng = np.random.default_rng(2)
    host = rng.standard_normal((300, 40)).astype(np.float32)
    x = cupy.asarray(host)
    for view, want in ((x[::2, 1:30], host[::2, 1:30]), (x.T.copy().T, host), (cupy.asfortranarray(x), host)):
        out = get_col_major_tma_aligned_tensor(view)
        np.testing.assert_array_equal(cupy.asnumpy(out), want)
        assert is_col_major_tma_aligned(out)


@gpu_test
def test_gpu_col_major_rejects_non_float32():
    with pytest.raises(TypeError, match="float32"):
        get_col_major_tma_aligned_tensor(cupy.zeros((4, 2), cupy.float16))


@gpu_test
def test_gpu_col_major_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    x = torch.randn(5, 3, device="cuda")
    out = get_col_major_tma_aligned_tensor(x)
    assert isinstance(out, torch.Tensor) and out.is_cuda
    assert out.shape == (5, 3) and out.stride() == (1, 8)
    assert torch.equal(out, x)
    assert get_col_major_tma_aligned_tensor(out) is out
    x3 = torch.randn(2, 130, 4, device="cuda")
    out3 = get_col_major_tma_aligned_tensor(x3)
    assert out3.stride() == (4 * 132, 1, 132) and torch.equal(out3, x3)
