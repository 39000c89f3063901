"""How ``cupygemm bench`` times a call: an untimed L2 flush before each, then kernel time from CUPTI activity
records (what the peer tables' profiler reports) or CUDA events around the call."""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from .metrics import summarize_times

FLUSH_BYTES = 1 << 30
COPY_BYTES = 1 << 30


class Timer:
    """Times calls after flushing L2 (untimed memset) before each: kernel time from CUPTI records when a
    :class:`~cupygemm.bench.cupti.KernelTimer` is given (what profilers report), else CUDA events.

    An empty kernel follows each flush, so that a call comes after a kernel, as in a model's layer, not after a
    memset: launched with programmatic dependent launch (cupygemm's default) right after a memset, a GEMM took 1.6 %
    longer, after a kernel 0.2 % (benchmarks/NOTES.md, "PDL"). It is left out of the CUPTI sums."""

    def __init__(self, flush_bytes: int = FLUSH_BYTES, kernel_timer: Any = None):
        import cupy

        self.flush_buf = cupy.empty(flush_bytes, dtype=cupy.uint8)
        self.kernel_timer = kernel_timer
        self._noop = _noop_call()

    def flush(self) -> None:
        self.flush_buf.data.memset_async(0, self.flush_buf.nbytes)
        self._noop()

    def time(self, call: Callable[[], Any], iters: int, kernels: list[int] | None = None) -> list[float]:
        """Per-call times in microseconds. ``kernels``: gets the number of kernels of each call appended (CUPTI
        timing only)."""
        import cupy

        stream = cupy.cuda.get_current_stream()
        if self.kernel_timer is not None:
            if kernels is None:
                return self.kernel_timer.time(call, iters, before=self.flush, sync=stream.synchronize,
                                              exclude=_NOOP_NAME)
            return self.kernel_timer.time(call, iters, before=self.flush, sync=stream.synchronize, kernels=kernels,
                                          exclude=_NOOP_NAME)
        return self.time_events(call, iters)

    def median_us(self, call: Callable[[], Any], iters: int) -> float:
        """One untimed call (it may compile or load), then the median of ``iters`` event-timed calls: the quick
        measure of the tuning and probe scripts, which compare variants of one kernel in one process."""
        call()
        return float(np.median(self.time_events(call, iters)))

    def time_events(self, call: Callable[[], Any], iters: int) -> list[float]:
        """Event-timed microseconds. A few flushes first give the host a head start, so Python launch overhead
        hides behind the flushes instead of showing between the events."""
        import cupy

        stream = cupy.cuda.get_current_stream()
        starts = [cupy.cuda.Event() for _ in range(iters)]
        ends = [cupy.cuda.Event() for _ in range(iters)]
        for _ in range(3):
            self.flush()
        for s, e in zip(starts, ends):
            self.flush()
            s.record(stream)
            call()
            e.record(stream)
        ends[-1].synchronize()
        return [cupy.cuda.get_elapsed_time(s, e) * 1e3 for s, e in zip(starts, ends)]


_NOOP_NAME = "cupygemm_bench_noop"


def _noop_call() -> Callable[[], None]:
    """A call launching one empty kernel (compiled and run once here): the probe for timing overheads."""
    import cupy

    noop = cupy.RawKernel(f'extern "C" __global__ void {_NOOP_NAME}() {{}}', _NOOP_NAME)

    def call():
        noop((1,), (32,), ())

    call()
    cupy.cuda.get_current_stream().synchronize()
    return call


def open_cupti_timer(backend: str = "auto") -> tuple[Any, str]:
    """A CUPTI kernel timer (``backend``: see :func:`cupygemm.bench.cupti.open_kernel_timer`) checked on an empty kernel, or None
    and why not."""
    import cupy

    from .cupti import open_kernel_timer

    return open_kernel_timer(_noop_call(), _NOOP_NAME, cupy.cuda.get_current_stream().synchronize, backend)


def measure_copy_bandwidth(nbytes: int = COPY_BYTES, reps: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted), best of ``reps`` after a warm copy."""
    import cupy

    src = cupy.empty(nbytes, dtype=cupy.uint8)
    dst = cupy.empty(nbytes, dtype=cupy.uint8)
    src.data.memset_async(1, nbytes)
    stream = cupy.cuda.get_current_stream()
    best = math.inf
    for i in range(reps + 1):
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record(stream)
        dst.data.copy_from_device_async(src.data, nbytes)
        e.record(stream)
        e.synchronize()
        if i:
            best = min(best, cupy.cuda.get_elapsed_time(s, e) * 1e-3)
    del src, dst
    cupy.get_default_memory_pool().free_all_blocks()
    return 2 * nbytes / best


def measure_event_overhead(timer: Timer, iters: int = 50) -> float | None:
    """Median event-timed microseconds of an empty kernel, measured like the GEMMs (flush, events): what event
    timing adds to a kernel's own time (profilers, which the published peer tables use, do not count it)."""
    try:
        call = _noop_call()
        return summarize_times(timer.time_events(call, iters))["us"]
    except Exception:
        return None


def capture_graph(stream: Any, call: Callable[[], Any], calls: int) -> Any:
    """``calls`` calls of ``call`` captured on ``stream`` into a CUDA graph, launched once (so later launches are
    warm). Run ``call`` once before: its first call may load kernels or allocate, which a capture must not see."""
    with stream:
        stream.begin_capture()
        for _ in range(calls):
            call()
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    return graph


def back_to_back_us(stream: Any, run: Callable[[], Any], per: int = 1) -> float:
    """As :func:`stream_event_us`, for ``run()`` right behind another ``run()`` (untimed): the steady state of work
    enqueued faster than the GPU runs it, such as CUDA graphs replayed back to back. The GPU is busy with the first
    while the host submits the timed one, whose submission (a graph launch of hundreds of kernels takes tens of
    microseconds) then does not show as idle time after the start event."""
    import cupy

    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    run()
    start.record(stream)
    run()
    end.record(stream)
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) * 1e3 / per


def stream_event_us(stream: Any, run: Callable[[], Any], per: int = 1) -> float:
    """Microseconds between CUDA events recorded on ``stream`` around ``run()``, divided by ``per``."""
    import cupy

    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    run()
    end.record(stream)
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) * 1e3 / per


def timing_method(cupti: bool, flush_bytes: int) -> str:
    what = ("kernel time per call from CUPTI activity records (sum of the kernels the call launches)" if cupti
            else "CUDA events around each call on the current stream")
    return (f"{what}; before each call an untimed {flush_bytes >> 20} MiB memset flushes L2, then an empty kernel "
            "runs; us = median "
            "(p10/p90, min/max) over iters calls after one untimed call; floor = max(bytes / copy bandwidth, "
            "FLOPs / 1979 TFLOPS)")
