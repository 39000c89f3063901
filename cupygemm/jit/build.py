"""Get a compiled kernel: cubin from the cache or NVRTC (+ the SASS pass), then a loaded CUDA function.

The in-process memo is keyed by (device, source digest, options) so the GEMM hot path touches no disk.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from dataclasses import dataclass
from typing import Iterator

from . import cache
from .. import env
from ..errors import CupygemmDeviceError, CupygemmToolchainError
from .compiler import BASE_OPTIONS, compile_cubin, nvrtc_version
from .source import KernelSource

_lock = threading.Lock()
_loaded: dict[tuple[int, str], "LoadedKernel"] = {}
_build_locks: dict[str, threading.Lock] = {}


def ffma_interleave_mode() -> str:
    """``CUPYGEMM_FFMA_INTERLEAVE``: auto (default), on or off (see cupygemm.env)."""
    return env.ffma_interleave_mode()


def _interleave_decision(post_process: bool) -> str:
    """What the SASS pass will do: 'off', or 'on'/'auto' tagged with the pass version."""
    if not post_process:
        return "off"
    mode = ffma_interleave_mode()
    if mode == "off" or (mode == "auto" and nvrtc_version() > (12, 8)):
        return "off"  # NVRTC >= 12.9 emits the interleave itself
    import sass_tools

    return f"{mode}:{sass_tools.PASS_VERSION}"


def cache_key(src: KernelSource, options: tuple[str, ...] = (), post_process: bool = True) -> str:
    """Key covering the rendered source and headers, options, NVRTC version and SASS-pass decision."""
    return cache.make_key(src.digest, BASE_OPTIONS + tuple(options), nvrtc_version(), _interleave_decision(post_process))


def build_cubin(src: KernelSource, options: tuple[str, ...] = (), post_process: bool = True,
                config: object = None) -> tuple[str, bytes]:
    """(cache key, cubin) for ``src``; compiles only on a cache miss. Needs no GPU."""
    key = cache_key(src, options, post_process)
    cubin = cache.load(key)
    if cubin is not None:
        return key, cubin
    with _lock:
        key_lock = _build_locks.setdefault(key, threading.Lock())
    with key_lock:  # one thread compiles, the others wait for its result
        cubin = cache.load(key)
        if cubin is None:
            cubin = compile_cubin(src, options, config=config)
            decision = _interleave_decision(post_process)
            if decision != "off":
                from sass_tools.interleave import interleave_ffma

                cubin = interleave_ffma(cubin, force=decision.startswith("on")).cubin
            cache.store(key, cubin)
    return key, cubin


_CAPTURE_MODE_RELAXED = 2  # CUstreamCaptureMode: global 0, thread-local 1, relaxed 2


@contextlib.contextmanager
def relaxed_capture() -> Iterator[None]:
    """Let this thread load modules and set function attributes while a stream is being captured.

    A first call made inside ``torch.cuda.graph`` (global capture mode) loads its kernel during the capture; module
    loading counts as a potentially unsafe call there and would invalidate the caller's capture. The loads are not
    stream work, so they may run outside the graph: switch this thread to relaxed mode for them, then back.
    """
    fn = _exchange_capture_mode()
    if fn is None:
        yield
        return
    mode = ctypes.c_int(_CAPTURE_MODE_RELAXED)
    swapped = fn(ctypes.byref(mode)) == 0
    try:
        yield
    finally:
        if swapped:
            fn(ctypes.byref(mode))


@functools.lru_cache(maxsize=1)
def _exchange_capture_mode():
    from ..tma import driver

    try:
        fn = driver().cuThreadExchangeStreamCaptureMode
    except (CupygemmDeviceError, AttributeError):  # no driver (CPU-only machine): nothing can be capturing
        return None
    fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
    fn.restype = ctypes.c_int
    return fn


@dataclass
class LoadedKernel:
    """A kernel loaded into one device's context. It holds its module: while it lives, so does the function (a
    launcher's bare function handle does not keep the module loaded). :func:`cupygemm.jit.loader.load` gives it a
    launcher for its parameter kinds."""

    module: object
    function: object
    key: str
    max_dynamic_smem: int = 0
    max_clusters: int = 0  # co-resident 2-CTA clusters (clustered kernels only)
    launcher: object = None  # a cupygemm.launch.Launcher for ``kinds``
    kinds: tuple[str, ...] = ()

    def ensure_dynamic_smem(self, nbytes: int) -> None:
        if nbytes > 48 * 1024 and nbytes > self.max_dynamic_smem:
            import cupy

            # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
            with relaxed_capture():
                cupy.cuda.driver.funcSetAttribute(self.function.ptr, 8, nbytes)
            self.max_dynamic_smem = nbytes


@functools.lru_cache(maxsize=None)
def check_driver_for_nvrtc(device_id: int) -> None:
    """Cubins from NVRTC N.x need a driver for CUDA >= N. CuPy 14 prefers NVRTC 13 when it is installed, even
    in cupy-cuda12x, so a CUDA 12 driver with NVRTC 13 present would fail at module load: say so plainly."""
    import cupy

    drv = cupy.cuda.runtime.driverGetVersion()
    major, minor = nvrtc_version()
    if drv and drv // 1000 < major:
        raise CupygemmToolchainError(
            f"NVRTC {major}.{minor} builds CUDA {major} cubins, but the driver supports CUDA "
            f"{drv // 1000}.{drv % 1000 // 10}. Upgrade the driver (CUDA {major} needs >= 580), or remove the newer "
            "NVRTC (pip uninstall nvidia-cuda-nvrtc) so that CuPy loads NVRTC 12.x."
        )


def load_kernel(src: KernelSource, options: tuple[str, ...] = (), post_process: bool = True,
                config: object = None) -> LoadedKernel:
    """Compile (or fetch) and load ``src`` on the current device; memoized per device."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    check_driver_for_nvrtc(dev)
    memo_key = (dev, src.digest + repr(options) + repr(post_process))
    k = _loaded.get(memo_key)
    if k is not None:
        return k
    key, cubin = build_cubin(src, options, post_process, config)
    with _lock:
        k = _loaded.get(memo_key)
        if k is None:
            module = cupy.cuda.function.Module()
            with relaxed_capture():
                module.load(cubin)
                k = LoadedKernel(module, module.get_function(src.entry), key)
            _loaded[memo_key] = k
    return k
