"""The GEMM entry points: read the caller's tensors -> validate -> plan -> launch on the caller's stream.

A call's tensors are read in place (:mod:`cupygemm.tensors`); their shapes, strides, dtypes and devices form
the call's signature. The first call of a signature validates it (:mod:`cupygemm.validate`) and makes its launch
plan (:mod:`cupygemm.plan`); later calls with the same signature reuse both, and only check that the pointers
are still 16-byte aligned before launching. Any other signature, a transposed view say, is validated afresh.

torch tensors go through the ``cupygemm::*`` torch operators (:mod:`cupygemm.torch`, loaded on first use), which
come back here: so ``torch.compile`` sees one opaque operator, and eager calls take the same path.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

from . import validate
from .config import KIND_CONTIGUOUS, KIND_MASKED, KIND_NORMAL, config_version
from .env import B_EVICT_FIRST, PDL, setting_key
from .device import num_sms_override, on_device, single_gpu
from .packing import PackedWeights
from .plan import NO_PAGE_SIDES, GemmPlan, plan_gemm
from .sfa_layout import to_m_major
from .streams import cupy_stream, is_capturing, resolve, torch_stream
from .tensors import _framework_by_type as _frameworks
from .tensors import BF16, Framework, View, cupy_view, empty, export_like, framework_of, gpu_device_of, \
    is_torch_tensor, read, read_cupy, read_torch
from .workspace import scratch

_CALLS_LIMIT = 1024

_lock = threading.Lock()
_calls: dict[tuple, tuple[validate.Problem, GemmPlan | None]] = {}


def _cupy_signature(kind: int, a: Any, sfa: Any, b: Any, sfb: Any, out: Any, layout: Any,
                    expected_m: int | None, sfa_ptr: int, devices: object) -> tuple:
    """Everything validation and planning read of CuPy operands besides the pointers, read straight from the
    arrays: each one's shape, strides and dtype, their devices, and the settings. SFA's alignment decides whether it
    is used in place, so it is part of the signature too."""
    return (kind, expected_m, sfa_ptr & 15, devices, a.shape, a.strides, a.dtype, sfa.shape, sfa.strides, sfa.dtype,
            b.shape, b.strides, b.dtype, sfb.shape, sfb.strides, sfb.dtype,
            None if out is None else (out.shape, out.strides, out.dtype),
            None if layout is None else (layout.shape, layout.strides, layout.dtype),
            num_sms_override(), config_version(), setting_key(B_EVICT_FIRST), setting_key(PDL))


def _torch_signature(kind: int, a: Any, sfa: Any, b: Any, sfb: Any, out: Any, layout: Any,
                     expected_m: int | None, sfa_ptr: int) -> tuple:
    """As :func:`_cupy_signature`, for torch tensors (strides in elements: the dtype is in the key too)."""
    return (kind, expected_m, sfa_ptr & 15, a.shape, a.stride(), a.dtype, a.get_device(), sfa.shape,
            sfa.stride(), sfa.dtype, sfa.get_device(), b.shape, b.stride(), b.dtype, b.get_device(), sfb.shape,
            sfb.stride(), sfb.dtype, sfb.get_device(),
            None if out is None else (out.shape, out.stride(), out.dtype, out.get_device()),
            None if layout is None else (layout.shape, layout.stride(), layout.dtype, layout.get_device()),
            num_sms_override(), config_version(), setting_key(B_EVICT_FIRST), setting_key(PDL))


def _view_signature(kind: int, views: tuple[View | None, ...], expected_m: int | None) -> tuple:
    """As :func:`_cupy_signature`, for operands read through DLPack."""
    return (kind, expected_m, views[1].ptr & 15) + tuple(None if v is None else v[1:5] for v in views) + \
        (num_sms_override(), config_version(), setting_key(B_EVICT_FIRST), setting_key(PDL))


_VALIDATORS: dict[int, Callable[..., validate.Problem]] = {
    KIND_NORMAL: lambda v, e: validate.normal(*v[:5]),
    KIND_CONTIGUOUS: lambda v, e: validate.contiguous(*v),
    KIND_MASKED: lambda v, e: validate.masked(*v, e),
}


def _prepare(kind: int, views: tuple[View | None, ...], expected_m: int | None,
             packed: PackedWeights | None = None) -> tuple[validate.Problem, GemmPlan | None]:
    """Validate and plan a call signature seen for the first time (or whose pointers failed the fast check).
    ``packed``: B is packed side-aware (views[2] is its data), validated and planned with B's shape."""
    if packed is not None:
        views = views[:2] + (packed.b_view(views[2]),) + views[3:]
    p = _VALIDATORS[kind](views, expected_m)
    if p.m == 0 or p.n == 0 or p.num_groups == 0 or p.k == 0:
        return p, None
    a, _, b, _, out = views[:5]
    plan = plan_gemm(kind, p.m, p.n, p.k, p.num_groups, p.device, expected_m=expected_m, a_strides=a.strides,
                     b_strides=b.strides, d_strides=None if out is None else out.strides, sides=packed is not None)
    return p, plan


