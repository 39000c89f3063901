"""The forward kernel's kinds (cuda_src/fp8_gemm.cu): A scaled per 1x128, B per 128x128 block, BF16 out.

Each kind is its descriptor, its argument check and its public function (DeepGEMM 03d0be3's name); the DeepGEMM 2.x
names of the same calls follow at the end.
"""
from __future__ import annotations

from typing import Any

from .. import shapes as seed_shapes
from .. import validate
from ..gemm import call
from ..layout import get_tma_aligned_size
from ..tensors import View
from ..util import ceil_div
from ..validate import EAGER, Names, Problem
from . import FORWARD, GemmKind, register


def _problem(kind: GemmKind, a: View, sfa: View, m: int, n: int, k: int, g: int, kb: int, views: list[View],
             names: list[str], out_shape: tuple[int, ...]) -> Problem:
    dev = validate.device_of(views, names)
    m_pad = get_tma_aligned_size(m, 4)
    m_major = validate.is_m_major(sfa, m_pad, kb)
    return Problem(kind, m, n, k, g, m_major, m_pad, dev, out_shape, validate.sfa_copy_strides(sfa, m_major))


def _grouped_b(b: View, sfb: View, k: int, names: Names) -> tuple[int, int]:
    validate.fp8(b, names.b, 3)
    g, n, kb_ = b.shape
    if kb_ != k:
        raise ValueError(f"{names.a} has K = {k} but {names.b} is [G, N, K] = {tuple(b.shape)}")
    validate.f32(sfb, names.sfb, (g, ceil_div(n, 128), ceil_div(k, 128)))
    validate.rows_tma_unless_empty(b, names.b)
    if not sfb.c_contiguous:
        raise ValueError(f"{names.sfb}: expected a C-contiguous array; call .contiguous()/.copy() first")
    return g, n


def check_normal(views: tuple[View | None, ...], static: int | None = None, names: Names = EAGER) -> Problem:
    a, sfa, b, sfb, out = views[:5]
    m, n, k = validate.nt_operands(a, b, names)
    validate.check_k_n(k, n)
    kb = ceil_div(k, 128)
    validate.f32(sfa, names.sfa, (m, kb))
    validate.f32(sfb, names.sfb, (ceil_div(n, 128), kb))
    validate.rows_tma_unless_empty(a, names.a)
    validate.rows_tma_unless_empty(b, names.b)
    if not sfb.c_contiguous:
        raise ValueError(f"{names.sfb}: expected a C-contiguous array; call .contiguous()/.copy() first")
    validate.out_operand(out, (m, n), names.out)
    views_, names_ = [a, sfa, b, sfb], ["A", "A scales", "B", "B scales"]
    if out is not None:
        views_.append(out), names_.append("out")
    return _problem(NORMAL, a, sfa, m, n, k, 1, kb, views_, names_, (m, n))


def check_contiguous(views: tuple[View | None, ...], static: int | None = None, names: Names = EAGER) -> Problem:
    a, sfa, b, sfb, out, m_indices = views
    validate.fp8(a, names.a, 2)
    m, k = a.shape
    g, n = _grouped_b(b, sfb, k, names)
    validate.check_limits(M=m, N=n, K=k, G=g)
    validate.check_k_n(k, n)
    kb = ceil_div(k, 128)
    validate.f32(sfa, names.sfa, (m, kb))
    validate.rows_tma_unless_empty(a, names.a)
    validate.int32_vector(m_indices, names.layout or "m_indices", m)
    validate.out_operand(out, (m, n), names.out)
    views_, names_ = [a, sfa, b, sfb, m_indices], ["A", "A scales", "B", "B scales", "m_indices"]
    if out is not None:
        views_.append(out), names_.append("out")
    return _problem(CONTIGUOUS, a, sfa, m, n, k, g, kb, views_, names_, (m, n))


