"""Where a lone PDL call's cost comes from (benchmarks/NOTES.md, "PDL"): the 12 decode shapes, lone calls after an
L2 flush (CUPTI kernel time, median of ``ITERS``), with the default kernel, the PDL kernel launched with PDL, and the
PDL kernel launched without the launch attribute (its waits are then no-ops); then the default and the PDL launch
after a small elementwise kernel (the flush is a memset), whose time both rows include.

Usage (on an H100): python benchmarks/probes/pdl_lone_probe.py OUT.json
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

ITERS = 30
DECODE = [(m, n, k) for m in (64, 128) for n, k in ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384),
                                                    (4096, 7168), (7168, 2048))]


def _fresh() -> None:
    plan._plan.cache_clear()
    cupygemm.gemm._calls.clear()


def _time(timer: timing.Timer, call) -> float:
    call()
    return float(np.median(timer.time(call, ITERS)))


def pdl_rows(timer: timing.Timer) -> list[dict]:
    info = cupygemm.device.require_hopper()
    cfgs = [cases.shape_config(cases.Shape("normal", d), cases.make_sizes(cases.Shape("normal", d), 0),
                               cupygemm.get_num_sms(), info.max_smem_per_block) for d in DECODE]
    for env in ("0", "1"):
        os.environ["CUPYGEMM_PDL"] = env  # the PDL variant is another source; the workers inherit the environment
        run.compile_configs(cfgs, os.cpu_count() or 1)
    rows = []
    tiny = cp.zeros(4096, cp.float32)
    for dims in DECODE:
        shape = cases.Shape("normal", dims)
        inp = inputs.make_inputs(shape, cases.make_sizes(shape, 0), 0)
        row = {"dims": list(dims)}
        for name, env, attr, after in (("default", "0", None, False), ("pdl", "1", None, False),
                                       ("pdl_kernel_plain_launch", "1", False, False),
                                       ("after_kernel_default", "0", None, True), ("after_kernel_pdl", "1", None, True)):
            os.environ["CUPYGEMM_PDL"] = env
            _fresh()
            prep = providers.prepare_cupygemm(inp)
            prep.call()
            if attr is not None:
                for _, p in cupygemm.gemm._calls.values():
                    object.__setattr__(p, "pdl", attr)
            call = prep.call
            if after:  # a small elementwise kernel between the flush and the GEMM, as in a model's layer
                call = lambda _c=prep.call: (cp.add(tiny, 1.0, out=tiny), _c())  # noqa: E731
            row[name] = _time(timer, call)
        os.environ["CUPYGEMM_PDL"] = "0"
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    out = sys.argv[1]
    kernel_timer, method = timing.open_cupti_timer()
    timer = timing.Timer(timing.FLUSH_BYTES, kernel_timer)
    result = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "timing": method,
              "iters": ITERS, "command": "python benchmarks/probes/pdl_lone_probe.py " + " ".join(sys.argv[1:]),
              "pdl": pdl_rows(timer)}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
