"""The GEMM call path, one for every kind: read the caller's tensors -> validate -> plan -> launch on the caller's
stream.

The public functions (one per kind, in :mod:`cupygemm.kinds`) come to :func:`call` with their kind's descriptor. A
call's tensors are read in place (:mod:`cupygemm.tensors`); their shapes, strides, dtypes and devices form the call's
signature. The first call of a signature validates it (the kind's check, :mod:`cupygemm.validate`) and makes its
launch plan (:mod:`cupygemm.plan`); later calls with the same signature reuse both, and only check that the pointers
are still 16-byte aligned before launching. Any other signature, a transposed view say, is validated afresh.

torch tensors and JAX arrays go to their framework's adapter (:mod:`cupygemm.frameworks`): the torch operators come
back to :func:`run` (so ``torch.compile`` sees one opaque operator, and eager calls take the same path); JAX calls
become XLA custom calls.
"""
from __future__ import annotations

import threading
from typing import Any

from . import validate
from .config import config_version
from .contract import SIDE_TICKET_COUNTERS
from .env import B_EVICT_FIRST, B_PREFETCH, PDL, setting_key
from .device import num_sms_key, on_device, single_gpu
from .frameworks import adapter
from .packing import PackedWeights
from .plan import NO_PAGE_SIDES, GemmPlan, plan_gemm
from .sfa_layout import to_m_major
from .streams import cupy_stream, is_capturing, resolve, torch_stream
from .tensors import _framework_by_type as _frameworks
from .tensors import (BF16, Framework, View, cupy_view, empty, export_like, framework_of, gpu_device_of, read,
                      read_cupy, read_torch)
from .workspace import scratch, side_tickets

_CALLS_LIMIT = 1024

_lock = threading.Lock()
_calls: dict[tuple, tuple[validate.Problem, GemmPlan | None]] = {}


def _cupy_signature(kind: Any, a: Any, sfa: Any, b: Any, sfb: Any, out: Any, layout: Any,
                    expected_m: int | None, sfa_ptr: int, devices: object) -> tuple:
    """Everything validation and planning read of CuPy operands besides the pointers, read straight from the
    arrays: each one's shape, strides and dtype, their devices, and the settings. SFA's alignment decides whether it
    is used in place, so it is part of the signature too."""
    return (kind, expected_m, sfa_ptr & 15, devices, a.shape, a.strides, a.dtype, sfa.shape, sfa.strides, sfa.dtype,
            b.shape, b.strides, b.dtype, sfb.shape, sfb.strides, sfb.dtype,
            None if out is None else (out.shape, out.strides, out.dtype),
            None if layout is None else (layout.shape, layout.strides, layout.dtype),
            num_sms_key(), config_version(), setting_key(B_EVICT_FIRST), setting_key(PDL),
            setting_key(B_PREFETCH))


def _torch_signature(kind: Any, a: Any, sfa: Any, b: Any, sfb: Any, out: Any, layout: Any,
                     expected_m: int | None, sfa_ptr: int) -> tuple:
    """As :func:`_cupy_signature`, for torch tensors (strides in elements: the dtype is in the key too)."""
    return (kind, expected_m, sfa_ptr & 15, a.shape, a.stride(), a.dtype, a.get_device(), sfa.shape,
            sfa.stride(), sfa.dtype, sfa.get_device(), b.shape, b.stride(), b.dtype, b.get_device(), sfb.shape,
            sfb.stride(), sfb.dtype, sfb.get_device(),
            None if out is None else (out.shape, out.stride(), out.dtype, out.get_device()),
            None if layout is None else (layout.shape, layout.stride(), layout.dtype, layout.get_device()),
            num_sms_key(), config_version(), setting_key(B_EVICT_FIRST), setting_key(PDL),
            setting_key(B_PREFETCH))


def _view_signature(kind: Any, views: tuple[View | None, ...], expected_m: int | None) -> tuple:
    """As :func:`_cupy_signature`, for operands read through DLPack."""
    return (kind, expected_m, views[1].ptr & 15) + tuple(None if v is None else v[1:5] for v in views) + \
        (num_sms_key(), config_version(), setting_key(B_EVICT_FIRST), setting_key(PDL),
            setting_key(B_PREFETCH))


