"""The wgrad references (cupygemm.reference.wgrad_reference, k_grouped_wgrad_reference) against independent
computations on tiny inputs: K not a multiple of 128, K = 0, empty groups, scales with padded rows."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cupygemm.reference import (float32_to_fp8, k_grouped_wgrad_reference, per_token_cast_to_fp8_reference,
                                wgrad_reference)


def fp8_values(bits: np.ndarray) -> np.ndarray:
    return bits.view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def naive(a_bits, sfa_rows, b_bits, sfb_rows, c):
    """c[m, n] + sum_k A[m, k] B[n, k] sfa[m, k // 128] sfb[n, k // 128], by einsum over expanded scales."""
    k = a_bits.shape[1]
    blk = np.arange(k) // 128
    a = fp8_values(a_bits) * sfa_rows.astype(np.float64)[:, blk]
    b = fp8_values(b_bits) * sfb_rows.astype(np.float64)[:, blk]
    return c.astype(np.float64) + np.einsum("mk,nk->mn", a, b)


@pytest.mark.parametrize("m,n,k", [(3, 5, 16), (7, 4, 128), (5, 9, 272), (4, 3, 4096 + 48)])
def test_wgrad_reference_matches_einsum(m, n, k):
    rng = np.random.default_rng(m * n + k)
    a_bits, sfa = per_token_cast_to_fp8_reference(rng.standard_normal((m, k)).astype(np.float32))
    b_bits, sfb = per_token_cast_to_fp8_reference(rng.standard_normal((n, k)).astype(np.float32))
    c = (rng.standard_normal((m, n)) * 10).astype(np.float32)
    got = wgrad_reference(a_bits, sfa, b_bits, sfb, c)
    np.testing.assert_allclose(got, naive(a_bits, sfa, b_bits, sfb, c), rtol=1e-12, atol=1e-12)
    # One element by a plain loop, to pin down the per-(row, K block) indexing.
    i, j = m - 1, n - 1
    want = float(c[i, j]) + sum(float(fp8_values(a_bits[i:i + 1, kk:kk + 1])[0, 0]) * float(sfa[i, kk // 128]) *
                                float(fp8_values(b_bits[j:j + 1, kk:kk + 1])[0, 0]) * float(sfb[j, kk // 128])
                                for kk in range(k))
    assert got[i, j] == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_wgrad_reference_k_zero_returns_c():
    c = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = wgrad_reference(np.zeros((2, 0), np.uint8), np.zeros((2, 0), np.float32), np.zeros((3, 0), np.uint8),
                          np.zeros((3, 0), np.float32), c)
    assert got.dtype == np.float64 and (got == c).all()


def test_wgrad_reference_uses_the_scales():
    a_bits = float32_to_fp8(np.ones((1, 256), np.float32))
    b_bits = float32_to_fp8(np.ones((1, 256), np.float32))
    sfa, sfb = np.array([[2.0, 3.0]], np.float32), np.array([[5.0, 7.0]], np.float32)
    got = wgrad_reference(a_bits, sfa, b_bits, sfb, np.array([[1.0]], np.float32))
    assert got[0, 0] == 1.0 + 128 * 2 * 5 + 128 * 3 * 7


def make_grouped(m, n, sizes, rng, pad_to=4):
    """Flat A/B bits and stacked M-/N-major scales (rows padded to a multiple of pad_to), as the kernel reads them."""
    a_parts, b_parts, sa_rows, sb_rows = [], [], [], []
    for k in sizes:
        a_bits, sa = per_token_cast_to_fp8_reference(rng.standard_normal((m, k)).astype(np.float32))
        b_bits, sb = per_token_cast_to_fp8_reference(rng.standard_normal((n, k)).astype(np.float32))
        a_parts.append(a_bits.reshape(-1)), b_parts.append(b_bits.reshape(-1))
        sa_rows.append(sa.T), sb_rows.append(sb.T)
    mp, np_ = -(-m // pad_to) * pad_to, -(-n // pad_to) * pad_to
    sfa = np.full((sum(s.shape[0] for s in sa_rows), mp), np.nan, np.float32)
    sfb = np.full((sum(s.shape[0] for s in sb_rows), np_), np.nan, np.float32)
    r = 0
    for sa, sb in zip(sa_rows, sb_rows):
        sfa[r:r + sa.shape[0], :m], sfb[r:r + sb.shape[0], :n] = sa, sb
        r += sa.shape[0]
    return (np.concatenate(a_parts) if a_parts else np.zeros(0, np.uint8),
            np.concatenate(b_parts) if b_parts else np.zeros(0, np.uint8), sfa, sfb)


@pytest.mark.parametrize("sizes", [[16, 0, 160, 128], [0, 0], [272], [48, 4096 + 48, 0, 16]])
def test_k_grouped_wgrad_reference(sizes):
    m, n = 5, 6
    rng = np.random.default_rng(sum(sizes) + len(sizes))
    a_flat, b_flat, sfa, sfb = make_grouped(m, n, sizes, rng)
    c = rng.standard_normal((len(sizes), m, n)).astype(np.float32)
    got = k_grouped_wgrad_reference(a_flat, sfa, b_flat, sfb, c, np.array(sizes, np.int32))
    k0 = r0 = 0
    for g, k in enumerate(sizes):
        kb = -(-k // 128)
        if k == 0:
            assert (got[g] == c[g]).all(), "empty group keeps c"
        else:
            a_bits = a_flat[m * k0:m * (k0 + k)].reshape(m, k)
            b_bits = b_flat[n * k0:n * (k0 + k)].reshape(n, k)
            want = naive(a_bits, sfa[r0:r0 + kb, :m].T, b_bits, sfb[r0:r0 + kb, :n].T, c[g])
            np.testing.assert_allclose(got[g], want, rtol=1e-12, atol=1e-12)
        k0 += k
        r0 += kb


def test_k_grouped_wgrad_reference_checks_sizes():
    with pytest.raises(ValueError, match="batch_sizes"):
        k_grouped_wgrad_reference(np.zeros(16, np.uint8), np.zeros((1, 4), np.float32), np.zeros(16, np.uint8),
                                  np.zeros((1, 4), np.float32), np.zeros((1, 1, 1), np.float32), [-16])
