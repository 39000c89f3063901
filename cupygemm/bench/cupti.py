"""Kernel time as a profiler reports it, through CUPTI's activity API (ctypes; benchmark use only).

The published peer tables (benchmarks/peers) sum the durations of every kernel a call launches, as the CUDA
profiler records them; CUDA events around a call add launch gaps (~3.5 us on an H200). This module records
CONCURRENT_KERNEL activity records (start/end timestamps written by the GPU) and sums them per call.

CUPTI ships with the CUDA toolkit (``extras/CUPTI/lib64``) and as the ``nvidia-cuda-cupti`` wheels; when no
library loads, or its records do not parse as expected, :func:`open_kernel_timer` returns None and callers fall
back to CUDA events.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import glob
import os
import sys
import threading
from typing import Any, Callable

_KIND_CONCURRENT_KERNEL = 10  # CUpti_ActivityKind
_FLUSH_FORCED = 1  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
_BUFFER_BYTES = 4 << 20
# CUpti_ActivityKernel4..9 share their head: kind (u32) at 0, start (u64) at 16, end (u64) at 24,
# correlationId (u32) at 92 and the kernel name (const char*) at 104.
_OFF_START, _OFF_END, _OFF_NAME = 16, 24, 104

_REQUESTED = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.POINTER(ctypes.c_uint8)), ctypes.POINTER(ctypes.c_size_t),
                              ctypes.POINTER(ctypes.c_size_t))
_COMPLETED = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint8), ctypes.c_size_t,
                              ctypes.c_size_t)


def _candidate_paths() -> list[str]:
    paths = []
    from ..env import cupti_path

    env = cupti_path()
    if env:
        paths.append(env)
    for base in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_cupti/lib", "nvidia/cu12/lib"):
            paths += sorted(glob.glob(os.path.join(base, sub, "libcupti.so*")), reverse=True)
    for root in (os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"):
        if root:
            paths += sorted(glob.glob(os.path.join(root, "extras/CUPTI/lib64/libcupti.so*")), reverse=True)
    found = ctypes.util.find_library("cupti")
    if found:
        paths.append(found)
    return paths


class KernelTimer:
    """Collects the kernels launched while it is enabled; :meth:`time` returns per-call kernel microseconds."""

    def __init__(self, lib: ctypes.CDLL, path: str):
        self.lib, self.path = lib, path
        self._buffers: dict[int, Any] = {}
        self._records: list[tuple[int, int, str]] = []
        self._lock = threading.Lock()
        self._req = _REQUESTED(self._on_request)
        self._done = _COMPLETED(self._on_complete)
        self._check(lib.cuptiActivityRegisterCallbacks(self._req, self._done), "cuptiActivityRegisterCallbacks")

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed with CUPTI status {status}")

    def _on_request(self, buf_pp, size_p, max_records_p) -> None:
        buf = (ctypes.c_uint8 * (_BUFFER_BYTES + 8))()
        addr = (ctypes.addressof(buf) + 7) & ~7  # records need 8-byte alignment
        self._buffers[addr] = buf
        buf_pp[0] = ctypes.cast(addr, ctypes.POINTER(ctypes.c_uint8))
        size_p[0] = _BUFFER_BYTES
        max_records_p[0] = 0

    def _on_complete(self, ctx, stream_id, buf_p, size, valid) -> None:
        addr = ctypes.cast(buf_p, ctypes.c_void_p).value
        record = ctypes.c_void_p()
        got = []
        while valid and self.lib.cuptiActivityGetNextRecord(buf_p, ctypes.c_size_t(valid), ctypes.byref(record)) == 0:
            base = record.value
            if ctypes.c_uint32.from_address(base).value == _KIND_CONCURRENT_KERNEL:
                start = ctypes.c_uint64.from_address(base + _OFF_START).value
                end = ctypes.c_uint64.from_address(base + _OFF_END).value
                name_p = ctypes.c_char_p.from_address(base + _OFF_NAME).value
                got.append((start, end, (name_p or b"").decode(errors="replace")))
        with self._lock:
            self._records += got
        self._buffers.pop(addr, None)

    def _drain(self) -> list[tuple[int, int, str]]:
        self._check(self.lib.cuptiActivityFlushAll(_FLUSH_FORCED), "cuptiActivityFlushAll")
        with self._lock:
            out, self._records = self._records, []
        return out

    @contextlib.contextmanager
    def _recording(self):
        """Kernel records enabled for the block, starting from an empty record list."""
        self._check(self.lib.cuptiActivityEnable(_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable")
        try:
            self._drain()
            yield
        finally:
            self.lib.cuptiActivityDisable(_KIND_CONCURRENT_KERNEL)

    def time(self, call: Callable[[], Any], iters: int, before: Callable[[], Any] | None = None,
             sync: Callable[[], Any] | None = None, kernels: list[int] | None = None,
             exclude: str | None = None) -> list[float]:
        """Microseconds of kernel time per call: the sum of the durations of the kernels each call launches.

        ``before`` runs untimed before each call (an L2 flush; memsets are not kernel records; a kernel named
        ``exclude`` is left out); ``sync`` waits for the device so each call's records can be told apart. ``kernels``: a list to which the number of kernels of
        each call is appended (a k-grouped peer that loops over its groups launches one per group)."""
        times = []
        with self._recording():
            for _ in range(iters):
                if before is not None:
                    before()
                call()
                if sync is not None:
                    sync()
                recs = [r for r in self._drain() if r[2] != exclude]
                if not recs:
                    raise RuntimeError("CUPTI recorded no kernel for a call")
                times.append(sum(end - start for start, end, _ in recs) / 1e3)
                if kernels is not None:
                    kernels.append(len(recs))
        return times

    def records(self, call: Callable[[], Any], sync: Callable[[], Any]) -> list[tuple[int, int, str]]:
        """(start ns, end ns, name) of every kernel one call launches (graph replays included), by start time."""
        with self._recording():
            call()
            sync()
            return sorted(self._drain())

    def names(self, call: Callable[[], Any], sync: Callable[[], Any]) -> list[str]:
        """Names of the kernels one call launches (a check that the records parse)."""
        return [name for _, _, name in self.records(call, sync)]


class CuptiPythonTimer(KernelTimer):
    """The same timer through NVIDIA's ``cupti-python`` (``from cupti import cupti``): CUPTI's activity records as
    Python objects, instead of driver structs read at fixed offsets. The default wherever the package is installed
    (``bench`` extra); it times like the ctypes path (within 0.5 % on an H100, ``scripts/compare_timers.py``,
    benchmarks/results/timers-h100-2026-11-25.json), which stays as the fallback: it needs nothing beyond
    libcupti, which the CUDA toolkit and torch's wheels carry."""

    def __init__(self, cupti_mod: Any):
        self.cupti, self.lib = cupti_mod, None
        self.path = "cupti-python"
        self._records = []
        self._lock = threading.Lock()
        self._kind = cupti_mod.ActivityKind.CONCURRENT_KERNEL
        cupti_mod.activity_register_callbacks(self._on_request_py, self._on_complete_py)

    def _on_request_py(self) -> tuple[int, int]:
        return _BUFFER_BYTES, 0  # 0: as many records as fit (a limit made CUPTI ask for buffers repeatedly)

    def _on_complete_py(self, activities: list) -> None:
        got = []
        for a in activities:
            if a.kind == self._kind:
                name = a.name
                got.append((a.start, a.end, name.decode(errors="replace") if isinstance(name, bytes) else str(name)))
        with self._lock:
            self._records += got

    def _drain(self) -> list[tuple[int, int, str]]:
        self.cupti.activity_flush_all(_FLUSH_FORCED)
        with self._lock:
            out, self._records = self._records, []
        return out

    @contextlib.contextmanager
    def _recording(self):
        self.cupti.activity_enable(self._kind)
        try:
            self._drain()
            yield
        finally:
            self.cupti.activity_disable(self._kind)


