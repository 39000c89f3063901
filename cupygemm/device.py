"""The GPU we run on: compute capability, SM count (with the user's override), shared-memory limits."""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from dataclasses import dataclass

from .errors import CupygemmDeviceError

#: Hopper's opt-in per-block shared-memory limit (227 KB).
SM90_MAX_SMEM_PER_BLOCK = 232448

#: What a "cannot run here" message ends with: the GPU the kernels need.
HOPPER_NEEDED = "cupygemm's kernels need an NVIDIA Hopper GPU (compute capability 9.0: H100, H200, H800, H20)"

#: The most SMs an SM count may name. Hopper has at most 144 (a full GH100): anything past this is a typo, not a GPU,
#: and would plan grids no device runs.
MAX_NUM_SMS = 1024

_lock = threading.Lock()
_num_sms_override: int | None = None


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    compute_capability: str  # e.g. "90"
    num_sms: int
    max_smem_per_block: int
    l2_bytes: int


@functools.lru_cache(maxsize=None)
def _query(index: int) -> DeviceInfo:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(index)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return DeviceInfo(
        index=index,
        name=name,
        compute_capability=f"{props['major']}{props['minor']}",
        num_sms=int(props["multiProcessorCount"]),
        max_smem_per_block=int(props.get("sharedMemPerBlockOptin", SM90_MAX_SMEM_PER_BLOCK)),
        l2_bytes=int(props.get("l2CacheSize", 50 * 1024 * 1024)),
    )


def gpu_available() -> bool:
    """True when CuPy sees at least one CUDA device."""
    try:
        import cupy

        return bool(cupy.cuda.is_available())
    except Exception:
        return False


def current_device() -> DeviceInfo:
    """Properties of CuPy's current device; raises CupygemmDeviceError when there is no GPU."""
    try:
        import cupy
    except ImportError as e:
        raise CupygemmDeviceError("CuPy is not installed: pip install 'cupygemm[cuda12]' (or '[cuda13]')") from e
    try:
        index = cupy.cuda.runtime.getDevice()
    except Exception as e:
        raise CupygemmDeviceError(f"{_why_no_device(e)}; {HOPPER_NEEDED}") from e
    return _query(index)


def _why_no_device(error: Exception) -> str:
    """Why CuPy found no device. Without a driver CuPy's error reads cudaErrorInsufficientDriver, which sends users
    after a driver upgrade on a machine that has no GPU at all."""
    if gpu_available():
        return f"no usable CUDA device ({error})"
    try:
        import cupy

        if cupy.cuda.runtime.driverGetVersion() == 0:
            return "no CUDA GPU visible (no NVIDIA driver found)"
    except Exception:
        pass
    return f"no CUDA GPU visible ({error})"


def require_hopper() -> DeviceInfo:
    """The current device, checked to be compute capability 9.0 (H100/H200/H800/H20); CupygemmDeviceError saying
    what is missing (CuPy, a GPU, Hopper) otherwise."""
    info = current_device()
    if info.compute_capability != "90":
        raise CupygemmDeviceError(
            f"cupygemm kernels need compute capability 9.0 (Hopper, sm_90a); device {info.index} "
            f"({info.name}) is {info.compute_capability[0]}.{info.compute_capability[1:]}"
        )
    return info


def require_hopper_or_exit(program: str | None = None) -> DeviceInfo:
    """:func:`require_hopper` for commands and scripts: where it fails, print ``program: <why>`` as one line on
    stderr and exit with status 2 instead of a traceback. ``program`` defaults to the script's file name."""
    try:
        return require_hopper()
    except CupygemmDeviceError as e:
        print(f"{program or os.path.basename(sys.argv[0]) or 'cupygemm'}: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def check_num_sms(num_sms: object) -> int:
    """``num_sms`` as an SM count: TypeError unless an int (not a bool), ValueError outside 1..MAX_NUM_SMS."""
    if isinstance(num_sms, bool) or not isinstance(num_sms, int):
        raise TypeError(f"num_sms: expected an int, got {type(num_sms).__name__}")
    if not 1 <= num_sms <= MAX_NUM_SMS:
        raise ValueError(f"num_sms: expected an SM count in 1..{MAX_NUM_SMS}, got {num_sms}")
    return num_sms


def set_num_sms(num_sms: int) -> None:
    """Limit the SMs the GEMM kernels use (e.g. to leave SMs for communication kernels): at most the device's SMs
    (without a GPU, at most MAX_NUM_SMS). TypeError/ValueError naming ``num_sms`` otherwise."""
    check_num_sms(num_sms)
    if gpu_available():
        total = current_device().num_sms
        if num_sms > total:
            raise ValueError(f"num_sms: the device has {total} SMs, got {num_sms}")
    global _num_sms_override
    with _lock:
        _num_sms_override = num_sms


def get_num_sms() -> int:
    """The SM count kernels are planned for: the value given to set_num_sms, else the device's."""
    with _lock:
        if _num_sms_override is not None:
            return _num_sms_override
    return current_device().num_sms


@functools.lru_cache(maxsize=1)
def single_gpu() -> bool:
    """Only one CUDA device: no call ever needs to switch the current device."""
    import cupy

    return cupy.cuda.runtime.getDeviceCount() == 1


def on_device(index: int):
    """A context making ``index`` the current device; nothing to do (and nothing done) when it already is."""
    import cupy

    if cupy.cuda.runtime.getDevice() == index:
        return contextlib.nullcontext()
    return cupy.cuda.Device(index)


def num_sms_override() -> int | None:
    """The value given to set_num_sms, or None (part of a launch plan's key)."""
    return _num_sms_override


def reset_num_sms() -> None:
    """Undo set_num_sms: use every SM of the device again."""
    global _num_sms_override
    with _lock:
        _num_sms_override = None