def check_masked(views: tuple[View | None, ...], expected_m: int, names: Names = EAGER) -> Problem:
    a, sfa, b, sfb, out, masked_m = views
    validate.fp8(a, names.a, 3)
    g, m, k = a.shape
    gb, n = _grouped_b(b, sfb, k, names)
    if gb != g:
        raise ValueError(f"{names.a} has {g} groups ([G, max_m, K] = {tuple(a.shape)}) but {names.b} has {gb}")
    validate.check_limits(max_m=m, N=n, K=k, G=g, total_rows=g * m)
    validate.check_k_n(k, n)
    validate.check_expected_m(expected_m)
    kb = ceil_div(k, 128)
    validate.f32(sfa, names.sfa, (g, m, kb))
    validate.rows_tma_unless_empty(a, names.a)
    validate.int32_vector(masked_m, names.layout or "masked_m", g)
    validate.out_operand(out, (g, m, n), names.out)
    if out is not None and out.size:
        if g > 1 and out.strides[0] != m * out.strides[1]:
            # The kernel finds a group's rows of D at group x M rows (its partial tiles are stored row by row).
            raise ValueError(f"{names.out}: expected the groups back to back (strides[0] == M x strides[1] = "
                             f"{m * out.strides[1]} bytes), got strides {tuple(out.strides)}; pass out=None or an "
                             "array allocated as (G, M, N)")
    views_, names_ = [a, sfa, b, sfb, masked_m], ["A", "A scales", "B", "B scales", "masked_m"]
    if out is not None:
        views_.append(out), names_.append("out")
    return _problem(MASKED, a, sfa, m, n, k, g, kb, views_, names_, (g, m, n))


NORMAL = register(GemmKind(
    name="normal", kid=0, api="gemm_fp8_fp8_bf16_nt", summary="D = A @ B.T", family=FORWARD, check=check_normal,
    a_dims="MK", b_dims="NK", out_dims="MN", seed_shapes=seed_shapes.NORMAL))
CONTIGUOUS = register(GemmKind(
    name="contiguous", kid=1, api="m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
    summary="MoE grouped GEMM, contiguous layout: row r of A uses B[m_indices[r]]", family=FORWARD,
    check=check_contiguous, a_dims="MK", b_dims="GNK", out_dims="MN", layout="m_indices", zero_new_out=True,
    shape_dims="GMNK", aliases=("contig",), check_layout=lambda idx, p: validate.check_m_indices(idx, p.num_groups),
    seed_shapes=seed_shapes.CONTIGUOUS))
MASKED = register(GemmKind(
    name="masked", kid=2, api="m_grouped_gemm_fp8_fp8_bf16_nt_masked",
    summary="MoE grouped GEMM, masked layout: group g computes its first masked_m[g] rows", family=FORWARD,
    check=check_masked, a_dims="GMK", b_dims="GNK", out_dims="GMN", layout="masked_m", static="expected_m",
    zero_new_out=True, shape_dims="GMNK", check_layout=lambda mm, p: validate.check_masked_m(mm, p.m),
    seed_shapes=seed_shapes.MASKED))


# ---- the public functions --------------------------------------------------------------------------------------

def gemm_fp8_fp8_bf16_nt(lhs: tuple[Any, Any], rhs: tuple[Any, Any], out: Any = None, *, stream: Any = None) -> Any:
    """D = A @ B.T with DeepSeek-V3 fine-grained FP8 scaling, BF16 output.

    Args:
        lhs: ``(A, SFA)``: A float8_e4m3fn (or uint8 holding e4m3 bits) [M, K]; SFA float32 [M, ceil(K/128)],
            one scale per row and 128 columns of K. Row-major SFA is transposed once per call into the TMA-aligned
            M-major layout; SFA already in that layout (see ``get_col_major_tma_aligned_tensor``) is used as is.
        rhs: ``(B, SFB)``: B float8_e4m3fn [N, K]; SFB float32 [ceil(N/128), ceil(K/128)], one scale per
            128x128 block, C-contiguous. Or :class:`~cupygemm.PackedWeights`.
        out: optional bfloat16 [M, N] written in place; allocated by the caller's framework when None.
        stream: the CUDA stream to run on (an int handle, a CuPy or torch stream, or an object with
            ``cuda_stream``/``ptr``/``__cuda_stream__``); default: the caller's current stream (torch's for torch
            tensors, else CuPy's). The call runs after the work queued there before it, and before the work
            queued after it. Nothing synchronizes.

    Returns:
        ``out`` if given, else a new bfloat16 array of the caller's framework (CuPy, torch or JAX).

    JAX arrays (eager) go through :mod:`cupygemm.jax`, XLA's custom call: ordered on XLA's stream like any JAX
    computation; use ``cupygemm.jax`` directly inside ``jax.jit``. torch tensors go through the ``cupygemm::*``
    torch operators (:mod:`cupygemm.torch`).

    Constraints: K % 16 == 0 and N % 8 == 0 (16-byte aligned rows for TMA), unit inner strides, all operands
    on one Hopper GPU, from one framework. K need not be a multiple of 128. M == 0 returns at once. NaN/Inf
    scales propagate. ``out`` must not overlap an input (ValueError).
    """
    return call(NORMAL, lhs, rhs, out, None, None, stream)


