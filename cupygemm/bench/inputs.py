"""The operands of one bench case, made on the GPU: randn BF16 quantized with the 1x128 / 128x128 recipe.

The unquantized BF16 inputs are kept beside the FP8 ones so the checks can compare against both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .cases import Shape, Sizes, contiguous_m_indices, shape_seed


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
    m_indices: Any = None  # int32 [M] (contiguous)
    masked_m: Any = None  # int32 [G] (masked)


def make_inputs(shape: Shape, sizes: Sizes, seed: int) -> Inputs:
    """randn BF16 A and B on the GPU (seeded per shape), quantized 1x128 (A) and 128x128 (B, per group)."""
    import cupy

    from ..layout import get_col_major_tma_aligned_tensor
    from ..quantization import per_block_cast_to_fp8, per_token_cast_to_fp8
    from ..tensors import BF16

    g, n, k = shape.groups, shape.n, shape.k
    kb = (k + 127) // 128
    if shape.kind == "normal":
        a_shape, b_shape = (shape.m, k), (n, k)
    elif shape.kind == "contiguous":
        a_shape, b_shape = (sizes.a_rows, k), (g, n, k)
    else:
        a_shape, b_shape = (g, sizes.a_rows, k), (g, n, k)
    rng = cupy.random.default_rng(shape_seed(shape, seed))
    x = bf16_bits(rng.standard_normal(a_shape, dtype=cupy.float32))
    y = bf16_bits(rng.standard_normal(b_shape, dtype=cupy.float32))
    a2, sfa2 = per_token_cast_to_fp8(x.reshape(-1, k).view(BF16))
    a, sfa = a2.reshape(a_shape), sfa2.reshape(a_shape[:-1] + (kb,))
    if len(b_shape) == 2:
        b, sfb = per_block_cast_to_fp8(y.view(BF16))
    else:
        parts = [per_block_cast_to_fp8(y[i].view(BF16)) for i in range(g)]
        b = cupy.stack([p[0] for p in parts])
        sfb = cupy.stack([p[1] for p in parts])
        del parts
    inp = Inputs(shape, sizes, a, sfa, get_col_major_tma_aligned_tensor(sfa), b, sfb, x, y)
    if shape.kind == "contiguous":
        inp.m_indices = cupy.asarray(contiguous_m_indices(sizes.group_rows))
    elif shape.kind == "masked":
        inp.masked_m = cupy.asarray(np.asarray(sizes.group_rows, dtype=np.int32))
    return inp


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
