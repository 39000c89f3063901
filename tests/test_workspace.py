"""The per-stream buffers (cupygemm.workspace) on CPU: one registry policy for the split-K scratch and the SFA
copies. Growth with headroom, at most MAX_SETS sets per kind (oldest out), CuPy memory kept for good (a captured
graph may hold its addresses), torch memory fresh from the graph's pool while the stream is being captured, and the
capture question asked only where it matters. The allocators are stand-ins that hand out numbered addresses."""
from __future__ import annotations

import contextlib
import itertools
import sys
from types import SimpleNamespace

import pytest

cupy = pytest.importorskip("cupy")

from cupygemm import workspace  # noqa: E402
from cupygemm.tensors import Framework  # noqa: E402

CUPY, TORCH = Framework.CUPY, Framework.TORCH


class _Array:
    def __init__(self, framework, n, dtype, zeroed, ptr):
        self.framework, self.n, self.dtype, self.zeroed, self.ptr = framework, n, dtype, zeroed, ptr
        self.data = SimpleNamespace(ptr=ptr)

    def data_ptr(self):
        return self.ptr


@pytest.fixture
def mem(monkeypatch):
    """Fresh registries, and allocators that log (framework, elements, dtype, zeroed) per array; ``capturing``
    says what the capture query answers, ``queries`` counts the queries."""
    state = SimpleNamespace(allocs=[], capturing=False, queries=0)
    ptrs = itertools.count(0x10000, 0x10000)

    def alloc(framework, zeroed):
        def make(n, dtype=None, device=None):
            a = _Array(framework, n, dtype, zeroed, next(ptrs))
            state.allocs.append(a)
            return a
        return make

    torch = SimpleNamespace(float32="f32", int32="i32", device=lambda kind, index: (kind, index),
                            empty=alloc("torch", False), zeros=alloc("torch", True))
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(cupy, "empty", alloc("cupy", False))
    monkeypatch.setattr(cupy, "zeros", alloc("cupy", True))
    monkeypatch.setattr(cupy.cuda, "Device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(workspace, "cupy_stream", lambda stream, device: contextlib.nullcontext())
    monkeypatch.setattr(workspace, "torch_stream", lambda stream, device: contextlib.nullcontext())

    def is_capturing(stream):
        state.queries += 1
        return state.capturing

    monkeypatch.setattr(workspace, "is_capturing", is_capturing)
    monkeypatch.setattr(workspace, "_SCRATCH", workspace.Registry("scratch", counters=True))
    monkeypatch.setattr(workspace, "_SFA", workspace.Registry("sfa", counters=False))
    return state


def _sizes(allocs):
    return [(a.framework, a.n, a.dtype, a.zeroed) for a in allocs]


@pytest.mark.parametrize("framework", [CUPY, TORCH])
def test_a_repeated_call_reuses_its_set(mem, framework):
    first = workspace.scratch(100, 8, 0, 7, framework)
    assert workspace.scratch(100, 8, 0, 7, framework) == first
    assert workspace.scratch(125, 10, 0, 7, framework)[:2] == first[:2]  # within the headroom
    f32, u32 = (cupy.float32, cupy.uint32) if framework is CUPY else ("f32", "i32")
    assert _sizes(mem.allocs) == [(framework.value, 125, f32, False), (framework.value, 10, u32, True)]
    s = first[2]
    assert (s.floats, s.num_counters, s.ptrs) == (125, 10, first[:2]) and s.counters is mem.allocs[1]
    assert s.pinned is (framework is CUPY)


@pytest.mark.parametrize("framework", [CUPY, TORCH])
def test_growth_keeps_outgrown_cupy_memory(mem, framework):
    _, _, small = workspace.scratch(100, 8, 0, 7, framework)
    _, _, big = workspace.scratch(200, 4, 0, 7, framework)  # more partials: both grow from the larger size
    assert (big.floats, big.num_counters) == (250, 12)
    _, _, more = workspace.scratch(100, 20, 0, 7, framework)  # more counters
    assert (more.floats, more.num_counters) == (312, 25)
    assert list(workspace._SCRATCH.sets.values()) == [more]
    assert workspace._SCRATCH.pinned == ([small, big] if framework is CUPY else [])


@pytest.mark.parametrize("framework", [CUPY, TORCH])
def test_at_most_max_sets_oldest_first(mem, monkeypatch, framework):
    monkeypatch.setattr(workspace, "MAX_SETS", 3)
    sets = [workspace.scratch(100, 8, 0, stream, framework)[2] for stream in (1, 2, 3)]
    workspace.scratch(200, 8, 0, 1, framework)  # regrown: stream 1's set is now the newest
    workspace.scratch(100, 8, 0, 4, framework)  # evicts stream 2's, the oldest
    assert [key[2] for key in workspace._SCRATCH.sets] == [3, 1, 4]
    kept = [sets[0], sets[1]] if framework is CUPY else []  # outgrown, then evicted
    assert workspace._SCRATCH.pinned == kept
    assert workspace.scratch(100, 8, 0, 3, framework)[2] is sets[2]


def test_each_device_and_framework_has_its_own_sets(mem):
    a = workspace.scratch(100, 8, 0, 7, CUPY)[2]
    assert workspace.scratch(100, 8, 1, 7, CUPY)[2] is not a
    assert workspace.scratch(100, 8, 0, 7, TORCH)[2] is not a
    assert set(workspace._SCRATCH.sets) == {(False, 0, 7), (False, 1, 7), (True, 0, 7)}


def test_torch_capture_gets_fresh_memory_each_launch(mem):
    mem.capturing = True
    p1 = workspace.scratch(100, 8, 0, 7, TORCH)
    p2 = workspace.scratch(100, 8, 0, 7, TORCH)
    assert p1[:2] != p2[:2] and mem.queries == 2
    assert _sizes(mem.allocs) == [("torch", 100, "f32", False), ("torch", 8, "i32", True)] * 2  # exact, zeroed
    assert not workspace._SCRATCH.sets and not workspace._SCRATCH.pinned  # the graph owns them
    ptr, owner = workspace.sfa_buffer(300, 0, 7, TORCH)
    assert owner.n == 300 and ptr == owner.ptr and not workspace._SFA.sets


def test_the_capture_question(mem):
    workspace.scratch(100, 8, 0, 7, CUPY)
    workspace.sfa_buffer(100, 0, 7, CUPY)
    assert mem.queries == 0  # CuPy memory is kept for good: nothing to ask
    workspace.scratch(100, 8, 0, 7, TORCH)
    assert mem.queries == 1  # asked when the caller does not say
    workspace.scratch(100, 8, 0, 7, TORCH, capturing=False)
    workspace.sfa_buffer(100, 0, 7, TORCH, capturing=False)
    assert mem.queries == 1 and len(workspace._SCRATCH.sets) == 2 and len(workspace._SFA.sets) == 2
    n = len(mem.allocs)
    workspace.scratch(100, 8, 0, 7, TORCH, capturing=True)  # the caller's answer stands
    assert mem.queries == 1 and len(mem.allocs) == n + 2


@pytest.mark.parametrize("framework", [CUPY, TORCH])
def test_sfa_buffers_follow_the_same_policy(mem, monkeypatch, framework):
    monkeypatch.setattr(workspace, "MAX_SETS", 2)
    ptr, owner = workspace.sfa_buffer(1000, 0, 7, framework)
    assert (ptr, owner.n, owner.zeroed) == (owner.ptr, 1250, False) and len(mem.allocs) == 1  # no counters
    assert workspace.sfa_buffer(1250, 0, 7, framework) == (ptr, owner)
    ptr2, owner2 = workspace.sfa_buffer(1300, 0, 7, framework)
    assert owner2.n == 1625 and ptr2 != ptr
    workspace.sfa_buffer(10, 0, 8, framework)
    workspace.sfa_buffer(10, 0, 9, framework)  # evicts stream 7's
    assert [key[2] for key in workspace._SFA.sets] == [8, 9]
    assert [s.data for s in workspace._SFA.pinned] == ([owner, owner2] if framework is CUPY else [])
    assert not workspace._SCRATCH.sets  # a kind of its own


def test_the_per_thread_default_stream_has_sets_per_thread(mem):
    """cudaStreamPerThread is one handle but another stream in each host thread: a set shared between threads would
    let two threads' kernels use one scratch unordered."""
    import threading

    here = workspace.scratch(100, 8, 0, workspace.PER_THREAD_STREAM, CUPY)[2]
    assert workspace.scratch(100, 8, 0, workspace.PER_THREAD_STREAM, CUPY)[2] is here
    there = {}
    worker = threading.Thread(target=lambda: there.update(
        scratch=workspace.scratch(100, 8, 0, workspace.PER_THREAD_STREAM, CUPY)[2],
        sfa=workspace.sfa_buffer(100, 0, workspace.PER_THREAD_STREAM, CUPY)[1]))
    worker.start()
    worker.join()
    assert there["scratch"] is not here and len(workspace._SCRATCH.sets) == 2
    assert there["sfa"] is not workspace.sfa_buffer(100, 0, workspace.PER_THREAD_STREAM, CUPY)[1]
    a = workspace.scratch(100, 8, 0, 7, CUPY)[2]  # an ordinary stream stays one set for all threads
    worker = threading.Thread(target=lambda: there.update(ordinary=workspace.scratch(100, 8, 0, 7, CUPY)[2]))
    worker.start()
    worker.join()
    assert there["ordinary"] is a
