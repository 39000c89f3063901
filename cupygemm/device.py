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
# Per device index: each GPU of a process keeps its own limit (one per rank's GPU in a multi-GPU process).
_num_sms_overrides: dict[int, int] = {}
_num_sms_key: tuple[tuple[int, int], ...] = ()


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


def _current_index() -> int:
    """CuPy's (the CUDA runtime's) current device; 0 without a GPU, where there is nothing to choose from."""
    if not gpu_available():
        return 0
    import cupy

    return cupy.cuda.runtime.getDevice()


def _device_count() -> int | None:
    """How many CUDA devices there are; None without a GPU (nothing to check a device index against)."""
    if not gpu_available():
        return None
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def device_index(device: object = None) -> int:
    """The CUDA device index ``device`` names: None (the current device), an int, a ``torch.device`` of type cuda
    or a ``cupy.cuda.Device``. TypeError/ValueError naming ``device`` otherwise, or for an index no GPU here has."""
    if device is None:
        return _current_index()
    index = device
    kind = getattr(device, "type", None)  # a torch.device
    if isinstance(kind, str):
        if kind != "cuda":
            raise ValueError(f"device: expected a CUDA device, got {device}")
        if device.index is None:  # torch.device("cuda"): the current one
            return _current_index()
        index = device.index
    elif not isinstance(device, int):
        index = getattr(device, "id", None)  # a cupy.cuda.Device
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"device: expected None, a device index, a torch.device or a cupy.cuda.Device, got "
                        f"{type(device).__name__}")
    count = _device_count()
    if index < 0 or (count is not None and index >= count):
        raise ValueError(f"device: expected a device index in 0..{(count or 1) - 1}, got {index}")
    return index


def set_num_sms(num_sms: int, device: object = None) -> None:
    """Limit the SMs the GEMM kernels use on ``device`` (default: the current device; an index, a ``torch.device``
    or a ``cupy.cuda.Device``), e.g. to leave SMs for communication kernels: at most the device's SMs (without a
    GPU, at most MAX_NUM_SMS). Other devices keep their own setting. TypeError/ValueError naming ``num_sms`` or
    ``device`` otherwise. ``set_num_sms(n)`` is DeepGEMM's call, for the current device."""
    check_num_sms(num_sms)
    index = device_index(device)
    if gpu_available():
        total = _query(index).num_sms
        if num_sms > total:
            raise ValueError(f"num_sms: device {index} has {total} SMs, got {num_sms}")
    global _num_sms_key
    with _lock:
        _num_sms_overrides[index] = num_sms
        _num_sms_key = tuple(sorted(_num_sms_overrides.items()))


def get_num_sms(device: object = None) -> int:
    """The SM count kernels on ``device`` (default: the current device) are planned for: the value given to
    set_num_sms for that device, else all of its SMs."""
    index = device_index(device)
    n = _num_sms_overrides.get(index)
    if n is not None:
        return n
    if not gpu_available():
        current_device()  # raises CupygemmDeviceError saying what is missing
    return _query(index).num_sms


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


_threads = threading.local()


def ensure_context(device: int) -> None:
    """Bind ``device``'s context to this host thread if no launch from it has yet (``device`` must be current).

    A thread that made no CUDA runtime call has no context bound, and its current device still reads as 0, so
    neither ``on_device`` nor ``cupy.cuda.Device`` switches anything; a driver launch then fails with
    CUDA_ERROR_INVALID_CONTEXT. Torch's autograd threads are such threads (their ``set_device(0)`` is skipped when
    0 already reads as current), so a backward whose first CUDA work is one of our launches met it. The runtime
    binds a context at a thread's first call that needs one: ``cudaMemGetInfo`` once per thread and device (as
    CuPy's own launches do), then a thread-local set lookup."""
    try:
        if device in _threads.devices:
            return
    except AttributeError:
        _threads.devices = set()
    import cupy

    cupy.cuda.runtime.memGetInfo()
    _threads.devices.add(device)


def num_sms_override(device: object = None) -> int | None:
    """The value given to set_num_sms for ``device`` (default: the current device), or None."""
    return _num_sms_overrides.get(device_index(device))


def num_sms_key() -> tuple[tuple[int, int], ...]:
    """Every device's set_num_sms value, as (device, num_sms) pairs: part of a call signature (a call's devices are
    in its signature too), read without a device query on the hot path."""
    return _num_sms_key


def reset_num_sms(device: object = None) -> None:
    """Undo set_num_sms on ``device`` (default: the current device): use every SM of it again."""
    index = device_index(device)
    global _num_sms_key
    with _lock:
        _num_sms_overrides.pop(index, None)
        _num_sms_key = tuple(sorted(_num_sms_overrides.items()))
