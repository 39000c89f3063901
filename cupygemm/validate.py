"""Argument checking and normalization for the GEMM entry points.

Everything here runs before any launch: a bad argument raises ValueError/TypeError naming the
argument, what was expected and what was given. The result is a :class:`Problem` holding CuPy views of
every operand in the layout the kernel reads.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import KIND_CONTIGUOUS, KIND_MASKED, KIND_NORMAL
from .layout import _col_major_tma_aligned_copy, ceil_div, get_tma_aligned_size
from .tensors import BF16, Framework, as_cupy, framework_of

_INT32_LIMIT = 2**31


@dataclass
class Problem:
    kind: int
    m: int  # rows (normal, contiguous) or max rows per group (masked)
    n: int
    k: int
    num_groups: int
    a: Any  # cupy uint8 [M, K] or [G, M, K]
    sfa: Any  # cupy float32, M-major: base of a [G?][KB][M_pad] buffer
    sfa_m_pad: int
    b: Any  # cupy uint8 [N, K] or [G, N, K]
    sfb: Any  # cupy float32, C-contiguous
    out: Any  # cupy bf16
    grouped_layout: Any  # cupy int32 or None
    device_id: int
    framework: Framework
    out_given: Any  # the caller's `out` object (returned as is), or None


def _pair(x: Any, name: str) -> tuple[Any, Any]:
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise TypeError(f"{name}: expected a (tensor, scales) pair, got {type(x).__name__}")
    return x[0], x[1]


def _fp8(x: Any, name: str, ndim: int):
    arr = as_cupy(x, name)
    if arr.dtype != np.uint8:
        raise TypeError(f"{name}: expected float8_e4m3fn data (or uint8 holding e4m3 bits), got {arr.dtype}")
    _check_ndim(arr, name, ndim)
    return arr


def _check_ndim(arr, name: str, ndim: int) -> None:
    if arr.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got shape {tuple(arr.shape)}")


def _check_rows_tma(arr, name: str) -> None:
    """Unit inner stride, 16-byte aligned base and outer strides (TMA requirements)."""
    item = arr.itemsize
    if arr.strides[-1] != item:
        raise ValueError(f"{name}: expected a unit stride along the last dimension, got strides {arr.strides} (bytes)")
    for d, s in enumerate(arr.strides[:-1]):
        if arr.shape[d] > 1 and (s % 16 or s <= 0):
            raise ValueError(
                f"{name}: expected strides that are positive multiples of 16 bytes for TMA, got {arr.strides} (bytes); "
                f"the last dimension ({arr.shape[-1]}) must be padded so rows start 16-byte aligned"
            )
    if arr.data.ptr % 16:
        raise ValueError(f"{name}: expected a 16-byte aligned base address, got 0x{arr.data.ptr:x}")
    if arr.ndim >= 2 and arr.shape[-2] > 1 and arr.strides[-2] < arr.shape[-1] * item:
        raise ValueError(f"{name}: rows overlap (row stride {arr.strides[-2]} B < row size {arr.shape[-1] * item} B)")


def _f32(x: Any, name: str, shape: tuple[int, ...]):
    arr = as_cupy(x, name)
    if arr.dtype != np.float32:
        raise TypeError(f"{name}: expected float32 scales, got {arr.dtype}")
    if tuple(arr.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(arr.shape)}")
    return arr


def _is_m_major(sfa, m_pad: int, kb: int) -> bool:
    s, shape = sfa.strides, sfa.shape
    inner = (shape[-2] <= 1 or s[-2] == 4) and (shape[-1] <= 1 or s[-1] == 4 * m_pad)
    groups = sfa.ndim == 2 or shape[0] <= 1 or s[0] == 4 * m_pad * kb
    return inner and groups and sfa.data.ptr % 16 == 0


def _sfa_m_major(sfa, m: int, kb: int):
    """SFA as the kernel reads it: M-major, the M stride padded to 16 bytes.

    Already in that layout (DeepGEMM's get_col_major_tma_aligned_tensor): used as is, no kernel runs.
    Otherwise it is transposed once into a new buffer (one small copy kernel).
    """
    import cupy

    m_pad = get_tma_aligned_size(m, 4)
    if _is_m_major(sfa, m_pad, kb):
        return sfa, m_pad
    return _col_major_tma_aligned_copy(sfa, cupy), m_pad


def _device_of(arrs: list, names: list[str]) -> int:
    import cupy

    ids = [a.device.id for a in arrs]
    if len(set(ids)) > 1:
        desc = ", ".join(f"{n} on GPU {i}" for n, i in zip(names, ids))
        raise ValueError(f"all operands must be on one GPU, got {desc}")
    return ids[0] if ids else cupy.cuda.runtime.getDevice()


def _out(out: Any, shape: tuple[int, ...], name: str = "out"):
    import cupy

    if out is None:
        return cupy.empty(shape, dtype=BF16)
    arr = as_cupy(out, name)
    if arr.dtype == np.uint16:
        arr = arr.view(BF16)
    if arr.dtype != BF16:
        raise TypeError(f"{name}: expected a bfloat16 array, got {arr.dtype}")
    if tuple(arr.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(arr.shape)}")
    _check_rows_tma(arr, name)
    return arr


def _check_limits(**dims: int) -> None:
    for k, v in dims.items():
        if v >= _INT32_LIMIT:
            raise ValueError(f"{k} = {v} is too large: dimensions must be below 2^31")


def _check_k_n(k: int, n: int) -> None:
    if k % 16:
        raise ValueError(f"K must be a multiple of 16 (16-byte aligned FP8 rows for TMA), got K = {k}")
    if n % 8:
        raise ValueError(f"N must be a multiple of 8 (16-byte aligned BF16 output rows for TMA), got N = {n}")


def check_inputs_enabled() -> bool:
    """``CUPYGEMM_CHECK_INPUTS=1``: verify m_indices / masked_m on the host (synchronizes)."""
    return os.environ.get("CUPYGEMM_CHECK_INPUTS", "0") not in ("0", "", "false")


def normal(lhs: Any, rhs: Any, out: Any) -> Problem:
    a_in, sfa_in = _pair(lhs, "lhs")
    b_in, sfb_in = _pair(rhs, "rhs")
    a = _fp8(a_in, "lhs[0] (A)", 2)
    b = _fp8(b_in, "rhs[0] (B)", 2)
    m, k = a.shape
    n, kb_ = b.shape
    if kb_ != k:
        raise ValueError(f"A is [M, K] = {tuple(a.shape)} and B is [N, K] = {tuple(b.shape)}: K differs")
    _check_limits(M=m, N=n, K=k)
    _check_k_n(k, n)
    kb = ceil_div(k, 128)
    sfa = _f32(sfa_in, "lhs[1] (A scales)", (m, kb))
    sfb = _f32(sfb_in, "rhs[1] (B scales)", (ceil_div(n, 128), kb))
    _check_rows_tma(a, "lhs[0] (A)")
    _check_rows_tma(b, "rhs[0] (B)")
    if not sfb.flags.c_contiguous:
        raise ValueError("rhs[1] (B scales): expected a C-contiguous array; call .copy() first")
    d = _out(out, (m, n))
    dev = _device_of([a, sfa, b, sfb, d], ["A", "A scales", "B", "B scales", "out"])
    sfa, m_pad = _sfa_m_major(sfa, m, kb)
    return Problem(KIND_NORMAL, m, n, k, 1, a, sfa, m_pad, b, sfb, d, None, dev, framework_of(a_in), out)


def _grouped_b(rhs: Any, k: int):
    b_in, sfb_in = _pair(rhs, "rhs")
    b = _fp8(b_in, "rhs[0] (B)", 3)
    g, n, kb_ = b.shape
    if kb_ != k:
        raise ValueError(f"A has K = {k} but B is [G, N, K] = {tuple(b.shape)}")
    sfb = _f32(sfb_in, "rhs[1] (B scales)", (g, ceil_div(n, 128), ceil_div(k, 128)))
    _check_rows_tma(b, "rhs[0] (B)")
    if not sfb.flags.c_contiguous:
        raise ValueError("rhs[1] (B scales): expected a C-contiguous array; call .copy() first")
    return b, sfb, g, n


def _int32_vector(x: Any, name: str, length: int):
    arr = as_cupy(x, name)
    if arr.dtype != np.int32:
        raise TypeError(f"{name}: expected int32, got {arr.dtype}")
    if arr.ndim != 1 or arr.shape[0] != length:
        raise ValueError(f"{name}: expected shape ({length},), got {tuple(arr.shape)}")
    if not arr.flags.c_contiguous:
        raise ValueError(f"{name}: expected a contiguous array")
    return arr


def contiguous(lhs: Any, rhs: Any, out: Any, m_indices: Any) -> Problem:
    a_in, sfa_in = _pair(lhs, "lhs")
    a = _fp8(a_in, "lhs[0] (A)", 2)
    m, k = a.shape
    b, sfb, g, n = _grouped_b(rhs, k)
    _check_limits(M=m, N=n, K=k, G=g)
    _check_k_n(k, n)
    kb = ceil_div(k, 128)
    sfa = _f32(sfa_in, "lhs[1] (A scales)", (m, kb))
    _check_rows_tma(a, "lhs[0] (A)")
    idx = _int32_vector(m_indices, "m_indices", m)
    d = _out(out, (m, n))
    dev = _device_of([a, sfa, b, sfb, d, idx], ["A", "A scales", "B", "B scales", "out", "m_indices"])
    if check_inputs_enabled():
        check_m_indices(idx.get(), g)
    sfa, m_pad = _sfa_m_major(sfa, m, kb)
    return Problem(KIND_CONTIGUOUS, m, n, k, g, a, sfa, m_pad, b, sfb, d, idx, dev, framework_of(a_in), out)


def masked(lhs: Any, rhs: Any, out: Any, masked_m: Any, expected_m: int) -> Problem:
    a_in, sfa_in = _pair(lhs, "lhs")
    a = _fp8(a_in, "lhs[0] (A)", 3)
    g, m, k = a.shape
    b, sfb, gb, n = _grouped_b(rhs, k)
    if gb != g:
        raise ValueError(f"A has {g} groups ([G, max_m, K] = {tuple(a.shape)}) but B has {gb}")
    _check_limits(max_m=m, N=n, K=k, G=g, total_rows=g * m)
    _check_k_n(k, n)
    if isinstance(expected_m, bool) or not isinstance(expected_m, (int, np.integer)) or expected_m < 0:
        raise ValueError(f"expected_m: expected a non-negative int, got {expected_m!r}")
    kb = ceil_div(k, 128)
    sfa = _f32(sfa_in, "lhs[1] (A scales)", (g, m, kb))
    _check_rows_tma(a, "lhs[0] (A)")
    mm = _int32_vector(masked_m, "masked_m", g)
    d = _out(out, (g, m, n))
    if g > 1 and d.strides[0] != m * d.strides[1]:
        # The kernel finds a group's rows of D at group x M rows (its partial tiles are stored row by row).
        raise ValueError(f"out: expected the groups back to back (strides[0] == M x strides[1] = {m * d.strides[1]} "
                         f"bytes), got strides {tuple(d.strides)}; pass out=None or an array allocated as (G, M, N)")
    dev = _device_of([a, sfa, b, sfb, d, mm], ["A", "A scales", "B", "B scales", "out", "masked_m"])
    if check_inputs_enabled():
        check_masked_m(mm.get(), m)
    sfa, m_pad = _sfa_m_major(sfa, m, kb)
    return Problem(KIND_MASKED, m, n, k, g, a, sfa, m_pad, b, sfb, d, mm, dev, framework_of(a_in), out)


def check_m_indices(idx: np.ndarray, num_groups: int, alignment: int = 128) -> None:
    """Host check of a contiguous layout: values in [-1, G), each ``alignment``-row block one group.

    Raises ValueError naming the first bad entry.
    """
    idx = np.asarray(idx)
    bad = np.nonzero((idx < -1) | (idx >= num_groups))[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"m_indices[{i}] = {int(idx[i])} is outside [-1, {num_groups}) (G = {num_groups})")
    for start in range(0, idx.shape[0], alignment):
        block = idx[start:start + alignment]
        first = int(block[0])
        wrong = np.nonzero((block != first) & (block != -1))[0] if first != -1 else np.nonzero(block != -1)[0]
        if wrong.size:
            i = start + int(wrong[0])
            raise ValueError(
                f"m_indices[{i}] = {int(idx[i])}: group boundaries must be aligned to {alignment} rows "
                f"(rows {start}..{start + len(block) - 1} start with {first}; pad each group with -1 rows)"
            )


def check_masked_m(masked_m: np.ndarray, max_m: int) -> None:
    """Host check: every masked_m[g] in [0, max_m]. Raises ValueError naming the first bad entry."""
    masked_m = np.asarray(masked_m)
    bad = np.nonzero((masked_m < 0) | (masked_m > max_m))[0]
    if bad.size:
        g = int(bad[0])
        raise ValueError(f"masked_m[{g}] = {int(masked_m[g])} is outside [0, {max_m}] (max_m = {max_m})")
