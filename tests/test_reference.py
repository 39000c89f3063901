"""CPU tests of cupygemm.reference: FP8 encodings, the 03d0be3 casts, dequantization, GEMM references, calc_diff."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from cupygemm import reference as ref

BF16 = np.dtype(ml_dtypes.bfloat16)


# ---- an independent e4m3fn model (no ml_dtypes) -----------------------------------------------------------------

def _e4m3_value(code: int) -> float:
    """Value of an e4m3fn code from the format definition (bias 7, no inf, 0x7F/0xFF = NaN)."""
    sign = -1.0 if code & 0x80 else 1.0
    exp, mant = (code >> 3) & 0xF, code & 0x7
    if exp == 0xF and mant == 0x7:
        return math.nan
    if exp == 0:
        return sign * mant / 8.0 * 2.0 ** -6
    return sign * (1.0 + mant / 8.0) * 2.0 ** (exp - 7)


_CODES = np.arange(256)
_VALUES = np.array([_e4m3_value(c) for c in _CODES])
_POS_CODES = np.arange(0x7F)  # 0x00 .. 0x7E: every finite non-negative code, increasing in value
_POS_VALUES = _VALUES[_POS_CODES]


def _encode_e4m3(v: float) -> int:
    """Round to nearest, ties to even (even code = even mantissa), saturating at 448; sign kept for zero."""
    sign = 0x80 if math.copysign(1.0, v) < 0 else 0
    a = min(abs(v), 448.0)
    i = int(np.searchsorted(_POS_VALUES, a))  # first value >= a
    if i < len(_POS_VALUES) and _POS_VALUES[i] == a:
        return sign | int(_POS_CODES[i])
    lo, hi = i - 1, i
    d_lo, d_hi = a - _POS_VALUES[lo], _POS_VALUES[hi] - a
    pick = lo if d_lo < d_hi else hi if d_hi < d_lo else (lo if _POS_CODES[lo] % 2 == 0 else hi)
    return sign | int(_POS_CODES[pick])


def _formula_cast_groups(x32: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """The 03d0be3 cast of one group, element by element with NumPy float32 scalars."""
    amax = np.float32(0)
    for v in x32.ravel():
        amax = max(amax, np.float32(abs(v)))
    amax = max(amax, np.float32(1e-4))
    factor = np.float32(448) / amax
    q = np.array([_encode_e4m3(float(np.float32(v) * factor)) for v in x32.ravel()], dtype=np.uint8)
    return q.reshape(x32.shape), np.float32(amax / np.float32(448))


# ---- encodings ---------------------------------------------------------------------------------------------------

def test_known_encodings():
    q = ref.float32_to_fp8(np.array([1.0, -2.5, 448.0, -448.0, 0.0, -0.0, 2.0 ** -9, 0.5], np.float32))
    assert q.dtype == np.uint8
    assert q.tolist() == [0x38, 0xC2, 0x7E, 0xFE, 0x00, 0x80, 0x01, 0x30]


def test_fp8_to_float32_matches_format_definition():
    codes = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=np.uint8)
    got = ref.fp8_to_float32(codes)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.astype(np.float64), _VALUES[codes])
    assert np.isnan(ref.fp8_to_float32(np.array([0x7F, 0xFF], np.uint8))).all()
    # the ml_dtypes FP8 dtype is accepted as well
    np.testing.assert_array_equal(ref.fp8_to_float32(codes.view(ml_dtypes.float8_e4m3fn)), got)
    with pytest.raises(TypeError, match="q"):
        ref.fp8_to_float32(np.zeros(3, np.int16))


def test_encode_roundtrip_all_codes():
    codes = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=np.uint8)
    np.testing.assert_array_equal(ref.float32_to_fp8(ref.fp8_to_float32(codes)), codes)


def test_rne_ties_and_saturation():
    # exact midpoints between neighbouring e4m3 values go to the even code
    mids = (_POS_VALUES[:-1] + _POS_VALUES[1:]) / 2
    vals = np.concatenate([mids, -mids]).astype(np.float32)
    assert np.all(vals.astype(np.float64) == np.concatenate([mids, -mids]))  # midpoints are exact in float32
    got = ref.float32_to_fp8(vals)
    want = np.array([_encode_e4m3(float(v)) for v in vals], dtype=np.uint8)
    np.testing.assert_array_equal(got, want)
    assert np.all(got % 2 == 0)  # every tie resolved to an even mantissa
    # hand-checked ties: 1.0625 (1 | 1.125) -> 1.0 = 0x38, 1.1875 (1.125 | 1.25) -> 1.25 = 0x3A,
    # 2^-10 (0 | 2^-9) -> +0, 3 * 2^-10 (2^-9 | 2^-8) -> 2^-8 = 0x02, 464 (448 | 480) -> 448 = 0x7E
    t = np.array([1.0625, 1.1875, 2.0 ** -10, 3 * 2.0 ** -10, 464.0, -1.0625], np.float32)
    assert ref.float32_to_fp8(t).tolist() == [0x38, 0x3A, 0x00, 0x02, 0x7E, 0xB8]
    # out of range saturates (ml_dtypes alone would give NaN)
    assert ref.float32_to_fp8(np.array([449.0, 1e6, -1e30], np.float32)).tolist() == [0x7E, 0x7E, 0xFE]


def test_cast_matches_independent_encoder_and_ml_dtypes():
    rng = np.random.default_rng(0)
    v = (rng.standard_normal(20000) * np.exp2(rng.uniform(-14, 9, 20000))).astype(np.float32)
    v = np.clip(v, -448, 448)
    got = ref.float32_to_fp8(v)
    np.testing.assert_array_equal(got, v.astype(ml_dtypes.float8_e4m3fn).view(np.uint8))
    want = np.array([_encode_e4m3(float(x)) for x in v[:3000]], dtype=np.uint8)
    np.testing.assert_array_equal(got[:3000], want)


# ---- casts -------------------------------------------------------------------------------------------------------

def test_per_token_hand_values():
    x = np.zeros((3, 128), np.float32)
    x[0, :4] = [448.0, 1.0, -2.5, 0.5]     # amax 448 -> scale 1, q = plain encodings
    x[2, :3] = [2.0, -1.0, 0.25]           # amax 2 -> factor 224
    q, s = ref.per_token_cast_to_fp8_reference(x)
    assert q.shape == (3, 128) and q.dtype == np.uint8
    assert s.shape == (3, 1) and s.dtype == np.float32
    assert s[0, 0] == np.float32(1.0)
    assert q[0, :4].tolist() == [0x7E, 0x38, 0xC2, 0x30]
    assert not q[0, 4:].any()
    # all-zero row: amax clamps to 1e-4, q = 0
    assert s[1, 0] == np.float32(1e-4) / np.float32(448)
    assert not q[1].any()
    # 2 * 224 = 448, -1 * 224 = -224 -> 0xF6 (-224 = -1.75 * 2^7), 0.25 * 224 = 56 = 1.75 * 2^5 -> 0x66
    assert s[2, 0] == np.float32(2.0) / np.float32(448)
    assert q[2, :3].tolist() == [0x7E, 0xF6, 0x66]


@pytest.mark.parametrize("shape", [(1, 128), (3, 200), (2, 1), (4, 384), (5, 129)])
def test_per_token_matches_formula(shape):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * np.exp2(rng.uniform(-20, 10, (shape[0], 1)))).astype(np.float32)
    q, s = ref.per_token_cast_to_fp8_reference(x)
    nb = -(-shape[1] // 128)
    assert q.shape == shape and s.shape == (shape[0], nb)
    for r in range(shape[0]):
        for g in range(nb):
            gq, gs = _formula_cast_groups(x[r, g * 128:(g + 1) * 128])
            np.testing.assert_array_equal(q[r, g * 128:(g + 1) * 128], gq)
            assert s[r, g] == gs


@pytest.mark.parametrize("shape", [(128, 128), (130, 260), (1, 5), (200, 64)])
def test_per_block_matches_formula(shape):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(3.0)
    x[: min(128, shape[0]), : min(128, shape[1])] *= np.float32(100)  # blocks with different amax
    q, s = ref.per_block_cast_to_fp8_reference(x)
    mb, nb = -(-shape[0] // 128), -(-shape[1] // 128)
    assert q.shape == shape and s.shape == (mb, nb) and s.dtype == np.float32
    for i in range(mb):
        for j in range(nb):
            blk = x[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            bq, bs = _formula_cast_groups(blk)
            np.testing.assert_array_equal(q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128], bq)
            assert s[i, j] == bs


def test_per_token_padding_is_zeros():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 200)).astype(np.float32)
    padded = np.zeros((6, 256), np.float32)
    padded[:, :200] = x
    q, s = ref.per_token_cast_to_fp8_reference(x)
    qp, sp = ref.per_token_cast_to_fp8_reference(padded)
    np.testing.assert_array_equal(q, qp[:, :200])
    np.testing.assert_array_equal(s, sp)
    # the tail group's amax only sees the 72 real columns
    np.testing.assert_array_equal(s[:, 1], np.maximum(np.abs(x[:, 128:]).max(axis=1), np.float32(1e-4)) / np.float32(448))


def test_per_block_padding_is_zeros():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((150, 140)).astype(np.float32)
    padded = np.zeros((256, 256), np.float32)
    padded[:150, :140] = x
    q, s = ref.per_block_cast_to_fp8_reference(x)
    qp, sp = ref.per_block_cast_to_fp8_reference(padded)
    np.testing.assert_array_equal(q, qp[:150, :140])
    np.testing.assert_array_equal(s, sp)
    assert s[1, 1] == np.abs(x[128:, 128:]).max() / np.float32(448)


@pytest.mark.parametrize("cast", [ref.per_token_cast_to_fp8_reference, ref.per_block_cast_to_fp8_reference])
def test_input_dtypes_agree(cast):
    rng = np.random.default_rng(5)
    x_bf16 = rng.standard_normal((130, 300)).astype(BF16)
    x_f16 = rng.standard_normal((130, 300)).astype(np.float16)
    for x in (x_bf16, x_f16):
        q, s = cast(x)
        q32, s32 = cast(x.astype(np.float32))  # widening to float32 is exact
        np.testing.assert_array_equal(q, q32)
        np.testing.assert_array_equal(s, s32)


def test_cast_is_03d0be3_variant_not_head():
    # 03d0be3: q = e4m3(x * (448 / amax)); HEAD: q = e4m3(x * (1 / (amax / 448))). The factors differ by an ulp for
    # some amax, which flips the rounding of values next to a tie. This row is such a case: 03d0be3 gives 0x6C.
    amax = np.uint32(0x3FF4D52D).view(np.float32)   # 1.9127556
    v = np.uint32(0x3EDA99C4).view(np.float32)      # 0.4269544
    x = np.zeros((1, 128), np.float32)
    x[0, :2] = [amax, v]
    ours = ref.float32_to_fp8(np.array([v * (np.float32(448) / amax)]))[0]
    head = ref.float32_to_fp8(np.array([v * (np.float32(1) / (amax / np.float32(448)))]))[0]
    assert (ours, head) == (0x6C, 0x6D)
    for cast in (ref.per_token_cast_to_fp8_reference, ref.per_block_cast_to_fp8_reference):
        q, s = cast(x)
        assert q[0, :2].tolist() == [0x7E, 0x6C]
        assert s[0, 0] == amax / np.float32(448)


def test_cast_validation():
    with pytest.raises(TypeError, match="float32, bfloat16"):
        ref.per_token_cast_to_fp8_reference(np.zeros((2, 128), np.float64))
    with pytest.raises(ValueError, match="2-D"):
        ref.per_block_cast_to_fp8_reference(np.zeros(128, np.float32))
    q, s = ref.per_token_cast_to_fp8_reference(np.zeros((0, 300), np.float32))
    assert q.shape == (0, 300) and s.shape == (0, 3)


def test_dequantize_error_bound():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((64, 300)) * np.exp2(rng.uniform(-8, 8, (64, 1)))).astype(np.float32)
    for cast, deq in ((ref.per_token_cast_to_fp8_reference, ref.dequantize_per_token),
                      (ref.per_block_cast_to_fp8_reference, ref.dequantize_per_block)):
        q, s = cast(x)
        d = deq(q, s)
        assert d.dtype == np.float64 and d.shape == x.shape
        scale = (np.repeat(s, 128, axis=1)[:, :300] if deq is ref.dequantize_per_token
                 else np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)[:64, :300]).astype(np.float64)
        # half an ulp of e4m3: 2^-4 relative for normals, 2^-10 absolute (in quantized units) for subnormals
        bound = np.abs(x) * 2.0 ** -4 * (1 + 1e-6) + scale * 2.0 ** -10
        assert np.all(np.abs(d - x) <= bound)
        assert ref.calc_diff(d, x) < 1e-3


def test_dequantize_shape_checks():
    q = np.zeros((4, 200), np.uint8)
    with pytest.raises(ValueError, match="per-token scales of shape"):
        ref.dequantize_per_token(q, np.ones((4, 1), np.float32))
    with pytest.raises(ValueError, match="per-block scales of shape"):
        ref.dequantize_per_block(q, np.ones((1, 1), np.float32))
    # batched (leading dims) work
    assert ref.dequantize_per_token(np.zeros((2, 3, 130), np.uint8), np.ones((2, 3, 2))).shape == (2, 3, 130)
    assert ref.dequantize_per_block(np.zeros((2, 130, 5), np.uint8), np.ones((2, 2, 1))).shape == (2, 130, 5)


# ---- GEMM references ---------------------------------------------------------------------------------------------

def _random_fp8(rng, shape):
    q = rng.integers(0, 256, shape, dtype=np.uint8)
    q[(q & 0x7F) == 0x7F] = 0x38  # no NaNs
    return q


def _naive_gemm(a_q, sfa, b_q, sfb):
    """D[i, j] = sum_kb sfa[i, kb] * sfb[j // 128, kb] * sum_{k in kb} A[i, k] * B[j, k] (the kernel's formula)."""
    a = _VALUES[a_q.astype(np.int64)]
    b = _VALUES[b_q.astype(np.int64)]
    m, k = a.shape
    n = b.shape[0]
    out = np.zeros((m, n))
    for kb in range(-(-k // 128)):
        ks = slice(kb * 128, (kb + 1) * 128)
        partial = a[:, ks] @ b[:, ks].T
        out += partial * sfa[:, kb][:, None] * np.repeat(sfb[:, kb], 128)[:n][None, :]
    return out


@pytest.mark.parametrize("m,n,k", [(5, 130, 200), (1, 128, 128), (17, 64, 384), (3, 257, 70)])
def test_gemm_reference_matches_naive(m, n, k):
    rng = np.random.default_rng(8)
    a_q, b_q = _random_fp8(rng, (m, k)), _random_fp8(rng, (n, k))
    sfa = rng.uniform(0.1, 2, (m, -(-k // 128))).astype(np.float32)
    sfb = rng.uniform(0.1, 2, (-(-n // 128), -(-k // 128))).astype(np.float32)
    d = ref.gemm_reference(a_q, sfa, b_q, sfb)
    assert d.dtype == np.float64 and d.shape == (m, n)
    np.testing.assert_allclose(d, _naive_gemm(a_q, sfa, b_q, sfb), rtol=1e-12, atol=1e-12 * np.abs(d).max())
    # col-major ("MN-major") scale storage gives the same values
    np.testing.assert_array_equal(ref.gemm_reference(a_q, np.asfortranarray(sfa), b_q, sfb), d)


def test_gemm_reference_close_to_unquantized_product():
    rng = np.random.default_rng(9)
    a = rng.standard_normal((64, 512)).astype(np.float32)
    b = rng.standard_normal((256, 512)).astype(np.float32)
    d = ref.gemm_reference(*ref.per_token_cast_to_fp8_reference(a), *ref.per_block_cast_to_fp8_reference(b))
    assert ref.calc_diff(d, a.astype(np.float64) @ b.T.astype(np.float64)) < 1e-3


def test_gemm_reference_shape_checks():
    a_q, b_q = np.zeros((4, 256), np.uint8), np.zeros((8, 128), np.uint8)
    with pytest.raises(ValueError, match="b_q"):
        ref.gemm_reference(a_q, np.ones((4, 2)), b_q, np.ones((1, 1)))
    with pytest.raises(ValueError, match="a_q"):
        ref.gemm_reference(np.zeros(5, np.uint8), np.ones(1), b_q, np.ones((1, 1)))


def test_grouped_contiguous_reference():
    rng = np.random.default_rng(10)
    g, n, k = 3, 130, 256
    m_indices = np.array([0] * 5 + [-1] * 2 + [2] * 4 + [1] * 3 + [-1], dtype=np.int32)
    m_sum = len(m_indices)
    a_q, b_q = _random_fp8(rng, (m_sum, k)), _random_fp8(rng, (g, n, k))
    sfa = rng.uniform(0.1, 2, (m_sum, 2)).astype(np.float32)
    sfb = rng.uniform(0.1, 2, (g, 2, 2)).astype(np.float32)
    out = ref.grouped_contiguous_reference(a_q, sfa, b_q, sfb, m_indices)
    assert out.shape == (m_sum, n) and out.dtype == np.float64
    for r, gi in enumerate(m_indices):
        if gi < 0:
            assert np.isnan(out[r]).all()
        else:
            want = ref.gemm_reference(a_q[r:r + 1], sfa[r:r + 1], b_q[gi], sfb[gi])[0]
            np.testing.assert_allclose(out[r], want, rtol=0, atol=1e-12 * np.abs(want).max())
    with pytest.raises(ValueError, match="m_indices"):
        ref.grouped_contiguous_reference(a_q, sfa, b_q, sfb, np.full(m_sum, 3, np.int32))
    with pytest.raises(ValueError, match="m_indices"):
        ref.grouped_contiguous_reference(a_q, sfa, b_q, sfb, m_indices[:-1])


def test_grouped_masked_reference():
    rng = np.random.default_rng(11)
    g, max_m, n, k = 3, 20, 64, 200
    masked_m = np.array([20, 0, 7], dtype=np.int32)
    a_q, b_q = _random_fp8(rng, (g, max_m, k)), _random_fp8(rng, (g, n, k))
    sfa = rng.uniform(0.1, 2, (g, max_m, 2)).astype(np.float32)
    sfb = rng.uniform(0.1, 2, (g, 1, 2)).astype(np.float32)
    out = ref.grouped_masked_reference(a_q, sfa, b_q, sfb, masked_m)
    assert out.shape == (g, max_m, n) and out.dtype == np.float64
    for gi in range(g):
        mm = masked_m[gi]
        assert np.isnan(out[gi, mm:]).all()
        want = ref.gemm_reference(a_q[gi, :mm], sfa[gi, :mm], b_q[gi], sfb[gi])
        np.testing.assert_allclose(out[gi, :mm], want, rtol=0, atol=1e-12 * np.abs(want).max(initial=0.0))
    with pytest.raises(ValueError, match="masked_m"):
        ref.grouped_masked_reference(a_q, sfa, b_q, sfb, np.array([21, 0, 0], np.int32))
    with pytest.raises(ValueError, match="masked_m"):
        ref.grouped_masked_reference(a_q, sfa, b_q, sfb, np.array([1, 2], np.int32))


# ---- calc_diff ---------------------------------------------------------------------------------------------------

def test_calc_diff_properties():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((32, 48))
    y = x + 0.01 * rng.standard_normal((32, 48))
    assert ref.calc_diff(x, x) == pytest.approx(0.0, abs=1e-15)
    assert ref.calc_diff(x, -x) == pytest.approx(2.0)
    assert ref.calc_diff(np.zeros(5), np.zeros(5)) == 0.0
    assert ref.calc_diff(np.zeros(5), np.ones(5)) == pytest.approx(1.0)
    assert ref.calc_diff(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(1.0)  # orthogonal
    d = ref.calc_diff(x, y)
    assert d == pytest.approx(ref.calc_diff(y, x))
    assert d == pytest.approx(ref.calc_diff(1000.0 * x, 1000.0 * y))  # scale invariant
    assert d == pytest.approx(np.sum((x - y) ** 2) / (np.sum(x * x) + np.sum(y * y)))
    assert 0 < d < 1e-3
    assert isinstance(d, float)


def test_calc_diff_dtypes_and_shapes():
    x = np.linspace(-3, 3, 64).astype(np.float32)
    assert ref.calc_diff(x.astype(BF16), x.astype(BF16).astype(np.float64)) == pytest.approx(0.0, abs=1e-15)
    assert ref.calc_diff(x, x.astype(BF16)) < 1e-4
    with pytest.raises(ValueError, match="shapes"):
        ref.calc_diff(np.zeros(3), np.zeros(4))


def test_bf16_to_float32():
    vals = np.array([1.0, -2.5, 3.140625, 0.0, -0.0, 1e30], np.float32).astype(BF16)
    bits = vals.view(np.uint16)
    np.testing.assert_array_equal(ref.bf16_to_float32(vals), vals.astype(np.float32))
    np.testing.assert_array_equal(ref.bf16_to_float32(bits), vals.astype(np.float32))
    assert ref.bf16_to_float32(bits[::2]).dtype == np.float32
    assert ref.bf16_to_float32(np.array([0x3F80], np.uint16))[0] == 1.0
    with pytest.raises(TypeError, match="bfloat16"):
        ref.bf16_to_float32(np.zeros(2, np.float32))


@pytest.mark.parametrize("x,y,name", [(None, None, "x"), (np.ones(3), None, "y"), (["a", "b"], np.ones(2), "x"),
                                      (np.ones(2), np.array([object(), object()]), "y")])
def test_calc_diff_refuses_what_is_not_numbers(x, y, name):
    """None would become an object array whose float64 cast is nan: a metric that silently passes no gate."""
    with pytest.raises(TypeError, match=f"^{name}: expected"):
        ref.calc_diff(x, y)


def test_calc_diff_takes_bfloat16_and_ints():
    bf = np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16)
    assert ref.calc_diff(bf, np.arange(4)) == 0.0
