"""Differentiable FP8 linear layers for JAX: the DeepSeek-V3 recipe as ``jax.custom_vjp`` over cupygemm's kernels.

:func:`fp8_linear` is ``y = x @ w.T`` (a dense layer) and :func:`fp8_grouped_linear` its MoE counterpart (expert g's
tokens a consecutive row range of ``x``, multiplied by ``w[g]``). Each GEMM of the step runs in FP8 with
DeepSeek-V3's fine-grained scaling, as ``/shared/docs/training-notes.md`` tabulates it:

======== =========================== ====================================== ===========================================
GEMM     computes                    A (1x128 scales)                       B
======== =========================== ====================================== ===========================================
forward  y [T, N] = x @ W^T          x, row-wise                            W, 128x128 blocks
dgrad    dx [T, K] = dy @ W          dy, row-wise                           W^T, the same blocks transposed
wgrad    dW [N, K] = dy^T @ x        dy^T, 1x128 along the tokens           x^T, 1x128 along the tokens (FP32 out)
======== =========================== ====================================== ===========================================

The casts are cupygemm's (:func:`cupygemm.jax.per_token_cast_to_fp8_transposed` with ``rowwise=True`` gives x's
row-wise cast and its token-axis cast in one call; :func:`cupygemm.jax.per_block_cast_to_fp8_with_transpose` gives W
and W^T); the GEMMs are the custom calls of :mod:`cupygemm.jax`. Both layers work under ``jax.grad``, ``jit``,
``lax.scan``, ``jax.checkpoint`` and ``vmap``; the GEMMs are planned when the step is traced (see
:mod:`cupygemm.jax`), so shapes are static and a new shape retraces.

What the forward keeps for the backward (``save``):

- ``"fp8"`` (default): only the FP8 operands the backward GEMMs read, x^T and W^T with their FP32 scales: one byte
  per element of x and of W (plus 4 bytes per 128 elements), instead of the 2-4 of the inputs.
- ``"input"``: ``x`` and ``w`` themselves; the backward casts them again. For callers that keep ``x`` alive anyway
  (then nothing extra is stored), or under ``jax.checkpoint`` policies that save the inputs.

The token count T need not be a multiple of anything: where the wgrad GEMM needs T % 16 == 0, the layer pads the
token axis with zero rows (they add nothing to dW) and slices the results back.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..kinds import KINDS
from .casts import per_block_cast_to_fp8 as _cast_blocks
from .casts import per_block_cast_to_fp8_with_transpose as _cast_w
from .casts import per_token_cast_to_fp8_transposed as _cast_xt
from .casts import per_token_cast_to_fp8_transposed_rowwise as _cast_x

_ROWS = 16  # the wgrad GEMM's K (the token count) must give 16-byte FP8 rows
_BLOCK = 128
_SAVES = ("fp8", "input")
_X_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)
_W_DTYPES = (jnp.bfloat16, jnp.float32)


class _Static(NamedTuple):
    """What the backward needs to know besides the residuals (hashable: a custom_vjp's non-differentiable
    argument)."""

    save: str
    x_dtype: np.dtype
    w_dtype: np.dtype


def _gemm(name: str) -> Any:
    """The JAX function of the kind whose eager function is ``cupygemm.NAME`` (cupygemm.jax makes them from the
    descriptors after importing this module)."""
    from . import frontend

    return frontend.public(next(kind for kind in KINDS if kind.api == name))


def _dtype_name(dt: Any) -> str:
    return np.dtype(dt).name


def _check_save(save: Any) -> str:
    if save not in _SAVES:
        raise ValueError(f"save: expected one of {_SAVES}, got {save!r}")
    return save


def _check_float(x: Any, name: str, allowed: tuple) -> None:
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(f"{name}: expected a JAX array, got {type(x).__name__}")
    if np.dtype(x.dtype) not in [np.dtype(d) for d in allowed]:
        raise TypeError(f"{name}: expected dtype {' or '.join(_dtype_name(d) for d in allowed)}, got "
                        f"{_dtype_name(x.dtype)}")


def _check_features(n: int, k: int, w_name: str) -> None:
    """N and K as every GEMM of the step needs them: the forward's K and dgrad's K are K and N (16-byte FP8 rows), the
    forward's and dgrad's BF16 outputs have N and K columns, and wgrad's FP32 output K."""
    for size, what in ((n, "N (output features)"), (k, "K (input features)")):
        if size < 1 or size % _ROWS:
            raise ValueError(f"{w_name}: {what} must be a positive multiple of {_ROWS} for the FP8 GEMMs (16-byte FP8 "
                             f"rows in the forward, dgrad and wgrad GEMMs), got {size}")


