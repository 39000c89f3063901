"""DeepGEMM-compatible layout utilities (03d0be3 names and semantics).

* :func:`ceil_div`, :func:`get_tma_aligned_size`, :func:`get_m_alignment_for_contiguous_layout`: plain integer helpers.
* :func:`get_col_major_tma_aligned_tensor`: the LHS scale layout the GEMM kernels read with TMA: ``[m, kb]`` (or
  ``[g, m, kb]``) FP32 values stored M-major ("column-major"), with the M stride padded so each column is a multiple
  of 16 bytes.
"""
from __future__ import annotations

import operator
from typing import Any

import numpy as np

from . import util
from .tensors import export_like, framework_of, require_cupy

__all__ = [
    "ceil_div",
    "get_tma_aligned_size",
    "get_m_alignment_for_contiguous_layout",
    "get_col_major_tma_aligned_tensor",
    "is_col_major_tma_aligned",
]

#: TMA needs every global stride (and the base address) to be a multiple of 16 bytes.
TMA_ALIGNMENT_BYTES = 16
#: Row alignment of each group in the M-grouped contiguous layout (the GEMM's block_m).
M_ALIGNMENT_FOR_CONTIGUOUS_LAYOUT = 128


def _as_int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected an int, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} ({value!r})") from None


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers, ``b > 0`` (arguments checked: this is the public helper; the host modules use
    the unchecked :func:`cupygemm.util.ceil_div`)."""
    a = _as_int(a, "a")
    b = _as_int(b, "b")
    if b <= 0:
        raise ValueError(f"b: expected a positive divisor, got {b}")
    return util.ceil_div(a, b)


def get_tma_aligned_size(x: int, element_size: int) -> int:
    """Round ``x`` (a count of elements) up so that ``x * element_size`` is a multiple of 16 bytes.

    ``element_size`` (bytes) must divide 16: 1, 2, 4, 8 or 16. E.g. ``get_tma_aligned_size(5, 4) == 8``.
    """
    x = _as_int(x, "x")
    element_size = _as_int(element_size, "element_size")
    if x < 0:
        raise ValueError(f"x: expected a non-negative size, got {x}")
    if element_size <= 0 or TMA_ALIGNMENT_BYTES % element_size:
        raise ValueError(f"element_size: expected a divisor of {TMA_ALIGNMENT_BYTES} (1, 2, 4, 8 or 16), got {element_size}")
    return util.round_up(x, TMA_ALIGNMENT_BYTES // element_size)


def get_m_alignment_for_contiguous_layout() -> int:
    """Row alignment (128) each group's block of rows must have in the M-grouped contiguous layout."""
    return M_ALIGNMENT_FOR_CONTIGUOUS_LAYOUT


def _expected_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """Byte strides of the col-major TMA-aligned layout of ``shape`` ([m, kb] or [g, m, kb])."""
    m, kb = shape[-2], shape[-1]
    m_pad = get_tma_aligned_size(m, itemsize)
    if len(shape) == 2:
        return (itemsize, m_pad * itemsize)
    return (kb * m_pad * itemsize, itemsize, m_pad * itemsize)


def _data_ptr(x: Any) -> int:
    if isinstance(x, np.ndarray):
        return int(x.ctypes.data)
    return int(x.data.ptr)


def is_col_major_tma_aligned(x: Any) -> bool:
    """True when the CuPy array ``x`` ([m, kb] or [g, m, kb]) already has the col-major TMA-aligned layout.

    That is, element strides ``(1, m_pad)`` (2-D) or ``(kb * m_pad, 1, m_pad)`` (3-D) with
    ``m_pad = get_tma_aligned_size(m, itemsize)``, and a 16-byte aligned base address.
    Strides are compared exactly, also for dimensions of size 1. NumPy arrays are accepted too (host-side checks).
    """
    if x.ndim not in (2, 3):
        return False
    shape = tuple(int(d) for d in x.shape)
    if tuple(int(st) for st in x.strides) != _expected_strides(shape, x.dtype.itemsize):
        return False
    return x.size == 0 or _data_ptr(x) % TMA_ALIGNMENT_BYTES == 0


def _col_major_tma_aligned_copy(x: Any, xp: Any) -> Any:
    """Copy ``x`` ([m, kb] or [g, m, kb]) into the col-major TMA-aligned layout using array module ``xp``
    (CuPy on the GPU; NumPy works the same, which the CPU tests use). Padding rows are zero."""
    m, kb = int(x.shape[-2]), int(x.shape[-1])
    m_pad = get_tma_aligned_size(m, x.dtype.itemsize)
    if x.ndim == 2:
        buf = xp.zeros((kb, m_pad), dtype=x.dtype)
        buf[:, :m] = x.T
        return buf[:, :m].T
    buf = xp.zeros((int(x.shape[0]), kb, m_pad), dtype=x.dtype)
    buf[:, :, :m] = _swap_last(x)
    return _swap_last(buf[:, :, :m])


def _swap_last(x: Any) -> Any:
    """``x`` [g, a, b] as [g, b, a] (a view), for NumPy, CuPy and torch alike."""
    return x.transpose(1, 2) if hasattr(x, "data_ptr") else x.transpose(0, 2, 1)


def get_col_major_tma_aligned_tensor(x: Any) -> Any:
    """Return the float32 scales ``x`` ([m, kb] or [g, m, kb]) in the col-major TMA-aligned layout.

    The result has the same shape and values as ``x`` but is stored M-major with the M stride padded to
    ``m_pad = get_tma_aligned_size(m, 4)`` elements: strides (in elements) ``(1, m_pad)`` for 2-D and
    ``(kb * m_pad, 1, m_pad)`` for 3-D. This is the layout the GEMM reads the LHS scales (SFA) with. If ``x``
    already has it, ``x`` itself is returned; otherwise a new array is made (padding rows are zero) on the
    framework's current stream.

    ``x`` may be a CuPy array, a torch CUDA tensor or any DLPack GPU tensor (JAX, ...); the result is in the same
    framework.
    """
    from .tensors import F32, cupy_view, is_torch_tensor, read

    v = read(x, "x")
    if v.ndim not in (2, 3):
        raise ValueError(f"x: expected a 2-D [m, kb] or 3-D [g, m, kb] array, got {v.ndim}-D with shape {v.shape}")
    if v.dtype != F32:
        raise TypeError(f"x: expected float32 scales, got {v.dtype}")
    if v.strides == _expected_strides(v.shape, 4) and (v.size == 0 or v.ptr % TMA_ALIGNMENT_BYTES == 0):
        return x
    if is_torch_tensor(x):
        return _col_major_tma_aligned_copy(x, _TorchOps(x))
    return export_like(_col_major_tma_aligned_copy(cupy_view(v), require_cupy()), framework_of(x))


class _TorchOps:
    """The two array-module calls :func:`_col_major_tma_aligned_copy` makes, for torch tensors."""

    def __init__(self, like: Any):
        self._like = like

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        import torch

        return torch.zeros(shape, dtype=torch.float32, device=self._like.device)
