"""Kernel launch through the driver with one packed parameter buffer.

CuPy's RawKernel launch converts every argument on each call; with four by-value 128-byte TMA descriptors that
took ~19 us of host time per GEMM (benchmarks/NOTES.md, "Host call path"). Here the parameter layout is read once per
kernel from the driver (``cuFuncGetParamInfo``); :meth:`PackedLauncher.pack` packs a call's values into the
bytes and the ``extra`` array that ``cuLaunchKernel`` takes (``CU_LAUNCH_PARAM_BUFFER_POINTER``), and a launch
plan keeps them for the pointers it has seen, so launching again is one driver call. Drivers without
``cuFuncGetParamInfo`` (CUDA < 12.4) get a :class:`CupyLauncher`, which lets CuPy pack the values per call.
"""
from __future__ import annotations

import ctypes
import struct
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from .device import ensure_context
from .errors import CupygemmDeviceError
from .tma import driver
from .util import keep_newest

# Parameter kinds: a by-value 128-byte TMA descriptor, a 64-bit device pointer, a 32-bit unsigned int, a 64-bit signed
# int (``long long``), and the 32-byte SM side map of side-aware kernels (cuda_src/l2_sides.cuh). A 64-bit unsigned
# int (``unsigned long long``, ``uint64_t``) is packed as a pointer is: U64 is PTR.
DESC, PTR, U32, I64, SIDE_MAP = "128s", "Q", "I", "q", "32s"
U64 = PTR
_SIZES = {DESC: 128, PTR: 8, U32: 4, I64: 8, SIDE_MAP: 32}
_CU_LAUNCH_PARAM_END, _CU_LAUNCH_PARAM_BUFFER_POINTER, _CU_LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2


class Launcher(Protocol):
    def pack(self, values: Sequence[object]) -> Any: ...

    def launch(self, params: Any, grid: int, block: int, smem: int, stream: int) -> None: ...

    def launch_grid(self, params: Any, grid: tuple[int, int, int], block: int, smem: int, stream: int) -> None: ...

    def bound(self, params: Any, grid: int, block: int, smem: int, pdl: bool = False) -> Callable[[int], None]: ...


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


class _Packed:
    """A call's parameter bytes and the ``extra`` array pointing at them (kept together: the array holds the
    buffer's address)."""

    __slots__ = ("buf", "size", "extra", "extra_ptr")

    def __init__(self, data: bytes):
        self.buf = ctypes.create_string_buffer(data, len(data))
        self.size = ctypes.c_size_t(len(data))
        self.extra = (ctypes.c_void_p * 5)(_CU_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(self.buf),
                                           _CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(self.size),
                                           _CU_LAUNCH_PARAM_END)
        self.extra_ptr = ctypes.addressof(self.extra)

    def __bytes__(self) -> bytes:
        return self.buf.raw


class _LaunchAttribute(ctypes.Structure):
    # CUlaunchAttribute: an id, padding, and a 64-byte value union (programmaticStreamSerializationAllowed: an int).
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int), ("rest", ctypes.c_char * 60)]


class _LaunchConfigEx(ctypes.Structure):
    # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


class _PdlConfig:
    """A CUlaunchConfig with the programmatic-stream-serialization attribute, kept per (grid, block, smem, stream)
    so that a launch passes one pointer."""

    __slots__ = ("attr", "config", "address")

    def __init__(self, grid: int, block: int, smem: int, stream: int):
        self.attr = _LaunchAttribute(_PROGRAMMATIC_STREAM_SERIALIZATION, b"", 1)
        self.config = _LaunchConfigEx((grid, 1, 1), (block, 1, 1), smem, stream or None, ctypes.pointer(self.attr), 1)
        self.address = ctypes.addressof(self.config)


#: PDL launch configs a launcher keeps (one per grid, block, shared memory and stream it launched on).
_PDL_CONFIG_LIMIT = 64

_launch_ex_fn = None


