"""The kernel loader (cupygemm.jit.loader) on CPU: what is loaded once per device and source, what runs in relaxed
capture mode, how the small kernels launch; and that every small kernel's declared parameter kinds match the layout
NVRTC compiles (so the packed launches pass the arguments the CuPy launches of before did, type for type).

The GPU parts (module loads, the driver's parameter layout, launches) are stand-ins that record what they were asked:
the loader's own logic and memos are real."""
from __future__ import annotations

import contextlib
import itertools
import struct
from types import SimpleNamespace

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from cupygemm import l2, packing, quantization, sfa_layout  # noqa: E402
from cupygemm.jit import build, loader  # noqa: E402
from cupygemm.jit.build import build_cubin  # noqa: E402
from cupygemm.jit.loader import PackedParams, SmallKernel, load  # noqa: E402
from cupygemm.jit.source import KernelSource  # noqa: E402
from cupygemm.launch import I64, PTR, U32, U64, PackedLauncher  # noqa: E402
from cupygemm.tensors import BF16  # noqa: E402
from sass_tools.elf import Cubin  # noqa: E402

RELAXED = build._CAPTURE_MODE_RELAXED


class _FakeLauncher:
    def __init__(self, function, kinds, mode):
        self.function, self.kinds, self.made_in_mode = function, tuple(kinds), mode
        self.calls = []

    def pack(self, values):
        return ("packed", tuple(values))

    def launch(self, params, grid, block, smem, stream):
        self.calls.append(("launch", params, grid, block, smem, stream))

    def launch_grid(self, params, grid, block, smem, stream):
        self.calls.append(("launch_grid", params, grid, block, smem, stream))


@pytest.fixture
def gpu(monkeypatch):
    """Stand-ins for the device: a current device, module loads, function attributes, the capture mode and the
    launcher; records each step (with the capture mode it ran in)."""
    state = SimpleNamespace(device=0, mode=0, loads=[], attrs=[], launchers=[])
    ptrs = itertools.count(0x1000)

    class Module:
        def load(self, cubin):
            state.loads.append((state.device, cubin, state.mode))

        def get_function(self, name):
            return SimpleNamespace(ptr=next(ptrs), name=name, module=self)

    def exchange(ref):  # cuThreadExchangeStreamCaptureMode: swap the thread's mode with *ref
        mode = ref._obj
        state.mode, mode.value = mode.value, state.mode
        return 0

    @contextlib.contextmanager
    def on_device(device):
        before, state.device = state.device, device
        try:
            yield
        finally:
            state.device = before

    def make_launcher(function, kinds, device):
        launcher = _FakeLauncher(function, kinds, state.mode)
        state.launchers.append(launcher)
        return launcher

    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: state.device)
    monkeypatch.setattr(cupy.cuda.function, "Module", Module)
    monkeypatch.setattr(cupy.cuda.driver, "funcSetAttribute",
                        lambda ptr, attr, value: state.attrs.append((ptr, attr, value, state.mode)))
    monkeypatch.setattr(build, "build_cubin", lambda src, options=(), post_process=True, config=None:
                        ("key", f"cubin of {src.digest[:12]}".encode()))
    monkeypatch.setattr(build, "check_driver_for_nvrtc", lambda device: None)
    monkeypatch.setattr(build, "_exchange_capture_mode", lambda: exchange)
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setattr(loader, "on_device", on_device)
    monkeypatch.setattr(loader, "make_launcher", make_launcher)
    monkeypatch.setattr(loader, "_declared", [])
    return state


def _src(text, entry="k"):
    return KernelSource("k.cu", text, {}, entry)


def test_load_is_memoized_per_device_and_source(gpu):
    a, b = _src("a"), _src("b")
    k0 = load(0, a, (PTR, U32))
    assert load(0, a, [PTR, U32]) is k0 and load(0, _src("a"), (PTR, U32)) is k0  # same source, same kernel
    k1 = load(1, a, (PTR, U32))
    kb = load(0, b, (PTR, U32))
    assert len({id(k0), id(k1), id(kb)}) == 3
    assert [(d, m) for d, _, m in gpu.loads] == [(0, RELAXED), (1, RELAXED), (0, RELAXED)]  # on its device, relaxed
    assert gpu.device == 0 and gpu.mode == 0  # both restored
    assert [la.made_in_mode for la in gpu.launchers] == [RELAXED] * 3  # one launcher per loaded kernel
    assert k0.launcher.function is k0.function and k0.kinds == (PTR, U32)
    assert load(0, a, (PTR, U32), post_process=False) is not k0  # another cubin (the SASS pass is in its key)
    with pytest.raises(ValueError, match="parameter kinds"):
        load(0, a, (PTR, PTR))