def m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(lhs: tuple[Any, Any], rhs: tuple[Any, Any], out: Any,
                                              m_indices: Any, *, stream: Any = None) -> Any:
    """Grouped GEMM, contiguous layout (MoE prefill/training): row r of A uses B[m_indices[r]].

    Args:
        lhs: ``(A, SFA)``: A [M_sum, K] FP8, SFA [M_sum, ceil(K/128)] float32.
        rhs: ``(B, SFB)``: B [G, N, K] FP8, SFB [G, ceil(N/128), ceil(K/128)] float32 (or PackedWeights).
        out: bfloat16 [M_sum, N]; None allocates one, zeros where rows are skipped.
        m_indices: int32 [M_sum], the group of each row; -1 marks padding rows, which are neither computed
            nor written (their ``out`` rows keep their previous contents). Each group's rows are contiguous and
            padded to ``get_m_alignment_for_contiguous_layout()`` (128) rows; a 128-row block takes the group of
            its first row. Out-of-range values never cause out-of-bounds accesses (the block or row is skipped);
            ``CUPYGEMM_CHECK_INPUTS=1`` reports them, and misaligned groups, as ValueError.
        stream: as for :func:`gemm_fp8_fp8_bf16_nt`.
    """
    return call(CONTIGUOUS, lhs, rhs, out, m_indices, None, stream)


def m_grouped_gemm_fp8_fp8_bf16_nt_masked(lhs: tuple[Any, Any], rhs: tuple[Any, Any], out: Any, masked_m: Any,
                                          expected_m: int, *, stream: Any = None) -> Any:
    """Grouped GEMM, masked layout (MoE decode, CUDA-graph friendly): group g computes its first masked_m[g] rows.

    Args:
        lhs: ``(A, SFA)``: A [G, max_m, K] FP8, SFA [G, max_m, ceil(K/128)] float32.
        rhs: ``(B, SFB)``: B [G, N, K] FP8, SFB [G, ceil(N/128), ceil(K/128)] float32 (or PackedWeights).
        out: bfloat16 [G, max_m, N], groups back to back (rows may be padded; None allocates zeros); rows at or past
            masked_m[g] are left untouched.
        masked_m: int32 [G] on the device, read by the kernel (no host synchronization; capturable in a
            CUDA graph). Values are clamped to [0, max_m]; ``CUPYGEMM_CHECK_INPUTS=1`` reports them instead.
        expected_m: typical rows per group; only used to choose the kernel config, which is planned for groups
            of int(expected_m x U(0.7, 1.3)) rows (the spread of DeepGEMM's tests), not for exactly expected_m.
        stream: as for :func:`gemm_fp8_fp8_bf16_nt`.
    """
    validate.check_expected_m(expected_m)
    return call(MASKED, lhs, rhs, out, masked_m, int(expected_m), stream)


# ---- DeepGEMM 2.x names --------------------------------------------------------------------------------------

_DG2_OPTIONS = {"recipe_a", "recipe_b", "compiled_dims", "disable_ue8m0_cast", "use_psum_layout",
                "ensure_zero_padding", "expected_m_for_psum_layout"}


