"""GPU FP8 (e4m3fn) quantization with DeepSeek-V3 fine-grained scales.

``per_token_cast_to_fp8`` (1x128 groups, for the LHS / activations) and ``per_block_cast_to_fp8``
(128x128 blocks, for the RHS / weights). Both are bit-exact with :mod:`cupygemm.reference` (the DeepGEMM 03d0be3
casts)::

    amax  = max(max|x| over the group (FP32), 1e-4)
    q     = e4m3fn(x * (448 / amax))      # FP32, IEEE division and multiply, round to nearest even
    scale = amax / 448

Inputs are 2-D GPU arrays ``[m, n]`` of bfloat16 (``ml_dtypes.bfloat16`` CuPy arrays, torch/JAX bf16), float32 or
float16; ``n`` (and ``m``) need not be multiples of 128 (the tail groups are padded with zeros). The last dimension
must have unit stride; any row stride is accepted. The kernels run on the caller's stream (see
:mod:`cupygemm.streams`; ``stream=`` overrides it).

Results are ``(q, s)``, made by the caller's framework:

* ``q``: ``[m, n]`` e4m3fn: ``torch.float8_e4m3fn`` for torch callers, ``jnp.float8_e4m3fn`` for JAX callers,
  ``uint8`` holding the e4m3fn bits for CuPy callers (CuPy cannot represent FP8).
* ``s``: ``float32``, ``[m, ceil(n/128)]`` (per-token) or ``[ceil(m/128), ceil(n/128)]`` (per-block), row-major.
  The GEMMs take per-token scales in this layout (and transpose them per call) or, faster, already in the
  M-major layout of :func:`cupygemm.layout.get_col_major_tma_aligned_tensor`.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .device import on_device
from .errors import CupygemmDeviceError
from .frameworks import adapter
from .jit.loader import PackedParams, SmallKernel, ensure_context
from .launch import I64, PTR
from .streams import resolve
from .tensors import BF16, F16, F32, FP8_E4M3, Framework, View, empty, framework_of, gpu_device_of, \
    is_torch_tensor, read, require_cupy
from .util import ceil_div

__all__ = ["per_token_cast_to_fp8", "per_block_cast_to_fp8"]

_GROUP = 128
_THREADS = 256
# Input dtype -> CUPYGEMM_QUANT_IN_KIND in cuda_src/quantize.cu.
_IN_KINDS = {F32: 0, BF16: 1, F16: 2}
# Entry point -> CUPYGEMM_QUANT_KERNEL.
_ENTRIES = {"per_token_cast_to_fp8": 0, "per_block_cast_to_fp8": 1}

_checked_devices: set[int] = set()


def _kernel_source(dtype: Any, entry: str):
    """The rendered ``quantize.cu`` for one input dtype and entry point (compiles without a GPU)."""
    from .jit.source import render

    dtype = np.dtype(dtype)
    if dtype not in _IN_KINDS:
        raise TypeError(f"no quantization kernel for input dtype {dtype}; expected float32, bfloat16 or float16")
    if entry not in _ENTRIES:
        raise ValueError(f"unknown quantization entry point {entry!r}; expected one of {sorted(_ENTRIES)}")
    return render("quantize.cu", entry, {"CUPYGEMM_QUANT_IN_KIND": _IN_KINDS[dtype],
                                         "CUPYGEMM_QUANT_KERNEL": _ENTRIES[entry]})


def _check_device(cupy: Any, dev: int) -> None:
    if dev in _checked_devices:
        return
    cc = cupy.cuda.Device(dev).compute_capability
    if cc != "90":
        raise CupygemmDeviceError(
            f"cupygemm's FP8 kernels are built for sm_90a (Hopper, compute capability 9.0); device {dev} has "
            f"compute capability {cc[:-1]}.{cc[-1]}"
        )
    _checked_devices.add(dev)


# x, q, s, m, n, ld_x, num_groups / num_col_blocks (long long); one build per (input dtype, entry point)
_CASTS = SmallKernel(_kernel_source, (PTR, PTR, PTR, I64, I64, I64, I64),
                     check=lambda dev: _check_device(require_cupy(), dev))
_params = PackedParams()  # the values above -> packed parameters (callers' buffers come back: the allocators reuse)


def _get_kernel(dtype: np.dtype, entry: str, dev: int) -> Any:
    """The cast kernel for ``dtype`` (an input dtype) and ``entry`` loaded on ``dev`` (a LoadedKernel)."""
    return _CASTS.get(dev, dtype, entry)


def _prepare(x: Any, name: str = "x") -> tuple[View, int, int, int]:
    """Validate the input (a tensor or its View) and return (View, m, n, row stride in elements)."""
    v = x if isinstance(x, View) else read(x, name)
    if v.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D [m, n] array, got {v.ndim}-D with shape {tuple(v.shape)}")
    if v.dtype not in _IN_KINDS:
        hint = " (already FP8 bits?)" if v.dtype.itemsize == 1 else ""
        raise TypeError(f"{name}: expected dtype bfloat16, float32 or float16, got {v.dtype}{hint}")
    m, n = v.shape
    item = v.itemsize
    s0, s1 = v.strides
    if m == 0 or n == 0:  # nothing is read (and CuPy gives empty arrays zero strides)
        return v, m, n, n
    if n > 1 and s1 != item:
        raise ValueError(
            f"{name}: the last dimension must have unit stride ({item} bytes), got a stride of {s1} bytes; "
            "pass a contiguous array (e.g. cupy.ascontiguousarray(x))"
        )
    if m > 1:
        if s0 % item:
            raise ValueError(f"{name}: row stride {s0} bytes is not a multiple of the element size {item}")
        ld = s0 // item
    else:
        ld = n
    return v, m, n, ld


def run_cast(entry: str, x: Any, stream: Any, framework: Framework) -> tuple[Any, Any]:
    """One cast on the caller's tensor (CuPy, torch, or another DLPack producer, whose results are CuPy arrays);
    returns (q, s) made by that framework."""
    if framework in (Framework.TORCH, Framework.CUPY):
        v, m, n, ld = _prepare(x)
        launch_stream = resolve(stream, framework, v.device)
    else:  # DLPack producers order their pending writes before the stream we launch on
        launch_stream = resolve(stream, framework, gpu_device_of(x, "x"))
        v, m, n, ld = _prepare(read(x, "x", launch_stream))
    alloc_stream = None if stream is None else launch_stream  # allocated in the order of the stream writing them
    q = empty(framework, (m, n), FP8_E4M3, v.device, alloc_stream)
    s = empty(framework, (scale_rows(entry, m), ceil_div(n, _GROUP)), F32, v.device, alloc_stream)
    launch_cast(entry, v.dtype, v.ptr, _ptr(q), _ptr(s), m, n, ld, launch_stream, v.device)
    return q, s


def scale_rows(entry: str, m: int) -> int:
    """Rows of the scales a cast of ``m`` rows returns."""
    return m if entry == "per_token_cast_to_fp8" else ceil_div(m, _GROUP)


def launch_cast(entry: str, dtype: np.dtype, x: int, q: int, s: int, m: int, n: int, ld: int, stream: int,
                device: int) -> None:
    """Launch a cast kernel over device pointers on ``stream`` (x [m, n] with row stride ``ld`` elements; q and s
    dense). Loads the kernel on first use."""
    nb = ceil_div(n, _GROUP)
    items = scale_rows(entry, m) * nb
    if not items:
        return
    grid = ceil_div(items, _THREADS // 32) if entry == "per_token_cast_to_fp8" else items
    values = (x, q, s, m, n, ld, nb)
    params = _params.get(values)
    if params is None:
        params = _params.put(values, _CASTS.pack(device, values, dtype, entry))
    with on_device(device):
        ensure_context(device)  # as CuPy's launches did: this may be the thread's first CUDA work
        _CASTS.launch(device, stream, grid, _THREADS, 0, params, dtype, entry)


def _ptr(x: Any) -> int:
    return x.data_ptr() if is_torch_tensor(x) else x.data.ptr


def per_token_cast_to_fp8(x: Any, *, stream: Any = None) -> tuple[Any, Any]:
    """Quantize ``x`` [m, n] to e4m3fn with one FP32 scale per row and 128 columns (1x128 groups).

    Returns ``(q, s)``: ``q`` e4m3fn [m, n] (uint8 bits for CuPy callers), ``s`` float32 [m, ceil(n/128)]
    row-major, made by the framework of ``x``, on the caller's stream (``stream=`` overrides it). Bit-exact with
    :func:`cupygemm.reference.per_token_cast_to_fp8_reference`.
    """
    return _route("per_token_cast_to_fp8", x, stream)


def per_block_cast_to_fp8(x: Any, *, stream: Any = None) -> tuple[Any, Any]:
    """Quantize ``x`` [m, n] to e4m3fn with one FP32 scale per 128x128 block.

    Returns ``(q, s)``: ``q`` e4m3fn [m, n] (uint8 bits for CuPy callers), ``s`` float32
    [ceil(m/128), ceil(n/128)] row-major, made by the framework of ``x``, on the caller's stream (``stream=``
    overrides it). Bit-exact with :func:`cupygemm.reference.per_block_cast_to_fp8_reference`.
    """
    return _route("per_block_cast_to_fp8", x, stream)


def _route(entry: str, x: Any, stream: Any) -> tuple[Any, Any]:
    """torch tensors and JAX arrays go to their framework's adapter (the torch operators; cupygemm.jax's jittable
    casts, bit-exact with these kernels), the rest straight to the kernels."""
    framework = framework_of(x)
    if framework is Framework.TORCH or framework is Framework.JAX:
        return adapter(framework).cast(entry, x, stream)
    return run_cast(entry, x, stream, framework)