def test_load_allows_dynamic_shared_memory_once(gpu):
    k = load(0, _src("smem"), (PTR,), dynamic_smem=120 * 1024)
    load(0, _src("smem"), (PTR,), dynamic_smem=120 * 1024)
    load(0, _src("small"), (PTR,), dynamic_smem=16 * 1024)  # within the default 48 KiB: nothing to set
    assert gpu.attrs == [(k.function.ptr, 8, 120 * 1024, RELAXED)]


def test_small_kernel_loads_once_per_device_and_variant(gpu):
    rendered, checked = [], []

    def source(n):
        rendered.append(n)
        return _src(f"n = {n}")

    sk = SmallKernel(source, (PTR, U32), check=checked.append, dynamic_smem=64 * 1024)
    k = sk.get(0, 5)
    assert sk.get(0, 5) is k and rendered == [5] and checked == [0]
    k1, k6 = sk.get(1, 5), sk.get(0, 6)
    assert k1 is not k and k6 is not k and rendered == [5, 5, 6] and checked == [0, 1, 0]
    assert sk.loaded() == {(0, 5): k, (1, 5): k1, (0, 6): k6}
    assert len(gpu.loads) == 3 and len(gpu.attrs) == 3
    assert sk.pack(0, (0x100, 7), 5) == ("packed", (0x100, 7))
    sk.launch(0, 11, 132, 256, 0, "params", 5)
    sk.launch_grid(0, 11, (8, 2, 1), 512, 64 * 1024, "params", 5)
    assert k.launcher.calls == [("launch", "params", 132, 256, 0, 11),
                                ("launch_grid", "params", (8, 2, 1), 512, 64 * 1024, 11)]
    sk.launch(1, 12, 4, 32, 0, "p1", 5)  # each device's own function
    assert k1.launcher.calls == [("launch", "p1", 4, 32, 0, 12)] and len(k.launcher.calls) == 2


def test_small_kernel_loads_on_first_launch(gpu):
    sk = SmallKernel(lambda: _src("lazy"), (PTR,))
    assert not gpu.loads
    sk.launch(3, 0, 1, 32, 0, "p")
    assert [d for d, _, _ in gpu.loads] == [3] and sk.get(3).launcher.calls == [("launch", "p", 1, 32, 0, 0)]


def test_variants_with_one_source_share_the_kernel(gpu):
    sk = SmallKernel(lambda variant: _src("the same"), (PTR,))
    assert sk.get(0, "x") is sk.get(0, "y") and len(gpu.loads) == 1


def test_clear_forgets_every_loaded_kernel(gpu):
    sk = SmallKernel(lambda: _src("c"), (PTR,))
    k = sk.get(0)
    loader.clear()
    assert sk.loaded() == {} and build._loaded == {}
    assert sk.get(0) is not k and len(gpu.loads) == 2


def test_a_failed_check_loads_nothing(gpu):
    def refuse(device):
        raise RuntimeError(f"device {device} is not a Hopper")

    sk = SmallKernel(lambda: _src("checked"), (PTR,), check=refuse)
    with pytest.raises(RuntimeError, match="not a Hopper"):
        sk.get(2)
    assert not gpu.loads and sk.loaded() == {}


def test_packed_params_keep_the_newest():
    p = PackedParams(limit=3)
    for i in range(4):
        assert p.put(i, f"params {i}") == f"params {i}"
    assert len(p) == 3 and p.get(0) is None and p.get(3) == "params 3"


# ---- the declarations against what NVRTC compiles --------------------------------------------------------------

def _param_layout(cubin: bytes, entry: str) -> list[tuple[int, int]]:
    """(offset, size) of each parameter, from the cubin's EIATTR_KPARAM_INFO records (what cuFuncGetParamInfo
    reports on the GPU)."""
    params = {}
    for a in Cubin.from_bytes(cubin).kernel(entry).attributes:
        if a.name == "EIATTR_KPARAM_INFO":
            _, ordinal, offset, flags = struct.unpack("<IHHI", a.payload)
            params[ordinal] = (offset, (flags >> 18) & 0x3FFF)
    return [params[i] for i in range(len(params))]


