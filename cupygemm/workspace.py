"""Per-stream buffers: the scratch memory of split-K across CTAs (``GemmConfig.split_k > 1``) and of the stream-K tail
(``GemmConfig.stream_k``), FP32 partial tiles and arrival counters (:func:`scratch`; the sizes a launch needs are the
kernel contract's, :func:`cupygemm.contract.scratch_sizes`), and the buffer that A's scales are copied into when a
call's SFA is not in the kernels' layout (:func:`sfa_buffer`, :mod:`cupygemm.sfa_layout`). Each kind is a
:class:`Registry` of buffer sets per (memory's framework, device, stream), all under the rules below.

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

Side-aware kernels (packed weights) draw a ticket for their half of N from counters that the launch's last cluster
sets back to zero. A PDL kernel starts while the kernel before it on the stream ends, so on counters shared with
it the draw would have to wait for it; :func:`side_tickets` gives each stream two sets that its launches take in
turn. A PDL kernel starts only once the one before it has passed its own wait, which came after the kernel before
that had finished: the set it takes is free, and it draws before its wait (``side_tickets_before_wait``). A torch
capture keeps the tickets in the launch's fresh scratch (drawn after the wait): the graph may be replayed on
another stream, beside this one's own launches.

A set grows with headroom (a quarter more than asked for, or than it had), so a few larger problems do not each
reallocate; each kind keeps at most ``MAX_SETS`` sets, the oldest (made or grown longest ago) going first.
"""
from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from .contract import SIDE_TICKET_COUNTERS
from .streams import cupy_stream, is_capturing, torch_stream
from .tensors import Framework

MAX_SETS = 64


@dataclass(slots=True)
class BufferSet:
    """One stream's buffers of one kind: ``data``, FP32, and for kinds with counters ``counters``, uint32 (CuPy) or
    int32 (torch), all zero between kernels."""

    data: Any  # float32 array (CuPy or torch)
    counters: Any  # the counters' array, or None
    ptrs: tuple[int, int]  # data's and the counters' device pointers (0: none)
    floats: int  # sizes of data and counters (read on every call: cheaper than the arrays' shapes)
    num_counters: int
    pinned: bool  # CuPy memory: may be captured into a CUDA graph, so never freed
    # Side tickets only (:func:`side_tickets`): the set the stream's last launch took, and the lock held from
    # :meth:`next_tickets` until that launch is queued, so that two threads on one stream alternate too.
    parity: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_tickets(self) -> int:
        """The device pointer of the ticket set the stream's next launch takes: the other one than its last
        launch's. The launch takes it once it is queued (:meth:`took_tickets`): one that raised before took none, and
        the launch after it must not get the set that the kernel before may still be drawing from."""
        return self.ptrs[1] + 4 * SIDE_TICKET_COUNTERS * (self.parity ^ 1)

    def took_tickets(self) -> None:
        """The launch given :meth:`next_tickets` is queued."""
        self.parity ^= 1


