"""Bad inputs on real GPU arrays: a specific exception before any launch, and the context keeps working;
large problems (past 2^31 elements, huge K) give correct results."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

import cupygemm  # noqa: E402
from gpu_helpers import check_against_reference, make_normal, ref_normal  # noqa: E402


@pytest.fixture(scope="module")
def good():
    return make_normal(256, 512, 1024, 11)


def still_works(good):
    a, sfa, b, sfb, _, _ = good
    out = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    want, mag = ref_normal(a, sfa, b, sfb)
    stats = check_against_reference(out, want, mag)
    assert stats["finite"] and stats["beyond_one_ulp"] == 0


def cases(good):
    a, sfa, b, sfb, _, _ = good
    big = cp.zeros((256, 1024 + 16), cp.uint8)
    return [
        ("A float32", lambda: ((a.astype(cp.float32), sfa), (b, sfb), None), TypeError),
        ("A int8", lambda: ((a.view(cp.int8), sfa), (b, sfb), None), TypeError),
        ("B 3-D", lambda: ((a, sfa), (b[None], sfb), None), ValueError),
        ("K mismatch", lambda: ((a, sfa), (b[:, :512], sfb[:, :4]), None), ValueError),
        ("A transposed view", lambda: ((a.T, sfa), (b, sfb), None), ValueError),
        ("A misaligned base", lambda: ((big[:, 1:1025], sfa), (b, sfb), None), ValueError),
        ("SFA wrong shape", lambda: ((a, sfa[:, :4]), (b, sfb), None), ValueError),
        ("SFA float64", lambda: ((a, sfa.astype(cp.float64)), (b, sfb), None), TypeError),
        ("SFB wrong shape", lambda: ((a, sfa), (b, sfb[:, :3]), None), ValueError),
        ("SFB non-contiguous", lambda: ((a, sfa), (b, cp.asfortranarray(sfb)), None), ValueError),
        ("out float32", lambda: ((a, sfa), (b, sfb), cp.empty((256, 512), cp.float32)), TypeError),
        ("out wrong shape", lambda: ((a, sfa), (b, sfb), cp.empty((256, 256), cupygemm.tensors.BF16)), ValueError),
        ("host arrays", lambda: ((a.get(), sfa.get()), (b, sfb), None), TypeError),
        # A [256, 1024] FP8 has the bytes of a [256, 512] BF16 output: the kernel would overwrite what it reads
        ("out aliasing A", lambda: ((a, sfa), (b, sfb), a.view(cupygemm.tensors.BF16)), ValueError),
        ("out aliasing B", lambda: ((a, sfa), (b, sfb), b[:256].view(cupygemm.tensors.BF16)), ValueError),
    ]


def test_battery(good):
    for name, make, exc in cases(good):
        lhs, rhs, out = make()
        with pytest.raises(exc):
            cupygemm.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)
        still_works(good)


def test_different_gpus(good):
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    a, sfa, b, sfb, _, _ = good
    with cp.cuda.Device(1 - a.device.id):  # the other GPU, whichever is current
        b1, sfb1 = cp.asarray(b), cp.asarray(sfb)
    assert b1.device.id != a.device.id
    with pytest.raises(ValueError, match="one GPU"):
        cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b1, sfb1))
    still_works(good)


def test_second_gpu_works():
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    with cp.cuda.Device(1):
        a, sfa, b, sfb, _, _ = make_normal(300, 512, 1024, 12)
        out = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
        want, mag = ref_normal(a, sfa, b, sfb)
        stats = check_against_reference(out, want, mag)
        assert out.device.id == 1 and stats["beyond_one_ulp"] == 0


def test_more_than_2_31_elements():
    m, n, k = 66000, 256, 32768  # A has 2.16e9 elements
    rng = cp.random.default_rng(0)
    a = rng.integers(0, 0x7E, size=(m, k), dtype=cp.uint8)  # finite e4m3 codes
    sfa = cp.full((m, k // 128), 0.5, cp.float32)
    b = rng.integers(0, 0x7E, size=(n, k), dtype=cp.uint8)
    sfb = cp.full((2, k // 128), 0.25, cp.float32)
    out = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    rows = cp.asarray(np.array([0, 1, 65535, 65536, m - 1]))
    want, mag = ref_normal(a[rows], sfa[rows], b, sfb)
    stats = check_against_reference(out[rows], want, mag)
    assert stats["finite"] and stats["beyond_one_ulp"] == 0, stats
    del a


def test_huge_k():
    a, sfa, b, sfb, _, _ = make_normal(64, 128, 1 << 20, 13)
    out = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    want, mag = ref_normal(a, sfa, b, sfb)
    stats = check_against_reference(out, want, mag)
    assert stats["finite"] and stats["beyond_one_ulp"] == 0, stats
