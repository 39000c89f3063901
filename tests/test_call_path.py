"""The call path on CPU: what ``import cupygemm`` pulls in, ``stream=`` parsing, the call signature a launch plan is
cached under, and that a repeated call never launches a plan made for other strides or an unaligned pointer.

The GEMM calls here run on CuPy array headers over memory that does not exist, with the planner and the stream
look-up replaced by stand-ins that record what would be launched: everything the host does before the kernel
launch is real."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

import cupygemm  # noqa: E402
from cupygemm import gemm as gemm_mod  # noqa: E402
from cupygemm import streams  # noqa: E402
from cupygemm.tensors import BF16  # noqa: E402


def test_import_cupygemm_pulls_in_neither_torch_nor_jax():
    code = ("import sys, cupygemm, cupygemm.xla_ffi, cupygemm.plan, cupygemm.streams; "
            "bad = [m for m in ('torch', 'jax', 'jaxlib') if m in sys.modules]; "
            "bad += [m for m in sys.modules if m.startswith('cupygemm.bench')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


class _TorchStream:
    cuda_stream = 0x1234


class _CupyStream:
    ptr = 0x5678


class _Protocol:
    def __cuda_stream__(self):
        return (0, 0x9ABC)


@pytest.mark.parametrize("arg,want", [(0, 0), (7, 7), (_TorchStream(), 0x1234), (_CupyStream(), 0x5678),
                                      (_Protocol(), 0x9ABC)])
def test_stream_argument_forms(arg, want):
    assert streams.stream_handle(arg) == want


@pytest.mark.parametrize("arg,exc", [(True, TypeError), (-1, ValueError), ("default", TypeError), (1.0, TypeError),
                                     (SimpleNamespace(ptr="x"), TypeError)])
def test_bad_stream_arguments(arg, exc):
    with pytest.raises(exc, match="stream"):
        streams.stream_handle(arg)


# ---- the cached call path, with a recording planner -------------------------------------------------------------

_MEM = cupy.cuda.memory.UnownedMemory(0x10000000, 1 << 30, None, device_id=0)


def _fake(shape, dtype, offset=0, strides=None):
    return cupy.ndarray(shape, dtype=dtype, memptr=cupy.cuda.memory.MemoryPointer(_MEM, offset), strides=strides)


class _Plan:
    scratch_floats = scratch_counters = 0
    pdl, side_map = False, b""

    def __init__(self, log):
        self.log = log

    def launch(self, stream, a, sfa, b, sfb, d, layout=0, partials=0, counters=0, page_sides=(0,) * 6):
        self.log.append(("launch", a, sfa, b, d))


@pytest.fixture
def recorder(monkeypatch):
    log = []

    def plan_gemm(kind, m, n, k, g, device, **kw):
        log.append(("plan", kind, m, n, k, kw["a_strides"]))
        return _Plan(log)

    monkeypatch.setattr(gemm_mod, "plan_gemm", plan_gemm)
    monkeypatch.setattr(gemm_mod, "resolve", lambda stream, framework, device: 0)
    monkeypatch.setattr(gemm_mod, "single_gpu", lambda: True)
    monkeypatch.setattr(gemm_mod, "_calls", {})
    return log


def _operands(m=64, n=256, k=512, a_offset=0, a_strides=None):
    kb = k // 128
    a = _fake((m, k), np.uint8, a_offset, a_strides)
    sfa = _fake((m, kb), np.float32, 1 << 26, (4, 4 * m))  # already M-major: used in place
    b = _fake((n, k), np.uint8, 1 << 24)
    sfb = _fake((n // 128, kb), np.float32, 1 << 25)
    out = _fake((m, n), BF16, 1 << 27)
    return (a, sfa), (b, sfb), out


def test_repeated_call_reuses_its_plan(recorder):
    lhs, rhs, out = _operands()
    for _ in range(3):
        assert cupygemm.gemm_fp8_fp8_bf16_nt(lhs, rhs, out) is out
    assert [e[0] for e in recorder] == ["plan", "launch", "launch", "launch"]
    assert recorder[1][1:] == (lhs[0].data.ptr, lhs[1].data.ptr, rhs[0].data.ptr, out.data.ptr)


def test_other_strides_get_their_own_validation_and_plan(recorder):
    lhs, rhs, out = _operands()
    cupygemm.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)
    padded, _, _ = _operands(a_strides=(512 + 64, 1))  # same shape, rows 64 bytes apart more
    cupygemm.gemm_fp8_fp8_bf16_nt(padded, rhs, out)
    plans = [e for e in recorder if e[0] == "plan"]
    assert [p[5] for p in plans] == [(512, 1), (576, 1)]
    # A transposed view of the same shape has strides the validation refuses: never launched on the old plan.
    square_lhs, square_rhs, square_out = _operands(m=512, n=256, k=512)
    cupygemm.gemm_fp8_fp8_bf16_nt(square_lhs, square_rhs, square_out)
    launches = len([e for e in recorder if e[0] == "launch"])
    transposed = (square_lhs[0].T, square_lhs[1])
    with pytest.raises(ValueError, match="unit stride"):
        cupygemm.gemm_fp8_fp8_bf16_nt(transposed, square_rhs, square_out)
    assert len([e for e in recorder if e[0] == "launch"]) == launches


def test_unaligned_pointer_with_a_known_signature_is_refused(recorder):
    lhs, rhs, out = _operands(a_strides=(512 + 64, 1))
    cupygemm.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)
    shifted, _, _ = _operands(a_offset=8, a_strides=(512 + 64, 1))  # same shape and strides, base 8 bytes off
    with pytest.raises(ValueError, match="16-byte aligned base"):
        cupygemm.gemm_fp8_fp8_bf16_nt(shifted, rhs, out)
    assert len([e for e in recorder if e[0] == "launch"]) == 1


def test_signature_follows_settings(recorder, monkeypatch):
    lhs, rhs, out = _operands()
    cupygemm.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)
    monkeypatch.setenv("CUPYGEMM_B_EVICT_FIRST", "1")
    cupygemm.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)
    monkeypatch.setenv("CUPYGEMM_PDL", "1")
    cupygemm.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)
    cupygemm.override_config("normal", 256, 512, block_m=64, block_n=128)
    try:
        cupygemm.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)
    finally:
        cupygemm.override_config("normal", 256, 512)
    assert len([e for e in recorder if e[0] == "plan"]) == 4


def test_mixed_frameworks_are_named(recorder):
    lhs, rhs, out = _operands()
    with pytest.raises(TypeError, match=r"rhs\[0\] \(B\).*numpy.*one framework"):
        cupygemm.gemm_fp8_fp8_bf16_nt(lhs, (np.zeros((256, 512), np.uint8), rhs[1]), out)


def test_empty_problem_with_fresh_empty_arrays(recorder):
    """CuPy gives fresh empty arrays zero strides (and no memory): M = 0 returns an empty result, no launch."""
    a = cupy.ndarray((0, 512), np.uint8, memptr=cupy.cuda.MemoryPointer(_MEM, 0), strides=(0, 0))
    sfa = cupy.ndarray((0, 4), np.float32, memptr=cupy.cuda.MemoryPointer(_MEM, 0), strides=(0, 0))
    out = cupy.ndarray((0, 256), BF16, memptr=cupy.cuda.MemoryPointer(_MEM, 0), strides=(0, 0))
    _, rhs, _ = _operands()
    assert cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), rhs, out) is out
    assert recorder == []


def test_deepgemm2_names(recorder):
    lhs, rhs, out = _operands()
    assert cupygemm.fp8_gemm_nt(lhs, rhs, out, compiled_dims="nk") is out
    assert [e[0] for e in recorder] == ["plan", "launch"]
    with pytest.raises(ValueError, match="c: D = C"):
        cupygemm.fp8_gemm_nt(lhs, rhs, out, c=out)
    # recipe (1, 1, 128) without c is D = A @ B.T on both operands' 1x128 scales: these B scales are 128x128 ones
    with pytest.raises(ValueError, match=r"rhs\[1\] \(B scales\)"):
        cupygemm.fp8_gemm_nt(lhs, rhs, out, recipe=(1, 1, 128))
    with pytest.raises(TypeError, match="unexpected keyword"):
        cupygemm.m_grouped_fp8_gemm_nt_masked(lhs, rhs, out, None, 1, bogus=1)


def test_in_place_reshape_of_an_operand_is_seen(recorder):
    """CuPy lets ``x.shape = ...`` change an array in place: the same objects with a new shape are a new
    signature (validated and planned afresh), never launched on the old plan."""
    lhs, rhs, out = _operands(m=128, n=256, k=512)
    cupygemm.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)
    lhs[0].shape = (64, 1024)  # same bytes, other rows and K: now K disagrees with B's
    with pytest.raises(ValueError):
        cupygemm.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)
    assert [e[0] for e in recorder] == ["plan", "launch"]


class _DLPackProducer:
    """A GPU tensor of another library, seen only through DLPack: its capsules are made here with ctypes (no GPU),
    and every export is counted with the stream it was asked to order on."""

    def __init__(self, base, shape, strides_elems, code, bits):
        import ctypes

        from cupygemm import tensors as T

        self.exports = []
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._strides = (ctypes.c_int64 * len(shape))(*strides_elems)
        self._t = T._DLTensor(base, 2, 0, len(shape), T._DLDataType(code, bits, 1),
                              ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64)),
                              ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64)), 0)
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        self._new = new

    def __dlpack_device__(self):
        return 2, 0

    def __dlpack__(self, stream=None, max_version=None):
        import ctypes

        self.exports.append(stream)
        return self._new(ctypes.addressof(self._t), b"dltensor", None)


def test_dlpack_operands_are_exported_once_per_call(recorder, monkeypatch):
    """A DLPack caller's operands are exported once per call, ordered on the launch stream: also SFA when it has to
    be copied into the kernel's layout (the copy reuses the call's view instead of exporting it again)."""
    m, n, k = 64, 256, 512
    kb = k // 128
    ops = [_DLPackProducer(0x10000000, (m, k), (k, 1), 1, 8),            # A: uint8
           _DLPackProducer(0x14000000, (m, kb), (kb, 1), 2, 32),         # SFA: float32, row-major (copied)
           _DLPackProducer(0x11000000, (n, k), (k, 1), 1, 8),            # B
           _DLPackProducer(0x12000000, (n // 128, kb), (kb, 1), 2, 32),  # SFB
           _DLPackProducer(0x18000000, (m, n), (n, 1), 4, 16)]           # out: bfloat16
    copied = []

    def sfa_copy(problem, sfa_ptr, view, stream, framework, capturing=None):
        copied.append(view)
        return 0x1C000000, None

    monkeypatch.setattr(gemm_mod, "to_m_major", sfa_copy)
    monkeypatch.setattr(gemm_mod, "resolve", lambda stream, framework, device: 7)
    a, sfa, b, sfb, out = ops
    for _ in range(2):
        assert cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out) is out
    assert [len(x.exports) for x in ops] == [2, 2, 2, 2, 2] and all(s == 7 for x in ops for s in x.exports)
    assert len(copied) == 2 and copied[0].shape == (m, kb)
    assert [e[0] for e in recorder] == ["plan", "launch", "launch"]
    assert recorder[1][2] == 0x1C000000  # the kernel reads the copy


def test_a_plan_keeps_a_scan_worth_of_pointer_sets(monkeypatch):
    """A JAX scan can hand a custom call a new operand address on every step (XLA's dynamic-slice fusion): a plan
    cycling through 100 pointer sets packs each once, then finds them all again (a cache cleared whenever it was
    full made every call of such a cycle pack its arguments anew)."""
    from cupygemm import plan as plan_mod
    from cupygemm.kinds.forward import NORMAL
    from cupygemm.plan import GemmPlan

    monkeypatch.setattr(plan_mod, "ensure_context", lambda device: None)  # no GPU here

    class Spec:
        dims, strides = (16, 1, 1), (16, 16)  # 16 bytes: the operands lie apart

        def encode(self, ptr):
            return ptr.to_bytes(8, "little") * 16

    class Launcher:
        packs = launches = 0

        def pack(self, values):
            Launcher.packs += 1
            return tuple(values)

        def launch(self, params, grid, block, smem, stream):
            Launcher.launches += 1

    plan = GemmPlan(NORMAL, 64, 256, 512, 1, 0, None, None, Launcher(), 132, 384, 1024, 64, 0, 0, (Spec(),) * 5,
                    (64, 1, 256, 0))
    for _ in range(2):
        for step in range(100):
            plan.launch(0, 0x1000, 0x2000 + 16 * step, 0x3000, 0x4000, 0x5000)
    assert Launcher.launches == 200 and Launcher.packs == 100


# ---- a plan's launch bound to its pointers (the XLA FFI handler's) ----------------------------------------------

class _Spec:
    dims, strides = (16, 1, 1), (16, 16)  # 16 bytes: the operands lie apart

    def encode(self, ptr):
        return ptr.to_bytes(8, "little") * 16


def _stub_memset(monkeypatch):
    """cuMemsetD32Async as a ctypes callback recording its arguments (the plan binds the driver's by address)."""
    import ctypes

    from cupygemm import plan as plan_mod
    from cupygemm import tma

    calls = []
    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p)
    stub = proto(lambda ptr, value, count, stream: calls.append((ptr, value, count, stream)) or 0)
    monkeypatch.setattr(tma, "driver", lambda: SimpleNamespace(cuMemsetD32Async=stub))
    plan_mod._memset_gil_fn.cache_clear()
    return calls


def test_bind_does_the_per_pointer_work_once_and_the_fire_only_launches(monkeypatch):
    from cupygemm import plan as plan_mod
    from cupygemm.kinds.forward import NORMAL
    from cupygemm.plan import GemmPlan

    memsets = _stub_memset(monkeypatch)

    class Launcher:
        def __init__(self):
            self.packs, self.fired = 0, []

        def pack(self, values):
            self.packs += 1
            return tuple(values)

        def bound(self, params, grid, block, smem, pdl=False):
            return lambda stream: self.fired.append((params[5:10], grid, block, smem, pdl, stream))

    launcher = Launcher()
    plan = GemmPlan(NORMAL, 64, 256, 512, 1, 0, None, None, launcher, 132, 384, 1024, 64, 2048, 16, (_Spec(),) * 5,
                    (64, 1, 256, 0))
    try:
        fire = plan.bind(0x1000, 0x2000, 0x3000, 0x4000, 0x5000, partials=0x6000, counters=0x7000,
                         zero_counters=True)
        again = plan.bind(0x1000, 0x2000, 0x3000, 0x4000, 0x5000, partials=0x6000, counters=0x7000,
                          zero_counters=True)
        assert launcher.packs == 1 and launcher.fired == [] and memsets == []  # binding launches nothing
        fire(0xABC0)
        again(0xDEF0)
        # the counters cleared on the call's stream, then the kernel: sfb, layout, d, partials, counters
        assert memsets == [(0x7000, 0, 16, 0xABC0), (0x7000, 0, 16, 0xDEF0)]
        assert launcher.fired == [((0x4000, 0, 0x5000, 0x6000, 0x7000), 132, 384, 1024, False, s)
                                  for s in (0xABC0, 0xDEF0)]
        # the same pointers through launch(): the packed parameters are shared
        plan.bind(0x1000, 0x2000, 0x3000, 0x4000, 0x5000, partials=0x6000, counters=0x7000)(1)
        assert len(memsets) == 2 and launcher.packs == 1  # zero_counters off: no memset
        with pytest.raises(ValueError, match="needs scratch"):
            plan.bind(0x1000, 0x2000, 0x3000, 0x4000, 0x5000)
        with pytest.raises(ValueError, match="overlaps lhs\\[0\\]"):
            plan.bind(0x1000, 0x2000, 0x3000, 0x4000, 0x1008, partials=0x6000, counters=0x7000)
    finally:
        plan_mod._memset_gil_fn.cache_clear()


def test_a_failed_memset_is_a_device_error(monkeypatch):
    import ctypes

    from cupygemm import plan as plan_mod
    from cupygemm import tma
    from cupygemm.errors import CupygemmDeviceError
    from cupygemm.kinds.forward import NORMAL
    from cupygemm.plan import GemmPlan

    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p)
    stub = proto(lambda *a: 700)
    monkeypatch.setattr(tma, "driver", lambda: SimpleNamespace(cuMemsetD32Async=stub))
    plan_mod._memset_gil_fn.cache_clear()
    launched = []
    launcher = SimpleNamespace(pack=tuple, bound=lambda *a, **k: launched.append)
    plan = GemmPlan(NORMAL, 64, 256, 512, 1, 0, None, None, launcher, 132, 384, 1024, 64, 2048, 16, (_Spec(),) * 5,
                    (64, 1, 256, 0))
    try:
        fire = plan.bind(0x1000, 0x2000, 0x3000, 0x4000, 0x5000, partials=0x6000, counters=0x7000,
                         zero_counters=True)
        with pytest.raises(CupygemmDeviceError, match="CUresult 700"):
            fire(5)
        assert launched == []
    finally:
        plan_mod._memset_gil_fn.cache_clear()


