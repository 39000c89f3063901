"""Packed weights in the side-aware order and in the plain tile order, against plain weights, over M; and where a
lone PDL call's cost comes from (benchmarks/NOTES.md, "L2-side-aware weights" and "PDL").

Part 1 (``order``): per shape, lone calls after an L2 flush (CUPTI kernel time, median of ``ITERS``): plain B,
packed B side-aware (forced), packed B in the plain tile order (forced), and which one the library's rule
(:func:`cupygemm.config.side_order_pays`) picks. Part 2 (``pdl``): the 12 decode shapes with the default kernel, the
PDL kernel launched with PDL, and the PDL kernel launched without the attribute (its waits are then no-ops).

Usage (on an H100): python benchmarks/probes/packed_order.py OUT.json [order] [pdl]
"""
from __future__ import annotations

import json
import os
import sys

import cupy as cp
import numpy as np

import cupygemm
from cupygemm import plan
from cupygemm.bench import cases, inputs, providers, run, timing
from cupygemm.config import choice

ITERS = 30
DENSE_NK = ((2112, 7168), (24576, 1536), (7168, 16384), (7168, 2048))
DENSE_M = (64, 256, 512, 1024, 4096)
GROUPED = (("contiguous", (4, 8192, 4096, 7168)), ("contiguous", (8, 4096, 4096, 7168)),
           ("contiguous", (8, 4096, 7168, 2048)), ("masked", (8, 32, 4096, 7168)), ("masked", (8, 32, 7168, 2048)),
           ("masked", (4, 1024, 4096, 7168)))
DECODE = [(m, n, k) for m in (64, 128) for n, k in ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384),
                                                    (4096, 7168), (7168, 2048))]


def _fresh() -> None:
    plan._plan.cache_clear()
    cupygemm.gemm._calls.clear()


def _time(timer: timing.Timer, call) -> float:
    call()
    return float(np.median(timer.time(call, ITERS)))


def _precompile(shapes: list[cases.Shape]) -> None:
    """Every kernel of the three variants, in parallel worker processes (as cupygemm bench does)."""
    info = cupygemm.device.require_hopper()
    num_sms, smem = cupygemm.get_num_sms(), info.max_smem_per_block
    rule, cfgs = choice.side_order_pays, []
    for shape in shapes:
        sizes = cases.make_sizes(shape, 0)
        cfgs.append(cases.shape_config(shape, sizes, num_sms, smem))
        for forced in (True, False):
            choice.side_order_pays = lambda cfg, m, g, _f=forced: _f
            try:
                cfgs.append(cases.shape_config(shape, sizes, num_sms, smem, True))
            finally:
                choice.side_order_pays = rule
    run.compile_configs([c for c in cfgs if c is not None], os.cpu_count() or 1)


def order_rows(timer: timing.Timer) -> list[dict]:
    shapes = [cases.Shape("normal", (m, n, k)) for n, k in DENSE_NK for m in DENSE_M]
    shapes += [cases.Shape(kind, dims) for kind, dims in GROUPED]
    _precompile(shapes)
    rule = choice.side_order_pays
    rows = []
    for shape in shapes:
        inp = inputs.make_inputs(shape, cases.make_sizes(shape, 0), 0)
        packed = cupygemm.pack_weights(inp.b, inp.sfb)
        row = {"kind": shape.kind, "dims": list(shape.dims)}
        _fresh()
        row["plain"] = _time(timer, providers.prepare_cupygemm(inp).call)
        want = None
        for name, forced in (("packed_side", True), ("packed_plain_order", False)):
            choice.side_order_pays = lambda cfg, m, g, _f=forced: _f
            try:
                _fresh()
                prep = providers.prepare_cupygemm(inp, packed)
                row[name] = _time(timer, prep.call)
                out = cp.asnumpy(prep.output())
                want = out if want is None else want
                row.setdefault("same_output", True)
                row["same_output"] &= bool(np.array_equal(out, want))
            except Exception as e:  # a config the variant cannot build: recorded, not fatal
                row[name] = None
                row[name + "_error"] = str(e)[:200]
            finally:
                choice.side_order_pays = rule
        _fresh()
        prep = providers.prepare_cupygemm(inp, packed)
        prep.call()
        cfg = next(p for _, p in cupygemm.gemm._calls.values() if p is not None).cfg
        row["rule"] = "plain_order" if cfg.plain_order else "side"
        row["config"] = cfg.describe()
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def pdl_rows(timer: timing.Timer) -> list[dict]:
    info = cupygemm.device.require_hopper()
    cfgs = [cases.shape_config(cases.Shape("normal", d), cases.make_sizes(cases.Shape("normal", d), 0),
                               cupygemm.get_num_sms(), info.max_smem_per_block) for d in DECODE]
    for env in ("0", "1"):
        os.environ["CUPYGEMM_PDL"] = env  # the PDL variant is another source; the workers inherit the environment
        run.compile_configs(cfgs, os.cpu_count() or 1)
    rows = []
    for dims in DECODE:
        shape = cases.Shape("normal", dims)
        inp = inputs.make_inputs(shape, cases.make_sizes(shape, 0), 0)
        row = {"dims": list(dims)}
        for name, env, attr in (("default", "0", None), ("pdl", "1", None), ("pdl_kernel_plain_launch", "1", False)):
            os.environ["CUPYGEMM_PDL"] = env
            _fresh()
            prep = providers.prepare_cupygemm(inp)
            prep.call()
            if attr is not None:
                for _, p in cupygemm.gemm._calls.values():
                    object.__setattr__(p, "pdl", attr)
            row[name] = _time(timer, prep.call)
        os.environ["CUPYGEMM_PDL"] = "0"
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    out = sys.argv[1]
    parts = sys.argv[2:] or ["order", "pdl"]
    kernel_timer, method = timing.open_cupti_timer()
    timer = timing.Timer(timing.FLUSH_BYTES, kernel_timer)
    result = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "timing": method,
              "iters": ITERS, "command": "python benchmarks/probes/packed_order.py " + " ".join(sys.argv[1:])}
    if "order" in parts:
        result["order"] = order_rows(timer)
    if "pdl" in parts:
        result["pdl"] = pdl_rows(timer)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