def _prepare(kind: Any, views: tuple[View | None, ...], expected_m: int | None,
             packed: PackedWeights | None = None) -> tuple[validate.Problem, GemmPlan | None]:
    """Validate and plan a call signature seen for the first time (or whose pointers failed the fast check).
    ``packed``: B is packed side-aware (views[2] is its data), validated and planned with B's shape."""
    if packed is not None:
        views = views[:2] + (packed.b_view(views[2]),) + views[3:]
    p = kind.check(views if kind.layout else views[:5], expected_m)
    if p.m == 0 or p.n == 0 or p.num_groups == 0 or p.k == 0:
        return p, None
    a, sfa, b, _, out = views[:5]
    plan = plan_gemm(kind, p.m, p.n, p.k, p.num_groups, p.device, expected_m=expected_m, a_strides=a.strides,
                     b_strides=b.strides, d_strides=None if out is None else out.strides, sides=packed is not None,
                     sfa_m_pad=p.sfa_m_pad, sfb_m_pad=p.sfb_m_pad, scale_rows=sfa.shape[0])
    return p, plan


_NAMES = ("lhs[0] (A)", "lhs[1] (A scales)", "rhs[0] (B)", "rhs[1] (B scales)", "out")


def run(kind: Any, a: Any, sfa: Any, b: Any, sfb: Any, out: Any, layout: Any, expected_m: int | None,
        stream: Any, framework: Framework, packed: PackedWeights | None = None) -> Any:
    """One GEMM call of ``kind`` (a :class:`cupygemm.kinds.GemmKind`) on the caller's tensors (CuPy's, torch's or
    another DLPack producer's); returns ``out``, or the new output.

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
            views += (read(layout, kind.layout, launch_stream),)
        ptrs = tuple(0 if v is None else v.ptr for v in views) + (() if layout is not None else (0,))
        key = _view_signature(kind, views, expected_m) + (() if packed is None else (packed.shape,))
        hit = _calls.get(key)
        if hit is None or (ptrs[0] | ptrs[2] | ptrs[4]) & 15:
            hit = _remember(key, _prepare(kind, views, expected_m, packed))
    problem, plan = hit
    if launch_stream is None:
        launch_stream = resolve(stream, framework, problem.device)
    if out is None:  # allocated in the order of the stream that writes it (stream= may not be the current one)
        if kind.zero_new_out:
            result = _zeros(framework, problem.out_shape, kind.out_dtype, problem.device, launch_stream)
        else:
            result = empty(framework, problem.out_shape, kind.out_dtype, problem.device,
                           None if stream is None else launch_stream)
        d_ptr = result.data_ptr() if framework is Framework.TORCH else result.data.ptr
    else:
        result, d_ptr = out, ptrs[4]
    if plan is None:
        if problem.k == 0 and problem.m and problem.n and problem.num_groups and not kind.accumulates:
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
        _check_layout_on_host(problem, views[5] if views is not None else read(layout, kind.layout),
                              launch_stream)
    if not problem.sfb_m_major:  # 1D1D kinds: B's 1x128 scales into the kernels' layout, as A's
        sfb_ptr, keep_b = to_m_major(problem, ptrs[3], sfb if views is None else views[3], launch_stream, framework,
                                     capturing, operand="b")
    else:
        sfb_ptr = ptrs[3]
    partials = counters = 0
    tickets = None  # a side-aware PDL launch's stream's two ticket sets (workspace.py), where it has them
    if plan.side_map and plan.pdl:
        if capturing is None and framework is Framework.TORCH:
            capturing = is_capturing(launch_stream)
        tickets = side_tickets(problem.device, launch_stream, framework, capturing)
    if plan.scratch_floats or plan.scratch_counters:
        # Counters that are only the side tickets need no scratch where the stream's ticket sets hold them.
        if tickets is None or plan.scratch_floats or plan.scratch_counters > SIDE_TICKET_COUNTERS:
            partials, counters, keep2 = scratch(plan.scratch_floats, plan.scratch_counters, problem.device,
                                                launch_stream, framework, capturing)
    page_sides = NO_PAGE_SIDES if packed is None else packed.launch_sides
    if tickets is not None:
        _launch_with_tickets(plan, problem.device, launch_stream, ptrs, sfa_ptr, sfb_ptr, d_ptr, partials, counters,
                             page_sides, tickets)
    elif single_gpu():
        plan.launch(launch_stream, ptrs[0], sfa_ptr, ptrs[2], sfb_ptr, d_ptr, ptrs[5], partials, counters,
                    page_sides=page_sides)
    else:
        with on_device(problem.device):
            plan.launch(launch_stream, ptrs[0], sfa_ptr, ptrs[2], sfb_ptr, d_ptr, ptrs[5], partials, counters,
                        page_sides=page_sides)
    del keep
    return result if out is not None else export_like(result, framework)


def _launch_with_tickets(plan: GemmPlan, device: int, stream: int, ptrs: tuple[int, ...], sfa_ptr: int, sfb_ptr: int,
                         d_ptr: int, partials: int, counters: int, page_sides: tuple[int, ...], tickets: Any) -> None:
    """Queue a side-aware PDL plan's kernel on the stream's ticket sets: the set it takes and the launch under their
    lock, so that launches on one stream from two threads still take the sets in turn."""
    with tickets.lock:
        taken = tickets.next_tickets()
        if single_gpu():
            plan.launch(stream, ptrs[0], sfa_ptr, ptrs[2], sfb_ptr, d_ptr, ptrs[5], partials, counters,
                        page_sides=page_sides, tickets=taken)
        else:
            with on_device(device):
                plan.launch(stream, ptrs[0], sfa_ptr, ptrs[2], sfb_ptr, d_ptr, ptrs[5], partials, counters,
                            page_sides=page_sides, tickets=taken)
        tickets.took_tickets()


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


def same_framework(*tensors: Any) -> None:
    """One call, one framework: a torch stream and a CuPy stream are not ordered with each other, so mixing would
    leave the result's ordering to chance. (Objects read through DLPack are capsules: not checked.)"""
    names = _NAMES + ("m_indices/masked_m",)
    framework = framework_of(tensors[0])
    for name, t in zip(names, tensors):
        if t is not None and framework_of(t) is not framework:
            raise TypeError(f"{name}: got a {type(t).__module__}.{type(t).__name__} while A is a {framework.value} "
                            f"tensor; pass every tensor of a call from one framework (convert with DLPack first)")


