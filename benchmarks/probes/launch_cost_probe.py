"""Host cost of one bound GEMM launch (benchmarks/NOTES.md, "JAX and XLA command buffers"): the XLA FFI handler's
launch (``GemmPlan.bind``) with and without programmatic dependent launch (``cuLaunchKernelEx`` with the PDL
attribute, against CuPy's ``cuLaunchKernel``), first in a process where only CuPy has touched the GPU, then once
JAX has started its GPU backend (its threads share the driver). 64x2112x7168, the jax-scan case.

Each number: host ns per call, median over batches of ``BATCH`` launches (the stream synchronized between batches,
so that the launch queue never fills).

Usage (on the GPU machine): python benchmarks/probes/launch_cost_probe.py OUT.json
"""
from __future__ import annotations

import json
import os
import sys
import time

import cupy as cp
import numpy as np

import cupygemm
from cupygemm import plan
from cupygemm.bench import cases, inputs

BATCH, BATCHES = 50, 60
DIMS = (64, 2112, 7168)


def bound_launches() -> dict[str, object]:
    """The bound launch of the case's plan, PDL off and on (each a function of the stream)."""
    shape = cases.Shape("normal", DIMS)
    inp = inputs.make_inputs(shape, cases.make_sizes(shape, 0), 0)
    fires = {}
    for env in ("0", "1"):
        os.environ["CUPYGEMM_PDL"] = env
        plan._plan.cache_clear()
        cupygemm.gemm._calls.clear()
        d = cupygemm.gemm_fp8_fp8_bf16_nt((inp.a, inp.sfa), (inp.b, inp.sfb))
        (_, p), = cupygemm.gemm._calls.values()
        assert p.pdl == (env == "1"), (env, p.pdl)
        assert not p.scratch_floats, "the case must launch without scratch"
        # the scales as the kernel reads them (M-major, TMA-aligned): the launches run
        fires["pdl" if p.pdl else "plain"] = p.bind(inp.a.data.ptr, inp.sfa_mn.data.ptr, inp.b.data.ptr,
                                                    inp.sfb.data.ptr, d.data.ptr)
        fires["_keep_" + env] = (inp, d)
    return fires


def host_ns(fire, stream: cp.cuda.Stream) -> float:
    per_call = []
    for _ in range(BATCHES):
        stream.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(BATCH):
            fire(stream.ptr)
        per_call.append((time.perf_counter_ns() - t0) / BATCH)
    stream.synchronize()
    return float(np.median(per_call[5:]))


def measure(fires: dict, stream: cp.cuda.Stream) -> dict[str, float]:
    out: dict[str, list[float]] = {"plain": [], "pdl": []}
    for _ in range(3):  # alternated, so that drift shows as such
        for name in ("plain", "pdl"):
            out[name].append(host_ns(fires[name], stream))
    return {k: v for k, v in out.items()}


def main(path: str) -> None:
    stream = cp.cuda.Stream(non_blocking=True)
    fires = bound_launches()
    result = {"dims": list(DIMS), "batch": BATCH, "batches": BATCHES,
              "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
              "command": "python benchmarks/probes/launch_cost_probe.py OUT.json",
              "cupy_only_ns": measure(fires, stream)}
    print("CuPy only:", result["cupy_only_ns"], flush=True)
    try:
        import jax
        import jax.numpy as jnp

        jax.block_until_ready(jnp.ones(1024) * 2)  # the GPU backend and its threads up
        result["jax"] = jax.__version__
        result["after_jax_ns"] = measure(fires, stream)
        print("after JAX started:", result["after_jax_ns"], flush=True)
    except ImportError:
        result["after_jax_ns"] = None
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
