"""Quick GPU smoke run: correctness of the three entry points on a handful of shapes, plus rough timings.

Run on a Hopper machine: python scripts/smoke.py
"""
from __future__ import annotations

import sys
import time

import cupy as cp
import ml_dtypes
import numpy as np

import cupygemm
from cupygemm import reference as ref

rng = np.random.default_rng(0)


def quant_pair(m, n, k):
    x = rng.standard_normal((m, k), dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    y = rng.standard_normal((n, k), dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    aq, sa = ref.per_token_cast_to_fp8_reference(x)
    bq, sb = ref.per_block_cast_to_fp8_reference(y)
    return x, y, aq, sa, bq, sb


def check_normal(m, n, k, rows=None):
    x, y, aq, sa, bq, sb = quant_pair(m, n, k)
    a, b = cp.asarray(aq), cp.asarray(bq)
    sfa, sfb = cp.asarray(sa), cp.asarray(sb)
    out = cp.full((m, n), 0xFFFF, dtype=cp.uint16).view(ml_dtypes.bfloat16)  # NaN poison
    cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
    got = out.get().astype(np.float64)
    sel = np.arange(m) if rows is None or m <= rows else np.sort(rng.choice(m, rows, replace=False))
    want = ref.gemm_reference(aq[sel], sa[sel], bq, sb)
    err = np.linalg.norm(got[sel] - want) / max(np.linalg.norm(want), 1e-30)
    diff = ref.calc_diff(got[sel], x[sel].astype(np.float64) @ y.T.astype(np.float64))
    out2 = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    same = bool((out2.view(cp.uint16) == out.view(cp.uint16)).all())
    ok = np.isfinite(got).all() and err < 1e-2 and diff < 1e-3 and same
    print(f"normal {m}x{n}x{k}: rel_err={err:.2e} calc_diff={diff:.2e} finite={np.isfinite(got).all()} "
          f"repeat_same={same} {'OK' if ok else 'FAIL'}")
    return ok, (a, sfa, b, sfb, out)


def time_call(fn, iters=20):
    flush = cp.empty(256 * 1024 * 1024, dtype=cp.uint8)
    fn()
    times = []
    for _ in range(iters):
        flush.fill(1)
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e) * 1e3)
    return float(np.median(times))


def main() -> int:
    print(cupygemm.__version__, cp.cuda.runtime.getDeviceProperties(0)["name"])
    all_ok = True
    for m, n, k in [(128, 128, 128), (64, 2112, 7168), (1, 8, 128), (7, 24, 576), (65, 136, 128),
                    (129, 2056, 7168), (1000, 4096, 576), (4096, 7168, 2048)]:
        t = time.time()
        try:
            ok, _ = check_normal(m, n, k, rows=256)
        except Exception as e:  # keep going: report every shape
            print(f"normal {m}x{n}x{k}: EXC {type(e).__name__}: {e}")
            ok = False
        all_ok &= ok
        print(f"   ({time.time() - t:.1f}s)")
    for m, n, k in [(64, 2112, 7168), (128, 7168, 2048), (4096, 7168, 16384), (4096, 4096, 7168)]:
        try:
            _, (a, sfa, b, sfb, out) = check_normal(m, n, k, rows=64)
            us = time_call(lambda: cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out))
            print(f"time {m}x{n}x{k}: {us:.1f} us, {2 * m * n * k / us / 1e6:.0f} TFLOPS")
        except Exception as e:
            print(f"time {m}x{n}x{k}: EXC {type(e).__name__}: {e}")
            all_ok = False
    print("SMOKE", "PASS" if all_ok else "FAIL")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
