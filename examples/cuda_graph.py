"""Masked grouped GEMM captured once in a CuPy CUDA graph and replayed with new masked_m each step. Hopper GPU."""
import cupygemm

cupygemm.device.require_hopper_or_exit()  # one clear line, not CuPy's driver error, where there is no Hopper GPU

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

from cupygemm.reference import calc_diff, grouped_masked_reference  # noqa: E402

g, max_m, n, k = 4, 256, 2048, 2048
# Everything runs on one non-blocking stream. Work queued on CuPy's default (legacy) stream is not ordered with a
# non-blocking stream: inputs made there could still be in flight when the stream reads them.
stream = cp.cuda.Stream(non_blocking=True)
with stream:
    a = cp.empty((g, max_m, k), cp.uint8)
    sfa = cp.empty((g, max_m, k // 128), cp.float32)
    b = cp.empty((g, n, k), cp.uint8)
    sfb = cp.empty((g, n // 128, k // 128), cp.float32)
    for i in range(g):
        a[i], sfa[i] = cupygemm.per_token_cast_to_fp8(cp.random.standard_normal((max_m, k), dtype=cp.float32))
        b[i], sfb[i] = cupygemm.per_block_cast_to_fp8(cp.random.standard_normal((n, k), dtype=cp.float32))
    sfa = cupygemm.get_col_major_tma_aligned_tensor(sfa)  # already in the kernel's layout: nothing to launch
    out = cp.zeros((g, max_m, n), dtype=cupygemm.tensors.BF16)
    masked_m = cp.zeros(g, cp.int32)

    # First call compiles and loads the kernel (not allowed during capture); then capture.
    cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sfa), (b, sfb), out, masked_m, 128)
    stream.begin_capture()
    cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sfa), (b, sfb), out, masked_m, 128)
    graph = stream.end_capture()

rng = np.random.default_rng(0)
for step in range(3):
    counts = rng.integers(0, max_m + 1, g).astype(np.int32)
    with stream:
        masked_m.set(counts, stream=stream)  # new routing, same graph
        graph.launch(stream)
        host = [x.get() for x in (a, sfa, b, sfb, out)]  # copied on the stream, after the replay
    ref = grouped_masked_reference(*host[:4], counts)
    mask = ~np.isnan(ref[..., 0])
    print(f"replay {step}: masked_m={counts.tolist()} calc_diff {calc_diff(host[4][mask].astype(np.float32), ref[mask]):.2e}")
