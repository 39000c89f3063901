"""Config sweep: time every legal tile config on the seed shapes (and cuBLAS block-scaled as a yardstick).

Writes JSON rows {kind, shape, config, us}; used to calibrate the cost model in cupygemm/config/cost.py.
Run on a Hopper machine: python scripts/tune.py OUT.json [normal|grouped|all|small|large]
"""
from __future__ import annotations

import json
import os
import sys
import time

import cupy as cp
import numpy as np

import cupygemm
from cupygemm import config as C
from cupygemm.bench.inputs import randn_bf16
from cupygemm.bench.run import compile_configs
from cupygemm.bench.timing import Timer
from cupygemm.shapes import CONTIGUOUS, K_TAIL_SHAPE, MASKED
from cupygemm.shapes import NORMAL as SEED_NORMAL

NORMAL = (*SEED_NORMAL, K_TAIL_SHAPE)

_TIMER = None


def timed(fn, iters=15):
    """Median event-timed microseconds after an untimed 512 MiB L2 flush per call (the bench's timer)."""
    global _TIMER
    if _TIMER is None:
        _TIMER = Timer(512 << 20)
    return _TIMER.median_us(fn, iters)


def variants(kind, m_rows, n, k):
    out = []
    for bm, bn, serial in C.candidate_tiles(kind, 4096):
        # 256-row tiles that fit both ways are measured both ways.
        for ser in ((False, True) if bm == 256 and not serial else (serial,)):
            for mc in C.multicast_options(kind, m_rows, n, bm, bn):
                for split in ((False, True) if bm == 64 else (False,)):
                    try:
                        out.append(C.make_config(kind, n, k, bm, bn, 132, multicast=mc, interleave_k=split, serial_m=ser))
                    except ValueError:
                        pass
    return out


def cublas_time(a, sfa, b, sfb, m):
    try:
        import torch
    except ImportError:
        return None
    ta = torch.from_dlpack(a).view(torch.float8_e4m3fn)
    tb = torch.from_dlpack(b).view(torch.float8_e4m3fn)
    sa = torch.from_dlpack(cupygemm.get_col_major_tma_aligned_tensor(sfa))
    sb = torch.from_dlpack(sfb).t()
    fn = lambda: torch._scaled_mm(ta, tb.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)  # noqa: E731
    try:
        return timed(fn)
    except Exception as e:  # report, keep sweeping
        print("cublas failed:", e)
        return None


def host_overhead_us(calls=2000):
    """Wall time per call of a tiny GEMM issued back to back: the host cost of one API call."""
    rng = cp.random.default_rng(1)
    a, sfa = cupygemm.per_token_cast_to_fp8(randn_bf16((64, 256), rng))
    b, sfb = cupygemm.per_block_cast_to_fp8(randn_bf16((256, 256), rng))
    sfa = cupygemm.get_col_major_tma_aligned_tensor(sfa)
    out = cp.empty((64, 256), dtype=cupygemm.tensors.BF16)
    for _ in range(10):
        cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
    host = (time.perf_counter() - t) / calls * 1e6
    cp.cuda.Device().synchronize()
    return host