def test_packed_launcher_bound_launches_its_parameters():
    import ctypes
    import struct

    from cupygemm.errors import CupygemmDeviceError
    from cupygemm.launch import DESC, PTR, PackedLauncher

    class DriverError(Exception):
        pass

    calls = []
    launcher = PackedLauncher.__new__(PackedLauncher)  # no driver here: what __init__ would set
    launcher._struct = struct.Struct("<" + DESC + PTR)
    launcher._func, launcher._error, launcher._pdl_configs = 0xF00, DriverError, {}
    launcher._launch_kernel = lambda *args: calls.append(args)
    params = launcher.pack((b"\0" * 128, 0x1234))
    fire = launcher.bound(params, 66, 384, 2048)
    del params  # the fire keeps the packed bytes its pointer points at
    fire(0xABC0)
    (args,) = calls
    assert args[:10] == (0xF00, 66, 1, 1, 384, 1, 1, 2048, 0xABC0, 0)
    extra = ctypes.c_void_p.from_address(args[10] + 8).value  # the buffer pointer in `extra`
    assert bytes((ctypes.c_char * 136).from_address(extra))[128:] == (0x1234).to_bytes(8, "little")

    def fail(*args):
        raise DriverError("CUDA_ERROR_INVALID_VALUE")
    launcher._launch_kernel = fail
    with pytest.raises(CupygemmDeviceError, match="cuLaunchKernel failed .*grid 66, block 384"):
        launcher.bound(launcher.pack((b"\0" * 128, 1)), 66, 384, 2048)(0)


