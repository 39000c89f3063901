"""The 1D1D kernel's kinds (cuda_src/fp8_wgrad.cu): both operands scaled per 1x128 along K, FP32 out accumulated in
place. They are the weight gradients of the recipe (``/shared/docs``: dW [N, K] += dY^T @ X, K = tokens): dense
(:func:`wgrad_gemm_fp8_fp8_fp32_nt`) and, for MoE experts, one launch over every expert's own token count, with each
expert's operands as their own blocks (:func:`k_grouped_wgrad_gemm_fp8_fp8_fp32_nt`, DeepGEMM's layout) or as
consecutive column ranges of one matrix (:func:`k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns`, what the transposed
casts of a MoE layer's dY and X give when each expert's tokens are a consecutive run of rows). Semantics are DeepGEMM 03d0be3's; the k-grouped kind also takes the
group sizes as an int32 array on the device, so it runs inside CUDA graphs and ``jax.jit`` with sizes that change.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import validate
from ..gemm import call
from ..layout import get_tma_aligned_size
from ..tensors import F32, I32, View
from ..util import ceil_div
from ..validate import EAGER, Names, Problem
from . import ONE_D_ONE_D, GemmKind, register

#: Group sizes along K must keep every group's rows 16-byte aligned for TMA (FP8: 16 elements).
K_ALIGN = 16


def _row_scales(sf: View, rows: int, kb: int, name: str) -> tuple[View, bool, int, tuple[int, int, int] | None]:
    """1x128 scales of ``rows`` rows as the 1D1D kernel reads them: [kb][rows_pad] (M- or N-major, TMA-aligned).

    Takes DeepGEMM's two forms: [rows, kb] in any layout (row-major from the casts: copied per call; already
    rows-major and aligned, as ``get_col_major_tma_aligned_tensor`` makes it: used in place), or [kb, rows], the
    transposed stack (used in place when contiguous with rows % 4 == 0). A square array (rows == kb) is read as
    [rows, kb]: the casts' row-major scales are the common case (DeepGEMM 03d0be3 reads it as the stack, which
    misreads the casts' scales). Returns the [rows, kb] View, whether it is used in place, the padded stride and the
    copy strides."""
    if sf.dtype != F32:
        raise TypeError(f"{name}: expected float32 scales, got {sf.dtype}")
    if sf.ndim == 2 and tuple(sf.shape) == (kb, rows) and rows != kb:
        sf = View(sf.ptr, (rows, kb), (sf.strides[1], sf.strides[0]), sf.dtype, sf.device, sf.obj)
    validate.f32(sf, name, (rows, kb))
    pad = get_tma_aligned_size(rows, 4)
    in_place = validate.is_m_major(sf, pad, kb)
    return sf, in_place, pad, validate.sfa_copy_strides(sf, in_place)


def _fp32_out(out: View | None, shape: tuple[int, ...], name: str) -> None:
    if out is None:
        raise TypeError(f"{name}: the weight-gradient GEMMs accumulate into out (FP32 {list(shape)}); pass it "
                        "(zeros for a plain product)")
    validate.out_operand(out, shape, name, F32)


def _check_dense(views: tuple[View | None, ...], names: Names, kind: GemmKind) -> Problem:
    a, sfa, b, sfb, out = views[:5]
    m, n, k = validate.nt_operands(a, b, names, "K (the token count)")
    if k % K_ALIGN:
        raise ValueError(f"K must be a multiple of {K_ALIGN} (16-byte aligned FP8 rows for TMA), got K = {k}")
    kb = ceil_div(k, 128)
    sfa, a_in_place, m_pad, a_strides = _row_scales(sfa, m, kb, names.sfa)
    sfb, b_in_place, n_pad, b_strides = _row_scales(sfb, n, kb, names.sfb)
    validate.rows_tma_unless_empty(a, names.a)
    validate.rows_tma_unless_empty(b, names.b)
    if kind.accumulates:
        _fp32_out(out, (m, n), names.out)
    else:
        validate.out_operand(out, (m, n), names.out, F32)
    operands = [(a, "A"), (sfa, "A scales"), (b, "B"), (sfb, "B scales")] + ([(out, "out")] if out is not None else [])
    dev = validate.device_of([v for v, _ in operands], [name for _, name in operands])
    return Problem(kind, m, n, k, 1, a_in_place, m_pad, dev, (m, n), a_strides, b_in_place, n_pad, b_strides)


def check_wgrad(views: tuple[View | None, ...], static: int | None = None, names: Names = EAGER) -> Problem:
    return _check_dense(views, names, WGRAD)


def check_wgrad_store(views: tuple[View | None, ...], static: int | None = None, names: Names = EAGER) -> Problem:
    return _check_dense(views, names, WGRAD_STORE)


def _flat_fp8(v: View, name: str) -> int:
    """A flat FP8 operand (any shape, contiguous): its element count."""
    validate.fp8(v, name, v.ndim)
    if not v.c_contiguous:
        raise ValueError(f"{name}: expected a contiguous array (groups are laid out back to back), got strides "
                         f"{tuple(v.strides)}")
    if v.size and v.ptr % validate.TMA_ALIGN:
        raise ValueError(f"{name}: expected a 16-byte aligned base address, got 0x{v.ptr:x}")
    return v.size


def check_k_grouped_wgrad(views: tuple[View | None, ...], static: int | None = None, names: Names = EAGER) -> Problem:
    a, sfa, b, sfb, out, batch_sizes = views
    if out is None:
        raise TypeError(f"{names.out}: the k-grouped weight gradient accumulates into out (FP32 [G, M, N]); pass it")
    if out.ndim != 3:
        raise ValueError(f"{names.out}: expected a 3-D [G, M, N] float32 array, got shape {tuple(out.shape)}")
    g, m, n = out.shape
    _fp32_out(out, (g, m, n), names.out)
    a_size, b_size = _flat_fp8(a, names.a), _flat_fp8(b, names.b)
    layout = names.layout or "batch_sizes"
    validate.int32_vector(batch_sizes, layout, g)
    if m and a_size % m or n and b_size % n:
        raise ValueError(f"{names.a} holds {a_size} elements and {names.b} {b_size}: expected M x sum(k) = "
                         f"{m} x K and N x sum(k) = {n} x K for one K")
    k_total = a_size // m if m else 0
    if n and b_size // n != k_total:
        raise ValueError(f"{names.a} holds {k_total} tokens of M = {m} rows but {names.b} holds {b_size // n} of "
                         f"N = {n}: the groups' K must be the same for both")
    if m % 4 or n % 4:
        raise ValueError(f"M and N must be multiples of 4 for the k-grouped kernel (16-byte aligned rows of the "
                         f"stacked scales and of out), got M = {m}, N = {n}")
    for sf, rows, name in ((sfa, m, names.sfa), (sfb, n, names.sfb)):
        if sf.dtype != F32:
            raise TypeError(f"{name}: expected float32 scales, got {sf.dtype}")
        if sf.ndim != 2 or sf.shape[1] != rows or not sf.c_contiguous:
            raise ValueError(f"{name}: expected the groups' scales stacked transposed, a contiguous "
                             f"[sum(ceil(k_g / 128)), {rows}] float32 array, got shape {tuple(sf.shape)} strides "
                             f"{tuple(sf.strides)}")
    if sfa.shape[0] != sfb.shape[0]:
        raise ValueError(f"{names.sfa} has {sfa.shape[0]} K blocks and {names.sfb} {sfb.shape[0]}: expected the same")
    validate.check_limits(M=m, N=n, K=k_total, G=g)
    dev = validate.device_of([a, sfa, b, sfb, out, batch_sizes], ["A", "A scales", "B", "B scales", "out", layout])
    return Problem(K_GROUPED_WGRAD, m, n, k_total, g, True, m, dev, (g, m, n), None, True, n, None)


def check_k_grouped_wgrad_columns(views: tuple[View | None, ...], static: int | None = None,
                                  names: Names = EAGER) -> Problem:
    a, sfa, b, sfb, out, group_sizes = views
    m, n, k = validate.nt_operands(a, b, names, "K (the token count)")
    if k % K_ALIGN:
        raise ValueError(f"K must be a multiple of {K_ALIGN} (16-byte aligned FP8 rows for TMA), got K = {k}")
    if out is None:
        raise TypeError(f"{names.out}: the k-grouped weight gradient accumulates into out (FP32 [G, M, N]); pass it")
    if out.ndim != 3:
        raise ValueError(f"{names.out}: expected a 3-D [G, M, N] float32 array, got shape {tuple(out.shape)}")
    g = out.shape[0]
    _fp32_out(out, (g, m, n), names.out)
    validate.int32_vector(group_sizes, names.layout or "group_sizes", g)
    kb = ceil_div(k, 128)
    sfa, a_in_place, m_pad, a_strides = _row_scales(sfa, m, kb, names.sfa)
    sfb, b_in_place, n_pad, b_strides = _row_scales(sfb, n, kb, names.sfb)
    validate.rows_tma_unless_empty(a, names.a)
    validate.rows_tma_unless_empty(b, names.b)
    validate.check_limits(G=g)
    dev = validate.device_of([a, sfa, b, sfb, out, group_sizes],
                             ["A", "A scales", "B", "B scales", "out", names.layout or "group_sizes"])
    return Problem(K_GROUPED_WGRAD_COLUMNS, m, n, k, g, a_in_place, m_pad, dev, (g, m, n), a_strides, b_in_place,
                   n_pad, b_strides)


def check_batch_sizes(sizes: np.ndarray, problem: Problem) -> None:
    """Host check of k-grouped sizes (``CUPYGEMM_CHECK_INPUTS=1`` and host lists): non-negative multiples of 16 that
    fit the operands; ValueError naming the first bad entry."""
    sizes = np.asarray(sizes)
    bad = np.nonzero((sizes < 0) | (sizes % K_ALIGN != 0))[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"batch_sizes[{i}] = {int(sizes[i])}: expected a non-negative multiple of {K_ALIGN}")
    total = int(sizes.astype(np.int64).sum())
    if total > problem.k:
        raise ValueError(f"batch_sizes sum to {total} tokens, but A and B hold {problem.k}")


def check_column_sizes(sizes: np.ndarray, problem: Problem) -> None:
    """Host check of the columns layout's sizes: as :func:`check_batch_sizes`, and every group but the last starts
    on a multiple of 128 columns (so every one but the last non-empty group is a multiple of 128)."""
    sizes = np.asarray(sizes)
    bad = np.nonzero((sizes < 0) | (sizes % K_ALIGN != 0))[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"group_sizes[{i}] = {int(sizes[i])}: expected a non-negative multiple of {K_ALIGN}")
    starts = np.concatenate([[0], np.cumsum(sizes.astype(np.int64))])
    off = np.nonzero((sizes > 0) & (starts[:-1] % 128 != 0))[0]
    if off.size:
        i = int(off[0])
        raise ValueError(f"group_sizes: group {i} starts at column {int(starts[i])}, not a multiple of 128 (each "
                         f"group's tokens must fill whole 1x128 scale blocks; pad every group but the last to 128)")
    if starts[-1] > problem.k:
        raise ValueError(f"group_sizes sum to {int(starts[-1])} tokens, but A and B hold {problem.k}")


#: The bench's shapes (DeepGEMM 03d0be3 test_core's): wgrad (M, N, K = tokens), k-grouped (G, M, N, K = each group's
#: base token count; the bench draws the groups' K around it as test_core does).
WGRAD_SHAPES = tuple((m, n, k) for k in (4096, 8192) for m, n in (
    (7168, 2112), (1536, 24576), (512, 32768), (16384, 7168), (7168, 4096), (2048, 7168)))
K_GROUPED_WGRAD_SHAPES = tuple((g, m, n, k) for g, k in ((4, 4096), (4, 8192), (8, 4096))
                               for m, n in ((7168, 4096), (2048, 7168)))

WGRAD = register(GemmKind(
    name="wgrad", kid=3, api="wgrad_gemm_fp8_fp8_fp32_nt", summary="D += A @ B.T, both scaled 1x128, FP32 D",
    family=ONE_D_ONE_D, check=check_wgrad, a_dims="MK", b_dims="NK", out_dims="MN", out_dtype=F32,
    accumulates=True, b_block_scales=False, seed_shapes=WGRAD_SHAPES))
WGRAD_STORE = register(GemmKind(
    name="wgrad_store", kid=6, api="wgrad_gemm_fp8_fp8_fp32_nt_store",
    summary="D = A @ B.T, both scaled 1x128, FP32 D stored (a fresh weight gradient: no zeros first)",
    family=ONE_D_ONE_D, check=check_wgrad_store, a_dims="MK", b_dims="NK", out_dims="MN", out_dtype=F32,
    b_block_scales=False, seed_shapes=WGRAD_SHAPES))
K_GROUPED_WGRAD = register(GemmKind(
    name="k_grouped_wgrad", kid=4, api="k_grouped_wgrad_gemm_fp8_fp8_fp32_nt",
    summary="D[g] += A_g @ B_g.T with each group's own K (MoE weight gradients), FP32 D", family=ONE_D_ONE_D,
    check=check_k_grouped_wgrad, check_layout=check_batch_sizes, a_dims="F", b_dims="F", out_dims="GMN",
    layout="batch_sizes", out_dtype=F32, accumulates=True, b_block_scales=False, shape_dims="GMNK",
    seed_shapes=K_GROUPED_WGRAD_SHAPES))
K_GROUPED_WGRAD_COLUMNS = register(GemmKind(
    name="k_grouped_wgrad_columns", kid=5, api="k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns",
    summary="D[g] += A[:, K_g] @ B[:, K_g].T over consecutive column ranges K_g of A and B, FP32 D",
    family=ONE_D_ONE_D, check=check_k_grouped_wgrad_columns, check_layout=check_column_sizes, a_dims="MK",
    b_dims="NK", out_dims="GMN", layout="group_sizes", out_dtype=F32, accumulates=True, b_block_scales=False,
    shape_dims="GMNK", seed_shapes=K_GROUPED_WGRAD_SHAPES))


# ---- the public functions --------------------------------------------------------------------------------------

def wgrad_gemm_fp8_fp8_fp32_nt(lhs: tuple[Any, Any], rhs: tuple[Any, Any], out: Any, *, stream: Any = None) -> Any:
    """``out += A @ B.T`` with both operands scaled per 1x128 block along K: the weight gradient dW += dY^T X.

    Args:
        lhs: ``(A, SFA)``: A float8_e4m3fn (or uint8 e4m3 bits) [M, K], K-major (K is the token axis); SFA float32
            [M, ceil(K/128)] in any layout (the casts' row-major one is copied per call into the kernel's; M-major
            TMA-aligned, as ``get_col_major_tma_aligned_tensor`` or
            ``per_token_cast_to_fp8_transposed(..., m_major_scales=True)`` make it, is used in place) or the
            transposed stack [ceil(K/128), M] (used in place when M % 4 == 0).
        rhs: ``(B, SFB)``: B [N, K] and SFB [N, ceil(K/128)], likewise.
        out: float32 [M, N], accumulated into in place (its row stride a multiple of 4 elements). Required.
        stream: as for :func:`cupygemm.gemm_fp8_fp8_bf16_nt`.

    Returns ``out``. K % 16 == 0 (any multiple of 16; K == 0 leaves ``out`` as it is). Each element of ``out``
    receives exactly one FP32 addition per call, so results are bitwise repeatable. ``out`` must not overlap an
    input.
    """
    return call(WGRAD, lhs, rhs, out, None, None, stream)


def wgrad_gemm_fp8_fp8_fp32_nt_store(lhs: tuple[Any, Any], rhs: tuple[Any, Any], out: Any = None, *,
                                     stream: Any = None) -> Any:
    """``out = A @ B.T`` with both operands scaled per 1x128 block along K: :func:`wgrad_gemm_fp8_fp8_fp32_nt` for a
    fresh weight gradient, whose output needs no zeros first (the kernel stores its tiles instead of adding them).

    Operands as for :func:`wgrad_gemm_fp8_fp8_fp32_nt`; ``out`` float32 [M, N] (any contents; its row stride a
    multiple of 4 elements) or None for a new array of the caller's framework. Returns it. K == 0 gives zeros.
    Bitwise the same as accumulating into zeros.
    """
    return call(WGRAD_STORE, lhs, rhs, out, None, None, stream)


def k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(lhs: tuple[Any, Any], rhs: tuple[Any, Any], out: Any, batch_sizes: Any,
                                         *, stream: Any = None) -> Any:
    """``out[g] += A_g @ B_g.T`` for G groups with their own K (the tokens routed to expert g), one launch.

    Args:
        lhs: ``(A, SFA)``: A flat FP8 with every group's [M, k_g] K-major matrix back to back (group g starts at
            element M x (k_0 + ... + k_{g-1})), any shape, contiguous; SFA float32 [sum_g ceil(k_g/128), M], the
            groups' scales stacked transposed (group g's K blocks follow the earlier groups').
        rhs: ``(B, SFB)``: B likewise with N, SFB [sum_g ceil(k_g/128), N].
        out: float32 [G, M, N], accumulated into in place. Required.
        batch_sizes: the k_g: a host list/tuple of ints (DeepGEMM's form; copied to the device each call), or an
            int32 array [G] on the device, read by the kernel: no host synchronization, capturable in a CUDA graph
            and traceable in ``cupygemm.jax``, with sizes that may change between replays. Each k_g is a
            non-negative multiple of 16 (need not be one of 128); empty groups leave ``out[g]`` untouched. Device
            sizes past what A and B hold are clamped (the kernel never reads past them);
            ``CUPYGEMM_CHECK_INPUTS=1`` reports them as ValueError instead.
        stream: as for :func:`cupygemm.gemm_fp8_fp8_bf16_nt`.

    Returns ``out``. M % 4 == 0 and N % 4 == 0. Bitwise repeatable.
    """
    if isinstance(batch_sizes, (list, tuple, np.ndarray)):
        batch_sizes = _device_sizes(batch_sizes, lhs, stream)
    return call(K_GROUPED_WGRAD, lhs, rhs, out, batch_sizes, None, stream)


def k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns(lhs: tuple[Any, Any], rhs: tuple[Any, Any], out: Any,
                                                 group_sizes: Any, *, stream: Any = None) -> Any:
    """``out[g] += A[:, o_g:o_g+k_g] @ B[:, o_g:o_g+k_g].T`` (``o_g = k_0 + ... + k_{g-1}``), one launch: the MoE
    experts' weight gradients when each expert's tokens are a consecutive run of rows of dY [T, N] and X [T, K], so
    that their transposed casts (:func:`cupygemm.per_token_cast_to_fp8_transposed`) hold the experts as column ranges.

    Args:
        lhs: ``(A, SFA)``: A float8_e4m3fn (or uint8 bits) [M, T], K-major; SFA float32 [M, ceil(T/128)] in any
            layout (the transposed cast's row-major one is copied per call; M-major TMA-aligned is used in place) or
            the stack [ceil(T/128), M], as for :func:`wgrad_gemm_fp8_fp8_fp32_nt`.
        rhs: ``(B, SFB)``: B [N, T] and SFB likewise.
        out: float32 [G, M, N], accumulated into in place. Required.
        group_sizes: the k_g: an int32 array [G] on the device (read by the kernel: no host synchronization,
            capturable in a CUDA graph, traceable in ``cupygemm.jax``) or a host list. Each k_g is a non-negative
            multiple of 16, every group starts on a multiple of 128 columns (pad each expert's tokens to 128; the
            last group may end anywhere), and they sum to at most T. On the device, groups breaking that are
            skipped (their ``out[g]`` untouched); ``CUPYGEMM_CHECK_INPUTS=1`` (and host lists) report them as
            ValueError instead.
        stream: as for :func:`cupygemm.gemm_fp8_fp8_bf16_nt`.

    Returns ``out``. T % 16 == 0. Bitwise repeatable.
    """
    if isinstance(group_sizes, (list, tuple, np.ndarray)):
        group_sizes = _device_sizes(group_sizes, lhs, stream, "group_sizes", 128)
    return call(K_GROUPED_WGRAD_COLUMNS, lhs, rhs, out, group_sizes, None, stream)


def _device_sizes(sizes: Sequence[int], lhs: Any, stream: Any, name: str = "batch_sizes", start_align: int = 1
                  ) -> Any:
    """Host group sizes as an int32 array of A's framework on its device, copied on the call's stream (checked on
    the host first: they are known there)."""
    host = np.asarray(sizes)
    if host.ndim != 1 or host.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected a list of ints or an int32 device array, got {sizes!r}")
    bad = np.nonzero((host < 0) | (host % K_ALIGN != 0))[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{name}[{i}] = {int(host[i])}: expected a non-negative multiple of {K_ALIGN}")
    starts = np.cumsum(host.astype(np.int64)) - host
    off = np.nonzero((host > 0) & (starts % start_align != 0))[0]
    if off.size:
        i = int(off[0])
        raise ValueError(f"{name}: group {i} starts at column {int(starts[i])}, not a multiple of {start_align} "
                         f"(pad every group but the last to a multiple of {start_align})")
    from ..tensors import device_array

    a = lhs[0] if isinstance(lhs, (tuple, list)) else lhs
    return device_array(host.astype(np.int32), a, stream)


def wgrad_dg2(a: tuple[Any, Any], b: tuple[Any, Any], d: Any, c: Any, *, stream: Any = None, **options: Any) -> Any:
    """``fp8_gemm_nt(a, b, d, c, recipe=(1, 1, 128))``: d = c + a @ b.T (c may be d; else copied into d first); with
    ``c=None`` (where DeepGEMM asserts), d = a @ b.T (:func:`wgrad_gemm_fp8_fp8_fp32_nt_store`)."""
    if options:
        raise TypeError(f"unexpected keyword arguments {sorted(options)} with recipe (1, 1, 128)")
    if c is None:
        return wgrad_gemm_fp8_fp8_fp32_nt_store(a, b, d, stream=stream)
    from ..tensors import copy_into

    if c is not d:
        copy_into(d, c, stream)
    return wgrad_gemm_fp8_fp8_fp32_nt(a, b, d, stream=stream)


def k_grouped_fp8_gemm_nt_contiguous(a: tuple[Any, Any], b: tuple[Any, Any], d: Any, ks: Sequence[int],
                                     ks_tensor: Any = None, c: Any = None, recipe: Any = (1, 1, 128), *,
                                     stream: Any = None) -> Any:
    """DeepGEMM 2.x name of :func:`k_grouped_wgrad_gemm_fp8_fp8_fp32_nt`: ``d = c + a @ b.T`` per group with K =
    ``ks`` (host list) or ``ks_tensor`` (int32 on the device: used when given, so the call needs no host list).
    ``c`` may alias ``d``; otherwise it is copied into ``d`` first. Only recipe (1, 1, 128)."""
    if recipe is not None and tuple(recipe) != (1, 1, 128):
        raise ValueError(f"recipe: the k-grouped GEMM takes (1, 1, 128) only, got {recipe!r}")
    if c is not None and c is not d:
        from ..tensors import copy_into

        copy_into(d, c, stream)
    return k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(a, b, d, ks_tensor if ks_tensor is not None else ks, stream=stream)


__all__ = ["wgrad_gemm_fp8_fp8_fp32_nt", "wgrad_gemm_fp8_fp8_fp32_nt_store", "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt",
           "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns", "k_grouped_fp8_gemm_nt_contiguous"]
