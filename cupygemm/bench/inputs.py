"""The operands of one bench case, made on the GPU: randn BF16 quantized with the recipe of the shape's kind.

The unquantized BF16 inputs are kept beside the FP8 ones so the checks can compare against both. :class:`Inputs`
holds the forward kinds' operands (1x128 / 128x128); each kind's bench code makes its own
(:mod:`cupygemm.bench.kinds`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .cases import Shape, Sizes


def bf16_bits(x: Any) -> Any:
    """float32 array (NumPy or CuPy) -> uint16 BF16 bits, round to nearest even (finite inputs)."""
    u = x.view(np.uint32)
    one, bias, sixteen = np.uint32(1), np.uint32(0x7FFF), np.uint32(16)
    return ((u + ((u >> sixteen) & one) + bias) >> sixteen).astype(np.uint16)


def bf16_bits_to_f64(bits: Any) -> np.ndarray:
    """uint16 BF16 bits (host) -> float64."""
    b = np.asarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def rows2d(arr: Any) -> Any:
    """``arr`` viewed as 2-D [rows, last dim]: grouped outputs are checked row by row like normal ones."""
    return arr.reshape(-1, arr.shape[-1])


@dataclass
class Inputs:
    """One shape's operands (CuPy on the GPU; NumPy works for the host-side helpers)."""

    shape: Shape
    sizes: Sizes
    a: Any  # uint8 e4m3 bits [M, K] / [G, max_m, K]
    sfa: Any  # float32 row-major [M, K/128] / [G, max_m, K/128]
    sfa_mn: Any  # the same scales in the M-major TMA-aligned layout (what the kernels read)
    b: Any  # uint8 [N, K] / [G, N, K]
    sfb: Any  # float32 [N/128, K/128] / [G, N/128, K/128]
    x: Any  # uint16 BF16 bits of the unquantized A (shape of a)
    y: Any  # uint16 BF16 bits of the unquantized B (shape of b)
    # the layout operands, named as the descriptors name them (GemmKind.layout):
    m_indices: Any = None  # int32 [M] (contiguous)
    masked_m: Any = None  # int32 [G] (masked)


def make_inputs(shape: Shape, sizes: Sizes, seed: int) -> Any:
    """The shape's operands on the GPU, made by its kind's bench code (seeded per shape): :class:`Inputs` for the
    forward kinds (:func:`cupygemm.bench.forward.make_inputs`), :class:`cupygemm.bench.training.TrainingInputs` for
    the weight-gradient ones."""
    from .kinds import bench_kind

    return bench_kind(shape.kind).make_inputs(shape, sizes, seed)


def randn_bf16(shape: tuple[int, ...], rng: Any) -> Any:
    """A CuPy BF16 array of standard normal values drawn from ``rng`` (a ``cupy.random.Generator``)."""
    import cupy

    from ..tensors import BF16

    return bf16_bits(rng.standard_normal(shape, dtype=cupy.float32)).view(BF16)


def make_normal(m: int, n: int, k: int, seed: int = 0) -> tuple[Any, Any, Any, Any]:
    """Recipe operands of one normal GEMM, for the scripts that time or profile single kernels:
    (A uint8 [M, K], SFA float32 [M, K/128] row-major, B uint8 [N, K], SFB float32 [N/128, K/128])."""
    import cupy

    from ..quantization import per_block_cast_to_fp8, per_token_cast_to_fp8

    rng = cupy.random.default_rng(seed)
    a, sfa = per_token_cast_to_fp8(randn_bf16((m, k), rng))
    b, sfb = per_block_cast_to_fp8(randn_bf16((n, k), rng))
    return a, sfa, b, sfb


def grouped_weights(g: int, n: int, k: int, rng: Any) -> tuple[Any, Any]:
    """G recipe-quantized weight matrices: (B uint8 [G, N, K], SFB float32 [G, ceil(N/128), ceil(K/128)])."""
    import cupy

    from ..quantization import per_block_cast_to_fp8
    from ..util import ceil_div

    b = cupy.empty((g, n, k), cupy.uint8)
    sfb = cupy.empty((g, ceil_div(n, 128), ceil_div(k, 128)), cupy.float32)
    for i in range(g):
        b[i], sfb[i] = per_block_cast_to_fp8(randn_bf16((n, k), rng))
    return b, sfb
