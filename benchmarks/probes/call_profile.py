"""Where a GEMM call's host time goes, part by part, and what each launch mechanism costs, on the GPU machine's CPU.

Each line is the median over rounds of a loop of back-to-back calls of one part (synchronized between rounds,
never inside a loop), in host microseconds per call: the whole call for CuPy and torch operands, the call with
the driver launch replaced by a no-op (the Python part), the stream lookups, and the same GEMM kernel launched
by every mechanism at hand (CuPy's Cython binding, ctypes ``cuLaunchKernel`` with a packed buffer or a pointer
array, ctypes ``cuLaunchKernelEx``, NVIDIA's cuda-bindings when installed) next to an empty kernel's launch.
``--cprofile`` adds a cProfile listing of the whole calls.

Usage: python benchmarks/probes/call_profile.py [MxNxK] [--calls N] [--rounds R] [--json FILE] [--cprofile]
"""
import argparse
import ctypes
import json
import statistics
import sys
import time

import cupy as cp

import cupygemm
from cupygemm import gemm as gemm_mod
from cupygemm.tensors import Framework
from cupygemm.tma import driver
from cupygemm.workspace import scratch


def timed(fn, calls, rounds, sync):
    for _ in range(20):
        fn()
    sync()
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
        sync()
    return statistics.median(per)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", nargs="?", default="64x2112x7168")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json")
    p.add_argument("--cprofile", action="store_true")
    args = p.parse_args()
    m, n, k = (int(t) for t in args.shape.split("x"))
    a, sfa = cupygemm.per_token_cast_to_fp8(cp.random.standard_normal((m, k), dtype=cp.float32))
    b, sfb = cupygemm.per_block_cast_to_fp8(cp.random.standard_normal((n, k), dtype=cp.float32))
    sfa = cupygemm.get_col_major_tma_aligned_tensor(sfa)
    out = cp.empty((m, n), cupygemm.tensors.BF16)
    sync = cp.cuda.Device().synchronize
    rows = {}

    def add(name, fn, calls=args.calls):
        rows[name] = timed(fn, calls, args.rounds, sync)
        print(f"{name:<44} {rows[name]:7.2f} us", flush=True)

    call = lambda: cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)  # noqa: E731
    call()
    (problem, plan), = gemm_mod._calls.values()
    add("cupy: whole call", call)
    launcher = plan.launcher
    real_launch = launcher.launch
    launcher.launch = lambda *x: None
    add("cupy: whole call, launch a no-op", call)
    launcher.launch = real_launch
    add("cupy: get_current_stream(0).ptr", lambda: cp.cuda.get_current_stream(0).ptr)
    stream = cp.cuda.get_current_stream().ptr
    partials = counters = 0
    if plan.scratch_floats:  # the call path's own split-K scratch for this stream
        partials, counters, keep = scratch(plan.scratch_floats, plan.scratch_counters, 0, stream, Framework.CUPY)
    ptrs = (a.data.ptr, sfa.data.ptr, b.data.ptr, sfb.data.ptr, out.data.ptr, 0, partials, counters)
    add("plan.launch", lambda: plan.launch(stream, *ptrs))
    params = plan._packed[ptrs]
    grid, block, smem = plan.grid, plan.threads, plan.smem_bytes
    func = plan.kernel.function.ptr
    lk = cp.cuda.driver.launchKernel
    add("CuPy driver.launchKernel (packed extra)", lambda: lk(func, grid, 1, 1, block, 1, 1, smem, stream, 0,
                                                              params.extra_ptr))
    drv = driver()
    c_launch = drv.cuLaunchKernel
    c_launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    c_launch.restype = ctypes.c_int
    add("ctypes cuLaunchKernel (packed extra)", lambda: c_launch(func, grid, 1, 1, block, 1, 1, smem, stream, None,
                                                                 params.extra_ptr))
    # kernelParams: one pointer per parameter into the packed buffer.
    layout = gemm_param_offsets(func)
    base = ctypes.addressof(params.buf)
    kp = (ctypes.c_void_p * len(layout))(*[base + off for off in layout])
    kp_ptr = ctypes.addressof(kp)
    add("ctypes cuLaunchKernel (kernelParams)", lambda: c_launch(func, grid, 1, 1, block, 1, 1, smem, stream, kp_ptr,
                                                                 None))
    # The same call through a prototype bound once (no per-call argtypes conversion of Python ints).
    proto = ctypes.CFUNCTYPE(ctypes.c_int, *([ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3))
    bound = proto(ctypes.cast(c_launch, ctypes.c_void_p).value)
    args_fixed = (func, grid, 1, 1, block, 1, 1, smem, stream, None, params.extra_ptr)
    add("ctypes CFUNCTYPE cuLaunchKernel (extra)", lambda: bound(*args_fixed))
    add_launch_ex(add, drv, func, grid, block, smem, stream, params)
    py_proto = ctypes.PYFUNCTYPE(ctypes.c_int, *([ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3))
    py_bound = py_proto(ctypes.cast(c_launch, ctypes.c_void_p).value)
    add("ctypes PYFUNCTYPE cuLaunchKernel (extra, GIL held)", lambda: py_bound(*args_fixed))
    try:
        from cuda.bindings import driver as cbd

        cfunc = cbd.CUfunction(func)
        cstream = cbd.CUstream(stream)
        add("cuda-bindings cuLaunchKernel (extra)",
            lambda: cbd.cuLaunchKernel(cfunc, grid, 1, 1, block, 1, 1, smem, cstream, 0, params.extra_ptr))
    except Exception as e:  # noqa: BLE001 - optional
        print(f"cuda-bindings: not measured ({type(e).__name__}: {e})")
    empty = cp.RawKernel('extern "C" __global__ void empty_kernel() {}', "empty_kernel")
    empty.compile()
    efunc = empty.kernel.ptr if hasattr(empty, "kernel") else None
    if efunc is None:
        mod = cp.RawModule(code='extern "C" __global__ void empty_kernel() {}')
        efunc = mod.get_function("empty_kernel").ptr
    add("CuPy driver.launchKernel, empty kernel", lambda: lk(efunc, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0))
    add("ctypes cuLaunchKernel, empty kernel", lambda: c_launch(efunc, 1, 1, 1, 32, 1, 1, 0, stream, None, None))
    add("python: 5 read_cupy", lambda: (gemm_mod.read_cupy(a), gemm_mod.read_cupy(sfa), gemm_mod.read_cupy(b),
                                        gemm_mod.read_cupy(sfb), gemm_mod.read_cupy(out)))
    try:
        import torch

        t8 = lambda x: torch.from_dlpack(x).view(torch.float8_e4m3fn)  # noqa: E731
        ta, tb, tsa, tsb = t8(a), t8(b), torch.from_dlpack(sfa), torch.from_dlpack(sfb)
        tout = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
        tcall = lambda: cupygemm.gemm_fp8_fp8_bf16_nt((ta, tsa), (tb, tsb), tout)  # noqa: E731
        tcall()
        tsync = torch.cuda.synchronize
        rows_t = {
            "torch: whole call": tcall,
            "torch: _plain_eager": lambda: sys.modules["cupygemm.torch"]._plain_eager(ta, tsa, tb, tsb, tout),
            "torch: _cuda_getCurrentRawStream(0)": lambda: torch._C._cuda_getCurrentRawStream(0),
            "torch: 5 read_torch": lambda: (gemm_mod.read_torch(ta, "a"), gemm_mod.read_torch(tsa, "s"),
                                            gemm_mod.read_torch(tb, "b"), gemm_mod.read_torch(tsb, "t"),
                                            gemm_mod.read_torch(tout, "o")),
        }
        x16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        rows_t["torch.mm BF16 (out=)"] = lambda: torch.mm(x16, w16.t(), out=tout)
        for name, fn in rows_t.items():
            rows[name] = timed(fn, args.calls, args.rounds, tsync)
            print(f"{name:<44} {rows[name]:7.2f} us", flush=True)
        launcher.launch = lambda *x: None
        rows["torch: whole call, launch a no-op"] = timed(tcall, args.calls, args.rounds, tsync)
        print(f"{'torch: whole call, launch a no-op':<44} {rows['torch: whole call, launch a no-op']:7.2f} us")
        launcher.launch = real_launch
    except ImportError:
        pass
    if args.cprofile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            call()
        prof.disable()
        sync()
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": args.shape, "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                       "command": " ".join(sys.argv), "us_per_call": rows}, f, indent=1)


