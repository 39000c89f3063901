"""CPU reference implementations (NumPy + ml_dtypes): FP8 casts, dequantization, GEMMs, ``calc_diff``.

These define what the GPU code must produce. Everything here runs on the host; CuPy arrays are accepted where
noted and copied to the host with ``.get()``.

Quantization follows DeepGEMM 03d0be3 (``tests/test_core.py``: ``per_token_cast_to_fp8`` /
``per_block_cast_to_fp8``), the "03d0be3 variant"::

    x is padded with zeros to multiples of 128 along the quantized dimensions
    amax  = max(max|x| over the group, computed in float32, 1e-4)
    q     = e4m3fn(x * (448 / amax))    # float32 product, round to nearest even
    scale = amax / 448                  # float32

DeepGEMM HEAD instead computes ``sf = amax / 448; q = e4m3fn(x * (1 / sf))``, which differs in the last bit for some
inputs; it is *not* what these functions (or :mod:`cupygemm.quantization`) do. Since ``|x * 448 / amax| <= 448`` up
to one rounding, saturation never changes a result; values are clipped to +-448 before the cast only because
ml_dtypes turns out-of-range values into NaN instead of saturating.

FP8 tensors are ``uint8`` arrays of e4m3fn bits (the form CuPy and the GEMM use).
"""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .util import ceil_div

__all__ = [
    "FP8_E4M3_MAX",
    "MIN_AMAX",
    "GROUP",
    "per_token_cast_to_fp8_reference",
    "per_block_cast_to_fp8_reference",
    "fp8_to_float32",
    "float32_to_fp8",
    "dequantize_per_token",
    "dequantize_per_block",
    "gemm_reference",
    "grouped_contiguous_reference",
    "grouped_masked_reference",
    "wgrad_reference",
    "k_grouped_wgrad_reference",
    "k_grouped_wgrad_columns_reference",
    "calc_diff",
    "bf16_to_float32",
]

#: Largest finite e4m3fn value.
FP8_E4M3_MAX = 448.0
#: Lower clamp of a group's amax (so all-zero groups get the scale 1e-4 / 448).
MIN_AMAX = 1e-4
#: Quantization group size (1x128 per token, 128x128 per block).
GROUP = 128

_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_CAST_INPUTS = (np.dtype(np.float32), _BF16, np.dtype(np.float16))


def _host(x: Any, name: str) -> np.ndarray:
    """``x`` as a NumPy array (CuPy arrays are copied to the host)."""
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.split(".")[0] == "cupy" and hasattr(x, "get"):
        return x.get()
    try:
        return np.asarray(x)
    except Exception as e:
        raise TypeError(f"{name}: expected a NumPy or CuPy array, got {type(x).__name__}") from e


def _cast_input(x: Any, name: str = "x") -> np.ndarray:
    x = _host(x, name)
    if x.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D [m, n] array, got shape {x.shape}")
    if x.dtype not in _CAST_INPUTS:
        raise TypeError(f"{name}: expected float32, bfloat16 (ml_dtypes) or float16, got {x.dtype}")
    return x.astype(np.float32)  # exact for all three


def float32_to_fp8(y: np.ndarray) -> np.ndarray:
    """float32 -> e4m3fn bits (uint8), round to nearest even, saturating at +-448 (NaN stays NaN)."""
    y = np.asarray(y, dtype=np.float32)
    clipped = np.clip(y, np.float32(-FP8_E4M3_MAX), np.float32(FP8_E4M3_MAX))
    return np.ascontiguousarray(clipped.astype(_E4M3).view(np.uint8))


