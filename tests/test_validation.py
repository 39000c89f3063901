"""Every argument check of the GEMM entry points, on CPU.

The checks only read metadata (shape, dtype, strides, pointer, device), so light stand-ins for CuPy arrays
exercise them without a GPU. GPU-side equivalents live in test_bad_inputs_gpu.py.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import cupygemm
from cupygemm import validate
from cupygemm.kinds.forward import check_contiguous, check_masked, check_normal
from cupygemm.tensors import BF16, View


def Fake(shape, dtype, strides=None, ptr=0x10000, device=0) -> View:
    """The metadata validation reads of a tensor (no memory behind it)."""
    shape, dtype = tuple(shape), np.dtype(dtype)
    dense, acc = [], dtype.itemsize
    for d in reversed(shape):
        dense.insert(0, acc)
        acc *= max(d, 1)
    return View(ptr, shape, tuple(strides) if strides is not None else tuple(dense), dtype, device)


def colmajor_sfa(m, kb, groups=None):
    mp = cupygemm.get_tma_aligned_size(m, 4)
    if groups is None:
        return Fake((m, kb), np.float32, (4, 4 * mp))
    return Fake((groups, m, kb), np.float32, (4 * mp * kb, 4, 4 * mp))


def normal_args(m=256, n=512, k=1024, **over):
    kb = -(-k // 128)
    args = dict(
        a=Fake((m, k), np.uint8), sfa=colmajor_sfa(m, kb), b=Fake((n, k), np.uint8),
        sfb=Fake((-(-n // 128), kb), np.float32), out=Fake((m, n), BF16),
    )
    args.update(over)
    return args


def call_normal(**over):
    a = normal_args(**{k: v for k, v in over.items() if k in ("m", "n", "k")})
    a.update({k: v for k, v in over.items() if k not in ("m", "n", "k")})
    return check_normal((a["a"], a["sfa"], a["b"], a["sfb"], a["out"]))


def test_good_normal_problem():
    p = call_normal()
    assert (p.m, p.n, p.k, p.num_groups) == (256, 512, 1024, 1)
    assert p.sfa_m_pad == 256


@pytest.mark.parametrize("over,exc,msg", [
    (dict(a=Fake((256, 1024), np.float32)), TypeError, r"lhs\[0\] \(A\): expected float8_e4m3fn"),
    (dict(b=Fake((512, 1024), np.int32)), TypeError, r"rhs\[0\] \(B\): expected float8_e4m3fn"),
    (dict(a=Fake((4, 256, 1024), np.uint8)), ValueError, r"lhs\[0\] \(A\): expected a 2-D array"),
    (dict(b=Fake((512, 512), np.uint8)), ValueError, "K differs"),
    (dict(sfa=Fake((256, 8), np.float16)), TypeError, r"lhs\[1\] \(A scales\): expected float32"),
    (dict(sfa=Fake((256, 7), np.float32)), ValueError, r"lhs\[1\] \(A scales\): expected shape \(256, 8\)"),
    (dict(sfb=Fake((4, 7), np.float32)), ValueError, r"rhs\[1\] \(B scales\): expected shape \(4, 8\)"),
    (dict(sfb=Fake((4, 8), np.float32, (4, 16))), ValueError, "C-contiguous"),
    (dict(out=Fake((256, 512), np.float32)), TypeError, "out: expected a bfloat16"),
    (dict(out=Fake((256, 256), BF16)), ValueError, r"out: expected shape \(256, 512\)"),
    (dict(a=Fake((256, 1024), np.uint8, (1024, 2))), ValueError, "unit stride"),
    (dict(a=Fake((256, 1024), np.uint8, (1032, 1))), ValueError, "multiples of 16 bytes"),
    (dict(a=Fake((256, 1024), np.uint8, ptr=0x10008)), ValueError, "16-byte aligned base"),
    (dict(out=Fake((256, 512), BF16, (1000, 2))), ValueError, "multiples of 16 bytes"),
    (dict(out=Fake((256, 512), BF16, (512, 2))), ValueError, "rows overlap"),
    (dict(b=Fake((512, 1024), np.uint8, device=1)), ValueError, "one GPU.*B on GPU 1"),
])
def test_normal_rejects(over, exc, msg):
    with pytest.raises(exc, match=msg):
        call_normal(**over)


@pytest.mark.parametrize("m,n,k,msg", [(64, 512, 1000, "K must be a multiple of 16"),
                                       (64, 500, 1024, "N must be a multiple of 8"),
                                       (2**31, 512, 1024, "M = 2147483648 is too large")])
def test_shape_rules(m, n, k, msg):
    with pytest.raises(ValueError, match=msg):
        call_normal(m=m, n=n, k=k)


def test_pairs_must_be_pairs():
    with pytest.raises(TypeError, match="lhs: expected a .tensor, scales. pair"):
        cupygemm.gemm_fp8_fp8_bf16_nt(Fake((1, 16), np.uint8), (None, None), None)
    with pytest.raises(TypeError, match="rhs: expected"):
        cupygemm.gemm_fp8_fp8_bf16_nt((None, None), (1, 2, 3), None)


def test_col_major_detection():
    assert validate.is_m_major(colmajor_sfa(100, 8), 100, 8)
    assert not validate.is_m_major(Fake((100, 8), np.float32), 100, 8)
    assert validate.is_m_major(colmajor_sfa(5, 3, groups=4), 8, 3)
    assert validate.is_m_major(Fake((64, 1), np.float32), 64, 1)  # one K block: both layouts agree


def grouped_args(g=4, m=512, n=256, k=512):
    kb = -(-k // 128)
    return dict(a=Fake((m, k), np.uint8), sfa=colmajor_sfa(m, kb), b=Fake((g, n, k), np.uint8),
                sfb=Fake((g, -(-n // 128), kb), np.float32), out=Fake((m, n), BF16), idx=Fake((m,), np.int32))


def test_contiguous_checks():
    a = grouped_args()
    p = check_contiguous((a["a"], a["sfa"], a["b"], a["sfb"], a["out"], a["idx"]))
    assert p.num_groups == 4 and p.sfa_m_major
    with pytest.raises(TypeError, match="m_indices: expected int32"):
        check_contiguous((a["a"], a["sfa"], a["b"], a["sfb"], a["out"], Fake((512,), np.int64)))
    with pytest.raises(ValueError, match=r"m_indices: expected shape \(512,\)"):
        check_contiguous((a["a"], a["sfa"], a["b"], a["sfb"], a["out"], Fake((500,), np.int32)))
    with pytest.raises(ValueError, match="3-D"):
        check_contiguous((a["a"], a["sfa"], Fake((256, 512), np.uint8), a["sfb"], a["out"], a["idx"]))
    with pytest.raises(ValueError, match=r"rhs\[1\] \(B scales\): expected shape \(4, 2, 4\)"):
        check_contiguous((a["a"], a["sfa"], a["b"], Fake((4, 2, 3), np.float32), a["out"], a["idx"]))


def test_masked_checks():
    g, m, n, k = 3, 128, 256, 512
    kb = k // 128
    a3, s3 = Fake((g, m, k), np.uint8), colmajor_sfa(m, kb, groups=g)
    b, sfb = Fake((g, n, k), np.uint8), Fake((g, 2, kb), np.float32)
    out, mm = Fake((g, m, n), BF16), Fake((g,), np.int32)
    p = check_masked((a3, s3, b, sfb, out, mm), 64)
    assert (p.num_groups, p.m) == (3, 128)
    with pytest.raises(ValueError, match=r"\(A\) has 3 groups.*\(B\) has 2"):
        check_masked((a3, s3, Fake((2, n, k), np.uint8), Fake((2, 2, kb), np.float32), out, mm), 64)
    with pytest.raises(ValueError, match="expected_m"):
        check_masked((a3, s3, b, sfb, out, mm), -1)
    with pytest.raises(ValueError, match="expected_m"):
        check_masked((a3, s3, b, sfb, out, mm), 1.5)
    with pytest.raises(ValueError, match=r"out: expected shape \(3, 128, 256\)"):
        check_masked((a3, s3, b, sfb, Fake((m, n), BF16), mm), 64)
    # Padded rows (ld > N) are fine; groups spaced further apart than M rows are not (a view of a larger buffer).
    check_masked((a3, s3, b, sfb, Fake((g, m, n), BF16, strides=(m * 384 * 2, 384 * 2, 2)), mm), 64)
    with pytest.raises(ValueError, match=r"out: expected the groups back to back"):
        check_masked((a3, s3, b, sfb, Fake((g, m, n), BF16, strides=(2 * m * n * 2, n * 2, 2)), mm), 64)


def test_host_index_checks():
    validate.check_m_indices(np.array([0] * 128 + [1] * 100 + [-1] * 28 + [-1] * 128), 2)
    with pytest.raises(ValueError, match=r"m_indices\[3\] = 5 is outside \[-1, 2\)"):
        validate.check_m_indices(np.array([0, 0, 0, 5]), 2)
    with pytest.raises(ValueError, match=r"m_indices\[200\] = 1: group boundaries must be aligned"):
        validate.check_m_indices(np.array([0] * 200 + [1] * 56), 2)
    with pytest.raises(ValueError, match=r"m_indices\[130\] = 0"):
        validate.check_m_indices(np.array([0] * 128 + [-1, -1, 0] + [-1] * 125), 2)
    validate.check_masked_m(np.array([0, 5, 128]), 128)
    with pytest.raises(ValueError, match=r"masked_m\[1\] = -1 is outside \[0, 128\]"):
        validate.check_masked_m(np.array([3, -1]), 128)


def test_host_arrays_and_junk_are_rejected():
    pytest.importorskip("cupy")
    with pytest.raises(TypeError, match="NumPy \\(host\\) array"):
        cupygemm.gemm_fp8_fp8_bf16_nt((np.zeros((4, 16), np.uint8), np.ones((4, 1), np.float32)),
                                      (np.zeros((8, 16), np.uint8), np.ones((1, 1), np.float32)))
    with pytest.raises(TypeError, match="expected a CuPy array or a DLPack-capable GPU tensor, got list"):
        cupygemm.gemm_fp8_fp8_bf16_nt(([[1]], [[1.0]]), ([[1]], [[1.0]]))


def test_set_num_sms_validation():
    with pytest.raises(TypeError):
        cupygemm.set_num_sms(1.5)
    with pytest.raises(ValueError):
        cupygemm.set_num_sms(0)


@pytest.mark.parametrize("value,error", [(10**30, ValueError), (2**31, ValueError), (-3, ValueError),
                                         (True, TypeError), ("132", TypeError), (132.0, TypeError)])
def test_set_num_sms_refuses_what_no_gpu_has(value, error):
    """Without a GPU there is no device count to check against, but no GPU has 10^30 SMs either."""
    try:
        with pytest.raises(error, match="num_sms"):
            cupygemm.set_num_sms(value)
        cupygemm.set_num_sms(8)  # a real count still works, GPU or not
        assert cupygemm.device.num_sms_override() == 8
    finally:
        cupygemm.reset_num_sms()