def gemm_param_offsets(func):
    fn = driver().cuFuncGetParamInfo
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    fn.restype = ctypes.c_int
    offs, off, size, i = [], ctypes.c_size_t(), ctypes.c_size_t(), 0
    while fn(ctypes.c_void_p(func), i, ctypes.byref(off), ctypes.byref(size)) == 0:
        offs.append(off.value)
        i += 1
    return offs


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
                ("numAttrs", ctypes.c_uint)]


def add_launch_ex(add, drv, func, grid, block, smem, stream, params):
    fn = drv.cuLaunchKernelEx
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    cfg = LaunchConfig(grid, 1, 1, block, 1, 1, smem, stream, None, 0)
    cfg_ptr, extra = ctypes.addressof(cfg), params.extra_ptr
    add("ctypes cuLaunchKernelEx (extra, config kept)", lambda: fn(cfg_ptr, func, None, extra))
    # PDL attribute (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6): its launch cost.
    attr = (ctypes.c_ubyte * 72)()
    ctypes.c_int.from_buffer(attr, 0).value = 6
    ctypes.c_int.from_buffer(attr, 8).value = 1
    cfg2 = LaunchConfig(grid, 1, 1, block, 1, 1, smem, stream, ctypes.addressof(attr), 1)
    cfg2_ptr = ctypes.addressof(cfg2)
    add("ctypes cuLaunchKernelEx (extra, PDL attr)", lambda: fn(cfg2_ptr, func, None, extra))
    add._keep = (cfg, cfg2, attr)


if __name__ == "__main__":
    main()