def _scales_and_factors(amax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    amax = np.maximum(amax.astype(np.float32), np.float32(MIN_AMAX))
    factor = np.float32(FP8_E4M3_MAX) / amax  # float32 / float32 -> float32, IEEE round to nearest
    scale = amax / np.float32(FP8_E4M3_MAX)
    return scale.astype(np.float32), factor.astype(np.float32)


def per_token_cast_to_fp8_reference(x: Any) -> tuple[np.ndarray, np.ndarray]:
    """1x128 FP8 cast of ``x`` [m, n] (float32, ml_dtypes.bfloat16 or float16), DeepGEMM 03d0be3 variant.

    ``n`` is padded with zeros to a multiple of 128; each row's 128-column group gets
    ``amax = max(max|x|, 1e-4)`` (float32), ``q = e4m3fn(x * (448 / amax))`` and ``s = amax / 448``.

    Returns ``(q, s)``: ``q`` uint8 [m, n] (e4m3fn bits), ``s`` float32 [m, ceil(n/128)].
    """
    x32 = _cast_input(x)
    m, n = x32.shape
    nb = ceil_div(n, GROUP)
    padded = np.zeros((m, nb * GROUP), dtype=np.float32)
    padded[:, :n] = x32
    groups = padded.reshape(m, nb, GROUP)
    scale, factor = _scales_and_factors(np.abs(groups).max(axis=2, initial=np.float32(0)))
    q = float32_to_fp8(groups * factor[:, :, None]).reshape(m, nb * GROUP)[:, :n]
    return np.ascontiguousarray(q), scale


def per_block_cast_to_fp8_reference(x: Any) -> tuple[np.ndarray, np.ndarray]:
    """128x128 FP8 cast of ``x`` [m, n] (float32, ml_dtypes.bfloat16 or float16), DeepGEMM 03d0be3 variant.

    ``m`` and ``n`` are padded with zeros to multiples of 128; each 128x128 block gets
    ``amax = max(max|x|, 1e-4)`` (float32), ``q = e4m3fn(x * (448 / amax))`` and ``s = amax / 448``.

    Returns ``(q, s)``: ``q`` uint8 [m, n] (e4m3fn bits), ``s`` float32 [ceil(m/128), ceil(n/128)].
    """
    x32 = _cast_input(x)
    m, n = x32.shape
    mb, nb = ceil_div(m, GROUP), ceil_div(n, GROUP)
    padded = np.zeros((mb * GROUP, nb * GROUP), dtype=np.float32)
    padded[:m, :n] = x32
    blocks = padded.reshape(mb, GROUP, nb, GROUP)
    scale, factor = _scales_and_factors(np.abs(blocks).max(axis=(1, 3), initial=np.float32(0)))
    q = float32_to_fp8(blocks * factor[:, None, :, None]).reshape(mb * GROUP, nb * GROUP)[:m, :n]
    return np.ascontiguousarray(q), scale


def fp8_to_float32(q: Any) -> np.ndarray:
    """e4m3fn values (uint8 bits or an ml_dtypes.float8_e4m3fn array) -> float32 (exact)."""
    q = _host(q, "q")
    if q.dtype == np.uint8:
        q = q.view(_E4M3)
    elif q.dtype != _E4M3:
        raise TypeError(f"q: expected uint8 (e4m3fn bits) or float8_e4m3fn, got {q.dtype}")
    return q.astype(np.float32)


def _expand(s: np.ndarray, axis: int, size: int) -> np.ndarray:
    return np.repeat(s, GROUP, axis=axis).take(np.arange(size), axis=axis)


def dequantize_per_token(q: Any, s: Any) -> np.ndarray:
    """``q`` [..., m, k] e4m3fn bits times 1x128 scales ``s`` [..., m, ceil(k/128)], as float64."""
    qf = fp8_to_float32(q).astype(np.float64)
    s = _host(s, "s").astype(np.float64)
    if qf.ndim < 1:
        raise ValueError("q: expected at least a 1-D array")
    k = qf.shape[-1]
    expected = qf.shape[:-1] + (ceil_div(k, GROUP),)
    if s.shape != expected:
        raise ValueError(f"s: expected per-token scales of shape {expected} for q of shape {qf.shape}, got {s.shape}")
    return qf * _expand(s, -1, k)


def dequantize_per_block(q: Any, s: Any) -> np.ndarray:
    """``q`` [..., n, k] e4m3fn bits times 128x128 scales ``s`` [..., ceil(n/128), ceil(k/128)], as float64."""
    qf = fp8_to_float32(q).astype(np.float64)
    s = _host(s, "s").astype(np.float64)
    if qf.ndim < 2:
        raise ValueError(f"q: expected at least a 2-D array, got shape {qf.shape}")
    n, k = qf.shape[-2:]
    expected = qf.shape[:-2] + (ceil_div(n, GROUP), ceil_div(k, GROUP))
    if s.shape != expected:
        raise ValueError(f"s: expected per-block scales of shape {expected} for q of shape {qf.shape}, got {s.shape}")
    return qf * _expand(_expand(s, -1, k), -2, n)


def _check_ndim(arr: np.ndarray, ndim: int, name: str, what: str) -> None:
    if arr.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array {what}, got shape {arr.shape}")


def gemm_reference(a_q: Any, sfa: Any, b_q: Any, sfb: Any) -> np.ndarray:
    """D = dequant(A) @ dequant(B).T in float64: the exact value the FP8 GEMM approximates.

    ``a_q`` [m, k] e4m3fn bits with 1x128 scales ``sfa`` [m, ceil(k/128)] (any memory layout, e.g. the
    col-major TMA-aligned one); ``b_q`` [n, k] with 128x128 scales ``sfb`` [ceil(n/128), ceil(k/128)].
    ``k`` need not be a multiple of 128. Returns float64 [m, n].
    """
    a_q, b_q = _host(a_q, "a_q"), _host(b_q, "b_q")
    _check_ndim(a_q, 2, "a_q", "[m, k]")
    _check_ndim(b_q, 2, "b_q", "[n, k]")
    if a_q.shape[1] != b_q.shape[1]:
        raise ValueError(f"b_q: expected k = {a_q.shape[1]} columns (like a_q), got shape {b_q.shape}")
    a = dequantize_per_token(a_q, sfa)
    b = dequantize_per_block(b_q, sfb)
    return a @ b.T


def grouped_contiguous_reference(a_q: Any, sfa: Any, b_q: Any, sfb: Any, m_indices: Any) -> np.ndarray:
    """M-grouped contiguous GEMM reference: row r of the output is A[r] @ dequant(B[m_indices[r]]).T.

    ``a_q`` [m_sum, k], ``sfa`` [m_sum, ceil(k/128)], ``b_q`` [G, n, k], ``sfb`` [G, ceil(n/128), ceil(k/128)],
    ``m_indices`` int [m_sum] with values in [-1, G). Rows with ``m_indices == -1`` are NaN (mask them out).
    Returns float64 [m_sum, n].
    """
    a_q, b_q = _host(a_q, "a_q"), _host(b_q, "b_q")
    idx = _host(m_indices, "m_indices")
    _check_ndim(a_q, 2, "a_q", "[m_sum, k]")
    _check_ndim(b_q, 3, "b_q", "[G, n, k]")
    num_groups, n, k = b_q.shape
    if a_q.shape[1] != k:
        raise ValueError(f"a_q: expected k = {k} columns (like b_q), got shape {a_q.shape}")
    if idx.shape != (a_q.shape[0],) or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"m_indices: expected integers of shape ({a_q.shape[0]},), got {idx.dtype} {idx.shape}")
    if idx.size and (idx.min() < -1 or idx.max() >= num_groups):
        raise ValueError(f"m_indices: values must be in [-1, {num_groups}), got range [{idx.min()}, {idx.max()}]")
    a = dequantize_per_token(a_q, sfa)
    b = dequantize_per_block(b_q, sfb)
    out = np.full((a_q.shape[0], n), np.nan, dtype=np.float64)
    for g in range(num_groups):
        rows = idx == g
        if rows.any():
            out[rows] = a[rows] @ b[g].T
    return out