def main():
    print(f"host overhead per GEMM call: {host_overhead_us():.1f} us", flush=True)
    path = sys.argv[1]
    which = sys.argv[2] if len(sys.argv) > 2 else "all"
    rows = []
    rng = cp.random.default_rng(0)
    jobs = []
    if which in ("normal", "all"):
        jobs += [("normal", s) for s in NORMAL]
    if which == "large":  # the shapes where 256-row tiles compete
        jobs += [("normal", s) for s in NORMAL if s[0] >= 4096] + [("masked", s) for s in MASKED]
        jobs += [("contiguous", s) for s in CONTIGUOUS]
    if which == "small":  # the shapes where 64-row tiles compete
        jobs += [("normal", s) for s in NORMAL if s[0] <= 128] + [("masked", s) for s in MASKED]
    if which in ("grouped", "all"):
        jobs += [("contiguous", s) for s in CONTIGUOUS] + [("masked", s) for s in MASKED]
    # Compile everything first, in parallel.
    all_cfgs = []
    for kind, s in jobs:
        kid = {"normal": 0, "contiguous": 1, "masked": 2}[kind]
        m_rows = s[0] if kind == "normal" else (s[0] * s[1] if kind == "contiguous" else s[1])
        all_cfgs += variants(kid, m_rows, s[-2], s[-1])
    secs = compile_configs(all_cfgs, os.cpu_count() or 1, progress=False)
    print(f"compiled {len(set(all_cfgs))} kernels in {secs:.0f}s", flush=True)
    for kind, s in jobs:
        kid = {"normal": 0, "contiguous": 1, "masked": 2}[kind]
        n, k = s[-2], s[-1]
        if kind == "normal":
            m = s[0]
            a, sfa = cupygemm.per_token_cast_to_fp8(randn_bf16((m, k), rng))
            b, sfb = cupygemm.per_block_cast_to_fp8(randn_bf16((n, k), rng))
            sfa = cupygemm.get_col_major_tma_aligned_tensor(sfa)
            out = cp.empty((m, n), dtype=cupygemm.tensors.BF16)
            call = lambda: cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)  # noqa: E731
            rows.append({"kind": kind, "shape": s, "config": "cublas_block", "us": cublas_time(a, sfa, b, sfb, m)})
            m_hint = m
        else:
            g, mper = s[0], s[1]
            b = cp.empty((g, n, k), cp.uint8)
            sfb = cp.empty((g, -(-n // 128), k // 128), cp.float32)
            for i in range(g):
                b[i], sfb[i] = cupygemm.per_block_cast_to_fp8(randn_bf16((n, k), rng))
            if kind == "contiguous":
                sizes = [int(mper * u) for u in np.random.default_rng(0).uniform(0.7, 1.3, g)]
                idx = np.concatenate([np.r_[[i] * sz, [-1] * (-(-sz // 128) * 128 - sz)] for i, sz in enumerate(sizes)])
                m = len(idx)
                a, sfa = cupygemm.per_token_cast_to_fp8(randn_bf16((m, k), rng))
                sfa = cupygemm.get_col_major_tma_aligned_tensor(sfa)
                idx = cp.asarray(idx.astype(np.int32))
                out = cp.empty((m, n), dtype=cupygemm.tensors.BF16)
                call = lambda: cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(  # noqa: E731
                    (a, sfa), (b, sfb), out, idx)
                m_hint = m
            else:
                max_m = 4096
                mm = np.random.default_rng(0).uniform(0.7, 1.3, g) * mper
                mmd = cp.asarray(mm.astype(np.int32))
                a = cp.empty((g, max_m, k), cp.uint8)
                sfa = cp.empty((g, max_m, k // 128), cp.float32)
                for i in range(g):
                    a[i], sfa[i] = cupygemm.per_token_cast_to_fp8(randn_bf16((max_m, k), rng))
                sfa = cupygemm.get_col_major_tma_aligned_tensor(sfa)
                out = cp.empty((g, max_m, n), dtype=cupygemm.tensors.BF16)
                call = lambda: cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked(  # noqa: E731
                    (a, sfa), (b, sfb), out, mmd, mper)
                m_hint = mper
        default = C.choose_config(kid, m_hint, n, k, s[0] if kind != "normal" else 1, 132)
        dflt = timed(call)
        rows.append({"kind": kind, "shape": s, "config": "default " + default.describe(), "us": dflt})
        best = None
        for cfg in variants(kid, m_hint if kind != "contiguous" else m_hint, n, k):
            C.override_config(kid, n, k, block_m=cfg.block_m, block_n=cfg.block_n,
                              multicast=cfg.multicast, interleave_k=cfg.interleave_k, serial_m=cfg.serial_m)
            try:
                us = timed(call, iters=7)
            except Exception as e:
                print("fail", cfg.describe(), e)
                continue
            finally:
                C.override_config(kid, n, k)
            rows.append({"kind": kind, "shape": s, "bm": cfg.block_m, "bn": cfg.block_n,
                         "mc": cfg.multicast, "split": cfg.interleave_k, "serial": cfg.serial_m, "stages": cfg.num_stages,
                         "us": us})
            if best is None or us < best[0]:
                best = (us, cfg.describe())
        cub = next((r["us"] for r in rows if r["shape"] == s and r.get("config") == "cublas_block"), None)
        print(f"{kind} {s}: default {dflt:.1f}us best {best} cublas {cub}", flush=True)
        with open(path, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
