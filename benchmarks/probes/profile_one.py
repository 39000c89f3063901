"""One GEMM, a few calls after the bench's L2 flush, for a profiler (ncu) to measure.

    python benchmarks/probes/profile_one.py M N K [field=value ...] [packed=1]

Fields override the config (block_m=256 block_n=128 multicast=1 serial_m=1 ...); packed=1 runs on weights packed by
cupygemm.pack_weights (the side-aware kernel). Each call follows a 1 GiB memset, as in the bench. Example:
  ncu --clock-control none -k regex:cupygemm_fp8_gemm -s 2 -c 1 python benchmarks/probes/profile_one.py 4096 7168 16384
"""
from __future__ import annotations

import sys

import cupy as cp

import cupygemm
from cupygemm import config as C
from cupygemm.bench.inputs import make_normal


def main() -> None:
    m, n, k = (int(x) for x in sys.argv[1:4])
    fields = {kv.split("=")[0]: int(kv.split("=")[1]) for kv in sys.argv[4:]}
    packed = bool(fields.pop("packed", 0))
    if fields:
        C.override_config("normal", n, k, **fields)
    a, sfa, b, sfb = make_normal(m, n, k)
    sfa = cupygemm.get_col_major_tma_aligned_tensor(sfa)
    rhs = cupygemm.pack_weights(b, sfb) if packed else (b, sfb)
    out = cp.empty((m, n), dtype=cupygemm.tensors.BF16)
    flush = cp.empty(1 << 30, dtype=cp.uint8)
    cfg = C.choose_config(C.KIND_NORMAL, m, n, k, 1, cupygemm.get_num_sms())
    print((C.side_aware_config(cfg, cupygemm.get_num_sms()) if packed else cfg).describe(), flush=True)
    for _ in range(4):
        flush.fill(1)
        cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), rhs, out)
    cp.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
