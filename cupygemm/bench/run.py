"""The ``cupygemm bench`` run: check the options, compile every kernel first, then per shape time each provider
and check its result; print the table and write JSON and the plot on request."""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from typing import Any, Callable, Sequence

from ..device import get_num_sms, require_hopper_or_exit
from ..serving import build_kernels, kernel_keys
from .cases import (BenchUsageError, Shape, Sizes, parse_kinds, parse_shape_texts, select_shapes, shape_config,
                    shape_sizes)
from .environment import environment
from .kinds import bench_kind
from .metrics import FP8_DENSE_FLOPS, floor_us, summarize_times
from .plot import MATPLOTLIB_HINT, plot_available, write_plot
from .providers import TITLES, Prepared, load_peers, parse_peers
from .report import (build_report, fmt_us, format_configs, format_notes, format_sections, format_summary, make_row,
                     sections, write_json)
from .timing import FLUSH_BYTES, Timer, measure_copy_bandwidth, measure_event_overhead, open_cupti_timer, timing_method


#: ``--timing`` choice -> CUPTI backend of :func:`cupygemm.bench.cupti.open_kernel_timer`.
TIMING_BACKENDS = {"cupti": "auto", "cupti-python": "python", "cupti-ctypes": "ctypes"}


def _err(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


def _progress(text: str) -> None:
    print(f"[cupygemm] {text}", file=sys.stderr, flush=True)


def run_provider(name: str, prepare: Callable[[Any], Prepared], inp: Any, timer: Timer,
                 iters: int) -> tuple[Prepared | None, dict[str, float] | None, str | None]:
    """Prepare, call once untimed (loads modules, JIT), synchronize, then time ``iters`` calls. The statistics get
    ``kernels_per_call`` (the most kernels one call launched) where the timer counts them (CUPTI)."""
    import cupy

    try:
        prep = prepare(inp)
        prep.call()
        cupy.cuda.get_current_stream().synchronize()
        kernels: list[int] = []
        times = timer.time(prep.call, iters, kernels)
    except Exception as e:
        try:
            cupy.cuda.get_current_stream().synchronize()
        except Exception:
            pass
        return None, None, _err(e)
    stats: dict[str, Any] = summarize_times(times)
    if kernels:
        stats["kernels_per_call"] = max(kernels)
    return prep, stats, None


def bench_shape(shape: Shape, sizes: Sizes, seed: int, iters: int, timer: Timer, copy_bw: float,
                config: str | None, peers: dict[str, Any]) -> list[dict[str, Any]]:
    """All providers on one shape: inputs, timing, checks, as the shape's kind's bench code makes them
    (:mod:`cupygemm.bench.kinds`). Returns one row per provider that applies."""
    maker = bench_kind(shape.kind)
    flops, nbytes = maker.work(shape, sizes)
    floor = floor_us(flops, nbytes, copy_bw)
    try:
        inp = maker.make_inputs(shape, sizes, seed)
    except Exception as e:
        return [make_row(shape, sizes, "cupygemm", None, flops, nbytes, floor, config, error=f"inputs: {_err(e)}")]
    runners: list[tuple[str, Callable[[Any], Prepared]]] = [("cupygemm", maker.prepare_cupygemm)]
    runners += [(name, p.prepare) for name, p in peers.items() if p.supports(shape)]
    results = []
    for name, prepare in runners:
        prep, stats, error = run_provider(name, prepare, inp, timer, iters)
        results.append((name, prep, stats, error))
    rows = []
    check_of = maker.checker(inp, seed)
    for name, prep, stats, error in results:
        check = None
        if prep is not None:
            try:
                check = check_of(name, prep)
            except Exception as e:
                error = f"check: {_err(e)}"
        rows.append(make_row(shape, sizes, name, stats, flops, nbytes, floor,
                             config if name == "cupygemm" else None, check, error))
    return rows


def compile_configs(cfgs: Sequence[Any], jobs: int, progress: bool = True) -> float:
    """Compile the distinct kernels of ``cfgs`` into the disk cache in worker processes; returns the seconds.
    Done before anything is timed so that no measurement waits on NVRTC."""
    return build_kernels(list(kernel_keys(cfgs).values()), jobs, progress)


def precompile(shapes: Sequence[Shape], sizes: dict[Shape, Sizes], num_sms: int, smem_limit: int,
               jobs: int) -> dict[Shape, str]:
    """Pick every shape's config and compile them all in parallel; returns the configs' descriptions."""
    cfgs, described = [], {}
    for s in shapes:
        cfg = shape_config(s, sizes[s], num_sms, smem_limit)
        if cfg is None:  # the kind's kernels compile at their first (untimed) call
            continue
        cfgs.append(cfg)
        described[s] = cfg.describe()
    if not cfgs:
        _progress(f"{len(shapes)} shapes whose kernels compile at their first (untimed) call")
        return described
    n = len(set(cfgs))
    later = len(shapes) - len(described)
    _progress(f"compiling {n} kernel{'s' if n != 1 else ''} for {len(described)} shapes with {jobs} jobs"
              + (f" ({later} more shapes compile at their first, untimed, call)" if later else ""))
    try:
        compile_configs(cfgs, jobs)
    except Exception as e:  # the failing shapes fail again at their first call and are reported there
        _progress(f"pre-compilation failed: {_err(e)}")
    return described


def stream_context(peers: dict[str, Any]) -> contextlib.ExitStack:
    """Run CuPy and torch on the legacy default stream of CuPy's current device, so events order everything."""
    import cupy

    stack = contextlib.ExitStack()
    stack.enter_context(cupy.cuda.Stream.null)
    torch_mod = next((p.torch for p in peers.values() if getattr(p, "torch", None) is not None), None)
    if torch_mod is not None:
        dev = cupy.cuda.runtime.getDevice()
        stack.enter_context(torch_mod.cuda.device(dev))
        stack.enter_context(torch_mod.cuda.stream(torch_mod.cuda.default_stream(dev)))
    return stack


def _print_header(meta: dict[str, Any], peers: dict[str, Any], notes: Sequence[str]) -> None:
    print(f"device: {meta['device']} (compute capability {meta['compute_capability']}, {meta['num_sms']} SMs); "
          f"compare published numbers only with the same device")
    versions = [f"cupygemm {meta['cupygemm']}" + (f" ({meta['git_revision']})" if meta["git_revision"] else ""),
                f"CuPy {meta['cupy']}", f"CUDA runtime {meta['cuda_runtime']}", f"NVRTC {meta['nvrtc']}",
                f"driver {meta['driver'] or meta['cuda_driver']}"]
    if meta.get("torch"):
        versions.append(f"torch {meta['torch']}")
    if meta.get("deep_gemm"):
        versions.append(f"deep_gemm {meta['deep_gemm']}")
    print(", ".join(versions))
    print(f"peers: {', '.join(TITLES[p] for p in peers) or 'none'}")
    for n in notes:
        print(f"  {n}")


def run_bench(args: argparse.Namespace) -> int:
    """The ``cupygemm bench`` command; returns the exit code (0 ok, 1 a cupygemm result failed, 2 usage/setup;
    without a usable Hopper GPU it exits with 2, see :func:`~cupygemm.device.require_hopper_or_exit`)."""
    try:
        shapes = select_shapes(parse_kinds(args.kinds), parse_shape_texts(args.shapes))
        peer_names, peers_required = parse_peers(args.peers)
        if args.iters < 1:
            raise BenchUsageError("--iters must be at least 1")
        if args.seed < 0:
            raise BenchUsageError("--seed must be non-negative")
        sizes = shape_sizes(shapes, args.seed, args.match_rows, getattr(args, "full_groups", False))
    except BenchUsageError as e:
        print(f"cupygemm bench: {e}", file=sys.stderr)
        return 2
    if args.plot and not plot_available():
        print(f"cupygemm bench: {MATPLOTLIB_HINT}", file=sys.stderr)
        return 2
    info = require_hopper_or_exit("cupygemm bench")
    import cupy

    peers, notes = load_peers(peer_names, args.deepergemm_sideaware, cupy.cuda.runtime.getDevice())
    # cupygemm-packed left out where packing keeps the weights plain is no missing peer: its column would repeat ours
    wanted = [n for n in peer_names if n != "cupygemm_packed" or n in peers]
    if peers_required and len(peers) < len(wanted):
        print("cupygemm bench: a requested peer cannot run:\n  " + "\n  ".join(notes), file=sys.stderr)
        return 2
    meta = environment(info, args, peers)
    num_sms = get_num_sms()
    meta["num_sms"] = num_sms
    with stream_context(peers):
        return _run(args, shapes, sizes, peers, notes, meta, info, num_sms)


def _run(args: argparse.Namespace, shapes: Sequence[Shape], sizes: dict[Shape, Sizes], peers: dict[str, Any],
         notes: Sequence[str], meta: dict[str, Any], info: Any, num_sms: int) -> int:
    import cupy

    _print_header(meta, peers, notes)
    configs = precompile(shapes, sizes, num_sms, info.max_smem_per_block, args.jobs)
    copy_bw = measure_copy_bandwidth()
    meta["copy_gbs"] = copy_bw / 1e9
    meta["flush_bytes"] = max(FLUSH_BYTES, 2 * info.l2_bytes)
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s (device-to-device, read + write); "
          f"floor = max(bytes / copy bandwidth, FLOPs / {FP8_DENSE_FLOPS / 1e12:.0f} TFLOPS)")
    kernel_timer, why = ((None, "--timing events") if args.timing == "events"
                         else open_cupti_timer(TIMING_BACKENDS[args.timing]))
    timer = Timer(meta["flush_bytes"], kernel_timer)
    meta["timing"] = f"cupti ({why})" if kernel_timer is not None else "events"
    meta["method"] = timing_method(kernel_timer is not None, meta["flush_bytes"])
    meta["event_overhead_us"] = measure_event_overhead(timer)
    if kernel_timer is not None:
        print(f"timing: kernel time from CUPTI activity records ({why}), as the peer tables' profiler reports it")
    else:
        print(f"timing: CUDA events ({why}); an empty kernel measures {meta['event_overhead_us'] or 0:.2f} us, "
              "included in every time below (profiler-based tables do not count it)")
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    for i, shape in enumerate(shapes):
        shape_rows = bench_shape(shape, sizes[shape], args.seed, args.iters, timer, copy_bw, configs.get(shape),
                                 peers)
        rows += shape_rows
        done = ", ".join(f"{TITLES.get(r['provider'], r['provider'])} "
                         f"{'error' if r.get('error') else fmt_us(r.get('us')) + ' us'}"
                         f"{' FAIL' if r.get('check') == 'FAIL' and not r.get('error') else ''}" for r in shape_rows)
        _progress(f"{i + 1}/{len(shapes)} {shape.kind} {shape.label}: {done} ({time.time() - t0:.0f}s)")
        cupy.get_default_memory_pool().free_all_blocks()
        if args.json and i + 1 < len(shapes):  # what a run cut short (a device time limit) leaves behind
            partial = f"{i + 1} of {len(shapes)} shapes"
            write_json(args.json, {**build_report(meta, rows, list(peers)), "partial": partial})
    peer_cols = list(peers)
    parts = sections(rows, peer_cols)
    print()
    print(format_sections(parts))
    print()
    for block in (format_configs(rows), format_notes(rows), format_summary(rows, peer_cols)):
        if block:
            print(block)
    if args.markdown:
        print()
        print(format_sections(parts, markdown=True))
    report = build_report(meta, rows, peer_cols)
    if args.json:
        write_json(args.json, report)
        print(f"wrote {args.json}")
    if args.plot:
        write_plot(args.plot, rows, title=f"cupygemm bench, {meta['device']}")
        print(f"wrote {args.plot}")
    return 0 if report["ok"] else 1
