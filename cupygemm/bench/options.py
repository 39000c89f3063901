"""The ``cupygemm bench`` command line. Light on purpose: the CLI builds this parser on every invocation, so the
run itself (:mod:`cupygemm.bench.run`) is imported only when the command runs."""
from __future__ import annotations

import argparse
import os
import re
from typing import Any

DEFAULT_ITERS = 30


def run_bench(args: argparse.Namespace) -> int:
    """The ``cupygemm bench`` command; returns the exit code (0 ok, 1 a cupygemm result failed, 2 usage/setup)."""
    from .run import run_bench as run

    return run(args)


def help_text(doc: str) -> str:
    """A module docstring as a command's --help text: reStructuredText's inline literals and roles shown as the plain
    text they mark."""
    return re.sub(r"(?::\w+:)?``?~?([^`]+?)``?", r"\1", doc)


def _int_at_least(lowest: int, what: str):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {what} integer, got {text!r}") from None
        if v < lowest:
            raise argparse.ArgumentTypeError(f"expected a {what} integer, got {v}")
        return v

    return parse


_positive_int = _int_at_least(1, "positive")
_non_negative_int = _int_at_least(0, "non-negative")


def _kinds_help() -> str:
    """The kinds --kinds accepts, from the descriptors (cupygemm.kinds)."""
    from ..kinds import KINDS

    return ", ".join(k.name + (f" ({', '.join(k.aliases)})" if k.aliases else "") for k in KINDS)


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``cupygemm bench`` on the CLI's subparsers."""
    p = subparsers.add_parser(
        "bench",
        help="time cupygemm (and cuBLAS block-scaled / DeepGEMM when importable) on the seed shapes",
        description=(
            "Benchmark cupygemm on the 28 forward seed shapes (18 normal, 4 contiguous, 6 masked), on the seed shapes "
            "of --kinds (wgrad, k_grouped_wgrad: DeepGEMM 03d0be3 test_core's weight-gradient shapes, against "
            "DeepGEMM's wgrad functions) or on --shapes. "
            "Kernels are compiled first (in parallel); each call is timed after an untimed 1 GiB L2 flush, "
            "as kernel time from CUPTI activity records (the profiler's view, as in the peer tables; CUDA events "
            "when CUPTI is missing or with --timing events); every result is checked against a float64 "
            "reference on sampled rows (weight gradients: the whole output against FP32 products). Peers run "
            "in the same process when importable: cuBLASLt block-scaled FP8 via torch._scaled_mm (normal "
            "shapes) and DeepGEMM (03d0be3 API). Exit code: 0 all cupygemm results correct, 1 a result was "
            "wrong or a call failed, 2 usage or setup error."),
    )
    p.add_argument("--kinds", default=None, metavar="LIST",
                   help=f"comma-separated kinds to run: {_kinds_help()} (default: the forward kinds normal, "
                        "contiguous, masked; the weight-gradient kinds run only when named)")
    p.add_argument("--shapes", nargs="+", default=None, metavar="SHAPE",
                   help="shapes instead of the seed list, read as shapes of the one kind in --kinds (default: the "
                        "forward kinds) with that many dimensions: MxNxK (normal; wgrad, K = tokens) or GxMxNxK "
                        "(contiguous, masked: M = expected rows per group; k_grouped_wgrad: M rows, K = base "
                        "tokens per group); space- or comma-separated")
    p.add_argument("--json", default=None, metavar="FILE", help="write the results as JSON to FILE")
    p.add_argument("--markdown", action="store_true", help="also print the table as markdown")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="write a bar chart (needs matplotlib: pip install 'cupygemm[bench]')")
    p.add_argument("--peers", default="auto", metavar="auto|none|LIST",
                   help="peers to time in the same run: auto (those importable), none, or a list of "
                        "packed,cublas,deepgemm,deepergemm,deepergemm_s128 (then required; packed, cupygemm on "
                        "weights from pack_weights, is left out with a note on GPUs where packing keeps them plain); "
                        "default: %(default)s")
    p.add_argument("--deepergemm-sideaware", default=None, metavar="SIDEAWARE.so",
                   help="DeeperGEMM's compiled L2-side-aware allocator (its include/l2_torch_alloc/sideaware.so): set "
                        "up for the whole process before anything else allocates, as DeeperGEMM's own tests do")
    p.add_argument("--iters", type=_positive_int, default=DEFAULT_ITERS, help="timed calls per shape and provider (default: %(default)s)")
    p.add_argument("--seed", type=_non_negative_int, default=0, help="seed of the inputs and the group sizes (default: %(default)s)")
    p.add_argument("--match-rows", default=None, metavar="PEERS.json",
                   help="forward grouped shapes: draw group sizes that sum to the valid rows the peer table measured "
                        "(e.g. benchmarks/peers/h200-2026-11-21.json in the source tree), so both runs do the same "
                        "work; refused for the weight-gradient kinds (the tables have none)")
    p.add_argument("--full-groups", action="store_true",
                   help="masked shapes: every group holds M rows, all valid, and max_m = expected_m = M (instead of "
                        "the peers' random sizes around M)")
    p.add_argument("--timing", choices=("cupti", "cupti-python", "cupti-ctypes", "events"), default="cupti",
                   help="cupti: kernel time from CUPTI activity records, through NVIDIA's cupti-python when it is "
                        "installed (bench extra), else libcupti through ctypes (CUPYGEMM_CUPTI names the library), "
                        "else CUDA events; cupti-python / cupti-ctypes: only that path; events: CUDA events around "
                        "each call (default: %(default)s)")
    p.add_argument("--jobs", type=_positive_int, default=os.cpu_count() or 1, help="parallel kernel compilations (default: the CPU count, %(default)s here)")
    p.set_defaults(func=run_bench)
    return p