def grouped_masked_reference(a_q: Any, sfa: Any, b_q: Any, sfb: Any, masked_m: Any) -> np.ndarray:
    """M-grouped masked GEMM reference: out[g, :masked_m[g]] = A[g, :masked_m[g]] @ dequant(B[g]).T.

    ``a_q`` [G, max_m, k], ``sfa`` [G, max_m, ceil(k/128)], ``b_q`` [G, n, k], ``sfb`` [G, ceil(n/128), ceil(k/128)],
    ``masked_m`` int [G] with values in [0, max_m]. Rows at or past ``masked_m[g]`` are NaN.
    Returns float64 [G, max_m, n].
    """
    a_q, b_q = _host(a_q, "a_q"), _host(b_q, "b_q")
    mm = _host(masked_m, "masked_m")
    _check_ndim(a_q, 3, "a_q", "[G, max_m, k]")
    _check_ndim(b_q, 3, "b_q", "[G, n, k]")
    num_groups, max_m, k = a_q.shape
    if b_q.shape[0] != num_groups or b_q.shape[2] != k:
        raise ValueError(f"b_q: expected shape ({num_groups}, n, {k}) to match a_q {a_q.shape}, got {b_q.shape}")
    if mm.shape != (num_groups,) or not np.issubdtype(mm.dtype, np.integer):
        raise ValueError(f"masked_m: expected integers of shape ({num_groups},), got {mm.dtype} {mm.shape}")
    if mm.size and (mm.min() < 0 or mm.max() > max_m):
        raise ValueError(f"masked_m: values must be in [0, {max_m}], got range [{mm.min()}, {mm.max()}]")
    a = dequantize_per_token(a_q, sfa)
    b = dequantize_per_block(b_q, sfb)
    out = np.full((num_groups, max_m, b_q.shape[1]), np.nan, dtype=np.float64)
    for g in range(num_groups):
        rows = int(mm[g])
        out[g, :rows] = a[g, :rows] @ b[g].T
    return out


