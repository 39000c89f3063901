"""NVRTC compilation to sm_90a cubins through CuPy's low-level binding (works without a GPU)."""
from __future__ import annotations

import functools

from ..errors import CupygemmCompileError, CupygemmToolchainError
from .source import KernelSource

#: Options every kernel is compiled with. sm_90a (not sm_90) enables wgmma and setmaxnreg.
BASE_OPTIONS: tuple[str, ...] = ("-arch=sm_90a", "-std=c++17", "-default-device")


def _nvrtc():
    # CuPy's private binding, on purpose. The public cupy.cuda.compiler.compile_using_nvrtc (CuPy 14) cannot build
    # our kernels: it picks the architecture from the current device (memoized per device, so it needs a GPU and a
    # driver, and warm-up runs on CPU boxes), formats it as -arch=sm_<int> (no "90a", which wgmma and setmaxnreg
    # need), takes no in-memory headers unless through the deprecated jitify, and adds its own options
    # (--device-as-default-execution-space, --pch). NVIDIA's cuda-bindings nvrtc would do, but is one more
    # dependency for no measurable gain: on the same NVRTC 13.5 it built byte-identical cubins for three GEMM configs
    # in the same time (0.42-1.75 s each, within 0.1 s), so the binding is not what a build costs. Revisit if CuPy
    # drops this module. The cache key does not depend on the binding: source digest, options, NVRTC version,
    # SASS-pass decision (build.py).
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as e:  # pragma: no cover - CuPy is a hard requirement of the JIT
        raise CupygemmToolchainError(
            "CuPy is not installed; install cupygemm with an extra: pip install 'cupygemm[cuda12]' or '[cuda13]'"
        ) from e
    return nvrtc


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC CuPy loads; raises CupygemmToolchainError when NVRTC is missing."""
    try:
        return tuple(_nvrtc().getVersion())  # type: ignore[return-value]
    except CupygemmToolchainError:
        raise
    except Exception as e:  # DynamicLibNotFoundError, OSError, ...
        raise CupygemmToolchainError(
            f"NVRTC could not be loaded ({e}). Install the NVRTC matching your CuPy: "
            "pip install nvidia-cuda-nvrtc-cu12 (cupy-cuda12x) or nvidia-cuda-nvrtc (cupy-cuda13x)"
        ) from e


def compile_cubin(src: KernelSource, extra_options: tuple[str, ...] = (), config: object = None) -> bytes:
    """Compile ``src`` to an sm_90a cubin and return its bytes."""
    nvrtc = _nvrtc()
    nvrtc_version()
    options = BASE_OPTIONS + tuple(extra_options)
    names = list(src.headers)
    prog = nvrtc.createProgram(
        src.text, src.name, [src.headers[n].encode() for n in names], [n.encode() for n in names]
    )
    try:
        try:
            nvrtc.compileProgram(prog, options)
        except nvrtc.NVRTCError as e:
            log = nvrtc.getProgramLog(prog)
            raise CupygemmCompileError(f"NVRTC failed to compile {src.name} ({e})", log=log, config=config) from None
        cubin = nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    # CuPy strips what it takes for a trailing NUL, cutting the ELF one byte short (hopper-notes 3.2).
    if isinstance(cubin, str):  # pragma: no cover - older CuPy returned str
        cubin = cubin.encode("latin-1")
    return bytes(cubin) + b"\x00"
