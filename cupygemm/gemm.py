"""The GEMM entry points: validate -> pick a config -> get the kernel -> TMA descriptors -> launch."""
from __future__ import annotations

from typing import Any

import numpy as np

from . import tma, validate
from .config import KIND_MASKED, b_evict_first, choose_config, model_rows
from .device import get_num_sms, require_hopper
from .layout import ceil_div
from .kernels import get_gemm_kernel
from .tensors import export_like
from .workspace import split_k_scratch


def _launch(p: validate.Problem, expected_m: int | None = None) -> None:
    import cupy

    with cupy.cuda.Device(p.device_id):
        info = require_hopper()
        evict_b = b_evict_first(p.num_groups, p.n, p.k, info.l2_bytes)
        cfg = choose_config(p.kind, model_rows(p.kind, p.m, expected_m), p.n, p.k, p.num_groups, get_num_sms(),
                            smem_limit=info.max_smem_per_block)
        kernel = get_gemm_kernel(cfg, p.device_id)

        g_a = p.num_groups if p.kind == KIND_MASKED else 1
        g_b = p.num_groups
        m, n, k, kb = p.m, p.n, p.k, ceil_div(p.k, 128)
        a, b, d = p.a, p.b, p.out
        lda, ldb, ldd = a.strides[-2], b.strides[-2], d.strides[-2]
        wg_m = cfg.block_m if cfg.split_k else cfg.block_m // cfg.num_math_wg
        slab = cfg.block_n if cfg.swizzle_d == 0 else cfg.swizzle_d // 2
        # With multicast each CTA of a pair loads half of the shared tile.
        box_n = cfg.block_n // 2 if cfg.multicast == 2 else cfg.block_n
        tmap_a = tma.encode_tiled(tma.UINT8, a.data.ptr, (k, m, g_a),
                                  (lda, a.strides[0] if a.ndim == 3 else lda * m), (128, cfg.a_box_rows, 1), 128)
        tmap_b = tma.encode_tiled(tma.UINT8, b.data.ptr, (k, n, g_b),
                                  (ldb, b.strides[0] if b.ndim == 3 else ldb * n), (128, box_n, 1), 128)
        tmap_sfa = tma.encode_tiled(tma.FLOAT32, p.sfa.data.ptr, (m, kb, g_a),
                                    (4 * p.sfa_m_pad, 4 * p.sfa_m_pad * kb), (cfg.block_m, 1, 1), 0)
        tmap_d = tma.encode_tiled(tma.BFLOAT16, d.data.ptr, (n, m, g_a),
                                  (ldd, d.strides[0] if d.ndim == 3 else ldd * m), (slab, wg_m, 1), cfg.swizzle_d)
        layout = p.grouped_layout.data.ptr if p.grouped_layout is not None else 0
        grid = cfg.num_sms if not cfg.multicast else min(cfg.num_sms, 2 * kernel.max_clusters)
        stream = cupy.cuda.get_current_stream()
        partials, counters = split_k_scratch(cfg, m, p.device_id, stream)
        values = (tmap_a, tmap_b, tmap_sfa, tmap_d, p.sfb.data.ptr, layout, d.data.ptr, partials, counters, m,
                  p.num_groups, ldd // 2, int(evict_b))
        if kernel.launcher is not None:
            kernel.launcher(grid, cfg.threads, cfg.smem_bytes, stream.ptr, values)
        else:  # the driver cannot report parameter offsets (CUDA < 12.4): CuPy packs them
            kernel.function((grid,), (cfg.threads,),
                            tuple(np.frombuffer(t, "V128") for t in values[:4]) +
                            tuple(np.uint64(v) for v in values[4:9]) +
                            tuple(np.uint32(v) for v in values[9:]), shared_mem=cfg.smem_bytes)


def _finish(p: validate.Problem) -> Any:
    if p.out_given is not None:
        return p.out_given
    return export_like(p.out, p.framework)


def _trivial(p: validate.Problem) -> bool:
    """Empty problems: nothing to launch (K == 0 gives zeros)."""
    if p.m == 0 or p.n == 0 or p.num_groups == 0:
        return True
    if p.k == 0:
        p.out.view(np.uint16).fill(0)
        return True
    return False


def gemm_fp8_fp8_bf16_nt(lhs: tuple[Any, Any], rhs: tuple[Any, Any], out: Any = None) -> Any:
    """D = A @ B.T with DeepSeek-V3 fine-grained FP8 scaling, BF16 output.

    Args:
        lhs: ``(A, SFA)``: A float8_e4m3fn (or uint8 holding e4m3 bits) [M, K]; SFA float32 [M, ceil(K/128)],
            one scale per row and 128 columns of K. Row-major SFA is transposed once into the TMA-aligned
            M-major layout; SFA already in that layout (see ``get_col_major_tma_aligned_tensor``) is used as is.
        rhs: ``(B, SFB)``: B float8_e4m3fn [N, K]; SFB float32 [ceil(N/128), ceil(K/128)], one scale per
            128x128 block, C-contiguous.
        out: optional bfloat16 [M, N] written in place; allocated when None.

    Returns:
        ``out`` if given, else a new bfloat16 array of the caller's framework (CuPy, torch or JAX, zero-copy).

    Constraints: K % 16 == 0 and N % 8 == 0 (16-byte aligned rows for TMA), unit inner strides, all operands
    on one Hopper GPU. K need not be a multiple of 128. M == 0 returns at once. NaN/Inf scales propagate.
    """
    p = validate.normal(lhs, rhs, out)
    if not _trivial(p):
        _launch(p)
    return _finish(p)


def m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(lhs: tuple[Any, Any], rhs: tuple[Any, Any], out: Any,
                                              m_indices: Any) -> Any:
    """Grouped GEMM, contiguous layout (MoE prefill/training): row r of A uses B[m_indices[r]].

    Args:
        lhs: ``(A, SFA)``: A [M_sum, K] FP8, SFA [M_sum, ceil(K/128)] float32.
        rhs: ``(B, SFB)``: B [G, N, K] FP8, SFB [G, ceil(N/128), ceil(K/128)] float32.
        out: bfloat16 [M_sum, N] (None allocates).
        m_indices: int32 [M_sum], the group of each row; -1 marks padding rows, which are neither computed
            nor written (their ``out`` rows keep their previous contents). Each group's rows are contiguous and
            padded to ``get_m_alignment_for_contiguous_layout()`` (128) rows; a 128-row block takes the group of
            its first row. Out-of-range values never cause out-of-bounds accesses (the block or row is skipped);
            ``CUPYGEMM_CHECK_INPUTS=1`` reports them, and misaligned groups, as ValueError.
    """
    p = validate.contiguous(lhs, rhs, out, m_indices)
    if not _trivial(p):
        _launch(p)
    return _finish(p)


def m_grouped_gemm_fp8_fp8_bf16_nt_masked(lhs: tuple[Any, Any], rhs: tuple[Any, Any], out: Any, masked_m: Any,
                                          expected_m: int) -> Any:
    """Grouped GEMM, masked layout (MoE decode, CUDA-graph friendly): group g computes its first masked_m[g] rows.

    Args:
        lhs: ``(A, SFA)``: A [G, max_m, K] FP8, SFA [G, max_m, ceil(K/128)] float32.
        rhs: ``(B, SFB)``: B [G, N, K] FP8, SFB [G, ceil(N/128), ceil(K/128)] float32.
        out: bfloat16 [G, max_m, N], groups back to back (rows may be padded; None allocates); rows at or past
            masked_m[g] are left untouched.
        masked_m: int32 [G] on the device, read by the kernel (no host synchronization; capturable in a
            CUDA graph). Values are clamped to [0, max_m]; ``CUPYGEMM_CHECK_INPUTS=1`` reports them instead.
        expected_m: typical rows per group; only used to choose the kernel config, which is planned for groups
            of int(expected_m x U(0.7, 1.3)) rows (the spread of DeepGEMM's tests), not for exactly expected_m.
    """
    p = validate.masked(lhs, rhs, out, masked_m, expected_m)
    if not _trivial(p):
        _launch(p, expected_m)
    return _finish(p)
