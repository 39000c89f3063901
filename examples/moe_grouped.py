"""MoE with a toy router: contiguous layout (prefill) and masked layout (decode). CuPy, Hopper GPU."""
import cupygemm

cupygemm.device.require_hopper_or_exit()  # one clear line, not CuPy's driver error, where there is no Hopper GPU

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

from cupygemm.reference import calc_diff, grouped_contiguous_reference, grouped_masked_reference  # noqa: E402

experts, tokens, n, k = 8, 3000, 2048, 1024
rng = np.random.default_rng(0)
x = cp.random.standard_normal((tokens, k), dtype=cp.float32)
weights = cp.random.standard_normal((experts, n, k), dtype=cp.float32)
b = cp.empty((experts, n, k), cp.uint8)
sfb = cp.empty((experts, n // 128, k // 128), cp.float32)
for e in range(experts):
    b[e], sfb[e] = cupygemm.per_block_cast_to_fp8(weights[e])

# Toy router: each token goes to one expert.
route = rng.integers(0, experts, tokens)

# --- contiguous: tokens sorted by expert, each expert's rows padded to 128 with -1 rows ---
align = cupygemm.get_m_alignment_for_contiguous_layout()
order, m_indices = [], []
for e in range(experts):
    rows = np.nonzero(route == e)[0]
    pad = -len(rows) % align
    order += list(rows) + [-1] * pad
    m_indices += [e] * len(rows) + [-1] * pad
order, m_indices = np.array(order), np.array(m_indices, np.int32)
xs = cp.zeros((len(order), k), cp.float32)
xs[cp.asarray(np.nonzero(order >= 0)[0])] = x[cp.asarray(order[order >= 0])]
a, sfa = cupygemm.per_token_cast_to_fp8(xs)
out = cp.zeros((len(order), n), dtype=cupygemm.tensors.BF16)
cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sfa), (b, sfb), out, cp.asarray(m_indices))
ref = grouped_contiguous_reference(a.get(), sfa.get(), b.get(), sfb.get(), m_indices)
valid = m_indices >= 0
print(f"contiguous: {len(order)} rows ({valid.sum()} tokens), calc_diff {calc_diff(out.get()[valid].astype(np.float32), ref[valid]):.2e}")

# --- masked: a fixed [experts, max_m, k] buffer, masked_m tokens per expert (CUDA-graph friendly) ---
max_m = 512
counts = np.bincount(route[:1500], minlength=experts).clip(max=max_m)
xa = cp.zeros((experts, max_m, k), cp.float32)
for e in range(experts):
    xa[e, : counts[e]] = x[cp.asarray(np.nonzero(route[:1500] == e)[0][: counts[e]])]
am = cp.empty((experts, max_m, k), cp.uint8)
sam = cp.empty((experts, max_m, k // 128), cp.float32)
for e in range(experts):
    am[e], sam[e] = cupygemm.per_token_cast_to_fp8(xa[e])
outm = cp.zeros((experts, max_m, n), dtype=cupygemm.tensors.BF16)
masked_m = cp.asarray(counts.astype(np.int32))
cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((am, sam), (b, sfb), outm, masked_m, int(counts.mean()))
refm = grouped_masked_reference(am.get(), sam.get(), b.get(), sfb.get(), counts)
mask = ~np.isnan(refm[..., 0])
print(f"masked: {counts.sum()} tokens over {experts} experts, calc_diff {calc_diff(outm.get()[mask].astype(np.float32), refm[mask]):.2e}")
