"""The ``cupygemm`` command: ``info``, ``warmup``, ``cache export|import``, and ``bench``, ``overhead``,
``jax-scan``, ``chain`` and ``multigpu`` (from :mod:`cupygemm.bench`, imported only when the parser is built, so
``import cupygemm.cli`` stays light and the benchmark never imports the CLI)."""
from __future__ import annotations

import argparse
import os
import sys


def _ranges(values: list[int]) -> str:
    """[0, 1, 2, 5, 6] -> '0-2,5-6'."""
    out, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(f"{start}-{v}" if v != start else str(v))
            start = None
    return ",".join(out)


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
            if d.compute_capability == "90":
                from cupygemm import env, l2

                side = l2.side_info(i)  # measured now (well under a second), as pack_weights would
                print(f"  L2 sides    {side.describe() if side else f'none ({l2.unavailable_reason(i)})'}")
                if side:
                    far = [sm for sm, s in enumerate(side.sm_side) if s == 1]
                    print(f"  side 1 SMs  {_ranges(far)}")
                    print(f"  packing     {l2.why_plain(i) or 'side-aware'} ({env.L2_SIDES}={env.l2_sides_mode()})")
                from cupygemm.config import b_evict_first_rule

                print(f"  B in L2     first to evict when one row block reads it: {b_evict_first_rule(d.name)} "
                      f"({env.B_EVICT_FIRST}={env.b_evict_first_mode()})")
    else:
        print("GPU           no GPU")
    from cupygemm import env

    n, size = cache.disk_usage()
    print(f"cache         {cache.cache_dir()} ({n} kernels, {size / 1e6:.1f} MB)")
    print(f"interleave    {env.FFMA_INTERLEAVE}={env.ffma_interleave_mode()}")
    print(f"B in L2       {env.B_EVICT_FIRST}={env.b_evict_first_mode()}")
    print(f"PDL           {env.PDL}={int(env.pdl_enabled())}")
    return 0