def _dg2_options(recipe: Any, extra: dict[str, Any]) -> None:
    """The DeepGEMM 2.x options these kernels implement: the 1x128 / 128x128 recipe only."""
    if recipe is not None and tuple(recipe) != (1, 128, 128):
        raise ValueError(f"recipe: only (1, 128, 128) (A per 1x128, B per 128x128) is supported here, got {recipe!r}")
    unknown = set(extra) - _DG2_OPTIONS
    if unknown:
        raise TypeError(f"unexpected keyword arguments {sorted(unknown)}")
    if extra.get("use_psum_layout"):
        raise ValueError("use_psum_layout: the prefix-sum grouped layout is not supported; pass m_indices rows")


def fp8_gemm_nt(a: tuple[Any, Any], b: tuple[Any, Any], d: Any, c: Any = None, recipe: Any = None, *,
                stream: Any = None, **options: Any) -> Any:
    """DeepGEMM 2.x name of :func:`gemm_fp8_fp8_bf16_nt`: ``d = a @ b.T`` with ``a = (A, SFA)``, ``b = (B, SFB)``.

    With ``recipe=(1, 1, 128)`` (both operands scaled 1x128, the weight-gradient recipe), FP32 ``d`` and ``c``
    given, it computes ``d = c + a @ b.T`` through :func:`cupygemm.wgrad_gemm_fp8_fp8_fp32_nt` (``c`` may be ``d``
    itself; otherwise ``c`` is copied into ``d`` first, on the call's stream); with ``c=None`` (DeepGEMM asserts
    there) ``d = a @ b.T`` through :func:`cupygemm.wgrad_gemm_fp8_fp8_fp32_nt_store`.

    Otherwise differences from DeepGEMM 2.x: ``c`` is not supported (ValueError unless None); ``recipe`` must be
    None or (1, 128, 128); SFA may be row-major or M-major, FP32 (no UE8M0 packing); ``d`` may be None (a new array
    is returned); ``compiled_dims`` and ``disable_ue8m0_cast`` are accepted and have no effect (every kernel is
    specialized on N and K). Returns ``d`` (or the new output).
    """
    if recipe is not None and tuple(recipe) == (1, 1, 128):
        from .training import wgrad_dg2

        return wgrad_dg2(a, b, d, c, stream=stream, **options)
    if c is not None:
        raise ValueError("c: D = C + A @ B.T (an accumulator input) needs recipe=(1, 1, 128) and FP32 d; with the "
                         "(1, 128, 128) recipe pass c=None")
    _dg2_options(recipe, options)
    return gemm_fp8_fp8_bf16_nt(a, b, d, stream=stream)


def m_grouped_fp8_gemm_nt_contiguous(a: tuple[Any, Any], b: tuple[Any, Any], d: Any, grouped_layout: Any,
                                     *, stream: Any = None, **options: Any) -> Any:
    """DeepGEMM 2.x name of :func:`m_grouped_gemm_fp8_fp8_bf16_nt_contiguous` (``grouped_layout`` = m_indices).

    Differences: only the per-row layout (``use_psum_layout=False``); rows with index -1 are left untouched in
    ``d`` whatever ``ensure_zero_padding`` says (pass zeros in ``d`` to get zeros there); FP32 scales only."""
    _dg2_options(options.pop("recipe", None), options)
    return m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(a, b, d, grouped_layout, stream=stream)


def m_grouped_fp8_gemm_nt_masked(a: tuple[Any, Any], b: tuple[Any, Any], d: Any, masked_m: Any, expected_m: int,
                                 *, stream: Any = None, **options: Any) -> Any:
    """DeepGEMM 2.x name of :func:`m_grouped_gemm_fp8_fp8_bf16_nt_masked`. Differences: FP32 scales only (no
    UE8M0), ``recipe`` None or (1, 128, 128); ``expected_m`` only picks the kernel config, as in DeepGEMM."""
    _dg2_options(options.pop("recipe", None), options)
    return m_grouped_gemm_fp8_fp8_bf16_nt_masked(a, b, d, masked_m, expected_m, stream=stream)


__all__ = ["gemm_fp8_fp8_bf16_nt", "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
           "m_grouped_gemm_fp8_fp8_bf16_nt_masked", "fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous",
           "m_grouped_fp8_gemm_nt_masked"]