def wgrad_reference(a_bits: Any, sfa: Any, b_bits: Any, sfb: Any, c: Any) -> np.ndarray:
    """Weight-gradient GEMM reference (both operands 1x128-scaled along K, accumulated): ``c + dequant(A) @
    dequant(B).T`` in float64.

    ``a_bits`` [m, k] and ``b_bits`` [n, k] e4m3fn bits (uint8) or float8_e4m3fn; ``sfa`` [m, ceil(k/128)] and ``sfb``
    [n, ceil(k/128)] per-token scales (the casts' layout; the kernel's M-major [ceil(k/128), m] is ``sfa.T``); ``c``
    [m, n], the accumulator's value before the GEMM. ``k`` need not be a multiple of 128 and may be 0 (returns ``c``).
    Returns float64 [m, n].
    """
    a_bits, b_bits = _host(a_bits, "a_bits"), _host(b_bits, "b_bits")
    _check_ndim(a_bits, 2, "a_bits", "[m, k]")
    _check_ndim(b_bits, 2, "b_bits", "[n, k]")
    m, k = a_bits.shape
    n = b_bits.shape[0]
    if b_bits.shape[1] != k:
        raise ValueError(f"b_bits: expected k = {k} columns (like a_bits), got shape {b_bits.shape}")
    c = _host(c, "c").astype(np.float64)
    if c.shape != (m, n):
        raise ValueError(f"c: expected shape ({m}, {n}), got {c.shape}")
    a = dequantize_per_token(a_bits, sfa)
    b = dequantize_per_token(b_bits, sfb)
    return c + a @ b.T


def k_grouped_wgrad_reference(a_flat: Any, sfa: Any, b_flat: Any, sfb: Any, c: Any, batch_sizes: Any) -> np.ndarray:
    """K-grouped weight-gradient GEMM reference: ``out[g] = c[g] + dequant(A_g) @ dequant(B_g).T`` in float64.

    Group g (K = ``batch_sizes[g]`` >= 0 tokens) has A_g [m, k_g] at byte ``m * sum_{h<g} k_h`` of the flat e4m3 bits
    ``a_flat`` and B_g [n, k_g] at ``n * sum_{h<g} k_h`` of ``b_flat``; the scales are stacked M-major (DeepGEMM's
    layout): ``sfa`` [rows, m], group g's K blocks in rows ``sum_{h<g} ceil(k_h/128)`` onwards (``sfb`` [rows, n]
    likewise; columns past m or n, e.g. padding to a multiple of 4, are ignored). ``c`` [G, m, n]. Groups with
    k_g = 0 keep ``c[g]``. Returns float64 [G, m, n].
    """
    a_flat, b_flat = _host(a_flat, "a_flat").reshape(-1), _host(b_flat, "b_flat").reshape(-1)
    sfa, sfb = _host(sfa, "sfa"), _host(sfb, "sfb")
    sizes = [int(s) for s in _host(batch_sizes, "batch_sizes").reshape(-1)]
    c = _host(c, "c").astype(np.float64)
    _check_ndim(c, 3, "c", "[G, m, n]")
    num_groups, m, n = c.shape
    if len(sizes) != num_groups or min(sizes, default=0) < 0:
        raise ValueError(f"batch_sizes: expected {num_groups} non-negative sizes, got {sizes}")
    total = sum(sizes)
    if a_flat.size < m * total or b_flat.size < n * total:
        raise ValueError(f"a_flat/b_flat: need {m * total} and {n * total} elements, got {a_flat.size}, {b_flat.size}")
    rows = sum(ceil_div(k, GROUP) for k in sizes)
    if sfa.ndim != 2 or sfb.ndim != 2 or sfa.shape[0] < rows or sfb.shape[0] < rows or sfa.shape[1] < m or \
            sfb.shape[1] < n:
        raise ValueError(f"sfa/sfb: expected [>= {rows}, >= {m}] and [>= {rows}, >= {n}], got {sfa.shape}, {sfb.shape}")
    out = c.copy()
    k0 = row0 = 0
    for g, k in enumerate(sizes):
        kb = ceil_div(k, GROUP)
        if k:
            a_g = a_flat[m * k0:m * (k0 + k)].reshape(m, k)
            b_g = b_flat[n * k0:n * (k0 + k)].reshape(n, k)
            a = dequantize_per_token(a_g, sfa[row0:row0 + kb, :m].T)
            b = dequantize_per_token(b_g, sfb[row0:row0 + kb, :n].T)
            out[g] += a @ b.T
        k0 += k
        row0 += kb
    return out


