"""A's scales (SFA) in the GEMM kernels' layout, for calls whose SFA is not M-major already.

The kernels read SFA as [G][ceil(K/128)][m_pad] float32 (M-major, each K block's column of m_pad rows 16-byte
aligned: what :func:`cupygemm.get_col_major_tma_aligned_tensor` returns). The casts return row-major scales
(DeepGEMM's convention), so a call on them copies SFA into that layout first, on the call's stream, into the
stream's buffer (:func:`cupygemm.workspace.sfa_buffer`). The copy is ``cuda_src/sfa_layout.cu``, launched through
the driver with parameters packed once per pointer set; CuPy's strided assignment into a new array, which did it
before, cost the call 20-25 us of host time (benchmarks/NOTES.md, "Row-major A scales"). SFA with strides the kernel
cannot take (negative ones) is copied by its framework instead.
"""
from __future__ import annotations

from typing import Any

from .device import on_device, single_gpu
from .jit.loader import PackedParams, SmallKernel
from .jit.source import KernelSource, render
from .launch import PTR, U32, U64
from .streams import cupy_stream, torch_stream
from .tensors import Framework, View, cupy_view, read
from .util import ceil_div
from .validate import Problem
from .workspace import sfa_buffer

_THREADS = 256
_MAX_BLOCKS = 1024  # enough to fill the GPU; a larger SFA loops inside the kernel


def kernel_source() -> KernelSource:
    """The rendered ``sfa_layout.cu`` (compiles without a GPU)."""
    return render("sfa_layout.cu", "sfa_to_m_major", {})


# src, dst, group / row / column strides (elements, 64-bit), m, kb, m_pad, groups
_COPY = SmallKernel(kernel_source, (PTR, PTR, U64, U64, U64, U32, U32, U32, U32))
_params = PackedParams()  # (device, src, dst, strides, m, kb, m_pad, groups) -> packed parameters


def to_m_major(problem: Problem, sfa_ptr: int, sfa: Any, stream: int, framework: Framework,
               capturing: bool | None = None, operand: str = "a") -> tuple[int, Any]:
    """SFA (the caller's tensor, or its View, ``sfa`` at ``sfa_ptr``) of ``problem`` copied on ``stream`` into
    [G][ceil(K/128)][m_pad]; returns its pointer and the buffer's owner, to keep alive until the GEMM is queued.
    ``capturing``: whether ``stream`` is being captured, where the caller knows it already
    (:func:`cupygemm.workspace.sfa_buffer`). ``operand="b"``: the 1x128 scales of B (the 1D1D kinds) instead, into
    [ceil(K/128)][n_pad], in a buffer of their own."""
    if operand == "b":
        g, m, m_pad, strides = 1, problem.n, problem.sfb_m_pad, problem.sfb_strides
    else:
        g = problem.num_groups if problem.kind.a_dims[0] == "G" else 1  # A's groups: its scales' too
        m, m_pad, strides = problem.m, problem.sfa_m_pad, problem.sfa_strides
    kb, device = ceil_div(problem.k, 128), problem.device
    ptr, owner = sfa_buffer(g * kb * m_pad, device, stream, framework, capturing, operand)
    if strides is None:
        view = sfa if isinstance(sfa, View) else read(sfa, "scales")
        _framework_copy(view, ptr, owner, g, m, kb, m_pad, stream, framework, device)
        return ptr, owner
    key = (device, sfa_ptr, ptr, strides, m, kb, m_pad, g)
    params = _params.get(key)
    if params is None:
        params = _params.put(key, _COPY.pack(device, (sfa_ptr, ptr, *strides, m, kb, m_pad, g)))
    grid = min(ceil_div(g * kb * m, _THREADS), _MAX_BLOCKS)
    if single_gpu():
        _COPY.launch(device, stream, grid, _THREADS, 0, params)
    else:
        with on_device(device):
            _COPY.launch(device, stream, grid, _THREADS, 0, params)
    return ptr, owner


def _framework_copy(sfa: Any, ptr: int, owner: Any, g: int, m: int, kb: int, m_pad: int, stream: int,
                    framework: Framework, device: int) -> None:
    """The copy by SFA's framework, for strides the kernel does not take."""
    if framework is Framework.TORCH:
        with torch_stream(stream, device):
            owner[:g * kb * m_pad].view(g, kb, m_pad)[:, :, :m].copy_(sfa.obj.reshape(g, m, kb).transpose(1, 2))
        return
    import cupy

    with cupy.cuda.Device(device), cupy_stream(stream, device):
        dst = owner[:g * kb * m_pad].reshape(g, kb, m_pad)
        dst[:, :, :m] = cupy_view(sfa).reshape(g, m, kb).transpose(0, 2, 1)
