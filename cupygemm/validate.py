"""Argument checking for the GEMM entry points, on :class:`~cupygemm.tensors.View` s (metadata only).

Everything here runs before any launch: a bad argument raises ValueError/TypeError naming the argument, what was
expected and what was given. The result is a :class:`Problem`: the sizes, and how SFA is laid out. What a check
depends on besides the pointers (shapes, strides, dtypes, devices) is part of the launch plan's key
(:mod:`cupygemm.plan`), so a call that reuses a plan passed these checks already; the pointer checks
(:func:`aligned`) run on every call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .env import check_inputs_enabled  # noqa: F401 - the entry points ask validate whether to check on the host
from .layout import get_tma_aligned_size
from .tensors import BF16, F32, FP8_E4M3, I32, U8, View
from .util import ceil_div

_INT32_LIMIT = 2**31
TMA_ALIGN = 16


class Names(NamedTuple):
    """The operands' names in messages: the eager entry points' (:data:`EAGER`) or a frontend's own (JAX's)."""

    a: str = "lhs[0] (A)"
    sfa: str = "lhs[1] (A scales)"
    b: str = "rhs[0] (B)"
    sfb: str = "rhs[1] (B scales)"
    out: str = "out"
    layout: str | None = None  # the kind's layout operand (None: the kind's own name for it, e.g. m_indices)


#: The names the eager entry points use (DeepGEMM's ``lhs``/``rhs`` pairs).
EAGER = Names()


@dataclass(frozen=True)
class Problem:
    kind: object  # the GemmKind (cupygemm.kinds)
    m: int  # rows (normal, contiguous) or max rows per group (masked)
    n: int
    k: int
    num_groups: int
    sfa_m_major: bool  # SFA is already in the kernel's layout (else it is copied into it per call)
    sfa_m_pad: int  # M stride of that layout, in elements
    device: int
    out_shape: tuple[int, ...]
    # SFA's (group, row, column) strides in elements where it must be copied into the kernels' layout and the copy
    # kernel can read it (cupygemm.sfa_layout); None otherwise
    sfa_strides: tuple[int, int, int] | None = None
    # 1D1D kinds (B scaled per 1x128 like A): whether SFB is in the kernel's N-major layout already, its N stride,
    # and its strides for the copy otherwise (as for SFA)
    sfb_m_major: bool = True
    sfb_m_pad: int = 0
    sfb_strides: tuple[int, int, int] | None = None


def pair(x: object, name: str) -> tuple[object, object]:
    if type(x) is tuple and len(x) == 2:
        return x
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise TypeError(f"{name}: expected a (tensor, scales) pair, got {type(x).__name__}")
    return x[0], x[1]


def fp8(v: View, name: str, ndim: int) -> None:
    if v.dtype != U8 and v.dtype != FP8_E4M3:
        raise TypeError(f"{name}: expected float8_e4m3fn data (or uint8 holding e4m3 bits), got {v.dtype}")
    check_ndim(v, name, ndim)


def nt_operands(a: View, b: View, names: "Names", k_name: str = "K") -> tuple[int, int, int]:
    """A [M, K] and B [N, K], FP8, with one K: returns (M, N, K)."""
    fp8(a, names.a, 2)
    fp8(b, names.b, 2)
    m, k = a.shape
    n, kb = b.shape
    if kb != k:
        raise ValueError(f"{names.a} is [M, K] = {tuple(a.shape)} and {names.b} is [N, K] = {tuple(b.shape)}: "
                         f"{k_name} differs")
    check_limits(M=m, N=n, K=k)
    return m, n, k


def check_ndim(v: View, name: str, ndim: int) -> None:
    if v.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got shape {tuple(v.shape)}")


def check_rows_tma(v: View, name: str) -> None:
    """Unit inner stride, 16-byte aligned base and outer strides (TMA requirements)."""
    item = v.itemsize
    if v.strides[-1] != item and v.shape[-1] > 1:
        raise ValueError(f"{name}: expected a unit stride along the last dimension, got strides {v.strides} (bytes)")
    for d, s in enumerate(v.strides[:-1]):
        if v.shape[d] > 1 and (s % TMA_ALIGN or s <= 0):
            raise ValueError(
                f"{name}: expected strides that are positive multiples of 16 bytes for TMA, got {v.strides} (bytes); "
                f"the last dimension ({v.shape[-1]}) must be padded so rows start 16-byte aligned"
            )
    if v.ptr % TMA_ALIGN:
        raise ValueError(f"{name}: expected a 16-byte aligned base address, got 0x{v.ptr:x}")
    if v.ndim >= 2 and v.shape[-2] > 1 and v.strides[-2] < v.shape[-1] * item:
        raise ValueError(f"{name}: rows overlap (row stride {v.strides[-2]} B < row size {v.shape[-1] * item} B)")


def f32(v: View, name: str, shape: tuple[int, ...]) -> None:
    if v.dtype != F32:
        raise TypeError(f"{name}: expected float32 scales, got {v.dtype}")
    if tuple(v.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(v.shape)}")


def is_m_major(sfa: View, m_pad: int, kb: int) -> bool:
    """SFA already in the kernel's layout: M-major, the M stride padded to 16 bytes, 16-byte aligned."""
    s, shape = sfa.strides, sfa.shape
    inner = (shape[-2] <= 1 or s[-2] == 4) and (shape[-1] <= 1 or s[-1] == 4 * m_pad)
    groups = sfa.ndim == 2 or shape[0] <= 1 or s[0] == 4 * m_pad * kb
    return inner and groups and sfa.ptr % TMA_ALIGN == 0