# Each small kernel, a variant, sample values and the NumPy types its CuPy launch passed them as before.
_DECLARED = [
    (quantization._CASTS, (BF16, "per_token_cast_to_fp8"), (0x7F0000001000, 0x7F0000100000, 0x7F0000200000, 257,
                                                            7168, -7168, 56), [np.uint64] * 3 + [np.int64] * 4),
    (quantization._CASTS, (np.dtype(np.float32), "per_block_cast_to_fp8"),
     (0x7F0000001000, 0x7F0000100000, 0x7F0000200000, 3, 300, 1 << 40, 3), [np.uint64] * 3 + [np.int64] * 4),
    (sfa_layout._COPY, (), (0x7F0000001000, 0x7F0000100000, 1 << 33, 56, 1, 257, 56, 272, 4),
     [np.uint64] * 5 + [np.uint32] * 4),
    (packing._PACK, (1000, 384), (0x7F0000001000, 384, 384000, 0x7F0000200000, 0x1F000, 0xB3000),
     [np.uint64] * 4 + [np.uint32] * 2),
    (l2._PROBE, (), (0x7F0000001000, 32, 192, 0x7F0000100000, 0x7F0000200000),
     [np.uint64, np.uint32, np.uint32, np.uint64, np.uint64]),
]


@pytest.mark.parametrize("kernel,variant,values,old_types", _DECLARED,
                         ids=["cast-token", "cast-block", "sfa-copy", "pack-b", "l2-probe"])
def test_declared_kinds_match_the_compiled_parameters(kernel, variant, values, old_types):
    src = kernel.source(*variant)
    layout = _param_layout(build_cubin(src, post_process=kernel.post_process)[1], src.entry)
    launcher = PackedLauncher(0, kernel.kinds, layout, 0)  # refuses kinds whose sizes differ from the layout's
    packed = bytes(launcher.pack(values))
    want = bytearray(launcher.param_bytes)
    for (offset, size), t, v in zip(layout, old_types, values):
        want[offset:offset + size] = t(v).tobytes()
    assert packed == bytes(want)


def test_declarations_keep_their_build_options():
    # The SASS pass decision is part of the cache key: as each kernel was loaded before the loader.
    assert not quantization._CASTS.post_process and not sfa_layout._COPY.post_process
    assert packing._PACK.post_process and l2._PROBE.post_process
    assert l2._PROBE.dynamic_smem == l2._BLOCK_SMEM
    assert {k.source(*v).name for k, v, _, _ in _DECLARED} == {"quantize.cu", "sfa_layout.cu", "pack_b.cu",
                                                               "l2_probe.cu"}
    assert struct.calcsize("<" + I64) == 8 and U64 == PTR  # long long; unsigned long long packs as a pointer


def test_launchers_take_a_grid_of_three_dimensions(monkeypatch):
    from cupygemm.launch import CupyLauncher

    packed = PackedLauncher(0x1234, (PTR, I64, U32), [(0, 8), (8, 8), (16, 4)], 3)
    calls, contexts = [], []
    monkeypatch.setattr("cupygemm.launch.ensure_context", contexts.append)
    packed._launch_kernel = lambda *args: calls.append(args)
    params = packed.pack((0x7F0000001000, -5, 7))
    assert bytes(params) == struct.pack("<QqI", 0x7F0000001000, -5, 7)
    packed.launch(params, 10, 256, 0, 11)
    packed.launch_grid(params, (10, 3, 2), 512, 1024, 11)
    assert calls == [(0x1234, 10, 1, 1, 256, 1, 1, 0, 11, 0, params.extra_ptr),
                     (0x1234, 10, 3, 2, 512, 1, 1, 1024, 11, 0, params.extra_ptr)]
    assert contexts == [3, 3]  # each launch binds its device's context first (a thread's first CUDA work)

    # Drivers without cuFuncGetParamInfo: CuPy converts the values, as the casts' launches did before.
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    monkeypatch.setattr("cupygemm.streams.cupy_stream", lambda stream, device: ("stream", stream))
    seen = []
    fallback = CupyLauncher(lambda grid, block, args, shared_mem, stream: seen.append((grid, block, args, stream)),
                            (PTR, I64, U32))
    args = fallback.pack((0x7F0000001000, -5, 7))
    assert [type(a) for a in args] == [np.uint64, np.int64, np.uint32] and int(args[1]) == -5
    fallback.launch_grid(args, (10, 3, 1), 512, 0, 11)
    assert seen == [((10, 3, 1), (512,), args, ("stream", 11))]


def test_ensure_context_once_per_thread_and_device(monkeypatch):
    import threading

    from cupygemm import device as dev

    calls = []
    monkeypatch.setattr(cupy.cuda.runtime, "memGetInfo", lambda: calls.append(threading.get_ident()) or (0, 0))
    monkeypatch.setattr(dev, "_threads", threading.local())
    for device in (0, 0, 1, 1):
        dev.ensure_context(device)
    assert len(calls) == 2
    worker = threading.Thread(target=lambda: [dev.ensure_context(0) for _ in range(3)])
    worker.start()
    worker.join()
    assert len(calls) == 3 and calls[2] != calls[0]
