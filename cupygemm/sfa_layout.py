"""A's scales (SFA) in the GEMM kernels' layout, for calls whose SFA is not M-major already.

The kernels read SFA as [G][ceil(K/128)][m_pad] float32 (M-major, each K block's column of m_pad rows 16-byte
aligned: what :func:`cupygemm.get_col_major_tma_aligned_tensor` returns). The casts return row-major scales
(DeepGEMM's convention), so a call on them copies SFA into that layout first, on the call's stream, into the
stream's buffer (:func:`cupygemm.workspace.sfa_buffer`). The copy is ``cuda_src/sfa_layout.cu``, launched through
the driver with parameters packed once per pointer set; CuPy's strided assignment into a new array, which did it
before, cost the call 20-25 us of host time (benchmarks/NOTES.md 35). SFA with strides the kernel cannot take
(negative ones) is copied by its framework instead.
"""
from __future__ import annotations

import threading
from typing import Any

from .config import KIND_MASKED
from .device import on_device, single_gpu
from .launch import PTR, U32, Launcher, make_launcher
from .streams import cupy_stream, torch_stream
from .tensors import Framework, View, cupy_view, read
from .util import ceil_div
from .validate import Problem
from .workspace import sfa_buffer

_THREADS = 256
_MAX_BLOCKS = 1024  # enough to fill the GPU; a larger SFA loops inside the kernel
# src, dst, group / row / column strides (elements, 64-bit), m, kb, m_pad, groups
_KINDS = (PTR, PTR, PTR, PTR, PTR, U32, U32, U32, U32)
_PACKED_LIMIT = 256

_lock = threading.Lock()
# device -> the loaded kernel (it holds the module, which a launcher's bare function handle does not) and its
# launcher
_launchers: dict[int, tuple[Any, Launcher]] = {}
_packed: dict[tuple, Any] = {}  # (device, src, dst, strides, m, kb, m_pad, groups) -> packed parameters


def kernel_source():
    """The rendered ``sfa_layout.cu`` (compiles without a GPU)."""
    from .jit.source import render

    return render("sfa_layout.cu", "sfa_to_m_major", {})


def _launcher(device: int) -> Launcher:
    entry = _launchers.get(device)
    if entry is None:
        import cupy

        from .jit.build import load_kernel

        with cupy.cuda.Device(device):
            loaded = load_kernel(kernel_source(), post_process=False)
            made = (loaded, make_launcher(loaded.function, _KINDS))
        with _lock:
            entry = _launchers.setdefault(device, made)
    return entry[1]


def to_m_major(problem: Problem, sfa_ptr: int, sfa: Any, stream: int, framework: Framework,
               capturing: bool | None = None) -> tuple[int, Any]:
    """SFA (the caller's tensor, or its View, ``sfa`` at ``sfa_ptr``) of ``problem`` copied on ``stream`` into
    [G][ceil(K/128)][m_pad]; returns its pointer and the buffer's owner, to keep alive until the GEMM is queued.
    ``capturing``: whether ``stream`` is being captured, where the caller knows it already
    (:func:`cupygemm.workspace.sfa_buffer`)."""
    g = problem.num_groups if problem.kind == KIND_MASKED else 1
    kb, m, m_pad, device = ceil_div(problem.k, 128), problem.m, problem.sfa_m_pad, problem.device
    ptr, owner = sfa_buffer(g * kb * m_pad, device, stream, framework, capturing)
    strides = problem.sfa_strides
    if strides is None:
        view = sfa if isinstance(sfa, View) else read(sfa, "lhs[1] (A scales)")
        _framework_copy(view, ptr, owner, g, m, kb, m_pad, stream, framework, device)
        return ptr, owner
    key = (device, sfa_ptr, ptr, strides, m, kb, m_pad, g)
    params = _packed.get(key)
    launcher = _launcher(device)
    if params is None:
        params = launcher.pack((sfa_ptr, ptr, *strides, m, kb, m_pad, g))
        if len(_packed) >= _PACKED_LIMIT:
            del _packed[next(iter(_packed))]
        _packed[key] = params
    grid = min(ceil_div(g * kb * m, _THREADS), _MAX_BLOCKS)
    if single_gpu():
        launcher.launch(params, grid, _THREADS, 0, stream)
    else:
        with on_device(device):
            launcher.launch(params, grid, _THREADS, 0, stream)
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
