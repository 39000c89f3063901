"""The ``cupygemm`` command: ``info``, ``warmup`` and ``bench``."""
from __future__ import annotations

import argparse
import os
import sys
import time
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed


def _cmd_info(args: argparse.Namespace) -> int:
    import cupygemm
    from cupygemm.jit import cache
    from cupygemm.jit.compiler import nvrtc_version

    print(f"cupygemm      {cupygemm.__version__}")
    try:
        import cupy

        print(f"CuPy          {cupy.__version__}")
        rt = cupy.cuda.runtime.runtimeGetVersion()
        print(f"CUDA runtime  {rt // 1000}.{rt % 1000 // 10}")
        drv = cupy.cuda.runtime.driverGetVersion()
        print(f"CUDA driver   {drv // 1000}.{drv % 1000 // 10}" if drv else "CUDA driver   none")
    except ImportError:
        print("CuPy          not installed (pip install 'cupygemm[cuda12]' or '[cuda13]')")
    try:
        v = nvrtc_version()
        print(f"NVRTC         {v[0]}.{v[1]}")
    except Exception as e:
        print(f"NVRTC         unavailable ({e})")
    from cupygemm.device import current_device, gpu_available

    if gpu_available():
        import cupy

        for i in range(cupy.cuda.runtime.getDeviceCount()):
            with cupy.cuda.Device(i):
                d = current_device()
            cc = f"{d.compute_capability[0]}.{d.compute_capability[1:]}"
            note = "" if d.compute_capability == "90" else "  (not Hopper: cupygemm kernels will not run)"
            print(f"GPU {i}         {d.name}, compute capability {cc}, {d.num_sms} SMs{note}")
    else:
        print("GPU           no GPU")
    from cupygemm import env

    n, size = cache.disk_usage()
    print(f"cache         {cache.cache_dir()} ({n} kernels, {size / 1e6:.1f} MB)")
    print(f"interleave    {env.FFMA_INTERLEAVE}={env.ffma_interleave_mode()}")
    print(f"B in L2       {env.B_EVICT_FIRST}={env.b_evict_first_mode()}")
    return 0


def parse_shape(text: str) -> tuple[int, ...]:
    """'MxNxK' (normal) or 'GxMxNxK' (grouped)."""
    try:
        dims = tuple(int(t) for t in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected MxNxK or GxMxNxK") from None
    if len(dims) not in (3, 4) or min(dims) < 0:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected MxNxK or GxMxNxK")
    return dims


def warmup_configs(kind: str, shapes: list[tuple[int, ...]], num_sms: int):
    """The configs the library would pick for ``shapes`` on a GPU with ``num_sms`` SMs.

    Grouped shapes are GxMxNxK: contiguous = G groups of M rows, each padded to 128 as the layout requires;
    masked = G groups with expected_m = M (max_m = M).
    """
    from cupygemm.config import KIND_CONTIGUOUS, KIND_MASKED, KIND_NORMAL, choose_config, model_rows

    kid = {"normal": KIND_NORMAL, "contiguous": KIND_CONTIGUOUS, "masked": KIND_MASKED}[kind]
    cfgs = []
    for s in shapes:
        if kid == KIND_NORMAL:
            if len(s) != 3:
                raise SystemExit(f"normal shapes are MxNxK, got {'x'.join(map(str, s))}")
            m, n, k = s
            g = 1
        else:
            if len(s) != 4:
                raise SystemExit(f"grouped shapes are GxMxNxK (M = rows per group), got {'x'.join(map(str, s))}")
            g, m, n, k = s
            if kid == KIND_CONTIGUOUS:
                m = g * (-(-m // 128) * 128)
        cfgs.append(choose_config(kid, model_rows(kid, max(m, 1)), n, k, g, num_sms))
    return cfgs


def compile_all(cfgs, jobs: int, progress: bool = True) -> float:
    """Compile the configs into the disk cache in worker processes (NVRTC holds the GIL, so threads would
    not run in parallel); returns the seconds taken."""
    from cupygemm.kernels import compile_gemm, precompile_gemm

    unique = list(dict.fromkeys(cfgs))
    t0 = time.time()
    done = 0
    if len(unique) <= 1 or jobs <= 1:
        for c in unique:
            compile_gemm(c)
        return time.time() - t0
    ctx = multiprocessing.get_context("spawn")  # workers need no CUDA context; never fork one
    with ProcessPoolExecutor(max_workers=min(jobs, len(unique)), mp_context=ctx) as pool:
        futures = [pool.submit(precompile_gemm, c) for c in unique]
        for f in as_completed(futures):
            f.result()
            done += 1
            if progress:
                print(f"\r[cupygemm] compiled {done}/{len(unique)} kernels, {time.time() - t0:.1f}s",
                      end="", file=sys.stderr, flush=True)
    if progress and unique:
        print(file=sys.stderr)
    return time.time() - t0


def _cmd_warmup(args: argparse.Namespace) -> int:
    if args.arch != "sm_90a":
        print(f"only --arch sm_90a is supported, got {args.arch}", file=sys.stderr)
        return 2
    num_sms = args.num_sms
    if num_sms is None:
        from cupygemm.device import get_num_sms, gpu_available

        if not gpu_available():
            print("no GPU: give --num-sms (e.g. 132 for H100/H200 SXM)", file=sys.stderr)
            return 2
        num_sms = get_num_sms()
    cfgs = warmup_configs(args.kind, args.shapes, num_sms)
    for c in cfgs:
        print(c.describe())
    secs = compile_all(cfgs, args.jobs)
    print(f"{len(set(cfgs))} kernels ready in the cache ({secs:.1f}s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cupygemm", description="FP8 GEMM for Hopper: tools and benchmark.")
    sub = p.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("info", help="versions, GPU, cache directory")
    sp.set_defaults(func=_cmd_info)
    sp = sub.add_parser("warmup", help="pre-compile kernels for shapes into the cache (works without a GPU)")
    sp.add_argument("shapes", nargs="+", type=parse_shape, help="MxNxK (normal) or GxMxNxK (grouped)")
    sp.add_argument("--kind", choices=["normal", "contiguous", "masked"], default="normal")
    sp.add_argument("--arch", default="sm_90a", help="target architecture (only sm_90a)")
    sp.add_argument("--num-sms", type=int, default=None, help="SM count of the target GPU (needed without a GPU)")
    sp.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compilations")
    sp.set_defaults(func=_cmd_warmup)
    try:
        from cupygemm.bench import add_bench_parser
    except ImportError:
        pass
    else:
        add_bench_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
