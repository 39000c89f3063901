"""GEMM kernels by config: render ``cuda_src/fp8_gemm.cu``, build (cache) and load per device."""
from __future__ import annotations

import threading

from .config import GemmConfig
from .jit.build import LoadedKernel, build_cubin, load_kernel
from .jit.source import KernelSource, render

GEMM_FILE, GEMM_ENTRY = "fp8_gemm.cu", "cupygemm_fp8_gemm"

_lock = threading.Lock()
_by_config: dict[tuple[int, GemmConfig], LoadedKernel] = {}


def gemm_source(cfg: GemmConfig) -> KernelSource:
    return render(GEMM_FILE, GEMM_ENTRY, cfg.defines())


def _compile_key(cfg: GemmConfig) -> GemmConfig:
    # The grid size is a launch parameter, not part of the compiled kernel.
    import dataclasses

    return dataclasses.replace(cfg, num_sms=0)


def compile_gemm(cfg: GemmConfig) -> bytes:
    """The sm_90a cubin for ``cfg`` (from the cache or NVRTC). Needs no GPU."""
    return build_cubin(gemm_source(cfg), config=cfg)[1]


def precompile_gemm(cfg: GemmConfig) -> None:
    """Worker-process entry: build ``cfg`` into the disk cache (returns nothing, to avoid shipping bytes)."""
    compile_gemm(cfg)


def get_gemm_kernel(cfg: GemmConfig, device_id: int) -> LoadedKernel:
    """The loaded kernel for ``cfg`` on ``device_id`` (the current device); memoized in-process."""
    key = (device_id, _compile_key(cfg))
    k = _by_config.get(key)
    if k is None:
        k = load_kernel(gemm_source(cfg), config=cfg)
        k.ensure_dynamic_smem(cfg.smem_bytes)
        with _lock:
            _by_config[key] = k
    return k