def test_packed_launcher_bound_pdl_launch(monkeypatch):
    """The XLA handler's PDL launch: cuLaunchKernelEx on a config with the programmatic-stream-serialization
    attribute for the call's stream (made once per stream), the kernel, and the packed parameters."""
    import ctypes
    import struct

    from cupygemm import launch as launch_mod
    from cupygemm.errors import CupygemmDeviceError
    from cupygemm.launch import DESC, PTR, PackedLauncher

    calls = []

    def launch_ex(cfg, func, params, extra):
        c = launch_mod._LaunchConfigEx.from_address(cfg)
        attr = c.attrs[0]
        buf = ctypes.c_void_p.from_address(extra + 8).value  # the buffer pointer in `extra`
        calls.append((cfg, tuple(c.grid), tuple(c.block), c.smem, c.stream, c.num_attrs, attr.id, attr.value,
                      func, params, bytes((ctypes.c_char * 136).from_address(buf))[128:]))
        return 0 if len(calls) < 4 else 1  # CUDA_ERROR_INVALID_VALUE on the fourth

    monkeypatch.setattr(launch_mod, "_launch_ex_gil_fn", launch_ex)
    launcher = PackedLauncher.__new__(PackedLauncher)  # no driver here: what __init__ would set
    launcher._struct = struct.Struct("<" + DESC + PTR)
    launcher._func = 0xF00
    fire = launcher.bound(launcher.pack((b"\0" * 128, 0x1234)), 66, 384, 2048, pdl=True)
    fire(7)
    fire(7)
    fire(9)
    value = (0x1234).to_bytes(8, "little")
    assert [c[1:] for c in calls] == [((66, 1, 1), (384, 1, 1), 2048, s, 1, 6, 1, 0xF00, None, value)
                                      for s in (7, 7, 9)]
    assert calls[0][0] == calls[1][0] != calls[2][0]  # one config per stream
    with pytest.raises(CupygemmDeviceError, match="cuLaunchKernelEx failed .CUresult 1. for grid 66, block 384"):
        fire(7)


