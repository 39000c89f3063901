"""Where a GEMM call's host time goes: cProfile of back-to-back calls with CuPy and torch operands (GPU).

Usage: python scripts/call_profile.py [MxNxK] [calls]
"""
import cProfile
import pstats
import sys

import cupy as cp

import cupygemm

m, n, k = (int(t) for t in (sys.argv[1] if len(sys.argv) > 1 else "64x2112x7168").split("x"))
calls = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
a, sfa = cupygemm.per_token_cast_to_fp8(cp.random.standard_normal((m, k), dtype=cp.float32))
b, sfb = cupygemm.per_block_cast_to_fp8(cp.random.standard_normal((n, k), dtype=cp.float32))
sfa = cupygemm.get_col_major_tma_aligned_tensor(sfa)
out = cp.empty((m, n), cupygemm.tensors.BF16)
cases = {"cupy": ((a, sfa), (b, sfb), out)}
try:
    import torch

    t8 = lambda x: torch.from_dlpack(x).view(torch.float8_e4m3fn)  # noqa: E731
    cases["torch"] = ((t8(a), torch.from_dlpack(sfa)), (t8(b), torch.from_dlpack(sfb)),
                      torch.empty((m, n), dtype=torch.bfloat16, device="cuda"))
except ImportError:
    pass
for name, args in cases.items():
    for _ in range(50):
        cupygemm.gemm_fp8_fp8_bf16_nt(*args)
    cp.cuda.Device().synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        cupygemm.gemm_fp8_fp8_bf16_nt(*args)
    prof.disable()
    cp.cuda.Device().synchronize()
    print(f"==== {name} operands, {m}x{n}x{k}, {calls} calls")
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)
