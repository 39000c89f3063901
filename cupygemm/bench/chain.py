"""``cupygemm chain``: a decode sequence of GEMMs back to back on one stream, with and without programmatic
dependent launch (PDL, ``CUPYGEMM_PDL``), eager and replayed from a CUDA graph.

The default chain is DeepSeek-V3's per-layer decode GEMMs at 64 tokens: 64x2112x7168 -> 64x24576x1536 ->
64x32768x512 -> 64x7168x16384 (each its own operands; the chain is repeated ``--chains`` times per timing). With
PDL a kernel's launch and set-up overlap the end of the kernel before it, so the gaps between kernels shrink.

Per mode: ``eager_us``, CUDA events around ``--chains`` chains launched from Python (host and GPU both count), and
``graph_us``, the same chains captured once into a CUDA graph and replayed; both per chain, median of
``--rounds``. The results of the last chain with PDL are checked to equal those without it, bit for bit.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

from ..device import require_hopper_or_exit
from ..env import PDL
from .overhead import environment, shape_arg
from .options import help_text
from .timing import capture_graph, stream_event_us

DECODE_CHAIN = ((64, 2112, 7168), (64, 24576, 1536), (64, 32768, 512), (64, 7168, 16384))


def _operands(shapes: list[tuple[int, int, int]]) -> list[tuple[Any, ...]]:
    import cupy as cp

    import cupygemm

    rng = cp.random.default_rng(0)
    ops = []
    for m, n, k in shapes:
        a, sfa = cupygemm.per_token_cast_to_fp8(rng.standard_normal((m, k), dtype=cp.float32))
        b, sfb = cupygemm.per_block_cast_to_fp8(rng.standard_normal((n, k), dtype=cp.float32))
        ops.append((a, cupygemm.get_col_major_tma_aligned_tensor(sfa), b, sfb, cp.empty((m, n), cp.uint16)))
    return ops


def measure(shapes: list[tuple[int, int, int]], chains: int, rounds: int, pdl: bool) -> dict[str, Any]:
    """Per-chain times (eager, graph) with PDL on or off; the chain's outputs as host arrays."""
    import cupy as cp

    import cupygemm

    os.environ[PDL] = "1" if pdl else "0"  # read on every call (part of the plan's key)
    ops = _operands(shapes)
    stream = cp.cuda.Stream(non_blocking=True)

    def chain() -> None:
        for a, sfa, b, sfb, out in ops:
            cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out, stream=stream)

    for _ in range(3):
        chain()  # plans, kernels and scratch before timing and capture
    stream.synchronize()
    eager = statistics.median(stream_event_us(stream, lambda: [chain() for _ in range(chains)], chains)
                              for _ in range(rounds))
    graph = capture_graph(stream, chain, chains)
    graphed = statistics.median(stream_event_us(stream, lambda: graph.launch(stream), chains) for _ in range(rounds))
    outs = [cp.asnumpy(o[4]) for o in ops]
    plans_pdl = sorted({p.pdl for _, p in cupygemm.gemm._calls.values() if p is not None})
    return {"pdl": pdl, "eager_us": eager, "graph_us": graphed, "plans_pdl": plans_pdl, "_outs": outs}


def run(args: argparse.Namespace) -> int:
    import numpy as np

    require_hopper_or_exit("cupygemm chain")

    shapes = [tuple(s) for s in args.shapes] if args.shapes else list(DECODE_CHAIN)
    rows = [measure(shapes, args.chains, args.rounds, pdl) for pdl in (False, True)]
    same = all(np.array_equal(x, y) for x, y in zip(rows[0].pop("_outs"), rows[1].pop("_outs")))
    name = " -> ".join(f"{m}x{n}x{k}" for m, n, k in shapes)
    print(f"chain {name}, {args.chains} chains per timing, median of {args.rounds}")
    print("| PDL | eager us/chain | graph us/chain |\n|---|---|---|")
    for r in rows:
        print(f"| {'on' if r['pdl'] else 'off'} | {r['eager_us']:.1f} | {r['graph_us']:.1f} |")
    print(f"PDL on / off: eager {rows[1]['eager_us'] / rows[0]['eager_us']:.3f}, graph "
          f"{rows[1]['graph_us'] / rows[0]['graph_us']:.3f}; outputs bitwise equal: {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(["cupygemm chain"] + sys.argv[2:]), "chain": name, "chains": args.chains,
                       "rounds": args.rounds, "outputs_equal": same, "environment": environment(), "rows": rows},
                      f, indent=1)
    return 0 if same else 1


def add_parser(sub: Any) -> None:
    sp = sub.add_parser("chain", help="a decode sequence of GEMMs back to back, with and without programmatic "
                        "dependent launch, eager and in a CUDA graph", description=help_text(__doc__),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("shapes", nargs="*", type=shape_arg,
                    help="MxNxK in chain order (default: DeepSeek-V3 decode at M=64)")
    sp.add_argument("--chains", type=int, default=50, help="chains per timing (default 50)")
    sp.add_argument("--rounds", type=int, default=7, help="timings; the median is reported (default 7)")
    sp.add_argument("--json", metavar="FILE", help="write the rows and the environment as JSON")
    sp.set_defaults(func=run)