def _zeros(framework: Framework, shape: tuple[int, ...], dtype: Any, device: int, stream: int) -> Any:
    """A new output of zeros, cleared on ``stream``: the rows a grouped GEMM skips (padding rows, rows past
    masked_m) read as zeros, so a functional call's result is deterministic."""
    if framework is Framework.TORCH:
        import torch

        with torch_stream(stream, device):
            return torch.zeros(shape, dtype=torch.bfloat16 if dtype == BF16 else torch.float32,
                               device=torch.device("cuda", device))
    import cupy

    with cupy.cuda.Device(device), cupy_stream(stream, device):
        return cupy.zeros(shape, dtype=dtype)


def _zero(out: View, stream: int) -> None:
    import cupy

    with cupy.cuda.Device(out.device), cupy_stream(stream, out.device):
        cupy_view(out).view(cupy.uint16).fill(0)


def _check_layout_on_host(problem: validate.Problem, layout: View, stream: int) -> None:
    import cupy

    host = cupy_view(layout).get(stream=cupy_stream(stream, layout.device))
    problem.kind.check_layout(host, problem)


def call(kind: Any, lhs: tuple[Any, Any], rhs: Any, out: Any, layout: Any, static: int | None, stream: Any) -> Any:
    """A public function's call of ``kind``: unpack the ``(tensor, scales)`` pairs (``rhs`` may be
    :class:`~cupygemm.PackedWeights`), then :func:`run` for CuPy arrays and DLPack producers, or the framework's
    adapter for torch tensors and JAX arrays."""
    a, sfa = lhs if type(lhs) is tuple and len(lhs) == 2 else validate.pair(lhs, "lhs")
    packed = None
    if type(rhs) is PackedWeights:
        b, sfb = rhs.data, rhs.scales
        if rhs.side_aware:
            packed = rhs
    else:
        b, sfb = rhs if type(rhs) is tuple and len(rhs) == 2 else validate.pair(rhs, "rhs")
    framework = _frameworks.get(type(a)) or framework_of(a)
    if packed is not None and framework is not Framework.JAX and framework_of(b) is not framework:
        raise TypeError(f"rhs: packed weights held by {framework_of(b).value}, while A is a {framework.value} "
                        "tensor; pack the weights with the framework of the call")
    if framework is Framework.CUPY or framework is Framework.OTHER:
        return run(kind, a, sfa, b, sfb, out, layout, static, stream, framework, packed)
    return adapter(framework).gemm(kind, a, sfa, b, sfb, out, layout, static, stream, packed)
