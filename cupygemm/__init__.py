"""cupygemm: FP8 GEMM with fine-grained scaling for NVIDIA Hopper, compiled at run time with NVRTC via CuPy.

Entry points (DeepGEMM-compatible names and semantics):

- :func:`gemm_fp8_fp8_bf16_nt` - D = A @ B.T
- :func:`m_grouped_gemm_fp8_fp8_bf16_nt_contiguous` - MoE grouped GEMM, contiguous layout
- :func:`m_grouped_gemm_fp8_fp8_bf16_nt_masked` - MoE grouped GEMM, masked layout
- :func:`wgrad_gemm_fp8_fp8_fp32_nt` - D += A @ B.T, both operands scaled 1x128, FP32 D (weight gradients);
  :func:`wgrad_gemm_fp8_fp8_fp32_nt_store`: D = A @ B.T (a fresh gradient, no zeros first)
- :func:`k_grouped_wgrad_gemm_fp8_fp8_fp32_nt` - the same per group, each with its own K (MoE weight gradients)
- :func:`k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns` - the same with the groups as column ranges of one matrix
  (the transposed casts of a MoE layer's dY and X)
- :func:`fp8_gemm_nt`, :func:`m_grouped_fp8_gemm_nt_contiguous`, :func:`m_grouped_fp8_gemm_nt_masked`,
  :func:`k_grouped_fp8_gemm_nt_contiguous` - the same under DeepGEMM 2.x's names
- :func:`pack_weights` - B packed once so that each SM reads its tiles from its own L2 side (pass it as ``rhs``)
- :func:`warmup` - build ahead of time the kernels a range of M needs (serving)

Inputs are CuPy arrays, torch CUDA tensors, JAX arrays or any DLPack GPU tensor; results follow the caller's
framework, and calls run on the caller's stream (see :mod:`cupygemm.streams`). ``cupygemm.jax`` runs the GEMMs
inside ``jax.jit``; ``cupygemm.torch`` holds the torch operators. Neither is imported by ``import cupygemm``.
"""
from __future__ import annotations

__version__ = "0.1.0"

from .config import GemmConfig, choose_config, make_config, override_config
from .device import get_num_sms, reset_num_sms, set_num_sms
from .errors import CupygemmCompileError, CupygemmDeviceError, CupygemmError, CupygemmToolchainError
from .kinds.forward import (
    fp8_gemm_nt,
    gemm_fp8_fp8_bf16_nt,
    m_grouped_fp8_gemm_nt_contiguous,
    m_grouped_fp8_gemm_nt_masked,
    m_grouped_gemm_fp8_fp8_bf16_nt_contiguous,
    m_grouped_gemm_fp8_fp8_bf16_nt_masked,
)
from .kinds.training import (
    k_grouped_fp8_gemm_nt_contiguous,
    k_grouped_wgrad_gemm_fp8_fp8_fp32_nt,
    k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns,
    wgrad_gemm_fp8_fp8_fp32_nt,
    wgrad_gemm_fp8_fp8_fp32_nt_store,
)
from .layout import (
    ceil_div,
    get_col_major_tma_aligned_tensor,
    get_m_alignment_for_contiguous_layout,
    get_tma_aligned_size,
)
from .packing import PackedWeights, pack_weights
from .quantization import per_block_cast_to_fp8, per_token_cast_to_fp8, per_token_cast_to_fp8_transposed
from .reference import calc_diff
from .serving import WarmupReport, warmup

__all__ = [
    "__version__",
    "gemm_fp8_fp8_bf16_nt",
    "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
    "m_grouped_gemm_fp8_fp8_bf16_nt_masked",
    "fp8_gemm_nt",
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_masked",
    "wgrad_gemm_fp8_fp8_fp32_nt",
    "wgrad_gemm_fp8_fp8_fp32_nt_store",
    "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt",
    "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns",
    "k_grouped_fp8_gemm_nt_contiguous",
    "pack_weights",
    "PackedWeights",
    "per_token_cast_to_fp8",
    "per_block_cast_to_fp8",
    "per_token_cast_to_fp8_transposed",
    "calc_diff",
    "ceil_div",
    "get_tma_aligned_size",
    "get_col_major_tma_aligned_tensor",
    "get_m_alignment_for_contiguous_layout",
    "set_num_sms",
    "get_num_sms",
    "reset_num_sms",
    "GemmConfig",
    "choose_config",
    "make_config",
    "override_config",
    "warmup",
    "WarmupReport",
    "CupygemmError",
    "CupygemmCompileError",
    "CupygemmDeviceError",
    "CupygemmToolchainError",
]