def test_pdl_launch_configs_keep_the_newest_when_full(monkeypatch):
    """A launcher's PDL configs (one per stream it launched on) are bounded by dropping the oldest: a cycle over more
    streams than the limit keeps the newest ones rather than starting again from none (the cache used to be
    cleared whenever it was full)."""
    import struct

    from cupygemm import launch as launch_mod
    from cupygemm.launch import DESC, PTR, PackedLauncher

    launched = []
    monkeypatch.setattr(launch_mod, "_launch_ex_fn", lambda cfg, func, params, extra: launched.append(cfg) or 0)
    monkeypatch.setattr(launch_mod, "ensure_context", lambda device: None)
    launcher = PackedLauncher.__new__(PackedLauncher)  # no driver here: what __init__ would set
    launcher._struct = struct.Struct("<" + DESC + PTR)
    launcher._func, launcher._device, launcher._pdl_configs = 0xF00, 0, {}
    params = launcher.pack((b"\0" * 128, 1))
    limit = launch_mod._PDL_CONFIG_LIMIT
    for stream in range(1, limit + 2):
        launcher.launch_pdl(params, 66, 384, 2048, stream)
    assert [key[3] for key in launcher._pdl_configs] == list(range(2, limit + 2))
    first = launcher._pdl_configs[(66, 384, 2048, limit + 1)]
    launcher.launch_pdl(params, 66, 384, 2048, limit + 1)  # a hit: the same config
    assert launched[-1] == launched[-2] == first.address