_NAMES = ("lhs[0] (A)", "lhs[1] (A scales)", "rhs[0] (B)", "rhs[1] (B scales)", "out")


def run(kind: int, a: Any, sfa: Any, b: Any, sfb: Any, out: Any, layout: Any, expected_m: int | None,
        stream: Any, framework: Framework, packed: PackedWeights | None = None) -> Any:
    """One GEMM call on the caller's tensors (any framework's); returns ``out``, or the new output.

    This is every call's path, kept flat: a repeated call reads six tensors, looks its signature up, and launches.
    ``packed``: B is side-aware packed weights (``b`` is their data).
    """
    if framework is Framework.CUPY or framework is Framework.TORCH:
        cupy_ops = framework is Framework.CUPY
        try:
            if cupy_ops:
                ad, sd, bd, fd = a.data, sfa.data, b.data, sfb.data
                od = None if out is None else out.data
                ld = None if layout is None else layout.data
                ptrs = (ad.ptr, sd.ptr, bd.ptr, fd.ptr, 0 if od is None else od.ptr, 0 if ld is None else ld.ptr)
                # With one GPU every CuPy array is on device 0: no need to read the device ids.
                devices = 0 if single_gpu() else (ad.device_id, sd.device_id, bd.device_id, fd.device_id,
                                                  None if od is None else od.device_id,
                                                  None if ld is None else ld.device_id)
                key = _cupy_signature(kind, a, sfa, b, sfb, out, layout, expected_m, ptrs[1], devices)
                if packed is not None:
                    key += (packed.shape,)
            else:
                ptrs = (a.data_ptr(), sfa.data_ptr(), b.data_ptr(), sfb.data_ptr(), 0 if out is None else
                        out.data_ptr(), 0 if layout is None else layout.data_ptr())
                key = _torch_signature(kind, a, sfa, b, sfb, out, layout, expected_m, ptrs[1])
                if packed is not None:
                    key += (packed.shape,)
        except AttributeError:  # an operand of another kind: say which
            same_framework(a, sfa, b, sfb, out, layout)
            raise
        views = None  # made only for a new signature (and for the rare per-call copies below)
        hit = _calls.get(key)
        if hit is None or (ptrs[0] | ptrs[2] | ptrs[4]) & 15:
            views = _read_all(framework, a, sfa, b, sfb, out, layout)
            hit = _remember(key, _prepare(kind, views, expected_m, packed))
        launch_stream = None
    else:  # DLPack producers order their pending writes before the stream we launch on
        launch_stream = resolve(stream, framework, gpu_device_of(a, _NAMES[0]))
        views = tuple(None if x is None else read(x, name, launch_stream)
                      for x, name in zip((a, sfa, b, sfb, out), _NAMES))
        if layout is not None:
            views += (read(layout, _layout_name(kind), launch_stream),)
        ptrs = tuple(0 if v is None else v.ptr for v in views) + (() if layout is not None else (0,))
        key = _view_signature(kind, views, expected_m) + (() if packed is None else (packed.shape,))
        hit = _calls.get(key)
        if hit is None or (ptrs[0] | ptrs[2] | ptrs[4]) & 15:
            hit = _remember(key, _prepare(kind, views, expected_m, packed))
    problem, plan = hit
    if launch_stream is None:
        launch_stream = resolve(stream, framework, problem.device)
    if out is None:
        result = empty(framework, problem.out_shape, BF16, problem.device) if kind == KIND_NORMAL else \
            _zeros(framework, problem.out_shape, problem.device, launch_stream)
        d_ptr = result.data_ptr() if framework is Framework.TORCH else result.data.ptr
    else:
        result, d_ptr = out, ptrs[4]
    if plan is None:
        if problem.k == 0 and problem.m and problem.n and problem.num_groups:
            _zero(read(result, "out"), launch_stream)
        return result if out is not None else export_like(result, framework)
    keep = None  # what must live until the launch is queued: the framework's allocator frees in stream order
    capturing = None  # whether a torch call's stream is being captured: asked once for both per-stream buffers
    if problem.sfa_m_major:
        sfa_ptr = ptrs[1]
    else:
        capturing = framework is Framework.TORCH and is_capturing(launch_stream)
        sfa_ptr, keep = to_m_major(problem, ptrs[1], sfa if views is None else views[1], launch_stream, framework,
                                   capturing)
    if layout is not None and validate.check_inputs_enabled():
        _check_layout_on_host(problem, views[5] if views is not None else read(layout, _layout_name(kind)),
                              launch_stream)
    partials = counters = 0
    if plan.scratch_counters:
        partials, counters, keep2 = scratch(plan.scratch_floats, plan.scratch_counters, problem.device,
                                            launch_stream, framework, capturing)
    page_sides = NO_PAGE_SIDES if packed is None else packed.launch_sides
    if single_gpu():
        plan.launch(launch_stream, ptrs[0], sfa_ptr, ptrs[2], ptrs[3], d_ptr, ptrs[5], partials, counters,
                    page_sides=page_sides)
    else:
        with on_device(problem.device):
            plan.launch(launch_stream, ptrs[0], sfa_ptr, ptrs[2], ptrs[3], d_ptr, ptrs[5], partials, counters,
                        page_sides=page_sides)
    del keep
    return result if out is not None else export_like(result, framework)


