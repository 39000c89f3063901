"""Scratch memory of split-K across CTAs (``GemmConfig.split_k > 1``) and of the stream-K tail
(``GemmConfig.stream_k``): FP32 partial tiles and arrival counters, per (device, stream) on which the kernel runs.
The sizes a launch needs are the kernel contract's (:func:`cupygemm.contract.scratch_sizes`). Also per stream, and
under the same rules: the buffer that A's scales are copied into when a call's SFA is not in the kernels' layout
(:func:`sfa_buffer`, :mod:`cupygemm.sfa_layout`).

Kernels on one stream run in order, so they can share a set; kernels on different streams may overlap, so each
stream gets its own. The counters start at zero and every kernel leaves them at zero (the last CTA of a tile
resets its counter).

The memory comes from the caller's framework, allocated in the stream's order:

* torch callers: torch's caching allocator. While the stream is being captured into a CUDA graph, each launch
  gets a fresh set from the graph's private pool (counters zeroed by a captured memset), which the graph owns.
* everyone else: CuPy's pool. A set is never freed, also when it is outgrown or beyond ``MAX_SETS`` streams,
  since a CUDA graph captured on its stream may hold its addresses (checking for a capture on every call would
  cost a microsecond of the call's host time); CuPy callers must run a call once before capturing it, so that
  nothing is allocated during capture.
"""
from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from .streams import cupy_stream, is_capturing, torch_stream
from .tensors import Framework

MAX_SETS = 64


@dataclass
class _Scratch:
    partials: Any  # float32 array (CuPy or torch)
    counters: Any  # uint32 (CuPy) or int32 (torch) array, all zero between kernels
    ptrs: tuple[int, int]
    floats: int  # sizes of partials and counters (read on every call: cheaper than the arrays' shapes)
    num_counters: int
    pinned: bool = False  # may be captured into a CUDA graph: never freed
    outgrown: list = field(default_factory=list)  # pinned arrays this set has replaced


_lock = threading.Lock()
_sets: OrderedDict[tuple[str, int, int], _Scratch] = OrderedDict()
_pinned: list[_Scratch] = []  # evicted pinned sets, kept alive


def _alloc_torch(floats: int, counters: int, device: int, stream: int) -> _Scratch:
    torch = sys.modules["torch"]
    dev = torch.device("cuda", device)
    with torch_stream(stream, device):
        p = torch.empty(floats, dtype=torch.float32, device=dev)
        c = torch.zeros(counters, dtype=torch.int32, device=dev)
    return _Scratch(p, c, (p.data_ptr(), c.data_ptr()), floats, counters)


def _alloc_cupy(floats: int, counters: int, device: int, stream: int) -> _Scratch:
    import cupy

    with cupy.cuda.Device(device), cupy_stream(stream, device):
        p = cupy.empty(floats, dtype=cupy.float32)
        c = cupy.zeros(counters, dtype=cupy.uint32)
    return _Scratch(p, c, (p.data.ptr, c.data.ptr), floats, counters)


def scratch(floats: int, counters: int, device: int, stream: int, framework: Framework) -> tuple[int, int, Any]:
    """Device pointers (partials, counters) of at least ``floats`` FP32 partials and ``counters`` zeroed counters
    for a launch on ``stream``, and an object to keep alive until the launch is queued."""
    torch_memory = framework is Framework.TORCH
    if torch_memory:
        capturing = is_capturing(stream)
        if capturing:
            s = _alloc_torch(floats, counters, device, stream)
            return s.ptrs[0], s.ptrs[1], s
    key = (torch_memory, device, stream)
    s = _sets.get(key)
    if s is None or s.floats < floats or s.num_counters < counters:
        s = _grow(key, floats, counters, torch_memory)
    return s.ptrs[0], s.ptrs[1], s


def _grow(key: tuple[bool, int, int], floats: int, counters: int, torch_memory: bool) -> _Scratch:
    _, device, stream = key
    with _lock:
        s = _sets.get(key)
        # Grow with headroom so a few larger problems do not each reallocate.
        new = (_alloc_torch if torch_memory else _alloc_cupy)(
            max(floats, s.floats if s else 0) * 5 // 4, max(counters, s.num_counters if s else 0) * 5 // 4,
            device, stream)
        new.pinned = not torch_memory  # see the module docstring
        if s is not None and s.pinned:
            new.outgrown = s.outgrown + [s.partials, s.counters]
        _sets.pop(key, None)
        _sets[key] = new
        while len(_sets) > MAX_SETS:  # the oldest set goes first
            _, old = _sets.popitem(last=False)
            if old.pinned:
                _pinned.append(old)
        return new


_sfa: OrderedDict[tuple[bool, int, int], tuple[int, int, Any]] = OrderedDict()  # key -> (floats, pointer, array)
_sfa_pinned: list = []  # CuPy buffers outgrown or evicted: kept, as scratch sets are


def sfa_buffer(floats: int, device: int, stream: int, framework: Framework) -> tuple[int, Any]:
    """The device pointer of at least ``floats`` FP32 for a call's A scales in the kernels' layout, written and
    read on ``stream`` (so one buffer serves every call there), and the object owning it."""
    torch_memory = framework is Framework.TORCH
    if torch_memory and is_capturing(stream):
        t = _alloc_torch_floats(floats, device, stream)
        return t.data_ptr(), t
    key = (torch_memory, device, stream)
    got = _sfa.get(key)
    if got is None or got[0] < floats:
        got = _grow_sfa(key, floats, torch_memory)
    return got[1], got[2]


def _alloc_torch_floats(floats: int, device: int, stream: int) -> Any:
    torch = sys.modules["torch"]
    with torch_stream(stream, device):
        return torch.empty(floats, dtype=torch.float32, device=torch.device("cuda", device))


def _grow_sfa(key: tuple[bool, int, int], floats: int, torch_memory: bool) -> tuple[int, int, Any]:
    _, device, stream = key
    with _lock:
        old = _sfa.pop(key, None)
        floats = max(floats, old[0] if old else 0) * 5 // 4
        if torch_memory:
            t = _alloc_torch_floats(floats, device, stream)
            new = (floats, t.data_ptr(), t)
        else:
            import cupy

            with cupy.cuda.Device(device), cupy_stream(stream, device):
                arr = cupy.empty(floats, dtype=cupy.float32)
            new = (floats, arr.data.ptr, arr)
            if old is not None:
                _sfa_pinned.append(old[2])
        _sfa[key] = new
        while len(_sfa) > MAX_SETS:
            (evicted_torch, _, _), (_, _, arr) = _sfa.popitem(last=False)
            if not evicted_torch:
                _sfa_pinned.append(arr)
        return new
