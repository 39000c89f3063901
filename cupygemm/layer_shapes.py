"""Shape rules of the FP8 training layers (``cupygemm.torch.layers``), kept free of any framework so that they are
checked, and tested, without one.

A layer ``y = x @ W^T`` runs three GEMMs (``/shared/docs/training-notes.md``): forward (K = features), dgrad (K = the
output features N) and wgrad (K = tokens). Their kernels need 16-byte aligned FP8 rows, so every axis that is some
GEMM's K is a multiple of 16: the features K and N always, the token count T after padding with zero rows (which
add nothing to dW and are sliced off y and dX). The MoE layer's experts hold consecutive row ranges of x whose
lengths are multiples of 128 (the m-grouped contiguous layout); its weights [G, N, K] are cast 128x128 as one
[G*N, K] matrix, so N is a multiple of 128 (no scale block may span two experts).
"""
from __future__ import annotations

from typing import Sequence

from .kinds.training import K_ALIGN
from .layout import M_ALIGNMENT_FOR_CONTIGUOUS_LAYOUT
from .util import round_up

#: The token count the wgrad kernels need a multiple of (their K): the layers pad x and dy with zero rows up to it.
TOKEN_ALIGN = K_ALIGN
#: Rows per expert of the m-grouped layout (and the 1x128 scale blocks along tokens that must not span two experts).
GROUP_ALIGN = M_ALIGNMENT_FOR_CONTIGUOUS_LAYOUT


def padded_tokens(tokens: int) -> int:
    """The token count after padding with zero rows to a multiple of :data:`TOKEN_ALIGN`."""
    return round_up(tokens, TOKEN_ALIGN)


def _features(k: int, n: int, n_align: int, weight: str) -> None:
    if k % TOKEN_ALIGN:
        raise ValueError(f"{weight}: in_features (K) must be a multiple of {TOKEN_ALIGN} (16-byte aligned FP8 rows), "
                         f"got K = {k}")
    if n % n_align:
        raise ValueError(f"{weight}: out_features (N) must be a multiple of {n_align} (the data gradient's K"
                         + (", and 128x128 scale blocks within one expert" if n_align > TOKEN_ALIGN else "")
                         + f"), got N = {n}")


def linear_dims(x_shape: Sequence[int], w_shape: Sequence[int], x: str = "x", weight: str = "weight"
                ) -> tuple[int, int, int]:
    """``(T, K, N)`` of a dense layer: x [..., K] (T = the product of the leading dimensions), weight [N, K].
    ValueError naming the argument otherwise."""
    if len(w_shape) != 2:
        raise ValueError(f"{weight}: expected a 2-D [out_features, in_features] tensor, got shape {tuple(w_shape)}")
    n, k = (int(d) for d in w_shape)
    if len(x_shape) < 1 or x_shape[-1] != k:
        raise ValueError(f"{x}: expected [..., in_features = {k}] (the last dimension of {weight} [{n}, {k}]), got "
                         f"shape {tuple(x_shape)}")
    _features(k, n, TOKEN_ALIGN, weight)
    tokens = 1
    for d in x_shape[:-1]:
        tokens *= int(d)
    return tokens, k, n


def grouped_linear_dims(x_shape: Sequence[int], w_shape: Sequence[int], num_sizes: int, x: str = "x",
                        weight: str = "weight", group_sizes: str = "group_sizes") -> tuple[int, int, int, int]:
    """``(T, G, K, N)`` of an MoE layer: x [T, K], weight [G, N, K], ``num_sizes`` group sizes (G of them)."""
    if len(w_shape) != 3:
        raise ValueError(f"{weight}: expected a 3-D [num_groups, out_features, in_features] tensor, got shape "
                         f"{tuple(w_shape)}")
    g, n, k = (int(d) for d in w_shape)
    if len(x_shape) != 2 or x_shape[1] != k:
        raise ValueError(f"{x}: expected a 2-D [tokens, in_features = {k}] tensor, got shape {tuple(x_shape)}")
    if num_sizes != g:
        raise ValueError(f"{group_sizes}: expected {g} sizes (one per group of {weight} {tuple(w_shape)}), got "
                         f"{num_sizes}")
    _features(k, n, GROUP_ALIGN, weight)
    return int(x_shape[0]), g, k, n


def check_group_sizes(sizes: Sequence[int], tokens: int, name: str = "group_sizes") -> list[int]:
    """Host group sizes of an MoE layer: non-negative multiples of :data:`GROUP_ALIGN` summing to at most
    ``tokens`` (the rows past the sum are padding). Returns them as ints; ValueError naming the first bad one."""
    out = []
    for i, s in enumerate(sizes):
        if isinstance(s, bool) or int(s) != s or s < 0 or int(s) % GROUP_ALIGN:
            raise ValueError(f"{name}[{i}] = {s!r}: expected a non-negative multiple of {GROUP_ALIGN} (each "
                             "expert's rows padded with zero rows)")
        out.append(int(s))
    if sum(out) > tokens:
        raise ValueError(f"{name}: the groups hold {sum(out)} rows, but x has {tokens}")
    return out