def _run_packed(kind: int, a: Any, sfa: Any, rhs: PackedWeights, out: Any, layout: Any, expected_m: int | None,
                stream: Any) -> Any:
    """A call on side-aware :class:`~cupygemm.packing.PackedWeights` (weights that fell back to plain B are passed
    on as ``(B, SFB)`` by the callers). JAX calls go through :mod:`cupygemm.jax`, torch calls through the
    ``cupygemm::*_packed`` operators (:mod:`cupygemm.torch`)."""
    framework = _frameworks.get(type(a)) or framework_of(a)
    if framework is Framework.JAX:
        ops = _jax_ops(stream, a, sfa, rhs.data, rhs.scales, out, layout)
        if kind == KIND_NORMAL:
            _no_jax_out(out)
            return ops.gemm_fp8_fp8_bf16_nt(a, sfa, rhs)
        if kind == KIND_CONTIGUOUS:
            return ops.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(a, sfa, rhs, None, layout, out)
        return ops.m_grouped_gemm_fp8_fp8_bf16_nt_masked(a, sfa, rhs, None, layout, expected_m, out)
    if framework_of(rhs.data) is not framework:
        raise TypeError(f"rhs: packed weights held by {framework_of(rhs.data).value}, while A is a "
                        f"{framework.value} tensor; pack the weights with the framework of the call")
    if framework is Framework.TORCH:
        return _torch_ops().gemm_packed(kind, a, sfa, rhs, out, layout, expected_m, stream)
    return run(kind, a, sfa, rhs.data, rhs.scales, out, layout, expected_m, stream, framework, rhs)


def _read_all(framework: Framework, a: Any, sfa: Any, b: Any, sfb: Any, out: Any,
              layout: Any) -> tuple[View | None, ...]:
    """The Views of a CuPy or torch call's operands (for validation and planning)."""
    if framework is Framework.CUPY:
        views = (read_cupy(a), read_cupy(sfa), read_cupy(b), read_cupy(sfb), None if out is None else read_cupy(out))
        return views if layout is None else views + (read_cupy(layout),)
    views = (read_torch(a, _NAMES[0]), read_torch(sfa, _NAMES[1]), read_torch(b, _NAMES[2]),
             read_torch(sfb, _NAMES[3]), None if out is None else read_torch(out, _NAMES[4]))
    return views if layout is None else views + (read_torch(layout, "layout"),)