# ---- side tickets: a side-aware PDL launch draws before its wait on one of its stream's two sets -------------------

def test_a_side_aware_launch_passes_its_tickets_and_whether_they_are_its_own(monkeypatch):
    from cupygemm import contract
    from cupygemm import plan as plan_mod
    from cupygemm.kinds.forward import NORMAL
    from cupygemm.plan import GemmPlan

    bound = []
    monkeypatch.setattr(plan_mod, "ensure_context", bound.append)

    class Launcher:
        def __init__(self):
            self.values = []

        def pack(self, values):
            assert bound, "the context is bound before the maps are encoded (a driver call)"
            self.values.append(tuple(values))
            return len(self.values) - 1

        def launch_pdl(self, params, grid, block, smem, stream):
            pass

    launcher = Launcher()
    plan = GemmPlan(NORMAL, 64, 256, 512, 1, 0, None, None, launcher, 132, 384, 1024, 64, 0,
                    contract.SIDE_TICKET_COUNTERS, (_Spec(),) * 5, (64, 1, 256, 0), pdl=True, side_map=b"\1" * 32,
                    side_clusters0=3)
    pages = (0x2000, 0xB3000, 1, 2, 3, 4)
    plan.launch(0, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, page_sides=pages, tickets=0x9010)
    plan.launch(0, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, counters=0x7000, page_sides=pages)
    sides = [v[5 + 5 + 4:] for v in launcher.values]  # after the maps, five pointers and four scalars
    # its own set: drawn before the wait; the scratch's counters (XLA's, a torch capture's): after it
    assert sides == [(b"\1" * 32, 0x3000, 0x9010, 3, *pages, 1), (b"\1" * 32, 0x3000, 0x7000, 3, *pages, 0)]
    assert len(sides[0]) == len(contract.SIDE_PARAM_NAMES)
    with pytest.raises(ValueError, match="ticket counters"):
        plan.launch(0, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, page_sides=pages)


