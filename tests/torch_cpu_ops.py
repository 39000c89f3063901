"""CPU kernels for the ``torch.ops.cupygemm`` operators, so that the layers' autograd plumbing (padding, transposed
operands, saved tensors, gradient accumulation, torch.compile) runs on a machine without a GPU.

The casts compute what the CUDA casts compute (amax per group clamped to 1e-4, ``q = e4m3(x * (448 / amax))``,
``s = amax / 448``); the GEMMs dequantize and multiply in float64. They check nothing the real kernels check: GPU
tests cover the kernels, these cover the layers around them.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

import cupygemm.torch  # noqa: F401 - defines the operators

FP8 = torch.float8_e4m3fn


def _cast(x: torch.Tensor, block_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    m, n = x.shape
    mp, np_ = -(-m // block_rows) * block_rows, -(-n // 128) * 128
    xf = torch.nn.functional.pad(x.float(), (0, np_ - n, 0, mp - m))
    blocks = xf.view(mp // block_rows, block_rows, np_ // 128, 128)
    amax = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-4)
    factor = (448.0 / amax)[:, None, :, None]
    q = (blocks * factor).view(mp, np_)[:m, :n].to(FP8)
    return q, amax / 448.0


def _rows_scale(q: torch.Tensor, s: torch.Tensor, block_rows: int) -> torch.Tensor:
    """Dequantize q [r, c] with scales per (block_rows x 128), float64."""
    r, c = q.shape
    full = s.double().repeat_interleave(block_rows, 0)[:r].repeat_interleave(128, 1)[:, :c]
    return q.double() * full


def per_token_cast_to_fp8(x, *args):
    return _cast(x, 1)


def per_block_cast_to_fp8(x, *args):
    return _cast(x, 128)


def _transposed(x, m_major_scales):
    q_t, s_t = _cast(x.T, 1)
    if m_major_scales:  # the GEMMs' layout: [ceil(T/128), round_up(d, 4)] storage, s_t its transposed view
        d = s_t.shape[0]
        buf = torch.zeros(s_t.shape[1], -(-d // 4) * 4)
        buf[:, :d] = s_t.T
        s_t = buf[:, :d].T
    return q_t, s_t


def per_token_cast_to_fp8_transposed(x, m_major_scales=False, *args):
    return _transposed(x, m_major_scales)


def per_token_cast_to_fp8_transposed_rowwise(x, m_major_scales=False, *args):
    return (*_transposed(x, m_major_scales), *_cast(x, 1))


def per_block_cast_to_fp8_with_transpose(x, *args):
    q, s = _cast(x, 128)
    return q, s, q.T.contiguous(), s.T.contiguous()


def gemm_fp8_fp8_bf16_nt(a, sfa, b, sfb, *args):
    return (_rows_scale(a, sfa, 1) @ _rows_scale(b, sfb, 128).T).to(torch.bfloat16)


def m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(a, sfa, b, sfb, m_indices, *args):
    da = _rows_scale(a, sfa, 1)
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    for g in range(b.shape[0]):
        rows = m_indices == g
        out[rows] = da[rows] @ _rows_scale(b[g], sfb[g], 128).T
    return out.to(torch.bfloat16)


def wgrad_gemm_fp8_fp8_fp32_nt_out(a, sfa, b, sfb, out, *args):
    out += (_rows_scale(a, sfa, 1) @ _rows_scale(b, sfb, 1).T).float()


def wgrad_gemm_fp8_fp8_fp32_nt_store(a, sfa, b, sfb, *args):
    return (_rows_scale(a, sfa, 1) @ _rows_scale(b, sfb, 1).T).float()


def k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns_out(a, sfa, b, sfb, group_sizes, out, *args):
    da, db = _rows_scale(a, sfa, 1), _rows_scale(b, sfb, 1)
    start = 0
    for g, k in enumerate(group_sizes.tolist()):
        out[g] += (da[:, start:start + k] @ db[:, start:start + k].T).float()
        start += k


_IMPLS = [per_token_cast_to_fp8, per_block_cast_to_fp8, per_token_cast_to_fp8_transposed,
          per_token_cast_to_fp8_transposed_rowwise, per_block_cast_to_fp8_with_transpose, gemm_fp8_fp8_bf16_nt,
          m_grouped_gemm_fp8_fp8_bf16_nt_contiguous, wgrad_gemm_fp8_fp8_fp32_nt_out, wgrad_gemm_fp8_fp8_fp32_nt_store,
          k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns_out]


@contextlib.contextmanager
def cpu_ops() -> Iterator[None]:
    """The operators run on CPU tensors inside this context (the CPU kernels are removed after it)."""
    lib = torch.library.Library("cupygemm", "IMPL")
    for fn in _IMPLS:
        lib.impl(fn.__name__, fn, "CPU")
    try:
        yield
    finally:
        lib._destroy()
