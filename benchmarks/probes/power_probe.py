"""SM clock and board power while one GEMM runs over and over: is a large shape bound by the power limit?

For each shape and kernel (cupygemm's pick, named config variants, and, when torch is installed, cuBLASLt
block-scaled and per-tensor-scaled FP8 through torch._scaled_mm), the call repeats for --secs seconds, either back
to back or, as ``cupygemm bench`` times, after a 1 GiB memset each (the L2 flush); nvidia-smi samples the SM clock
and power draw every 20 ms meanwhile. Per-call time is the mean from CUDA events around the whole run (back to
back) or the median of events around each call (flushed). Pipe utilization at the clock = TFLOPS / (8192 FLOP per
cycle per SM x 132 SMs x clock).

Usage (on a Hopper machine): python benchmarks/probes/power_probe.py OUT.json [--secs S]
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time

import cupy as cp
import numpy as np

from cupygemm import config as C
from cupygemm.bench import cases, inputs, providers, timing

SHAPES = [cases.Shape("normal", (4096, 7168, 16384)), cases.Shape("normal", (4096, 4096, 7168))]
VARIANTS = [("cupygemm", {}),
            ("cupygemm 256x128 serial, wgmma n64",
             {"block_m": 256, "block_n": 128, "wgmma_n": 64, "serial_m": True, "multicast": 1})]
FLOP_PER_CYCLE_PER_SM = 8192  # FP8 dense wgmma: 256x128x128 MACs per 1024 cycles (microbench/wgmma_chain)


def run_for(call, secs: float, flush_buf) -> float:
    """Repeat ``call`` for ``secs`` seconds; microseconds per call."""
    call()
    cp.cuda.runtime.deviceSynchronize()
    if flush_buf is None:
        start, end = cp.cuda.Event(), cp.cuda.Event()
        n, t0 = 0, time.time()
        start.record()
        while time.time() - t0 < secs:
            for _ in range(10):
                call()
            n += 10
            cp.cuda.runtime.deviceSynchronize()
        end.record()
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) * 1e3 / n
    times, t0 = [], time.time()
    while time.time() - t0 < secs:
        pairs = []
        for _ in range(10):
            flush_buf.data.memset_async(0, flush_buf.nbytes)
            s, e = cp.cuda.Event(), cp.cuda.Event()
            s.record()
            call()
            e.record()
            pairs.append((s, e))
        pairs[-1][1].synchronize()
        times += [cp.cuda.get_elapsed_time(s, e) * 1e3 for s, e in pairs]
    return float(np.median(times))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--secs", type=float, default=1.5)
    args = p.parse_args()
    try:
        import torch
    except ImportError:  # cupygemm's kernels only
        torch = None
    # Samples go to a file (an unread pipe fills and stalls nvidia-smi). Event reasons: a bit mask (0x4 software
    # power cap, 0x8 hardware slowdown, 0x20/0x40 thermal, 0x80 power brake).
    log = tempfile.TemporaryFile("w+")
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,enforced.power.limit,"
                            "clocks_event_reasons.active", "--format=csv,noheader,nounits", "-lms", "20"], stdout=log)
    flush_buf = cp.empty(timing.FLUSH_BYTES, dtype=cp.uint8)
    marks = []

    def measure(mode, shape, name, call):
        t0 = time.time()
        us = run_for(call, args.secs, flush_buf if mode == "flushed" else None)
        marks.append((mode, shape, name, t0 + 0.3, time.time(), us))  # skip the first 0.3 s (warm-up)
        print(f"{mode} {shape.label} {name}: {us:.1f} us", flush=True)
        time.sleep(0.5)

    for shape in SHAPES:
        sizes = cases.shape_sizes([shape], 0, None)[shape]
        inp = inputs.make_inputs(shape, sizes, 0)
        prep = providers.prepare_cupygemm(inp)
        calls = [(name, fields, prep.call) for name, fields in VARIANTS]  # (name, config override, call)
        if torch is not None:
            calls.append(("cublas_block", None, providers.CublasBlockPeer(torch).prepare(inp).call))
            a = providers.torch_fp8(torch, inp.a)
            bt = providers.torch_fp8(torch, inp.b).t()
            one = torch.ones((), device="cuda")
            calls.append(("cublas_tensor (per-tensor scales, no promotion)", None,
                          lambda: torch._scaled_mm(a, bt, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)))
        for _, fields, call in calls:  # compile before anything is timed
            C.override_config(shape.kind, shape.n, shape.k, **(fields or {}))
            call()
            C.override_config(shape.kind, shape.n, shape.k)
        cp.cuda.runtime.deviceSynchronize()
        for mode in ("back-to-back", "flushed"):
            for name, fields, call in calls:
                if fields:
                    C.override_config(shape.kind, shape.n, shape.k, **fields)
                try:
                    measure(mode, shape, name, call)
                finally:
                    C.override_config(shape.kind, shape.n, shape.k)
        del inp, prep, calls
        cp.get_default_memory_pool().free_all_blocks()
    time.sleep(0.2)
    smi.terminate()
    smi.wait()
    log.seek(0)
    samples = []
    for line in log.read().strip().splitlines():
        f = [x.strip() for x in line.split(",")]
        try:
            ts = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((ts, float(f[1]), float(f[2]), float(f[3]), f[4]))
        except (ValueError, IndexError):
            continue
    rows = []
    for mode, shape, name, a0, a1, us in marks:
        sel = [s for s in samples if a0 <= s[0] <= a1]
        m, n, k = shape.dims
        tflops = 2 * m * n * k / us / 1e6
        row = {"mode": mode, "shape": shape.label, "kernel": name, "us": us, "tflops": tflops, "samples": len(sel)}
        if sel:
            mhz = float(np.median([s[1] for s in sel]))
            row.update(sm_mhz=mhz, power_w=float(np.median([s[2] for s in sel])), power_limit_w=sel[0][3],
                       pipe_util_at_clock=tflops * 1e12 / (FLOP_PER_CYCLE_PER_SM * 132 * mhz * 1e6),
                       clock_event_reasons=max(set(s[4] for s in sel), key=[s[4] for s in sel].count))
        rows.append(row)
        print(json.dumps(row))
    with open(args.out, "w") as f:
        json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "command": " ".join(sys.argv),
                   "method": __doc__.split("\n\n")[1].replace("\n", " "), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