def _pad_tokens(a: jax.Array, rows: int) -> jax.Array:
    """``a`` [T, ...] with zero rows up to ``rows``."""
    extra = rows - a.shape[0]
    return a if extra == 0 else jnp.pad(a, [(0, extra)] + [(0, 0)] * (a.ndim - 1))


def _padded(t: int) -> int:
    return -(-t // _ROWS) * _ROWS


# ---- the dense layer -------------------------------------------------------------------------------------------

def _dense_forward(st: _Static, x: jax.Array, w: jax.Array) -> tuple[jax.Array, tuple]:
    t = x.shape[0]
    xp = _pad_tokens(x, _padded(t))
    x_qt, x_st, x_q, x_s = _cast_x(xp)
    w_q, w_s, w_qt, w_st = _cast_w(w)
    y = _gemm("gemm_fp8_fp8_bf16_nt")(x_q, x_s, w_q, w_s)[:t]
    res = (x_qt, x_st, w_qt, w_st) if st.save == "fp8" else (xp, w)
    return y, res


def _transposed_operands(st: _Static, res: tuple, cast_w: Any) -> tuple[jax.Array, ...]:
    """The backward GEMMs' x^T and W^T in FP8 (``x_qt, x_st, w_qt, w_st``): saved by the forward (``save="fp8"``),
    or cast again from the saved x and w."""
    if st.save == "fp8":
        return tuple(res)
    xp, w = res
    return (*_cast_xt(xp), *cast_w(w)[2:])


def _dense_backward(st: _Static, res: tuple, dy: jax.Array) -> tuple[jax.Array, jax.Array]:
    x_qt, x_st, w_qt, w_st = _transposed_operands(st, res, _cast_w)
    t = dy.shape[0]
    n, k = w_qt.shape[1], w_qt.shape[0]
    dy_qt, dy_st, dy_q, dy_s = _cast_x(_pad_tokens(dy, x_qt.shape[1]))
    dx = _gemm("gemm_fp8_fp8_bf16_nt")(dy_q, dy_s, w_qt, w_st)[:t]
    dw = _gemm("wgrad_gemm_fp8_fp8_fp32_nt_store")(dy_qt, dy_st, x_qt, x_st)  # stored: no zeros first
    return dx.astype(st.x_dtype), dw.astype(st.w_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _dense(st: _Static, x: jax.Array, w: jax.Array) -> jax.Array:
    return _dense_forward(st, x, w)[0]


_dense.defvjp(_dense_forward, _dense_backward)


def fp8_linear(x: jax.Array, w: jax.Array, *, save: str = "fp8") -> jax.Array:
    """``y = x @ w.T`` in BF16 with the DeepSeek-V3 FP8 recipe, differentiable (``jax.custom_vjp``).

    Forward: x cast per 1x128 (row-wise, and along the tokens for the backward, in one call), W per 128x128 block
    (with W^T), one FP8 GEMM. Backward: dy cast the same two ways; dx = dy @ W (FP8 GEMM against W^T, BF16 out) and
    dW = dy^T @ x (the FP8 weight-gradient GEMM, FP32 out).

    Args:
        x: [..., K] bfloat16, float16 or float32; the leading dimensions are T tokens (any T; the layer pads the token
            axis with zero rows where the kernels need it).
        w: [N, K] bfloat16 or float32 (the master weight), N and K positive multiples of 16.
        save: what the forward keeps for the backward: ``"fp8"`` (default) the FP8 copies x^T and W^T with their
            scales (1 byte per element), ``"input"`` x and w (cast again in the backward).

    Returns:
        bfloat16 [..., N]. Cotangents come back in the dtypes of ``x`` and ``w`` (dW is computed in FP32).

    Raises:
        TypeError, ValueError: at trace time, naming the argument, for dtypes or shapes the kernels cannot take.
    """
    save = _check_save(save)
    _check_float(x, "x", _X_DTYPES)
    _check_float(w, "w", _W_DTYPES)
    if w.ndim != 2:
        raise ValueError(f"w: expected a 2-D [N, K] array, got shape {tuple(w.shape)}")
    if x.ndim < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"x: expected [..., K] with K = {w.shape[1]} (w is [N, K] = {tuple(w.shape)}), got shape "
                         f"{tuple(x.shape)}")
    n, k = w.shape
    _check_features(n, k, "w")
    lead = tuple(x.shape[:-1])
    x2 = x.reshape(-1, k)
    if x2.shape[0] == 0:  # no tokens: y is empty and the cotangents zeros (y does not depend on x or w)
        return jnp.zeros(lead + (n,), jnp.bfloat16)
    y = _dense(_Static(save, np.dtype(x.dtype), np.dtype(w.dtype)), x2, w)
    return y.reshape(lead + (n,))


# ---- the grouped (MoE) layer -----------------------------------------------------------------------------------

def m_indices_from_sizes(group_sizes: jax.Array, rows: int) -> jax.Array:
    """The contiguous layout's row -> group map from the groups' row counts: row r belongs to the group whose range
    holds it, rows past ``sum(group_sizes)`` are padding (-1). Computed on the device (``group_sizes`` may be
    traced)."""
    ends = jnp.cumsum(group_sizes.astype(jnp.int32))
    g = jnp.searchsorted(ends, jnp.arange(rows, dtype=jnp.int32), side="right").astype(jnp.int32)
    return jnp.where(g < group_sizes.shape[0], g, jnp.int32(-1))


def _cast_w_grouped(w: jax.Array) -> tuple[jax.Array, ...]:
    """Every expert's W [G, N, K] and W^T [G, K, N] cast per 128x128 block: ``(q, s, q_t, s_t)``."""
    g, n, k = w.shape
    if n % _BLOCK == 0:  # no block straddles two experts: one cast of the stacked rows
        q, s = _cast_blocks(w.reshape(g * n, k))
        q, s = q.reshape(g, n, k), s.reshape(g, n // _BLOCK, -1)
        return q, s, jnp.swapaxes(q, 1, 2), jnp.swapaxes(s, 1, 2)
    return jax.vmap(_cast_w)(w)


def _grouped_forward(st: _Static, x: jax.Array, w: jax.Array, group_sizes: jax.Array) -> tuple[jax.Array, tuple]:
    t = x.shape[0]
    xp = _pad_tokens(x, _padded(t))
    x_qt, x_st, x_q, x_s = _cast_x(xp)
    w_q, w_s, w_qt, w_st = _cast_w_grouped(w)
    idx = m_indices_from_sizes(group_sizes, xp.shape[0])
    y = _gemm("m_grouped_gemm_fp8_fp8_bf16_nt_contiguous")(x_q, x_s, w_q, w_s, idx)[:t]
    res = ((x_qt, x_st, w_qt, w_st) if st.save == "fp8" else (xp, w)) + (group_sizes,)
    return y, res


def _grouped_backward(st: _Static, res: tuple, dy: jax.Array) -> tuple[jax.Array, jax.Array, None]:
    *ops, group_sizes = res
    x_qt, x_st, w_qt, w_st = _transposed_operands(st, ops, _cast_w_grouped)
    t = dy.shape[0]
    g, k, n = w_qt.shape
    rows = x_qt.shape[1]
    dy_qt, dy_st, dy_q, dy_s = _cast_x(_pad_tokens(dy, rows))
    idx = m_indices_from_sizes(group_sizes, rows)
    # Padding rows get no dx: y's padding rows do not depend on x.
    dx = _gemm("m_grouped_gemm_fp8_fp8_bf16_nt_contiguous")(dy_q, dy_s, w_qt, w_st, idx)[:t]
    dw = _gemm("k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns")(dy_qt, dy_st, x_qt, x_st, group_sizes,
                                                               jnp.zeros((g, n, k), jnp.float32))
    return dx.astype(st.x_dtype), dw.astype(st.w_dtype), None


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _grouped(st: _Static, x: jax.Array, w: jax.Array, group_sizes: jax.Array) -> jax.Array:
    return _grouped_forward(st, x, w, group_sizes)[0]


_grouped.defvjp(_grouped_forward, _grouped_backward)


def fp8_grouped_linear(x: jax.Array, w: jax.Array, group_sizes: jax.Array, *, save: str = "fp8") -> jax.Array:
    """The MoE experts' ``y[r] = x[r] @ w[g].T`` for the rows r of expert g, in BF16 with the DeepSeek-V3 FP8 recipe,
    differentiable in ``x`` and ``w`` (``jax.custom_vjp``).

    Layout (m-grouped contiguous): expert g's tokens are the consecutive rows ``o_g .. o_g + group_sizes[g]`` of
    ``x`` (``o_g`` the sum of the earlier sizes); each size is a multiple of 128 (pad each expert's tokens with zero
    rows), so that no 1x128 scale block along the tokens straddles two experts. Rows past ``sum(group_sizes)`` are
    padding: their outputs are zeros and their dx is zero.

    Forward: the m-grouped contiguous FP8 GEMM (row -> expert map made on the device from ``group_sizes``). Backward:
    dx by the same GEMM against each expert's W^T; dW [G, N, K] by the k-grouped weight-gradient GEMM over the
    experts' column ranges of dy^T and x^T (one launch).

    Args:
        x: [T, K] bfloat16, float16 or float32 (any T).
        w: [G, N, K] bfloat16 or float32, N and K positive multiples of 16.
        group_sizes: int32 [G] (may be traced and change between calls; not checked on the host): multiples of 128
            summing to at most T. It gets no cotangent.
        save: ``"fp8"`` (default) or ``"input"``, as for :func:`fp8_linear`.

    Returns:
        bfloat16 [T, N].
    """
    save = _check_save(save)
    _check_float(x, "x", _X_DTYPES)
    _check_float(w, "w", _W_DTYPES)
    if w.ndim != 3:
        raise ValueError(f"w: expected a 3-D [G, N, K] array, got shape {tuple(w.shape)}")
    if x.ndim != 2 or x.shape[1] != w.shape[2]:
        raise ValueError(f"x: expected [T, K] with K = {w.shape[2]} (w is [G, N, K] = {tuple(w.shape)}), got shape "
                         f"{tuple(x.shape)}")
    if not hasattr(group_sizes, "dtype") or np.dtype(group_sizes.dtype) != np.int32 \
            or tuple(group_sizes.shape) != (w.shape[0],):
        got = (f"{_dtype_name(group_sizes.dtype)} {tuple(group_sizes.shape)}" if hasattr(group_sizes, "dtype")
               else type(group_sizes).__name__)
        raise TypeError(f"group_sizes: expected an int32 array of shape ({w.shape[0]},) (one size per expert), got "
                        f"{got}")
    g, n, k = w.shape
    if g < 1:
        raise ValueError(f"w: expected at least one expert, got shape {tuple(w.shape)}")
    _check_features(n, k, "w")
    if x.shape[0] == 0:
        return jnp.zeros((0, n), jnp.bfloat16)
    return _grouped(_Static(save, np.dtype(x.dtype), np.dtype(w.dtype)), x, w, group_sizes)


__all__ = ["fp8_linear", "fp8_grouped_linear", "m_indices_from_sizes"]
