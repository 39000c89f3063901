"""``cupygemm overhead``: host time per GEMM call, back to back, for CuPy, torch and eager JAX callers, against
torch's own launch paths (``torch.mm`` BF16, ``torch._scaled_mm`` block-scaled FP8) and DeepGEMM when installed,
plus the time per call when the calls are replayed from a CUDA graph.

Per provider and shape: ``host_us``, the time for ``--calls`` calls to return (the GPU runs behind; nothing is
synchronized inside the loop), divided by the calls; ``wall_us``, the same loop until the GPU has finished; and
``graph_us``, the wall time per call of a CUDA graph holding ``--calls`` calls. Medians of ``--rounds`` rounds.
Operands are made once (SFA already in the M-major layout every provider reads), and each call writes into a
preallocated output where the API allows it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

from ..device import require_hopper_or_exit
from .options import help_text
from .timing import capture_graph

DECODE_SHAPES = ((64, 2112, 7168), (128, 7168, 2048), (64, 7168, 2048), (128, 2112, 7168))


def _time_loop(call: Callable[[], Any], calls: int, sync: Callable[[], None]) -> tuple[float, float]:
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    t1 = time.perf_counter()
    sync()
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


def measure(call: Callable[[], Any], calls: int, rounds: int, sync: Callable[[], None],
            graph: Callable[[int], Callable[[], None]] | None) -> dict[str, float | None]:
    """Median host and wall microseconds per call over ``rounds`` loops of ``calls`` calls; per-call graph time."""
    for _ in range(20):
        call()
    host, wall = zip(*(_time_loop(call, calls, sync) for _ in range(rounds)))
    row: dict[str, float | None] = {"host_us": statistics.median(host), "wall_us": statistics.median(wall),
                                    "graph_us": None}
    if graph is not None:
        replay = graph(calls)
        replay()
        row["graph_us"] = statistics.median(_time_loop(replay, 1, sync)[1] / calls for _ in range(rounds))
    return row


def _operands(m: int, n: int, k: int):
    import cupy as cp

    import cupygemm

    rng = cp.random.default_rng(0)
    x = rng.standard_normal((m, k), dtype=cp.float32)
    w = rng.standard_normal((n, k), dtype=cp.float32)
    a, sfa = cupygemm.per_token_cast_to_fp8(x)
    b, sfb = cupygemm.per_block_cast_to_fp8(w)
    return a, cupygemm.get_col_major_tma_aligned_tensor(sfa), sfa, b, sfb


def providers(m: int, n: int, k: int) -> dict[str, tuple[Callable[[], Any], Callable[[], None],
                                                         Callable[[int], Callable[[], None]] | None]]:
    """name -> (call, synchronize, make_graph(calls) -> replay) for every provider importable here."""
    import cupy as cp

    import cupygemm

    a, sfa, sfa_rows, b, sfb = _operands(m, n, k)  # SFA M-major, and row-major as the casts return it
    out = cp.empty((m, n), cupygemm.tensors.BF16)
    dev_sync = cp.cuda.Device().synchronize
    found: dict[str, Any] = {}

    def cupy_graph(calls: int) -> Callable[[], None]:
        s = cp.cuda.Stream(non_blocking=True)
        g = capture_graph(s, lambda: cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out), calls)
        return lambda: g.launch(s)

    found["cupygemm (CuPy)"] = (lambda: cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out), dev_sync, cupy_graph)
    # Row-major SFA (the casts') is copied into the kernels' layout on every call: its host cost is the point.
    found["cupygemm (CuPy, row-major SFA)"] = (lambda: cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa_rows), (b, sfb), out),
                                               dev_sync, None)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        ta, tb = torch.from_dlpack(a).view(torch.float8_e4m3fn), torch.from_dlpack(b).view(torch.float8_e4m3fn)
        tsfa, tsfb = torch.from_dlpack(sfa), torch.from_dlpack(sfb)
        tout = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")

        def torch_graph(fn: Callable[[], Any]) -> Callable[[int], Callable[[], None]]:
            def make(calls: int) -> Callable[[], None]:
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    fn()
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for _ in range(calls):
                        fn()
                return g.replay
            return make

        def ours_torch():
            cupygemm.gemm_fp8_fp8_bf16_nt((ta, tsfa), (tb, tsfb), tout)

        found["cupygemm (torch)"] = (ours_torch, torch.cuda.synchronize, torch_graph(ours_torch))
        tsfa_rows = torch.from_dlpack(sfa_rows)

        def ours_torch_rows():
            cupygemm.gemm_fp8_fp8_bf16_nt((ta, tsfa_rows), (tb, tsfb), tout)

        found["cupygemm (torch, row-major SFA)"] = (ours_torch_rows, torch.cuda.synchronize,
                                                    torch_graph(ours_torch_rows))
        x16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)

        def mm():
            torch.mm(x16, w16.t(), out=tout)

        found["torch.mm BF16"] = (mm, torch.cuda.synchronize, torch_graph(mm))
        if hasattr(torch, "_scaled_mm"):
            bt, scale_b = tb.t(), tsfb.t()

            def scaled():
                torch._scaled_mm(ta, bt, scale_a=tsfa, scale_b=scale_b, out_dtype=torch.bfloat16)

            try:
                scaled()
                found["torch._scaled_mm block"] = (scaled, torch.cuda.synchronize, torch_graph(scaled))
            except Exception as e:  # noqa: BLE001 - a torch without the block-scaled path
                print(f"torch._scaled_mm block-scaled: not run ({type(e).__name__}: {e})", file=sys.stderr)
        try:
            import deep_gemm

            if hasattr(deep_gemm, "gemm_fp8_fp8_bf16_nt"):
                def dg():
                    deep_gemm.gemm_fp8_fp8_bf16_nt((ta, tsfa), (tb, tsfb), tout)

                found["DeepGEMM"] = (dg, torch.cuda.synchronize, torch_graph(dg))
        except Exception as e:  # noqa: BLE001 - optional peer
            print(f"DeepGEMM: not run ({type(e).__name__}: {e})", file=sys.stderr)
    try:
        import jax
        import jax.numpy as jnp

        if any(d.platform == "gpu" for d in jax.devices()):
            ja = jax.lax.bitcast_convert_type(jax.dlpack.from_dlpack(a), jnp.float8_e4m3fn)
            jb = jax.lax.bitcast_convert_type(jax.dlpack.from_dlpack(b), jnp.float8_e4m3fn)
            jsfa, jsfb = jax.dlpack.from_dlpack(sfa), jax.dlpack.from_dlpack(sfb)
            holder: list[Any] = []

            def ours_jax():
                holder[:] = [cupygemm.gemm_fp8_fp8_bf16_nt((ja, jsfa), (jb, jsfb))]

            def jax_sync():
                if holder:
                    holder[0].block_until_ready()
                dev_sync()

            found["cupygemm (JAX eager)"] = (ours_jax, jax_sync, None)
    except Exception as e:  # noqa: BLE001 - optional framework
        print(f"JAX: not run ({type(e).__name__}: {e})", file=sys.stderr)
    return found


def run(shapes: list[tuple[int, int, int]], calls: int, rounds: int) -> list[dict[str, Any]]:
    rows = []
    for m, n, k in shapes:
        for name, (call, sync, graph) in providers(m, n, k).items():
            try:
                r = measure(call, calls, rounds, sync, graph)
            except Exception as e:  # noqa: BLE001 - report and go on with the other providers
                print(f"{name} {m}x{n}x{k}: failed ({type(e).__name__}: {e})", file=sys.stderr)
                continue
            rows.append({"shape": f"{m}x{n}x{k}", "provider": name, **r})
            print(f"{m}x{n}x{k:<6} {name:<26} host {r['host_us']:7.1f} us  wall {r['wall_us']:7.1f} us  "
                  f"graph {'-' if r['graph_us'] is None else format(r['graph_us'], '7.1f')} us", flush=True)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """One line per shape: host us per call of each provider, and ours over torch._scaled_mm."""
    names = list(dict.fromkeys(r["provider"] for r in rows))
    by = {(r["shape"], r["provider"]): r for r in rows}
    head = "| shape | " + " | ".join(f"{p} host us" for p in names) + " | cupygemm (CuPy) / _scaled_mm | " \
           "cupygemm (torch) / torch.mm |"
    lines = [head, "|" + "---|" * (len(names) + 3)]
    for shape in dict.fromkeys(r["shape"] for r in rows):
        cells = [f"{by[(shape, p)]['host_us']:.1f}" if (shape, p) in by else "-" for p in names]

        def ratio(x: str, y: str) -> str:
            if (shape, x) in by and (shape, y) in by:
                return f"{by[(shape, x)]['host_us'] / by[(shape, y)]['host_us']:.2f}"
            return "-"

        lines.append(f"| {shape} | " + " | ".join(cells) + f" | {ratio('cupygemm (CuPy)', 'torch._scaled_mm block')}"
                     f" | {ratio('cupygemm (torch)', 'torch.mm BF16')} |")
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    """GPU, driver and library versions of this run, and the measured tree."""
    import cupy as cp

    from .. import __version__
    from .environment import git_revision

    env: dict[str, Any] = {"gpu": cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode(),
                           "driver": cp.cuda.runtime.driverGetVersion(), "cupy": cp.__version__,
                           "cupygemm": __version__, "git_revision": git_revision(), "python": sys.version.split()[0]}
    for mod in ("torch", "jax"):
        if mod in sys.modules:
            env[mod] = sys.modules[mod].__version__
    return env


def add_parser(sub: Any) -> None:
    sp = sub.add_parser("overhead", help="host time per GEMM call (CuPy, torch, JAX callers; torch and DeepGEMM "
                        "peers) and per call inside a CUDA graph", description=help_text(__doc__),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("shapes", nargs="*", type=shape_arg, help="MxNxK (default: four decode shapes)")
    sp.add_argument("--calls", type=int, default=300, help="calls per timed loop (default 300)")
    sp.add_argument("--rounds", type=int, default=5, help="timed loops; the median is reported (default 5)")
    sp.add_argument("--json", metavar="FILE", help="write the rows and the environment as JSON")
    sp.add_argument("--markdown", action="store_true", help="print a Markdown table")
    sp.set_defaults(func=main)


def shape_arg(text: str) -> tuple[int, int, int]:
    """An MxNxK command-line argument."""
    try:
        m, n, k = (int(t) for t in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected MxNxK") from None
    return m, n, k


def main(args: argparse.Namespace) -> int:
    require_hopper_or_exit("cupygemm overhead")
    shapes = [tuple(s) for s in args.shapes] if args.shapes else list(DECODE_SHAPES)
    rows = run(shapes, args.calls, args.rounds)
    if args.markdown:
        print(markdown(rows))
    if args.json:
        report = {"command": " ".join(sys.argv), "calls": args.calls, "rounds": args.rounds,
                  "environment": environment(), "rows": rows}
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0