def k_grouped_wgrad_columns_reference(a_bits: Any, sfa: Any, b_bits: Any, sfb: Any, c: Any,
                                      group_sizes: Any) -> np.ndarray:
    """Columns-layout k-grouped weight-gradient reference: ``out[g] = c[g] + dequant(A)[:, o_g:o_g+k_g] @
    dequant(B)[:, o_g:o_g+k_g].T`` in float64, ``o_g = sum_{h<g} k_h``.

    ``a_bits`` [m, T], ``b_bits`` [n, T] e4m3 bits; ``sfa`` [m, ceil(T/128)] and ``sfb`` [n, ceil(T/128)] (the
    transposed casts' layout: the whole matrix's 1x128 blocks); ``c`` [G, m, n]. Every non-empty group but the last
    must start on a multiple of 128 columns (its blocks are then its own). Returns float64 [G, m, n].
    """
    a_bits, b_bits = _host(a_bits, "a_bits"), _host(b_bits, "b_bits")
    _check_ndim(a_bits, 2, "a_bits", "[m, T]")
    _check_ndim(b_bits, 2, "b_bits", "[n, T]")
    sizes = [int(s) for s in _host(group_sizes, "group_sizes").reshape(-1)]
    c = _host(c, "c").astype(np.float64)
    _check_ndim(c, 3, "c", "[G, m, n]")
    if len(sizes) != c.shape[0] or min(sizes, default=0) < 0 or sum(sizes) > a_bits.shape[1]:
        raise ValueError(f"group_sizes: expected {c.shape[0]} non-negative sizes summing to at most "
                         f"{a_bits.shape[1]}, got {sizes}")
    a = dequantize_per_token(a_bits, sfa)
    b = dequantize_per_token(b_bits, sfb)
    out = c.copy()
    k0 = 0
    for g, k in enumerate(sizes):
        if k and k0 % GROUP:
            raise ValueError(f"group_sizes: group {g} starts at column {k0}, not a multiple of {GROUP}")
        out[g] += a[:, k0:k0 + k] @ b[:, k0:k0 + k].T
        k0 += k
    return out


def calc_diff(x: Any, y: Any) -> float:
    """DeepGEMM's error metric: ``1 - 2 * sum(x * y) / sum(x * x + y * y)`` in float64.

    Equals ``|x - y|^2 / (|x|^2 + |y|^2)``: 0 for identical inputs, 2 for ``y = -x``, invariant under scaling both.
    Returns 0.0 when both are all zeros. Accepts NumPy (including ml_dtypes.bfloat16) or CuPy arrays of one shape;
    TypeError for anything that is not numbers (None, strings, objects).
    """
    x, y = _numbers(x, "x"), _numbers(y, "y")
    if x.shape != y.shape:
        raise ValueError(f"calc_diff: shapes differ: x {x.shape} vs y {y.shape}")
    denominator = float((x * x + y * y).sum())
    if denominator == 0.0:
        return 0.0
    return float(1.0 - 2.0 * float((x * y).sum()) / denominator)


def _numbers(x: Any, name: str) -> np.ndarray:
    """``x`` as float64; TypeError for anything else (None would become an object array whose cast is nan)."""
    arr = _host(x, name)
    if arr.dtype.kind not in "biuf" and arr.dtype.type.__module__ != "ml_dtypes":
        raise TypeError(f"{name}: expected a NumPy or CuPy array of numbers, got {type(x).__name__}"
                        + (f" of dtype {arr.dtype}" if x is not None else ""))
    return arr.astype(np.float64)


def bf16_to_float32(arr: Any) -> np.ndarray:
    """bfloat16 values (an ml_dtypes.bfloat16 array, or uint16 raw bits) -> float32 (exact)."""
    arr = _host(arr, "arr")
    if arr.dtype == _BF16:
        return arr.astype(np.float32)
    if arr.dtype == np.uint16:
        return (arr.astype(np.uint32) << np.uint32(16)).view(np.float32)
    raise TypeError(f"arr: expected bfloat16 (ml_dtypes) or uint16 bits, got {arr.dtype}")
