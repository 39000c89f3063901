"""Side tickets before the PDL wait, against after it (benchmarks/NOTES.md, "PDL"), in one process on the same kernels:
a side-aware PDL kernel draws its ticket before ``griddepcontrol.wait`` when its tickets are one of its stream's two
sets (``cupygemm.workspace.side_tickets``, the default), and after it when they sit in the launch's scratch (what
``side_tickets`` returning None gives: the way every packed PDL launch drew before). Same kernel binary; only the
runtime flag and the counters' address differ.

* ``chains``: ``cupygemm chain``'s sequences on packed weights with PDL on, eager and CUDA graph (us per chain),
  the two modes alternated ``--passes`` times; each mode's outputs checked bit for bit against the plain PDL-off
  chain.
* ``lone``: the 12 M = 64/128 decode shapes on packed weights, lone calls after the bench's L2 flush and a small
  elementwise kernel (CUPTI kernel time, median of ``ITERS``): PDL off, PDL on with the ticket after the wait, PDL on
  with it before.

Usage (on an H100): python benchmarks/probes/side_ticket_ab.py OUT.json [--passes 2] [--chains 20] [--rounds 7]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import cupy as cp
import numpy as np

import cupygemm
from cupygemm import gemm as call_path
from cupygemm import plan
from cupygemm.bench import cases, chain, inputs, providers, run, timing

ITERS = 30
DECODE = [(m, n, k) for m in (64, 128) for n, k in chain.DECODE_NK + ((4096, 7168), (7168, 2048))]
MODES = ("after_wait", "before_wait")


@contextlib.contextmanager
def mode(name: str):
    """``after_wait``: packed PDL launches take their tickets from their scratch (drawn after the wait)."""
    real = call_path.side_tickets
    if name == "after_wait":
        call_path.side_tickets = lambda *args, **kw: None
    try:
        yield
    finally:
        call_path.side_tickets = real


def chain_rows(passes: int, chains: int, rounds: int) -> list[dict]:
    info = cupygemm.device.require_hopper()
    seqs = chain.decode_chains(None, None, True)
    chain.precompile(seqs, (False, True), cupygemm.get_num_sms(), info.max_smem_per_block)
    stream = cp.cuda.Stream(non_blocking=True)
    rows = []
    for seq in seqs:
        gemms = chain.build_operands(seq, ("plain", "packed"), stream)
        want = chain.reference_outputs(gemms, stream)
        for p in range(passes):
            for name in MODES:
                with mode(name):
                    row = chain.measure_case(seq, gemms, "packed", True, chains, rounds, stream, want, None)
                row = {"chain": seq.name, "mode": name, "pass": p, "side_aware": row["side_aware"],
                       "eager_us": row["eager_us"], "graph_us": row["graph_us"],
                       "bitwise_equal": not row["eager_differs"] and not row["graph_differs"]}
                print(json.dumps(row), flush=True)
                rows.append(row)
        del gemms, want
        cp.get_default_memory_pool().free_all_blocks()
    os.environ["CUPYGEMM_PDL"] = "1"
    return rows


def lone_rows(timer: timing.Timer) -> list[dict]:
    info = cupygemm.device.require_hopper()
    shapes = [cases.Shape("normal", d) for d in DECODE]
    cfgs = [cases.shape_config(s, cases.make_sizes(s, 0), cupygemm.get_num_sms(), info.max_smem_per_block, True)
            for s in shapes]
    for env in ("0", "1"):
        os.environ["CUPYGEMM_PDL"] = env  # the PDL variant is another source; the workers inherit the environment
        run.compile_configs(cfgs, os.cpu_count() or 1)
    tiny = cp.zeros(4096, cp.float32)
    rows = []
    for shape in shapes:
        inp = inputs.make_inputs(shape, cases.make_sizes(shape, 0), 0)
        packed = cupygemm.pack_weights(inp.b, inp.sfb)
        row = {"dims": list(shape.dims)}
        for name, env in (("pdl_off", "0"), ("after_wait", "1"), ("before_wait", "1"), ("after_wait_again", "1")):
            os.environ["CUPYGEMM_PDL"] = env
            plan._plan.cache_clear()
            call_path._calls.clear()
            with mode(name.removesuffix("_again")):
                prep = providers.prepare_cupygemm(inp, packed)
                call = lambda _c=prep.call: (cp.add(tiny, 1.0, out=tiny), _c())  # noqa: E731
                call()
                row[name] = float(np.median(timer.time(call, ITERS)))
        print(json.dumps(row), flush=True)
        rows.append(row)
    os.environ["CUPYGEMM_PDL"] = "1"
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--chains", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    kernel_timer, method = timing.open_cupti_timer()
    timer = timing.Timer(timing.FLUSH_BYTES, kernel_timer)
    result = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "timing": method,
              "command": "python benchmarks/probes/side_ticket_ab.py " + " ".join(sys.argv[1:]),
              "chains": chain_rows(args.passes, args.chains, args.rounds), "lone": lone_rows(timer)}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