def _remember(key: tuple, hit: tuple[validate.Problem, GemmPlan | None]) -> tuple[validate.Problem,
                                                                                   GemmPlan | None]:
    with _lock:
        if len(_calls) >= _CALLS_LIMIT:
            _calls.clear()
        _calls[key] = hit
    return hit


def _layout_name(kind: int) -> str:
    return "m_indices" if kind == KIND_CONTIGUOUS else "masked_m"


def _data_ptr(x: Any) -> int:
    return x.data_ptr() if is_torch_tensor(x) else x.data.ptr


def same_framework(*tensors: Any) -> None:
    """One call, one framework: a torch stream and a CuPy stream are not ordered with each other, so mixing would
    leave the result's ordering to chance. (Objects read through DLPack are capsules: not checked.)"""
    names = _NAMES + ("m_indices/masked_m",)
    framework = framework_of(tensors[0])
    for name, t in zip(names, tensors):
        if t is not None and framework_of(t) is not framework:
            raise TypeError(f"{name}: got a {type(t).__module__}.{type(t).__name__} while A is a {framework.value} "
                            f"tensor; pass every tensor of a call from one framework (convert with DLPack first)")


def _zeros(framework: Framework, shape: tuple[int, ...], device: int, stream: int) -> Any:
    """A new BF16 output of zeros, cleared on ``stream``: the rows a grouped GEMM skips (padding rows, rows past
    masked_m) read as zeros, so a functional call's result is deterministic."""
    if framework is Framework.TORCH:
        import torch

        with torch_stream(stream, device):
            return torch.zeros(shape, dtype=torch.bfloat16, device=torch.device("cuda", device))
    import cupy

    with cupy.cuda.Device(device), cupy_stream(stream, device):
        return cupy.zeros(shape, dtype=BF16)


def _zero(out: View, stream: int) -> None:
    import cupy

    with cupy.cuda.Device(out.device), cupy_stream(stream, out.device):
        cupy_view(out).view(cupy.uint16).fill(0)


def _check_layout_on_host(problem: validate.Problem, layout: View, stream: int) -> None:
    import cupy

    host = cupy_view(layout).get(stream=cupy_stream(stream, layout.device))
    if problem.kind == KIND_CONTIGUOUS:
        validate.check_m_indices(host, problem.num_groups)
    else:
        validate.check_masked_m(host, problem.m)


_torch_module: Any = None


def _torch_ops():
    """cupygemm.torch, imported on the first torch call (an import statement costs a microsecond per call)."""
    global _torch_module
    if _torch_module is None:
        from . import torch as torch_ops

        _torch_module = torch_ops
    return _torch_module


def _jax_ops(stream: Any, *tensors: Any):
    """cupygemm.jax for an eager JAX call: XLA's stream orders it like any JAX computation."""
    if stream is not None:
        raise TypeError("stream: JAX calls run on XLA's stream, in JAX's order; stream= is for CuPy and torch")
    same_framework(*tensors)
    from . import jax as jax_ops

    return jax_ops


def _no_jax_out(out: Any) -> None:
    if out is not None:
        raise TypeError("out: JAX arrays are immutable, so a dense GEMM cannot write into one; call without out "
                        "and use the result")


def gemm_fp8_fp8_bf16_nt(lhs: tuple[Any, Any], rhs: tuple[Any, Any], out: Any = None, *, stream: Any = None) -> Any:
    """D = A @ B.T with DeepSeek-V3 fine-grained FP8 scaling, BF16 output.

    Args:
        lhs: ``(A, SFA)``: A float8_e4m3fn (or uint8 holding e4m3 bits) [M, K]; SFA float32 [M, ceil(K/128)],
            one scale per row and 128 columns of K. Row-major SFA is transposed once per call into the TMA-aligned
            M-major layout; SFA already in that layout (see ``get_col_major_tma_aligned_tensor``) is used as is.
        rhs: ``(B, SFB)``: B float8_e4m3fn [N, K]; SFB float32 [ceil(N/128), ceil(K/128)], one scale per
            128x128 block, C-contiguous.
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
    scales propagate.
    """
    a, sfa = lhs if type(lhs) is tuple and len(lhs) == 2 else validate.pair(lhs, "lhs")
    if type(rhs) is PackedWeights:
        if rhs.side_aware:
            return _run_packed(KIND_NORMAL, a, sfa, rhs, out, None, None, stream)
        rhs = (rhs.data, rhs.scales)
    b, sfb = rhs if type(rhs) is tuple and len(rhs) == 2 else validate.pair(rhs, "rhs")
    framework = _frameworks.get(type(a)) or framework_of(a)
    if framework is Framework.TORCH:
        return _torch_ops().gemm_fp8_fp8_bf16_nt(a, sfa, b, sfb, out, stream)
    if framework is Framework.JAX:
        _no_jax_out(out)
        return _jax_ops(stream, a, sfa, b, sfb).gemm_fp8_fp8_bf16_nt(a, sfa, b, sfb)
    return run(KIND_NORMAL, a, sfa, b, sfb, out, None, None, stream, framework)


