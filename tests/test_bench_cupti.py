"""CUPTI kernel timer: record parsing on synthetic activity buffers (CPU) and the real library (GPU)."""
import ctypes

import pytest

from cupygemm.bench import cupti as KT


class FakeCupti:
    """Walks a buffer of fixed-size records the way cuptiActivityGetNextRecord does."""

    RECORD = 128

    def __init__(self):
        self.pos = {}

    def cuptiActivityRegisterCallbacks(self, req, done):
        return 0

    def cuptiActivityGetNextRecord(self, buf_p, valid, record_ref):
        base = ctypes.cast(buf_p, ctypes.c_void_p).value
        off = self.pos.get(base, 0)
        if off + self.RECORD > valid.value:
            self.pos.pop(base, None)
            return 3  # CUPTI_ERROR_MAX_LIMIT_REACHED
        ctypes.cast(record_ref, ctypes.POINTER(ctypes.c_void_p))[0] = base + off
        self.pos[base] = off + self.RECORD
        return 0


def make_buffer(records):
    buf = (ctypes.c_uint8 * (FakeCupti.RECORD * len(records)))()
    names = []
    for i, (kind, start, end, name) in enumerate(records):
        base = ctypes.addressof(buf) + i * FakeCupti.RECORD
        ctypes.c_uint32.from_address(base).value = kind
        ctypes.c_uint64.from_address(base + KT._OFF_START).value = start
        ctypes.c_uint64.from_address(base + KT._OFF_END).value = end
        names.append(ctypes.create_string_buffer(name.encode()))
        ctypes.c_void_p.from_address(base + KT._OFF_NAME).value = ctypes.addressof(names[-1])
    return buf, names


def test_records_parse_kernel_start_end_and_name():
    timer = KT.KernelTimer(FakeCupti(), "fake")
    buf, _names = make_buffer([(10, 1000, 4500, "cupygemm_fp8_gemm"), (4, 0, 99, "a memset"),
                               (10, 5000, 5250, "second")])
    timer._on_complete(None, 0, ctypes.cast(buf, ctypes.POINTER(ctypes.c_uint8)), len(buf), len(buf))
    assert timer._records == [(1000, 4500, "cupygemm_fp8_gemm"), (5000, 5250, "second")]


def test_env_names_the_library_first(monkeypatch):
    monkeypatch.setenv("CUPYGEMM_CUPTI", "/opt/some/libcupti.so.13")
    assert KT._candidate_paths()[0] == "/opt/some/libcupti.so.13"


def test_missing_library_gives_reason(monkeypatch):
    monkeypatch.setattr(KT, "_candidate_paths", lambda: ["/nonexistent/libcupti.so"])
    timer, why = KT.open_kernel_timer(lambda: None, "x", lambda: None)
    assert timer is None and "/nonexistent/libcupti.so" in why


@pytest.mark.gpu
def test_cupti_kernel_time_on_the_gpu():
    """The real CUPTI: records parse (the probe kernel's name comes back) and a GEMM's kernel time is positive and
    below its event-timed duration (events add launch gaps)."""
    import cupy as cp

    from cupygemm.bench.timing import Timer, open_cupti_timer

    timer, why = open_cupti_timer()
    if timer is None and "records do not parse" not in why:
        pytest.skip(f"no usable libcupti on this machine: {why}")
    assert timer is not None, why
    a = cp.ones((2048, 2048), cp.float32)
    call = lambda: a @ a  # noqa: E731
    call()
    t = Timer(64 << 20, timer)
    kernel_us = sorted(t.time(call, 9))[4]
    event_us = sorted(t.time_events(call, 9))[4]
    assert 0 < kernel_us <= event_us * 1.05