def _ticket_calls(monkeypatch, launch):
    """A stream's two ticket sets, and GEMM calls planned as a side-aware PDL plan whose launch is ``launch(tickets)``
    (no scratch: the plan's only counters are its tickets)."""
    from cupygemm import contract
    from cupygemm.workspace import BufferSet

    sets = BufferSet(None, None, (0, 0x9000), 0, 2 * contract.SIDE_TICKET_COUNTERS, True)

    class Plan:
        scratch_floats, scratch_counters = 0, contract.SIDE_TICKET_COUNTERS
        pdl, side_map = True, b"\1" * 32

        def launch(self, stream, a, sfa, b, sfb, d, layout=0, partials=0, counters=0, page_sides=(), tickets=0):
            assert sets.lock.locked() and counters == 0
            launch(tickets)

    def no_scratch(*args):
        raise AssertionError("scratch() for a plan whose only counters are its tickets")

    monkeypatch.setattr(gemm_mod, "plan_gemm", lambda *a, **k: Plan())
    monkeypatch.setattr(gemm_mod, "resolve", lambda stream, framework, device: 0)
    monkeypatch.setattr(gemm_mod, "single_gpu", lambda: True)
    monkeypatch.setattr(gemm_mod, "_calls", {})
    monkeypatch.setattr(gemm_mod, "side_tickets", lambda device, stream, framework, capturing: sets)
    monkeypatch.setattr(gemm_mod, "scratch", no_scratch)
    return sets


