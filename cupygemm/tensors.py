"""Tensors in and out: CuPy arrays and any ``__dlpack__`` object (torch, JAX, ...), zero-copy.

FP8 operands are handled as ``uint8`` CuPy arrays holding e4m3 bits: CuPy 14 cannot represent FP8,
and its DLPack importer rejects the DLPack 1.1 FP8 type codes. For those we take the producer's
capsule, rewrite the dtype code to "unsigned int" in place and import that (same pointer, same strides).
BF16 results are CuPy arrays of ``ml_dtypes.bfloat16``; :func:`export_like` hands them back to the
caller's framework through DLPack, again without a copy.
"""
from __future__ import annotations

import ctypes
import enum
import sys
from typing import Any

import ml_dtypes
import numpy as np

try:  # CuPy is an extra; the CPU-only parts of the package import without it.
    import cupy
except ImportError:  # pragma: no cover
    cupy = None  # type: ignore[assignment]

FP8_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)

# DLPack type codes (dlpack.h 1.1).
_DL_UINT, _DL_FLOAT, _DL_BFLOAT = 1, 2, 4
_DL_FP8_CODES = {7: "float8_e3m4", 8: "float8_e4m3", 9: "float8_e4m3b11fnuz", 10: "float8_e4m3fn",
                 11: "float8_e4m3fnuz", 12: "float8_e5m2", 13: "float8_e5m2fnuz", 14: "float8_e8m0fnu"}
_DL_CUDA, _DL_CUDA_MANAGED = 2, 13


class Framework(enum.Enum):
    """Which library an input came from: results are handed back in the same kind."""

    CUPY = "cupy"
    TORCH = "torch"
    JAX = "jax"
    OTHER = "dlpack"


def framework_of(x: Any) -> Framework:
    mod = type(x).__module__.split(".")[0]
    if mod == "cupy":
        return Framework.CUPY
    if mod == "torch":
        return Framework.TORCH
    if mod in ("jax", "jaxlib"):
        return Framework.JAX
    return Framework.OTHER


def require_cupy():
    if cupy is None:
        raise ImportError(
            "cupygemm needs CuPy for GPU work: pip install 'cupygemm[cuda12]' (or '[cuda13]')"
        )
    return cupy


# ---- DLPack capsule surgery -------------------------------------------------------------------

class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


# DLManagedTensorVersioned = {u32 major, u32 minor; void* ctx; deleter; u64 flags; DLTensor}
_VERSIONED_TENSOR_OFFSET = 8 + 8 + 8 + 8

_PyCapsule_GetName = ctypes.pythonapi.PyCapsule_GetName
_PyCapsule_GetName.restype = ctypes.c_char_p
_PyCapsule_GetName.argtypes = [ctypes.py_object]
_PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_PyCapsule_GetPointer.restype = ctypes.c_void_p
_PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _capsule_tensor(capsule: Any) -> _DLTensor:
    name = _PyCapsule_GetName(capsule)
    if name not in (b"dltensor", b"dltensor_versioned"):
        raise TypeError(f"not an unconsumed DLPack capsule (name {name!r})")
    ptr = _PyCapsule_GetPointer(capsule, name)
    offset = _VERSIONED_TENSOR_OFFSET if name == b"dltensor_versioned" else 0
    return _DLTensor.from_address(ptr + offset)


def _dlpack_capsule(x: Any, stream: int | None) -> Any:
    try:
        return x.__dlpack__(stream=stream, max_version=(1, 0))
    except TypeError:  # producers predating DLPack 1.0 take no max_version
        return x.__dlpack__(stream=stream)


def _current_stream_for_dlpack() -> int:
    s = cupy.cuda.get_current_stream()
    # DLPack: 1 = legacy default stream; 0 is not allowed.
    return s.ptr if s.ptr else 1


def _import_dlpack(x: Any, name: str) -> "cupy.ndarray":
    dev_type, dev_id = x.__dlpack_device__()
    if int(dev_type) not in (_DL_CUDA, _DL_CUDA_MANAGED):
        raise TypeError(
            f"{name}: expected a CUDA GPU array, got a {type(x).__name__} on DLPack device type {int(dev_type)} "
            "(host memory?); move it to the GPU first"
        )
    capsule = _dlpack_capsule(x, _current_stream_for_dlpack())
    t = _capsule_tensor(capsule)
    code, bits = t.dtype.code, t.dtype.bits
    if code in _DL_FP8_CODES:
        if code != 10:
            raise TypeError(f"{name}: expected float8_e4m3fn, got {_DL_FP8_CODES[code]}")
        t.dtype.code = _DL_UINT  # same 8 bits, read as uint8
    elif code == _DL_BFLOAT and bits == 16:
        try:
            return cupy.from_dlpack(capsule).view(BF16)
        except Exception:  # CuPy builds without bfloat16 DLPack support: read the bits as uint16
            t = _capsule_tensor(capsule)
            t.dtype.code = _DL_UINT
            return cupy.from_dlpack(capsule).view(BF16)
    return cupy.from_dlpack(capsule)


def as_cupy(x: Any, name: str) -> "cupy.ndarray":
    """View ``x`` as a CuPy array without copying (FP8 becomes uint8, BF16 becomes ml_dtypes.bfloat16).

    Raises TypeError for host arrays and objects that are neither CuPy arrays nor DLPack producers.
    """
    require_cupy()
    if isinstance(x, cupy.ndarray):
        if x.dtype == FP8_E4M3:
            return x.view(np.uint8)
        return x
    if isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a GPU array, got a NumPy (host) array; use cupy.asarray() first")
    if not hasattr(x, "__dlpack__") or not hasattr(x, "__dlpack_device__"):
        raise TypeError(f"{name}: expected a CuPy array or a DLPack-capable GPU tensor, got {type(x).__name__}")
    return _import_dlpack(x, name)


def export_like(arr: "cupy.ndarray", framework: Framework) -> Any:
    """Hand ``arr`` to ``framework`` zero-copy (torch tensor, JAX array) or return it (CuPy).

    The framework is the caller's, already imported (its arrays came in): cupygemm never imports torch or JAX.
    """
    if framework is Framework.TORCH:
        return sys.modules["torch"].from_dlpack(arr)
    if framework is Framework.JAX:
        return sys.modules["jax"].dlpack.from_dlpack(arr)
    return arr