def _checked(timer: KernelTimer, probe: Callable[[], Any], probe_name: str, sync: Callable[[], Any]) -> str | None:
    """None when ``timer`` records ``probe`` as one kernel named ``probe_name`` with a plausible time, else why not."""
    names = timer.names(probe, sync)
    us = timer.time(probe, 3, sync=sync)
    if names != [probe_name] or not all(0 < t < 1e5 for t in us):
        return f"records do not parse as expected ({names}, {us})"
    return None


BACKENDS = ("auto", "python", "ctypes")


def open_kernel_timer(probe: Callable[[], Any], probe_name: str, sync: Callable[[], Any],
                      backend: str = "auto") -> tuple[KernelTimer | None, str]:
    """A working KernelTimer, checked on ``probe`` (a call launching one kernel named ``probe_name``), or None
    and the reason. ``backend``: ``"python"`` (NVIDIA's cupti-python package), ``"ctypes"`` (libcupti through
    ctypes) or ``"auto"`` (python where it works, else ctypes)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        timer, why_python = open_kernel_timer(probe, probe_name, sync, "python")
        if timer is not None:
            return timer, why_python
        timer, why = open_kernel_timer(probe, probe_name, sync, "ctypes")
        return (timer, why) if timer is not None else (None, f"{why_python}; {why}")
    if backend == "python":
        try:
            from cupti import cupti as cupti_mod
        except ImportError as e:
            return None, f"cupti-python is not installed ({e}): pip install cupti-python"
        try:
            timer = CuptiPythonTimer(cupti_mod)
            why = _checked(timer, probe, probe_name, sync)
        except Exception as e:  # CUPTI present but unusable (version, permissions, another profiler)
            return None, f"cupti-python: {e}"
        return (None, f"cupti-python: {why}") if why else (timer, "cupti-python")
    reasons = []
    for path in _candidate_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            reasons.append(f"{path}: {e}")
            continue
        try:
            timer = KernelTimer(lib, path)
            why = _checked(timer, probe, probe_name, sync)
        except Exception as e:  # CUPTI present but unusable (version, permissions, another profiler)
            reasons.append(f"{path}: {e}")
            continue
        if why:
            reasons.append(f"{path}: {why}")
            continue
        return timer, path
    return None, "; ".join(reasons) or "no libcupti found"