def test_a_stream_ticket_sets_alternate_across_threads(monkeypatch):
    """Calls on one stream from two threads: each launch takes the other set than the launch queued before it. The
    set is taken and the kernel queued under the sets' lock (without it, a thread switch between the two gave two
    launches in a row the same set here)."""
    import threading
    import time

    from cupygemm import contract

    queued = []

    def launch(tickets):
        time.sleep(0)  # the other thread's turn, if it can take it
        queued.append(tickets)

    _ticket_calls(monkeypatch, launch)
    lhs, rhs, out = _operands()

    def calls():
        for _ in range(200):
            cupygemm.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)

    threads = [threading.Thread(target=calls) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    set_bytes = 4 * contract.SIDE_TICKET_COUNTERS
    assert len(queued) == 400 and queued[0] == 0x9000 + set_bytes
    assert all(t != u for t, u in zip(queued, queued[1:])) and set(queued) == {0x9000, 0x9000 + set_bytes}


def test_a_launch_that_raised_takes_no_ticket_set(monkeypatch):
    """A side-aware launch that raised before it was queued (out overlapping A, found when its pointers are first
    packed) leaves the stream's alternation as it was: the next launch takes the other set than the last queued
    one, which may still be drawing from its own (the set was taken before the launch ran: the launch after a
    failed one got the running kernel's set)."""
    queued, calls = [], []

    def launch(tickets):
        calls.append(tickets)
        if len(calls) % 2 == 0:
            raise ValueError("out: its memory overlaps lhs[0] (A)'s")
        queued.append(tickets)

    sets = _ticket_calls(monkeypatch, launch)
    lhs, rhs, out = _operands()
    for i in range(7):
        if i % 2:
            with pytest.raises(ValueError, match="overlaps"):
                cupygemm.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)
        else:
            cupygemm.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)
    assert len(queued) == 4 and not sets.lock.locked()
    assert all(t != u for t, u in zip(queued, queued[1:])), [hex(t) for t in queued]


def test_every_plan_kind_has_what_the_call_path_reads():
    """gemm.run reads these of any plan, the weight-gradient kinds' included (a wgrad call failed with
    AttributeError when the side-ticket check first read side_map)."""
    import dataclasses

    from cupygemm.plan import GemmPlan
    from cupygemm.plan_wgrad import WgradPlan

    for cls in (GemmPlan, WgradPlan):
        names = {f.name for f in dataclasses.fields(cls)}
        assert {"pdl", "side_map", "scratch_floats", "scratch_counters", "device"} <= names, cls.__name__
        assert callable(cls.launch)


def test_a_torch_capture_keeps_the_tickets_in_its_scratch():
    from cupygemm.tensors import Framework
    from cupygemm.workspace import side_tickets

    assert side_tickets(0, 0x1234, Framework.TORCH, capturing=True) is None


# ---- out overlapping an input -------------------------------------------------------------------------------------

def _real_plan(m=256, n=256, k=512):
    """A launch plan as plan_gemm makes it, less the loaded kernel (nothing here launches)."""
    from cupygemm import contract
    from cupygemm.config import make_config
    from cupygemm.kinds.forward import NORMAL
    from cupygemm.plan import GemmPlan

    cfg = make_config("normal", n, k, 128, 128, num_sms=132)
    c = contract.launch_contract(cfg, m, n, k, 1, (k, 1), (k, 1), (2 * n, 2), False)
    return GemmPlan(NORMAL, m, n, k, 1, 0, cfg, None, None, 132, c.threads, c.smem_bytes, c.sfa_m_pad,
                    c.scratch_floats, c.scratch_counters, c.tmaps, c.scalars)


