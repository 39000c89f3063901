"""Kernel launch through the driver with one packed parameter buffer.

CuPy's RawKernel launch converts every argument on each call; with four by-value 128-byte TMA descriptors that
took ~19 us of host time per GEMM (benchmarks/NOTES.md section 11). Here the parameter layout is read once per
kernel from the driver (``cuFuncGetParamInfo``), each call packs the values with one ``struct.pack`` and hands
the bytes to ``cuLaunchKernel`` (``CU_LAUNCH_PARAM_BUFFER_POINTER``). Drivers without ``cuFuncGetParamInfo``
(CUDA < 12.4) get ``None`` from :func:`packed_launcher` and the caller launches through CuPy.
"""
from __future__ import annotations

import ctypes
import functools
import struct
from typing import Sequence

from .errors import CupygemmDeviceError
from .tma import driver

# Parameter kinds: a by-value 128-byte TMA descriptor, a 64-bit device pointer, a 32-bit unsigned int.
DESC, PTR, U32 = "128s", "Q", "I"
_SIZES = {DESC: 128, PTR: 8, U32: 4}
_CU_LAUNCH_PARAM_END, _CU_LAUNCH_PARAM_BUFFER_POINTER, _CU_LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2


def _param_layout(func_ptr: int, count: int) -> list[tuple[int, int]] | None:
    """(offset, size) of the kernel's first ``count`` parameters, or None when the driver cannot tell."""
    fn = getattr(driver(), "cuFuncGetParamInfo", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    fn.restype = ctypes.c_int
    out = []
    off, size = ctypes.c_size_t(), ctypes.c_size_t()
    for i in range(count):
        if fn(ctypes.c_void_p(func_ptr), i, ctypes.byref(off), ctypes.byref(size)) != 0:
            return None
        out.append((off.value, size.value))
    return out


@functools.lru_cache(maxsize=1)
def _launch_fn():
    fn = driver().cuLaunchKernel
    fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    fn.restype = ctypes.c_int
    return fn


class PackedLauncher:
    """Launches one kernel function with parameters of the given kinds (see DESC, PTR, U32)."""

    def __init__(self, func_ptr: int, kinds: Sequence[str], layout: list[tuple[int, int]]):
        if [s for _, s in layout] != [_SIZES[k] for k in kinds]:
            raise CupygemmDeviceError(f"kernel parameters {layout} do not match the expected kinds {list(kinds)}")
        fmt, pos = "<", 0
        for (off, _), kind in zip(layout, kinds):
            fmt += "x" * (off - pos) + kind
            pos = off + _SIZES[kind]
        self._struct = struct.Struct(fmt)
        self._func = ctypes.c_void_p(func_ptr)
        self._size = ctypes.c_size_t(self._struct.size)

    @property
    def param_bytes(self) -> int:
        return self._struct.size

    def pack(self, values: Sequence[object]) -> bytes:
        return self._struct.pack(*values)

    def __call__(self, grid: int, block: int, smem: int, stream: int, values: Sequence[object]) -> None:
        params = self.pack(values)
        buf = ctypes.c_char_p(params)  # the driver copies the parameters during the call
        extra = (ctypes.c_void_p * 5)(_CU_LAUNCH_PARAM_BUFFER_POINTER, ctypes.cast(buf, ctypes.c_void_p),
                                      _CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(self._size),
                                      _CU_LAUNCH_PARAM_END)
        res = _launch_fn()(self._func, grid, 1, 1, block, 1, 1, smem, stream, None, extra)
        if res != 0:
            raise CupygemmDeviceError(f"cuLaunchKernel failed (CUresult {res}) for grid {grid}, block {block}, "
                                      f"{smem} B of shared memory")


def packed_launcher(func_ptr: int, kinds: Sequence[str]) -> PackedLauncher | None:
    """A launcher for the kernel function ``func_ptr``, or None if the driver cannot report its parameters."""
    layout = _param_layout(func_ptr, len(kinds))
    return None if layout is None else PackedLauncher(func_ptr, kinds, layout)
