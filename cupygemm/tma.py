"""TMA descriptors (CUtensorMap) from ``cuTensorMapEncodeTiled`` on libcuda via ctypes.

Descriptors are cached by everything they encode (pointer, dims, strides, box, swizzle), so repeated
GEMMs on the same buffers reuse them; they are passed to kernels as 128-byte by-value parameters.
"""
from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np

from .errors import CupygemmDeviceError

# CUtensorMapDataType
UINT8, FLOAT32, BFLOAT16 = 0, 7, 9
# CUtensorMapSwizzle
SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}
_ELEM_SIZE = {UINT8: 1, FLOAT32: 4, BFLOAT16: 2}

_lock = threading.Lock()
_cache: dict[tuple, bytes] = {}
_CACHE_LIMIT = 4096


@functools.lru_cache(maxsize=1)
def driver() -> ctypes.CDLL:
    """The CUDA driver library (libcuda), loaded once; CupygemmDeviceError when it cannot be loaded."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise CupygemmDeviceError(f"cannot load the CUDA driver library libcuda.so.1 ({e})") from e


@functools.lru_cache(maxsize=1)
def _encode_fn():
    fn = driver().cuTensorMapEncodeTiled
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def encode_tiled(dtype: int, ptr: int, dims: tuple[int, ...], strides_bytes: tuple[int, ...],
                 box: tuple[int, ...], swizzle_bytes: int = 0, l2_promotion: int = 2) -> bytes:
    """A CUtensorMap: its 128 bytes, as a kernel takes it by value.

    ``dims``/``box`` innermost first; ``strides_bytes`` has len(dims) - 1 entries (outer dims).
    """
    key = (dtype, ptr, dims, strides_bytes, box, swizzle_bytes, l2_promotion)
    with _lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    rank = len(dims)
    if ptr % 16:
        raise ValueError(f"TMA needs a 16-byte aligned base address, got 0x{ptr:x}")
    for s in strides_bytes:
        if s % 16 or s >= 1 << 40:
            raise ValueError(f"TMA strides must be multiples of 16 bytes below 2^40, got {strides_bytes}")
    if box[0] * _ELEM_SIZE[dtype] % 16:
        raise ValueError(f"TMA box inner extent must be a multiple of 16 bytes, got {box[0]} elements")
    raw = np.zeros(128 + 128, dtype=np.uint8)  # the driver wants the map 64-byte aligned (128 on CUDA 13)
    offset = (-raw.ctypes.data) % 128
    addr = raw.ctypes.data + offset
    res = _encode_fn()(
        ctypes.c_void_p(addr), dtype, rank, ctypes.c_void_p(ptr),
        (ctypes.c_uint64 * rank)(*dims), (ctypes.c_uint64 * max(rank - 1, 1))(*strides_bytes),
        (ctypes.c_uint32 * rank)(*box), (ctypes.c_uint32 * rank)(*([1] * rank)),
        0, SWIZZLE[swizzle_bytes], l2_promotion, 0,
    )
    if res != 0:
        raise CupygemmDeviceError(
            f"cuTensorMapEncodeTiled failed (CUresult {res}) for dims={dims} strides={strides_bytes} box={box} "
            f"swizzle={swizzle_bytes}"
        )
    desc = raw[offset:offset + 128].tobytes()
    with _lock:
        if len(_cache) >= _CACHE_LIMIT:
            _cache.clear()
        _cache[key] = desc
    return desc