class Registry:
    """The buffer sets of one kind, per (torch memory or not, device, stream), under the module's rules.

    The lookup on the hot path is the caller's (one dict lookup and a size compare on :attr:`sets`); it calls
    :meth:`grow` when the set is missing or too small, and :meth:`fresh` for a launch inside a torch capture."""

    def __init__(self, name: str, counters: bool):
        self.name = name
        self.has_counters = counters
        self.sets: OrderedDict[tuple[bool, int, int], BufferSet] = OrderedDict()
        self.pinned: list[BufferSet] = []  # CuPy sets outgrown or evicted: kept alive for the process's life
        self._lock = threading.Lock()

    def fresh(self, floats: int, counters: int, device: int, stream: int) -> BufferSet:
        """A torch set of these sizes for one launch on ``stream`` while it is being captured: from the graph's
        pool, owned by the graph (not kept here)."""
        return self._alloc(True, floats, counters, device, stream)

    def grow(self, key: tuple[bool, int, int], floats: int, counters: int) -> BufferSet:
        """The set of ``key`` (torch memory or not, device, stream), made or replaced by one of at least ``floats``
        and ``counters``, with headroom; evicts the oldest sets beyond MAX_SETS."""
        torch_memory, device, stream = key[:3]
        with self._lock:
            old = self.sets.get(key)
            if old is not None and old.floats >= floats and old.num_counters >= counters:
                return old  # another thread grew it meanwhile
            new = self._alloc(torch_memory, max(floats, old.floats if old else 0) * 5 // 4,
                              max(counters, old.num_counters if old else 0) * 5 // 4, device, stream)
            if old is not None:
                del self.sets[key]
                if old.pinned:
                    self.pinned.append(old)
            self.sets[key] = new
            while len(self.sets) > MAX_SETS:  # the oldest set goes first
                _, evicted = self.sets.popitem(last=False)
                if evicted.pinned:
                    self.pinned.append(evicted)
            return new

    def _alloc(self, torch_memory: bool, floats: int, counters: int, device: int, stream: int) -> BufferSet:
        if torch_memory:
            torch = sys.modules["torch"]
            dev = torch.device("cuda", device)
            with torch_stream(stream, device):
                data = torch.empty(floats, dtype=torch.float32, device=dev)
                c = torch.zeros(counters, dtype=torch.int32, device=dev) if self.has_counters else None
            return BufferSet(data, c, (data.data_ptr(), 0 if c is None else c.data_ptr()), floats, counters, False)
        import cupy

        with cupy.cuda.Device(device), cupy_stream(stream, device):
            data = cupy.empty(floats, dtype=cupy.float32)
            c = cupy.zeros(counters, dtype=cupy.uint32) if self.has_counters else None
        return BufferSet(data, c, (data.data.ptr, 0 if c is None else c.data.ptr), floats, counters, True)


#: cudaStreamPerThread: one handle that is another stream in every host thread (CuPy with
#: CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1), so its buffers are per thread too: shared, two threads' kernels would run
#: unordered on one set.
PER_THREAD_STREAM = 2


def _per_thread_key(torch_memory: bool, device: int) -> tuple:
    return torch_memory, device, PER_THREAD_STREAM, threading.get_ident()


_SCRATCH = Registry("split-K and stream-K scratch", counters=True)
_TICKETS = Registry("side tickets", counters=True)
_SFA = Registry("A scales in the kernels' layout", counters=False)
_SFB = Registry("B's 1x128 scales in the kernels' layout", counters=False)


def scratch(floats: int, counters: int, device: int, stream: int, framework: Framework,
            capturing: bool | None = None) -> tuple[int, int, Any]:
    """Device pointers (partials, counters) of at least ``floats`` FP32 partials and ``counters`` zeroed counters
    for a launch on ``stream``, and an object to keep alive until the launch is queued. ``capturing``: whether
    ``stream`` is being captured, where the caller knows already (None: asked here, for torch memory only)."""
    torch_memory = framework is Framework.TORCH
    if torch_memory and (is_capturing(stream) if capturing is None else capturing):
        s = _SCRATCH.fresh(floats, counters, device, stream)
        return s.ptrs[0], s.ptrs[1], s
    key = (torch_memory, device, stream) if stream != PER_THREAD_STREAM else _per_thread_key(torch_memory, device)
    s = _SCRATCH.sets.get(key)
    if s is None or s.floats < floats or s.num_counters < counters:
        s = _SCRATCH.grow(key, floats, counters)
    return s.ptrs[0], s.ptrs[1], s


def side_tickets(device: int, stream: int, framework: Framework, capturing: bool | None = None) -> BufferSet | None:
    """The two side ticket sets of ``stream`` (see the module docstring), or None while a torch stream is being
    captured (the launch then takes its tickets from its scratch). ``capturing`` as for :func:`scratch`."""
    torch_memory = framework is Framework.TORCH
    if torch_memory and (is_capturing(stream) if capturing is None else capturing):
        return None
    key = (torch_memory, device, stream) if stream != PER_THREAD_STREAM else _per_thread_key(torch_memory, device)
    s = _TICKETS.sets.get(key)
    if s is None:
        s = _TICKETS.grow(key, 0, 2 * SIDE_TICKET_COUNTERS)
    return s


def sfa_buffer(floats: int, device: int, stream: int, framework: Framework,
               capturing: bool | None = None, operand: str = "a") -> tuple[int, Any]:
    """The device pointer of at least ``floats`` FP32 for a call's A scales in the kernels' layout, written and
    read on ``stream`` (so one buffer serves every call there), and the array owning it. ``capturing`` as for
    :func:`scratch`. ``operand="b"``: a second buffer, for the 1x128 B scales of the 1D1D kinds."""
    registry = _SFA if operand == "a" else _SFB
    torch_memory = framework is Framework.TORCH
    if torch_memory and (is_capturing(stream) if capturing is None else capturing):
        s = registry.fresh(floats, 0, device, stream)
        return s.ptrs[0], s.data
    key = (torch_memory, device, stream) if stream != PER_THREAD_STREAM else _per_thread_key(torch_memory, device)
    s = registry.sets.get(key)
    if s is None or s.floats < floats:
        s = registry.grow(key, floats, 0)
    return s.ptrs[0], s.data
