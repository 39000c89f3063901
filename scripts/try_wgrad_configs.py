"""Time config variants of the weight-gradient kernels (wgrad, k-grouped wgrad) on chosen shapes, in one process.

For predict-change-measure experiments on the 1D1D kernel: each spec entry is a shape and a list of variants, each a
dict of :class:`cupygemm.contract_wgrad.WgradConfig` fields applied to the chooser's pick ({} = the pick itself).
Every variant is timed with the bench's timer (CUPTI kernel time per call, summed over the call's kernels, after an
L2 flush; median of ``--iters``) and its result compared bit for bit with the pick's (the promotion order is the
same whatever the tile, so the bits must be too).

Usage (on a Hopper machine): python scripts/try_wgrad_configs.py SPEC.json OUT.json [--iters N] [--max-block-n N]
SPEC.json: [{"dims": [M, N, K], "variants": [{}, {"pingpong": true}, ...]},
            {"dims": [G, M, N, K], "variants": [...]}]   (k-grouped: K tokens per group, every group the same)
OUT.json: {"device", "timing", "command", "rows": [{dims, variant, config, us, same_bits, error}]}
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import cupy as cp
import numpy as np

from cupygemm import contract_wgrad as cw
from cupygemm.bench import timing
from cupygemm.device import get_num_sms
from cupygemm.kinds.training import K_GROUPED_WGRAD, WGRAD
from cupygemm.plan_wgrad import plan_config


def _fp8_bits(shape: tuple[int, ...], rng: np.random.Generator) -> cp.ndarray:
    """Random finite e4m3 bits (sign, exponent 1..14, any mantissa): values of magnitude about 2^-6 .. 2^7."""
    bits = rng.integers(0, 256, size=shape, dtype=np.uint8)
    exp = (bits >> 3) & 0xF
    bits = np.where((exp == 0) | (exp == 15), bits ^ 0x40, bits)
    return cp.asarray(bits.astype(np.uint8))


def _case(dims: list[int], rng: np.random.Generator):
    """(kind, cfg of the pick, plan args, pointers, out) of one shape."""
    num_sms = get_num_sms()
    if len(dims) == 3:
        m, n, k = dims
        kb = -(-k // 128)
        a, b = _fp8_bits((m, k), rng), _fp8_bits((n, k), rng)
        sfa = cp.asarray(rng.uniform(0.5, 2, (kb, m)).astype(np.float32))
        sfb = cp.asarray(rng.uniform(0.5, 2, (kb, n)).astype(np.float32))
        out = cp.zeros((m, n), cp.float32)
        pick = cw.choose_wgrad_config(cw.KIND_WGRAD, m, n, k, 1, num_sms)
        args = dict(kind=WGRAD, m=m, n=n, k=k, num_groups=1, ld_a=k, ld_b=k, d_strides=out.strides, sfa_m_pad=m,
                    sfb_m_pad=n, scale_rows=kb)
        ptrs = (a.data.ptr, sfa.data.ptr, b.data.ptr, sfb.data.ptr, out.data.ptr, 0, 0)
        keep = (a, b, sfa, sfb)
    else:
        g, m, n, k = dims
        kb = -(-k // 128)
        a, b = _fp8_bits((g * m * k,), rng), _fp8_bits((g * n * k,), rng)
        sfa = cp.asarray(rng.uniform(0.5, 2, (g * kb, m)).astype(np.float32))
        sfb = cp.asarray(rng.uniform(0.5, 2, (g * kb, n)).astype(np.float32))
        sizes = cp.full(g, k, cp.int32)
        out = cp.zeros((g, m, n), cp.float32)
        ws = cp.empty(cw.workspace_bytes(g), cp.uint8)
        pick = cw.choose_wgrad_config(cw.KIND_K_GROUPED, m, n, k, g, num_sms)
        args = dict(kind=K_GROUPED_WGRAD, m=m, n=n, k=g * k, num_groups=g, ld_a=0, ld_b=0, d_strides=out.strides,
                    sfa_m_pad=m, sfb_m_pad=n, scale_rows=g * kb)
        ptrs = (a.data.ptr, sfa.data.ptr, b.data.ptr, sfb.data.ptr, out.data.ptr, sizes.data.ptr, ws.data.ptr)
        keep = (a, b, sfa, sfb, sizes, ws)
    return pick, args, ptrs, out, keep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("spec")
    ap.add_argument("out")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--max-block-n", type=int, default=0,
                    help="raise the two-warpgroup width limit (contract_wgrad.MAX_BLOCK_N) for wider variants")
    args = ap.parse_args()
    if args.max_block_n:
        cw.MAX_BLOCK_N[(2, False)] = args.max_block_n
    spec = json.load(open(args.spec))
    rng = np.random.default_rng(0)
    dev = cp.cuda.runtime.getDevice()
    kernel_timer, why = timing.open_cupti_timer()
    timer = timing.Timer(timing.FLUSH_BYTES, kernel_timer)
    print("timing:", "cupti" if kernel_timer else f"events ({why})", flush=True)
    rows = []
    for entry in spec:
        pick, pargs, ptrs, out, keep = _case(entry["dims"], rng)
        stream = cp.cuda.get_current_stream().ptr
        base_bits = None
        for variant in entry["variants"]:
            row = {"dims": entry["dims"], "variant": variant}
            try:
                cfg = dataclasses.replace(pick, **variant)
                if "block_n" in variant or "block_m" in variant or "staged_slabs" in variant:
                    # stages as many as fit for the new tile, unless given
                    if "num_stages" not in variant:
                        slabs = cfg.staged
                        cfg = dataclasses.replace(cfg, num_stages=min(8, cw.max_stages(cfg.block_m, cfg.block_n,
                                                                                         cfg.swizzle, slabs)))
                row["config"] = cfg.describe()
                plan = plan_config(pargs["kind"], cfg, pargs["m"], pargs["n"], pargs["k"], pargs["num_groups"], dev,
                                   pargs["ld_a"], pargs["ld_b"], tuple(pargs["d_strides"]), pargs["sfa_m_pad"],
                                   pargs["sfb_m_pad"], pargs["scale_rows"])

                def call(plan=plan):
                    plan.launch(stream, *ptrs)

                out[...] = 0
                call()
                cp.cuda.get_current_stream().synchronize()
                bits = out.view(cp.uint32).copy()
                if base_bits is None:
                    base_bits = bits
                row["same_bits"] = bool((bits == base_bits).all())
                times = timer.time(call, args.iters)
                row["us"] = float(np.median(times))
            except Exception as e:  # noqa: BLE001 - a variant that fails is a row, not the end of the run
                row["error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
            print(json.dumps(row), flush=True)
        del keep
    props = cp.cuda.runtime.getDeviceProperties(dev)
    json.dump({"device": props["name"].decode(), "timing": "cupti" if kernel_timer else "events",
               "command": " ".join(sys.argv), "rows": rows}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
