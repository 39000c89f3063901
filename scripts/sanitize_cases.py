"""Small GEMMs of every kernel kind (forward, grouped, weight gradients, casts, packed weights) and representative
configs, for compute-sanitizer (scripts/sanitize.sh)."""
import cupy as cp
import numpy as np

import cupygemm
from cupygemm import config as C
from cupygemm.bench.inputs import grouped_weights, make_normal, randn_bf16


rng = cp.random.default_rng(0)
# (block_m, block_n, multicast) on odd shapes: smallest and largest tiles, multicast on and off.
for bm, bn, mc, (m, n, k) in [(64, 16, 0, (65, 136, 576)), (128, 160, 0, (129, 328, 1040)),
                              (256, 80, 0, (300, 168, 256)), (128, 128, 2, (512, 256, 640)),
                              (64, 64, 1, (70, 512, 384)), (64, 184, 0, (1, 8, 128)),
                              (128, 144, 0, (200, 600, 1408)), (256, 128, 1, (300, 512, 640)),
                              (192, 128, 1, (340, 512, 640)), (192, 120, 0, (70, 360, 384))]:
    # 128x144: K loop compiled per scale-block boundary offset; 256x128: serial m64 sub-tiles; 192: three math
    # warpgroups (340 rows: the second block's third warpgroup has 20, 70 rows: two warpgroups idle).
    extra = {"serial_m": True} if bm == 256 and bn > 96 else {}
    C.override_config("normal", n, k, block_m=bm, block_n=bn, multicast=mc, **extra)
    a, sfa, b, sfb = make_normal(m, n, k, bm + bn)
    out = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    C.override_config("normal", n, k)
# Split-K across CTAs (FP32 partials, last CTA reduces): ragged tiles, uneven splits, two row groups, multicast.
for bm, bn, ks, mc, (m, n, k) in [(64, 128, 3, 0, (65, 264, 1408)), (128, 128, 4, 2, (256, 384, 1024)),
                                  (64, 16, 7, 0, (33, 40, 896))]:
    C.override_config("normal", n, k, block_m=bm, block_n=bn, multicast=mc, split_k=ks)
    a, sfa, b, sfb = make_normal(m, n, k, bm + bn + ks)
    out = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    C.override_config("normal", n, k)