def _shape_arg(text: str) -> tuple[int, ...]:
    """'MxNxK' (normal) or 'GxMxNxK' (grouped), with argparse's error message."""
    from cupygemm.shapes import parse_shape

    try:
        return parse_shape(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def warmup_configs(kind: str, shapes: list[tuple[int, ...]], num_sms: int):
    """The configs the library would pick for ``shapes`` on a GPU with ``num_sms`` SMs.

    Grouped shapes are GxMxNxK: contiguous = G groups of M rows, each padded to 128 as the layout requires;
    masked = G groups with expected_m = M (max_m = M).
    """
    from cupygemm.serving import plan, problems_from_shapes

    try:
        return plan(problems_from_shapes(kind, shapes), num_sms)
    except ValueError as e:
        raise SystemExit(str(e)) from None


def parse_nk(text: str) -> list[tuple[int, int]]:
    """'2112x7168,24576x1536' -> [(2112, 7168), (24576, 1536)]."""
    out = []
    for tok in text.replace(" ", "").split(","):
        if not tok:
            continue
        parts = tok.lower().split("x")
        try:
            n, k = (int(t) for t in parts)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--nk {tok!r}: expected NxK (comma-separated)") from None
        if n < 1 or k < 1:
            raise argparse.ArgumentTypeError(f"--nk {tok!r}: N and K must be positive")
        out.append((n, k))
    return out


def _positive_int(text: str) -> int:
    """A count option (--jobs, --groups); argparse names the option in its error."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _num_sms_arg(text: str) -> int:
    """--num-sms: refused here, naming the option, rather than deep inside the planner."""
    from cupygemm.device import MAX_NUM_SMS, check_num_sms

    try:
        return check_num_sms(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an SM count in 1..{MAX_NUM_SMS}, got {text!r}") from None


def _require_num_sms(args: argparse.Namespace) -> None:
    """Without a GPU nothing stands in for --num-sms: a usage error (rc 2), as argparse gives for a missing required
    option. Commands that use it must have set ``usage_error`` (their parser's error method)."""
    from cupygemm.device import gpu_available

    if args.num_sms is None and not gpu_available():
        args.usage_error("--num-sms is required without a GPU (there is no device to ask; H100/H200 SXM have 132)")


def _m_ranges_arg(text: str) -> list[tuple[int, int]]:
    from cupygemm.serving import parse_m_ranges

    try:
        return parse_m_ranges(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).replace("m: ", "--m: ", 1)) from None


def _cmd_warmup(args: argparse.Namespace) -> int:
    from cupygemm.errors import CupygemmError
    from cupygemm.serving import warmup

    if args.arch != "sm_90a":
        print(f"only --arch sm_90a is supported, got {args.arch}", file=sys.stderr)
        return 2
    nk = [p for group in (args.nk or []) for p in group]
    ranges = [r for group in (args.m or []) for r in group] or None
    if not (args.shapes or nk or args.preset):
        print("cupygemm warmup: give SHAPES, or --nk / --preset (with --m)", file=sys.stderr)
        return 2
    _require_num_sms(args)
    try:
        report = warmup(nk, ranges, kind=args.kind, groups=args.groups, shapes=args.shapes or (),
                        preset=args.preset, num_sms=args.num_sms, jobs=args.jobs, progress=not args.quiet,
                        dry_run=args.dry_run, packed=args.packed)
    except ValueError as e:
        print(f"cupygemm warmup: {e}", file=sys.stderr)
        return 2
    except CupygemmError as e:
        print(f"cupygemm warmup: {e}", file=sys.stderr)
        return 1
    if args.list:
        for d in report.descriptions:
            print(d)
    from cupygemm.jit import cache

    print(report.summary() + ("" if args.dry_run else f"; cache {cache.cache_dir()}"))
    return 0


def _cmd_cache(args: argparse.Namespace) -> int:
    from cupygemm.errors import CupygemmError
    from cupygemm.jit import portable

    if args.cache_cmd == "export":
        _require_num_sms(args)
    try:
        if args.cache_cmd == "export":
            n = portable.export_cache(args.file, num_sms=args.num_sms)
            print(f"exported {n} kernels to {args.file}")
        else:
            res = portable.import_cache(args.file, num_sms=args.num_sms)
            print(f"imported {res.added} kernels into {res.cache_dir} ({res.present} already there)"
                  + (f"; {res.note}" if res.note else ""))
    except (ValueError, CupygemmError, OSError) as e:
        print(f"cupygemm cache {args.cache_cmd}: {e}", file=sys.stderr)
        return 1
    return 0


PRESET_NAMES = ("deepseek-v3", "deepseek-r1")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cupygemm", description="FP8 GEMM for Hopper: tools and benchmark.")
    sub = p.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("info", help="versions, GPU, cache directory")
    sp.set_defaults(func=_cmd_info)
    sp = sub.add_parser(
        "warmup", help="pre-compile the kernels for shapes or M ranges into the cache (works without a GPU)",
        description="Build into the disk cache exactly the distinct kernels the config chooser picks for every M of "
                    "the given ranges (per (N, K)) and for explicit shapes, in parallel processes. Prints the "
                    "count: problems -> configs -> kernels, already cached, built. Example: cupygemm warmup "
                    "--preset deepseek-v3 --m 1:4096 --num-sms 132")
    from cupygemm.kinds import names as kind_names

    sp.add_argument("shapes", nargs="*", type=_shape_arg,
                    help="MxNxK (normal, wgrad: K = tokens) or GxMxNxK (grouped; k_grouped_wgrad: K = tokens per group)")
    sp.add_argument("--kind", choices=kind_names(), default="normal")
    sp.add_argument("--nk", action="append", type=parse_nk, metavar="NxK[,NxK...]",
                    help="(N, K) pairs to warm for every M of --m (repeatable)")
    sp.add_argument("--preset", choices=sorted(PRESET_NAMES), default=None,
                    help="a model's (N, K) pairs for --kind (deepseek-v3 = deepseek-r1: the seed shapes' pairs)")
    sp.add_argument("--m", action="append", type=_m_ranges_arg, metavar="LO:HI[,...]",
                    help="inclusive M ranges for --nk/--preset, below 2^31 (default 1:4096 for normal GEMMs); "
                         "contiguous: total rows of A (the multiples of 128 in the range), masked: expected_m")
    sp.add_argument("--groups", type=_positive_int, default=1,
                    help="groups of grouped kinds with --nk/--preset (default 1)")
    sp.add_argument("--arch", default="sm_90a", help="target architecture (only sm_90a)")
    sp.add_argument("--num-sms", type=_num_sms_arg, default=None,
                    help="SM count of the target GPU (required without a GPU)")
    sp.add_argument("--jobs", type=_positive_int, default=os.cpu_count() or 1,
                    help="parallel compile processes (default: the CPU count)")
    sp.add_argument("--packed", action="store_true",
                    help="the kernels for weights from pack_weights (L2-side-aware; forward kinds), for GPUs where it "
                         "packs them (H100s by default; cupygemm info says)")
    sp.add_argument("--dry-run", action="store_true", help="plan and count only; build nothing")
    sp.add_argument("--list", action="store_true", help="print one config per kernel")
    sp.add_argument("--quiet", action="store_true", help="no progress on stderr")
    sp.set_defaults(func=_cmd_warmup, usage_error=sp.error)
    sp = sub.add_parser("cache", help="export or import the kernel cache as one file (e.g. to ship to GPU hosts)",
                        description="Cache directory: $CUPYGEMM_CACHE_DIR, else $XDG_CACHE_HOME/cupygemm, else "
                                    "~/.cache/cupygemm. An archive's manifest records the cupygemm version, NVRTC "
                                    "version, architecture, SM count and CUDA-source hash; import refuses a mismatch.")
    csub = sp.add_subparsers(dest="cache_cmd", required=True)
    for name, what, sms in (
            ("export", "write every cached kernel and a manifest to FILE (.tar.gz)",
             "the SM count the kernels were warmed for, recorded in the manifest (default: this GPU's; required "
             "without a GPU)"),
            ("import", "verify FILE's manifest and checksums, then add its kernels to the cache",
             "check the archive's SM count against this one and refuse a mismatch (default: this GPU's; without a "
             "GPU and without this option the SM count is not checked)")):
        cp = csub.add_parser(name, help=what, description=what)
        cp.add_argument("file", metavar="FILE")
        cp.add_argument("--num-sms", type=_num_sms_arg, default=None, help=sms)
        cp.set_defaults(func=_cmd_cache, usage_error=cp.error)
    from cupygemm.bench.casts import add_parser as add_cast_bench_parser
    from cupygemm.bench.chain import add_parser as add_chain_parser
    from cupygemm.bench.jax_scan import add_parser as add_jax_scan_parser
    from cupygemm.bench.multigpu import add_parser as add_multigpu_parser
    from cupygemm.bench.options import add_bench_parser
    from cupygemm.bench.overhead import add_parser as add_overhead_parser
    from cupygemm.bench.train_step import add_parser as add_train_step_parser

    add_overhead_parser(sub)
    add_jax_scan_parser(sub)
    add_chain_parser(sub)
    add_cast_bench_parser(sub)
    add_train_step_parser(sub)
    add_multigpu_parser(sub)
    add_bench_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from cupygemm import env

    args = build_parser().parse_args(argv)
    bad = env.invalid_settings()
    if bad:
        print("\n".join(f"cupygemm: {line}" for line in bad), file=sys.stderr)
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