def sfa_copy_strides(sfa: View, m_major: bool) -> tuple[int, int, int] | None:
    """SFA's (group, row, column) strides in elements, for the copy into the kernels' layout; None when SFA is in
    that layout already, or when its strides are negative or not whole elements (the framework copies it then)."""
    if m_major:
        return None
    strides = (0,) * (3 - sfa.ndim) + tuple(sfa.strides)
    if any(s < 0 or s % 4 for s in strides):
        return None
    return strides[0] // 4, strides[1] // 4, strides[2] // 4


def device_of(views: list[View], names: list[str]) -> int:
    ids = [v.device for v in views]
    if len(set(ids)) > 1:
        desc = ", ".join(f"{n} on GPU {i}" for n, i in zip(names, ids))
        raise ValueError(f"all operands must be on one GPU, got {desc}")
    return ids[0]


def out_operand(out: View | None, shape: tuple[int, ...], name: str = "out", dtype: np.dtype = BF16) -> None:
    """The output's dtype (bfloat16 also as uint16 bits; float32), shape, and TMA-able rows."""
    if out is None:
        return
    if out.dtype != dtype and not (dtype == BF16 and out.dtype == np.uint16):
        raise TypeError(f"{name}: expected a {dtype.name} array, got {out.dtype}")
    if tuple(out.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(out.shape)}")
    rows_tma_unless_empty(out, name)


def check_limits(**dims: int) -> None:
    """ValueError naming the first of ``dims`` (name=size) that the kernels' 32-bit indexing cannot address."""
    for k, v in dims.items():
        if v >= _INT32_LIMIT:
            raise ValueError(f"{k} = {v} is too large: dimensions must be below 2^31")


def check_k_n(k: int, n: int) -> None:
    """ValueError unless K and N give the 16-byte aligned rows TMA needs."""
    if k % 16:
        raise ValueError(f"K must be a multiple of 16 (16-byte aligned FP8 rows for TMA), got K = {k}")
    if n % 8:
        raise ValueError(f"N must be a multiple of 8 (16-byte aligned BF16 output rows for TMA), got N = {n}")


def rows_tma_unless_empty(v: View, name: str) -> None:
    """Operands with no elements are never read: their strides and pointer do not matter (CuPy gives fresh empty
    arrays zero strides and a null pointer)."""
    if v.size:
        check_rows_tma(v, name)


def int32_vector(v: View, name: str, length: int) -> None:
    if v.dtype != I32:
        raise TypeError(f"{name}: expected int32, got {v.dtype}")
    if v.ndim != 1 or v.shape[0] != length:
        raise ValueError(f"{name}: expected shape ({length},), got {tuple(v.shape)}")
    if not v.c_contiguous:
        raise ValueError(f"{name}: expected a contiguous array")


def check_expected_m(expected_m: object) -> None:
    if isinstance(expected_m, bool) or not isinstance(expected_m, (int, np.integer)) or expected_m < 0:
        raise ValueError(f"expected_m: expected a non-negative int, got {expected_m!r}")


def aligned(*ptrs: int) -> bool:
    """Every pointer 16-byte aligned (what TMA needs of A, B, SFA and D on every call)."""
    acc = 0
    for p in ptrs:
        acc |= p
    return acc % TMA_ALIGN == 0


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