def _launch_ex():
    """cuLaunchKernelEx(config, function, kernelParams, extra), bound once."""
    global _launch_ex_fn
    if _launch_ex_fn is None:
        fn = driver().cuLaunchKernelEx
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        _launch_ex_fn = fn
    return _launch_ex_fn


_launch_ex_gil_fn = None


def _launch_ex_gil():
    """cuLaunchKernelEx called with the GIL held (for the bound PDL launches of the XLA FFI handler): it only queues
    the launch, so releasing the GIL around it would let another Python thread take it and make the caller wait."""
    global _launch_ex_gil_fn
    if _launch_ex_gil_fn is None:
        fn = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
        _launch_ex_gil_fn = fn(ctypes.cast(driver().cuLaunchKernelEx, ctypes.c_void_p).value)
    return _launch_ex_gil_fn


class PackedLauncher:
    """Launches one kernel function, loaded on ``device``, with parameters of the given kinds (see DESC, PTR, U32,
    I64). Every launch but the bound ones (:meth:`bound`, for XLA's threads) first makes sure the calling thread has
    the device's context bound (:func:`ensure_context`): the caller has made ``device`` current, which binds nothing
    on a thread that has done no CUDA work yet."""

    def __init__(self, func_ptr: int, kinds: Sequence[str], layout: list[tuple[int, int]], device: int):
        if [s for _, s in layout] != [_SIZES[k] for k in kinds]:
            raise CupygemmDeviceError(f"kernel parameters {layout} do not match the expected kinds {list(kinds)}")
        fmt, pos = "<", 0
        for (off, _), kind in zip(layout, kinds):
            fmt += "x" * (off - pos) + kind
            pos = off + _SIZES[kind]
        self._struct = struct.Struct(fmt)
        self._func, self._device = func_ptr, device
        from cupy.cuda import driver as cu

        # CuPy's Cython binding of cuLaunchKernel: a third of the cost of a ctypes call with eleven arguments.
        self._launch_kernel, self._error = cu.launchKernel, cu.CUDADriverError
        self._pdl_configs: dict[tuple[int, int, int, int], _PdlConfig] = {}

    @property
    def param_bytes(self) -> int:
        return self._struct.size

    def pack(self, values: Sequence[object]) -> _Packed:
        return _Packed(self._struct.pack(*values))

    def launch(self, params: _Packed, grid: int, block: int, smem: int, stream: int) -> None:
        ensure_context(self._device)
        try:
            self._launch_kernel(self._func, grid, 1, 1, block, 1, 1, smem, stream, 0, params.extra_ptr)
        except self._error as e:
            raise CupygemmDeviceError(f"cuLaunchKernel failed ({e}) for grid {grid}, block {block}, "
                                      f"{smem} B of shared memory") from e

    def launch_grid(self, params: _Packed, grid: tuple[int, int, int], block: int, smem: int, stream: int) -> None:
        """As :meth:`launch`, on a grid of (x, y, z) blocks."""
        ensure_context(self._device)
        try:
            self._launch_kernel(self._func, grid[0], grid[1], grid[2], block, 1, 1, smem, stream, 0, params.extra_ptr)
        except self._error as e:
            raise CupygemmDeviceError(f"cuLaunchKernel failed ({e}) for grid {grid}, block {block}, "
                                      f"{smem} B of shared memory") from e

    def bound(self, params: _Packed, grid: int, block: int, smem: int, pdl: bool = False) -> Callable[[int], None]:
        """:meth:`launch` (``pdl``: :meth:`launch_pdl`) of these parameters as a function of the stream alone, for a
        caller that launches the same parameters again and again (the XLA FFI handler): one call, no lookups and no
        context check (XLA runs its thunks with the executor's context bound). The PDL launch keeps its config per
        stream and calls cuLaunchKernelEx with the GIL held."""
        if pdl:
            return self._bound_pdl(params, grid, block, smem)
        launch_kernel, error, func = self._launch_kernel, self._error, self._func

        def fire(stream: int) -> None:
            try:  # params.extra_ptr: the closure keeps the packed bytes it points at alive
                launch_kernel(func, grid, 1, 1, block, 1, 1, smem, stream, 0, params.extra_ptr)
            except error as e:
                raise CupygemmDeviceError(f"cuLaunchKernel failed ({e}) for grid {grid}, block {block}, "
                                          f"{smem} B of shared memory") from e
        return fire

    def _bound_pdl(self, params: _Packed, grid: int, block: int, smem: int) -> Callable[[int], None]:
        launch_ex, func, extra = _launch_ex_gil(), self._func, params.extra_ptr
        configs: dict[int, _PdlConfig] = {}  # per stream: XLA launches on one or a few

        def fire(stream: int) -> None:
            cfg = configs.get(stream)
            if cfg is None:
                cfg = keep_newest(configs, stream, _PdlConfig(grid, block, smem, stream), _PDL_CONFIG_LIMIT)
            res = launch_ex(cfg.address, func, None, extra)
            if res != 0:
                raise CupygemmDeviceError(f"cuLaunchKernelEx failed (CUresult {res}) for grid {grid}, block "
                                          f"{block}, {smem} B of shared memory, programmatic dependent launch")
        fire.params = params  # what `extra` points at lives as long as the launch
        return fire

    def launch_pdl(self, params: _Packed, grid: int, block: int, smem: int, stream: int) -> None:
        """As :meth:`launch`, with programmatic dependent launch: the kernel may start before the previous one on
        ``stream`` has finished (it must wait for it before touching memory: ``contract.defines(pdl=True)``)."""
        ensure_context(self._device)
        key = (grid, block, smem, stream)
        cfg = self._pdl_configs.get(key)
        if cfg is None:
            cfg = keep_newest(self._pdl_configs, key, _PdlConfig(grid, block, smem, stream), _PDL_CONFIG_LIMIT)
        res = _launch_ex()(cfg.address, self._func, None, params.extra_ptr)
        if res != 0:
            raise CupygemmDeviceError(f"cuLaunchKernelEx failed (CUresult {res}) for grid {grid}, block {block}, "
                                      f"{smem} B of shared memory, programmatic dependent launch")