# Split-K clusters (the partner's sums into the leader's shared memory) on two accumulator sets, over ragged rows
# whose last A box loads through the tail map.
C.override_config("normal", 264, 1408, block_m=128, block_n=32, split_k=2, split_cluster=True, two_acc_sets=True)
a, sfa, b, sfb = make_normal(100, 264, 1408, 11)
out = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
C.override_config("normal", 264, 1408)
g, n, k = 3, 256, 512
b, sfb = grouped_weights(g, n, k, rng)
a, sfa = cupygemm.per_token_cast_to_fp8(randn_bf16((384, k), rng))
idx = np.array([0] * 100 + [-1] * 28 + [9] * 128 + [2] * 128, np.int32)  # padding and an out-of-range block
cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sfa), (b, sfb), None, cp.asarray(idx))
# Contiguous on 256-row tiles: blocks 0 | - (half tile), 9 | 2 (half tile), 1 | 2 (two half tiles), 2 | 1 with
# the last 70 rows (two half tiles, the second reaching past M).
a5, sfa5 = cupygemm.per_token_cast_to_fp8(randn_bf16((966, k), rng))
idx5 = np.array([0] * 100 + [-1] * 156 + [9] * 128 + [2] * 128 + [1] * 128 + [2] * 256 + [1] * 70, np.int32)
C.override_config("contiguous", n, k, block_m=256, block_n=128, multicast=1, serial_m=True)
cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a5, sfa5), (b, sfb), None, cp.asarray(idx5))
C.override_config("contiguous", n, k)
a3, s3 = cp.stack([a[:128]] * 3), cp.stack([sfa[:128]] * 3)
out3 = cp.zeros((3, 128, n), dtype=cupygemm.tensors.BF16)
cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a3, s3), (b, sfb), out3, cp.asarray(np.array([0, 77, 999], np.int32)), 64)
# Masked, K interleaved over two warpgroups on 64-row tiles straddling scale blocks, four groups of uneven sizes.
g4, n4, k4 = 4, 1008, 1024
b4, sfb4 = grouped_weights(g4, n4, k4, rng)
a4, s4 = cupygemm.per_token_cast_to_fp8(randn_bf16((g4 * 320, k4), rng))
a4, s4 = a4.reshape(g4, 320, k4), s4.reshape(g4, 320, -1)
C.override_config("masked", n4, k4, block_m=64, block_n=168, interleave_k=True)
cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a4, s4), (b4, sfb4), None, cp.asarray(np.array([277, 220, 0, 181], np.int32)), 256)
C.override_config("masked", n4, k4)
# Masked on 256-row serial tiles with A multicast: groups ending in each m64 sub-tile of a block (skipped sub-tiles, A
# boxes past masked_m not loaded, cheap blocks scheduled last).
b6, sfb6 = grouped_weights(g4, 896, k4, rng)
C.override_config("masked", 896, k4, block_m=256, block_n=112, multicast=1, serial_m=True)
cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a4, s4), (b6, sfb6), None, cp.asarray(np.array([257, 129, 64, 320], np.int32)), 256)
C.override_config("masked", 896, k4)
# Stream-K tail on a 16-CTA grid: masked 128x160 pairs (10 units, 2 left over for 8 clusters: 4 pieces each) and a
# normal GEMM with fewer tiles than CTAs (5 tiles x 3 pieces).
b7, sfb7 = grouped_weights(g4, 640, k4, rng)
C.override_config("masked", 640, k4, block_m=128, block_n=160, multicast=1, stream_k=True, num_sms=16)
cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a4, s4), (b7, sfb7), None, cp.asarray(np.array([300, 1, 0, 100], np.int32)), 256)
C.override_config("masked", 640, k4)
C.override_config("normal", 640, 1408, block_m=128, block_n=128, stream_k=True, num_sms=16)
a, sfa, b, sfb = make_normal(100, 640, 1408, 7)
out = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
C.override_config("normal", 640, 1408)
cupygemm.per_block_cast_to_fp8(randn_bf16((130, 200), rng))
# Training: the fused casts on ragged shapes (row-wise copy, M-major scales, the weights' per-block transpose).
x = randn_bf16((200, 136), rng)
cupygemm.per_token_cast_to_fp8_transposed(x, rowwise=True)
cupygemm.per_block_cast_to_fp8(randn_bf16((130, 200), rng), with_transpose=True)


def wgrad_operand(rows, tokens):
    """A wgrad operand [rows, tokens] and its M-major 1x128 scales, as the transposed cast gives them."""
    return cupygemm.per_token_cast_to_fp8_transposed(randn_bf16((tokens, rows), rng), m_major_scales=True)


# Weight gradients, the chooser's picks: dense with the D prefetch (64x64 two accumulator sets, B multicast; 128x152
# sharing B whole over 16 m blocks), K not a multiple of 128; k-grouped as column ranges on 128x152 whole-B pairs, with
# an empty group and a one-block one.
for m, n, k in [(200, 308, 1040), (2048, 2432, 1040)]:
    out = cp.zeros((m, n), cp.float32)
    cupygemm.wgrad_gemm_fp8_fp8_fp32_nt(wgrad_operand(m, k), wgrad_operand(n, k), out)
sizes = [384, 0, 128, 48]
out = cp.zeros((len(sizes), 1024, 2432), cp.float32)
cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns(wgrad_operand(1024, sum(sizes)), wgrad_operand(2432, sum(sizes)),
                                                      out, cp.asarray(np.array(sizes, np.int32)))
# Packed (L2-side-aware) weights where this GPU packs them.
a, sfa, b, sfb = make_normal(64, 2112, 1024, 5)
cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), cupygemm.pack_weights(b, sfb))
cp.cuda.Device().synchronize()
print("sanitize cases done")
