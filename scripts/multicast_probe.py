"""Why is multicast slower? Co-resident cluster count, and time vs forced grid size, on three shapes. Hopper GPU."""
import cupy as cp

import cupygemm
from cupygemm import config as C
from cupygemm.bench.inputs import make_normal
from cupygemm.bench.timing import Timer
from cupygemm.kernels import get_gemm_kernel, max_active_clusters

timer = Timer(512 << 20)
for m, n, k, bm, bn in [(4096, 7168, 4096, 128, 160), (64, 2112, 7168, 64, 16), (4096, 4096, 7168, 128, 128)]:
    a, sfa, b, sfb = make_normal(m, n, k)
    sfa = cupygemm.get_col_major_tma_aligned_tensor(sfa)
    out = cp.empty((m, n), dtype=cupygemm.tensors.BF16)
    call = lambda: cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)  # noqa: E731
    for mc in (0, 1, 2):
        if mc not in C.multicast_options(0, m, n, bm, bn):
            continue
        for grid in (132, 128, 120, 96, 66):
            C.override_config(0, n, k, block_m=bm, block_n=bn, multicast=mc, num_sms=grid)
            cfg = C.choose_config(0, m, n, k, 1, 132)
            kern = get_gemm_kernel(cfg, 0)
            kern.max_clusters = 66  # bypass the cap: launch the grid asked for
            us = timer.median_us(call, 10)
            print(f"{m}x{n}x{k} {bm}x{bn} mc{mc} grid {grid}: {us:.1f} us  occupancy-query clusters "
                  f"{max_active_clusters(kern, cfg)}", flush=True)
        C.override_config(0, n, k)