@pytest.mark.parametrize("operand", range(4))
def test_out_overlapping_an_input_is_refused_before_any_launch(operand):
    m, n, k = 256, 256, 512
    plan = _real_plan(m, n, k)
    ptrs = [0x10000000, 0x20000000, 0x30000000, 0x40000000]
    d = ptrs[operand] + 16  # D starts inside the operand
    if operand == 3:
        d = ptrs[3] - m * n * 2 + 16  # D's last bytes on SFB's first
    names = ["lhs\\[0\\] \\(A\\)", "lhs\\[1\\] \\(A scales\\)", "rhs\\[0\\] \\(B\\)", "rhs\\[1\\] \\(B scales\\)"]
    with pytest.raises(ValueError, match=f"out: .* overlaps {names[operand]}"):
        plan.launch(0, *ptrs, d)
    assert len(plan._packed) == 0  # nothing packed, nothing launched


def test_threads_packing_new_pointers_past_the_limit(monkeypatch):
    """Threads sharing a plan, each on pointer sets it has not seen, past the plan's limit: two of them dropped the
    same oldest set (one failed with KeyError: 8 threads here, 10 runs of 10) or the cache grew past it."""
    import sys
    import threading

    from cupygemm import plan as plan_mod

    monkeypatch.setattr(plan_mod, "_PACKED_LIMIT", 8)
    monkeypatch.setattr(plan_mod, "ensure_context", lambda device: None)
    plan = _real_plan()
    plan.tmaps, plan._spans = (_Spec(),) * 5, (16,) * 6

    class Launcher:
        def pack(self, values):
            return tuple(values)

    plan.launcher = Launcher()
    errors = []

    def calls(base):
        try:
            for i in range(10000):
                plan._pack((base + 4096 * i, 0x2000_0000, 0x3000_0000, 0x4000_0000, 0x5000_0000, 0, 0, 0, 0,
                            *plan_mod.NO_PAGE_SIDES))
        except Exception as e:  # noqa: BLE001 - any failure is the finding
            errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=calls, args=((j + 7) << 28,)) for j in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors
    assert 0 < len(plan._packed) <= 8


def test_out_next_to_its_inputs_is_fine():
    m, n, k = 256, 256, 512
    plan = _real_plan(m, n, k)
    a, sfa, b, sfb = 0x10000000, 0x20000000, 0x30000000, 0x40000000
    plan._check_out_overlap(a, sfa, b, sfb, a + m * k, 0)  # right after A
    plan._check_out_overlap(a, sfa, b, sfb, sfb - m * n * 2, 0)  # right before SFB


def test_per_stream_buffers_get_the_capture_answer_from_the_call(recorder, monkeypatch):
    """A call that copies SFA and uses split-K scratch hands both per-stream buffers one answer to "is the stream
    being captured?" (torch calls ask it once; CuPy calls never need it)."""
    asked, got = [], []

    class ScratchPlan(_Plan):
        scratch_floats, scratch_counters = 4096, 16

    monkeypatch.setattr(gemm_mod, "plan_gemm", lambda *a, **kw: ScratchPlan(recorder))
    monkeypatch.setattr(gemm_mod, "is_capturing", lambda stream: asked.append(stream) or False)
    monkeypatch.setattr(gemm_mod, "to_m_major", lambda problem, sfa_ptr, view, stream, framework, capturing=None:
                        got.append(("sfa", capturing)) or (0x1C000000, None))
    monkeypatch.setattr(gemm_mod, "scratch", lambda floats, counters, device, stream, framework, capturing=None:
                        got.append(("scratch", capturing)) or (0x1D000000, 0x1E000000, None))
    (a, _), rhs, out = _operands()
    row_major_sfa = _fake((64, 4), np.float32, 1 << 26)
    cupygemm.gemm_fp8_fp8_bf16_nt((a, row_major_sfa), rhs, out)
    assert got == [("sfa", False), ("scratch", False)] and asked == []
    assert recorder[-1] == ("launch", a.data.ptr, 0x1C000000, rhs[0].data.ptr, out.data.ptr)
    got.clear()
    (a, sfa), rhs, out = _operands()  # M-major SFA: used in place, and the scratch asks for itself (if torch)
    cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), rhs, out)
    assert got == [("scratch", None)] and asked == []
