"""GEMM kernels by config: render ``cuda_src/fp8_gemm.cu`` with the contract's constants, build (cache) and load."""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

from . import contract
from .config import GemmConfig
from .env import pdl_enabled
from .jit.build import LoadedKernel, build_cubin, relaxed_capture
from .jit.loader import load
from .jit.source import KernelSource, render

_lock = threading.Lock()
_by_config: dict[tuple[int, GemmConfig, bool], LoadedKernel] = {}


def gemm_source(cfg: GemmConfig, pdl: bool | None = None, b_prefetch: int = 0) -> KernelSource:
    """The kernel source for ``cfg``; ``pdl``: the programmatic-dependent-launch variant (None: as
    ``CUPYGEMM_PDL`` says, i.e. the variant this process launches); ``b_prefetch``: see
    :func:`cupygemm.contract.defines`."""
    pdl = pdl_enabled() if pdl is None else pdl
    return render(contract.GEMM_FILE, contract.GEMM_ENTRY, contract.defines(cfg, pdl, b_prefetch))


@dataclass(frozen=True)
class GemmVariant:
    """A forward kernel that its config alone does not name: ``cfg`` with ``b_prefetch`` bytes of B fetched before
    the PDL wait (:func:`cupygemm.plan.b_prefetch`: packed weights, decode rows), as warm-ups plan it."""

    cfg: GemmConfig
    b_prefetch: int = 0

    def describe(self) -> str:
        return self.cfg.describe() + (f", B prefetch {self.b_prefetch >> 10} KiB" if self.b_prefetch else "")


def compile_gemm(cfg: GemmConfig, pdl: bool | None = None, b_prefetch: int = 0) -> bytes:
    """The sm_90a cubin for ``cfg`` (from the cache or NVRTC). Needs no GPU."""
    return build_cubin(gemm_source(cfg, pdl, b_prefetch), config=cfg)[1]


class _LaunchConfig(ctypes.Structure):
    # CUlaunchConfig (cuda.h): grid xyz, block xyz, dynamic smem, stream, attributes, attribute count.
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]


def max_active_clusters(kernel: LoadedKernel, cfg: GemmConfig) -> int:
    """How many clusters of this kernel (contract.cluster_size CTAs) fit on the GPU at once
    (cuOccupancyMaxActiveClusters).

    Clusters must sit within one GPC; GPCs with an odd number of free SMs leave one idle, so a persistent
    grid of num_sms CTAs may not be co-resident. Returns 0 when the driver cannot tell.
    """
    from .tma import driver

    fn = getattr(driver(), "cuOccupancyMaxActiveClusters", None)
    if fn is None:
        return 0
    cfg_struct = _LaunchConfig((cfg.num_sms, 1, 1), (contract.threads(cfg.num_math_wg), 1, 1), cfg.smem_bytes, None,
                               None, 0)
    out = ctypes.c_int(0)
    res = fn(ctypes.byref(out), ctypes.c_void_p(kernel.function.ptr), ctypes.byref(cfg_struct))
    return out.value if res == 0 else 0


def get_gemm_kernel(cfg: GemmConfig, device_id: int, pdl: bool = False, b_prefetch: int = 0) -> LoadedKernel:
    """The loaded kernel for ``cfg`` on ``device_id`` (the current device); memoized in-process. ``pdl``,
    ``b_prefetch``: the variant for programmatic dependent launch (:func:`cupygemm.contract.defines`).

    Configs differing only in grid size share one kernel (:func:`cupygemm.jit.loader.load` memoizes by source).
    """
    key = (device_id, cfg, pdl, b_prefetch)
    k = _by_config.get(key)
    if k is None:
        k = load(device_id, gemm_source(cfg, pdl, b_prefetch), contract.GEMM_PARAMS_SIDES if cfg.sides else contract.GEMM_PARAMS,
                 config=cfg, dynamic_smem=cfg.smem_bytes)
        if contract.cluster_size(cfg) > 1 and not k.max_clusters:
            with relaxed_capture():
                k.max_clusters = max_active_clusters(k, cfg) or cfg.num_sms // contract.cluster_size(cfg)
        with _lock:
            _by_config[key] = k
    return k