def m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(lhs: tuple[Any, Any], rhs: tuple[Any, Any], out: Any,
                                              m_indices: Any, *, stream: Any = None) -> Any:
    """Grouped GEMM, contiguous layout (MoE prefill/training): row r of A uses B[m_indices[r]].

    Args:
        lhs: ``(A, SFA)``: A [M_sum, K] FP8, SFA [M_sum, ceil(K/128)] float32.
        rhs: ``(B, SFB)``: B [G, N, K] FP8, SFB [G, ceil(N/128), ceil(K/128)] float32.
        out: bfloat16 [M_sum, N]; None allocates one, zeros where rows are skipped.
        m_indices: int32 [M_sum], the group of each row; -1 marks padding rows, which are neither computed
            nor written (their ``out`` rows keep their previous contents). Each group's rows are contiguous and
            padded to ``get_m_alignment_for_contiguous_layout()`` (128) rows; a 128-row block takes the group of
            its first row. Out-of-range values never cause out-of-bounds accesses (the block or row is skipped);
            ``CUPYGEMM_CHECK_INPUTS=1`` reports them, and misaligned groups, as ValueError.
        stream: as for :func:`gemm_fp8_fp8_bf16_nt`.
    """
    a, sfa = validate.pair(lhs, "lhs")
    if type(rhs) is PackedWeights:
        if rhs.side_aware:
            return _run_packed(KIND_CONTIGUOUS, a, sfa, rhs, out, m_indices, None, stream)
        rhs = (rhs.data, rhs.scales)
    b, sfb = validate.pair(rhs, "rhs")
    framework = framework_of(a)
    if framework is Framework.TORCH:
        return _torch_ops().m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(a, sfa, b, sfb, out, m_indices, stream)
    if framework is Framework.JAX:
        return _jax_ops(stream, a, sfa, b, sfb, out, m_indices).m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(
            a, sfa, b, sfb, m_indices, out)
    return run(KIND_CONTIGUOUS, a, sfa, b, sfb, out, m_indices, None, stream, framework)


def m_grouped_gemm_fp8_fp8_bf16_nt_masked(lhs: tuple[Any, Any], rhs: tuple[Any, Any], out: Any, masked_m: Any,
                                          expected_m: int, *, stream: Any = None) -> Any:
    """Grouped GEMM, masked layout (MoE decode, CUDA-graph friendly): group g computes its first masked_m[g] rows.

    Args:
        lhs: ``(A, SFA)``: A [G, max_m, K] FP8, SFA [G, max_m, ceil(K/128)] float32.
        rhs: ``(B, SFB)``: B [G, N, K] FP8, SFB [G, ceil(N/128), ceil(K/128)] float32.
        out: bfloat16 [G, max_m, N], groups back to back (rows may be padded; None allocates zeros); rows at or past
            masked_m[g] are left untouched.
        masked_m: int32 [G] on the device, read by the kernel (no host synchronization; capturable in a
            CUDA graph). Values are clamped to [0, max_m]; ``CUPYGEMM_CHECK_INPUTS=1`` reports them instead.
        expected_m: typical rows per group; only used to choose the kernel config, which is planned for groups
            of int(expected_m x U(0.7, 1.3)) rows (the spread of DeepGEMM's tests), not for exactly expected_m.
        stream: as for :func:`gemm_fp8_fp8_bf16_nt`.
    """
    a, sfa = validate.pair(lhs, "lhs")
    validate.check_expected_m(expected_m)
    if type(rhs) is PackedWeights:
        if rhs.side_aware:
            return _run_packed(KIND_MASKED, a, sfa, rhs, out, masked_m, int(expected_m), stream)
        rhs = (rhs.data, rhs.scales)
    b, sfb = validate.pair(rhs, "rhs")
    framework = framework_of(a)
    if framework is Framework.TORCH:
        return _torch_ops().m_grouped_gemm_fp8_fp8_bf16_nt_masked(a, sfa, b, sfb, out, masked_m, int(expected_m),
                                                                  stream)
    if framework is Framework.JAX:
        return _jax_ops(stream, a, sfa, b, sfb, out, masked_m).m_grouped_gemm_fp8_fp8_bf16_nt_masked(
            a, sfa, b, sfb, masked_m, int(expected_m), out)
    return run(KIND_MASKED, a, sfa, b, sfb, out, masked_m, int(expected_m), stream, framework)