def test_cupti_python_backend_parses_records(monkeypatch):
    """The cupti-python path (NVIDIA's package), on a stand-in module: kernel records summed per call, other
    activity kinds ignored, the probe check applied; without the package the reason says how to get it."""
    import enum
    import sys
    import types

    from cupygemm.bench import cupti as KT

    class Kind(enum.IntEnum):
        MEMCPY = 1
        CONCURRENT_KERNEL = 10

    state = {"enabled": False, "pending": []}
    fake = types.SimpleNamespace(ActivityKind=Kind)

    def register(req, done):
        state["req"], state["done"] = req, done

    fake.activity_register_callbacks = register
    fake.activity_enable = lambda kind: state.update(enabled=True)
    fake.activity_disable = lambda kind: state.update(enabled=False)

    def flush(flag):
        assert state["req"]() == (KT._BUFFER_BYTES, 0)
        recs, state["pending"] = state["pending"], []
        state["done"](recs)

    fake.activity_flush_all = flush
    rec = lambda kind, start, end, name: types.SimpleNamespace(kind=kind, start=start, end=end, name=name)  # noqa: E731

    def probe():
        if state["enabled"]:
            state["pending"] += [rec(Kind.CONCURRENT_KERNEL, 1000, 3500, b"noop"), rec(Kind.MEMCPY, 0, 99, "x")]

    monkeypatch.setitem(sys.modules, "cupti", types.SimpleNamespace(cupti=fake))
    monkeypatch.setitem(sys.modules, "cupti.cupti", fake)
    timer, why = KT.open_kernel_timer(probe, "noop", lambda: None, backend="python")
    assert timer is not None and why == "cupti-python", why
    assert timer.time(probe, 2) == [2.5, 2.5]
    counts = []
    assert timer.time(probe, 2, kernels=counts) == [2.5, 2.5] and counts == [1, 1]

    def grouped():  # a call launching one kernel per group (DeepGEMM's k-grouped wgrad): the kernels add up
        if state["enabled"]:
            state["pending"] += [rec(Kind.CONCURRENT_KERNEL, 1000 * g, 1000 * g + 500, b"wgrad") for g in range(4)]

    counts = []
    assert timer.time(grouped, 3, kernels=counts) == [2.0] * 3 and counts == [4] * 3
    timer, why = KT.open_kernel_timer(probe, "noop", lambda: None)  # the default prefers the package
    assert isinstance(timer, KT.CuptiPythonTimer) and why == "cupti-python", why
    _, why = KT.open_kernel_timer(probe, "other", lambda: None, backend="python")
    assert "records do not parse" in why
    monkeypatch.setitem(sys.modules, "cupti", None)
    timer, why = KT.open_kernel_timer(probe, "noop", lambda: None, backend="python")
    assert timer is None and "pip install cupti-python" in why
    # Without the package the default falls back to libcupti through ctypes, and says why when that fails too.
    monkeypatch.setattr(KT, "_candidate_paths", lambda: ["/nonexistent/libcupti.so"])
    timer, why = KT.open_kernel_timer(probe, "noop", lambda: None)
    assert timer is None and "pip install cupti-python" in why and "/nonexistent/libcupti.so" in why, why
    with pytest.raises(ValueError, match="backend: expected one of auto, python, ctypes"):
        KT.open_kernel_timer(probe, "noop", lambda: None, backend="nvtx")


def test_timer_passes_the_kernel_counts_through(monkeypatch):
    """Timer.time hands the list for the kernel counts to the CUPTI timer (and leaves timers without it alone), and
    has the empty kernel after each flush left out of the sums."""
    import types

    import cupy

    from cupygemm.bench.timing import Timer

    seen = []

    class Kernel:
        def time(self, call, iters, before=None, sync=None, **kw):
            seen.append(kw)
            if "kernels" in kw:
                kw["kernels"] += [2] * iters
            return [1.0] * iters

    monkeypatch.setattr(cupy.cuda, "get_current_stream", lambda: types.SimpleNamespace(synchronize=lambda: None))
    t = Timer.__new__(Timer)
    t.kernel_timer, t.flush_buf = Kernel(), None
    counts = []
    assert t.time(lambda: None, 3, counts) == [1.0] * 3 and counts == [2, 2, 2]
    assert t.time(lambda: None, 1) == [1.0] and seen[-1] == {"exclude": "cupygemm_bench_noop"}


def test_kernel_timer_leaves_out_the_excluded_kernel():
    """The empty kernel the bench runs after each flush (so a PDL launch follows a kernel, not a memset) is not part
    of a call's kernel time."""
    from cupygemm.bench import cupti as KT

    timer = KT.KernelTimer.__new__(KT.KernelTimer)
    batches = iter([[(0, 5000, "cupygemm_bench_noop"), (6000, 16000, "gemm")]])
    timer._drain = lambda: next(batches)
    timer._recording = lambda: __import__("contextlib").nullcontext()
    assert timer.time(lambda: None, 1, exclude="cupygemm_bench_noop") == [10.0]