class CupyLauncher:
    """For drivers that cannot report parameter offsets: CuPy converts the values on every launch."""

    def __init__(self, function: Any, kinds: Sequence[str]):
        import cupy

        self._function = function
        self._kinds = tuple(kinds)
        self._device = cupy.cuda.runtime.getDevice()

    def pack(self, values: Sequence[object]) -> tuple:
        conv = {DESC: lambda v: np.frombuffer(v, "V128"), PTR: np.uint64, U32: np.uint32, I64: np.int64,
                SIDE_MAP: lambda v: np.frombuffer(v, "V32")}
        return tuple(conv[k](v) for k, v in zip(self._kinds, values))

    def launch(self, params: tuple, grid: int, block: int, smem: int, stream: int) -> None:
        from .streams import cupy_stream

        self._function((grid,), (block,), params, shared_mem=smem, stream=cupy_stream(stream, self._device))

    def launch_grid(self, params: tuple, grid: tuple[int, int, int], block: int, smem: int, stream: int) -> None:
        from .streams import cupy_stream

        self._function(tuple(grid), (block,), params, shared_mem=smem, stream=cupy_stream(stream, self._device))

    def bound(self, params: tuple, grid: int, block: int, smem: int, pdl: bool = False) -> Callable[[int], None]:
        """:meth:`launch` of these parameters as a function of the stream (``pdl`` needs cuLaunchKernelEx, which
        this launcher's drivers lack: refused)."""
        if pdl:
            raise CupygemmDeviceError("programmatic dependent launch needs a driver with cuFuncGetParamInfo")
        return lambda stream: self.launch(params, grid, block, smem, stream)


def make_launcher(function: Any, kinds: Sequence[str], device: int) -> Launcher:
    """The launcher for a CuPy ``function`` loaded on ``device``: packed through the driver where it reports the
    parameter layout, else through CuPy."""
    layout = _param_layout(function.ptr, len(kinds))
    return CupyLauncher(function, kinds) if layout is None else PackedLauncher(function.ptr, kinds, layout, device)