# ---- DeepGEMM 2.x names ----------------------------------------------------------------------------------------

def _dg2_args(c: Any, recipe: Any, extra: dict[str, Any]) -> None:
    """The DeepGEMM 2.x options these kernels implement: no C accumulator, the 1x128 / 128x128 recipe only."""
    if c is not None:
        raise ValueError("c: D = C + A @ B.T (an accumulator input) is not supported on this path; pass c=None")
    if recipe is not None and tuple(recipe) != (1, 128, 128):
        raise ValueError(f"recipe: only (1, 128, 128) (A per 1x128, B per 128x128) is supported, got {recipe!r}")
    allowed = {"recipe_a", "recipe_b", "compiled_dims", "disable_ue8m0_cast", "use_psum_layout",
               "ensure_zero_padding", "expected_m_for_psum_layout"}
    unknown = set(extra) - allowed
    if unknown:
        raise TypeError(f"unexpected keyword arguments {sorted(unknown)}")
    if extra.get("use_psum_layout"):
        raise ValueError("use_psum_layout: the prefix-sum grouped layout is not supported; pass m_indices rows")


def fp8_gemm_nt(a: tuple[Any, Any], b: tuple[Any, Any], d: Any, c: Any = None, recipe: Any = None, *,
                stream: Any = None, **options: Any) -> Any:
    """DeepGEMM 2.x name of :func:`gemm_fp8_fp8_bf16_nt`: ``d = a @ b.T`` with ``a = (A, SFA)``, ``b = (B, SFB)``.

    Differences from DeepGEMM 2.x: ``c`` (accumulate into D) is not supported (ValueError unless None); ``recipe``
    must be None or (1, 128, 128); SFA may be row-major or M-major, FP32 (no UE8M0 packing); ``d`` may be None
    (a new array is returned); ``compiled_dims`` and ``disable_ue8m0_cast`` are accepted and have no effect (every
    kernel is specialized on N and K). Returns ``d`` (or the new output).
    """
    _dg2_args(c, recipe, options)
    return gemm_fp8_fp8_bf16_nt(a, b, d, stream=stream)


def m_grouped_fp8_gemm_nt_contiguous(a: tuple[Any, Any], b: tuple[Any, Any], d: Any, grouped_layout: Any,
                                     *, stream: Any = None, **options: Any) -> Any:
    """DeepGEMM 2.x name of :func:`m_grouped_gemm_fp8_fp8_bf16_nt_contiguous` (``grouped_layout`` = m_indices).

    Differences: only the per-row layout (``use_psum_layout=False``); rows with index -1 are left untouched in
    ``d`` whatever ``ensure_zero_padding`` says (pass zeros in ``d`` to get zeros there); FP32 scales only."""
    _dg2_args(None, options.pop("recipe", None), options)
    return m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(a, b, d, grouped_layout, stream=stream)


def m_grouped_fp8_gemm_nt_masked(a: tuple[Any, Any], b: tuple[Any, Any], d: Any, masked_m: Any, expected_m: int,
                                 *, stream: Any = None, **options: Any) -> Any:
    """DeepGEMM 2.x name of :func:`m_grouped_gemm_fp8_fp8_bf16_nt_masked`. Differences: FP32 scales only (no
    UE8M0), ``recipe`` None or (1, 128, 128); ``expected_m`` only picks the kernel config, as in DeepGEMM."""
    _dg2_args(None, options.pop("recipe", None), options)
    return m_grouped_gemm_fp8_fp8_bf16_nt_masked(a, b, d, masked_m, expected_m, stream=stream)
