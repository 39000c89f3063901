"""GPU FP8 (e4m3fn) quantization with DeepSeek-V3 fine-grained scales.

``per_token_cast_to_fp8`` (1x128 groups, for the LHS / activations) and ``per_block_cast_to_fp8``
(128x128 blocks, for the RHS / weights). Both are bit-exact with :mod:`cupygemm.reference` (the DeepGEMM 03d0be3
casts)::

    amax  = max(max|x| over the group (FP32), 1e-4)
    q     = e4m3fn(x * (448 / amax))      # FP32, IEEE division and multiply, round to nearest even
    scale = amax / 448

Inputs are 2-D GPU arrays ``[m, n]`` of bfloat16 (``ml_dtypes.bfloat16`` CuPy arrays, torch/JAX bf16), float32 or
float16; ``n`` (and ``m``) need not be multiples of 128 (the tail groups are padded with zeros). The last dimension
must have unit stride; any row stride is accepted. The kernels run on CuPy's current stream.

Results are ``(q, s)``:

* ``q``: ``uint8`` ``[m, n]`` holding the e4m3fn bits (CuPy cannot represent FP8). A torch caller receives a
  ``torch.uint8`` tensor: ``q.view(torch.float8_e4m3fn)`` is the FP8 view, without a copy. JAX callers receive a
  ``uint8`` array (``jax.lax.bitcast_convert_type(q, jnp.float8_e4m3fn)`` reinterprets it).
* ``s``: ``float32``, ``[m, ceil(n/128)]`` (per-token) or ``[ceil(m/128), ceil(n/128)]`` (per-block), row-major.
  For the GEMM's LHS, convert the per-token scales with
  :func:`cupygemm.layout.get_col_major_tma_aligned_tensor`.

Both come back in the framework of ``x`` (CuPy, torch or JAX, zero-copy through DLPack).
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .errors import CupygemmDeviceError
from .tensors import BF16, as_cupy, export_like, framework_of, require_cupy

__all__ = ["per_token_cast_to_fp8", "per_block_cast_to_fp8"]

_GROUP = 128
_THREADS = 256
# Input dtype -> CUPYGEMM_QUANT_IN_KIND in cuda_src/quantize.cu.
_IN_KINDS = {np.dtype(np.float32): 0, BF16: 1, np.dtype(np.float16): 2}
# Entry point -> CUPYGEMM_QUANT_KERNEL.
_ENTRIES = {"per_token_cast_to_fp8": 0, "per_block_cast_to_fp8": 1}

_lock = threading.Lock()
_kernels: dict[tuple[int, int, str], Any] = {}  # (device, input kind, entry) -> cupy Function
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


def _get_kernel(dtype: np.dtype, entry: str) -> Any:
    cupy = require_cupy()
    dev = cupy.cuda.runtime.getDevice()
    key = (dev, _IN_KINDS[dtype], entry)
    fn = _kernels.get(key)
    if fn is None:
        _check_device(cupy, dev)
        from .jit.build import load_kernel

        loaded = load_kernel(_kernel_source(dtype, entry), post_process=False)
        with _lock:
            fn = _kernels.setdefault(key, loaded.function)
    return fn


def _prepare(x: Any, name: str = "x") -> tuple[Any, int, int, int]:
    """Validate ``x`` and return (CuPy view, m, n, row stride in elements)."""
    xc = as_cupy(x, name)
    if xc.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D [m, n] array, got {xc.ndim}-D with shape {tuple(xc.shape)}")
    if xc.dtype not in _IN_KINDS:
        hint = " (already FP8 bits?)" if xc.dtype == np.uint8 else ""
        raise TypeError(f"{name}: expected dtype bfloat16, float32 or float16, got {xc.dtype}{hint}")
    m, n = (int(d) for d in xc.shape)
    item = xc.dtype.itemsize
    s0, s1 = (int(st) for st in xc.strides)
    if m == 0 or n == 0:  # nothing is read (and CuPy gives empty arrays zero strides)
        return xc, m, n, n
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
    return xc, m, n, ld


def _launch(entry: str, xc: Any, q: Any, s: Any, grid: int, args: tuple) -> None:
    cupy = require_cupy()
    fn = _get_kernel(xc.dtype, entry)
    fn((grid,), (_THREADS,), (xc, q, s) + tuple(np.int64(a) for a in args),
       stream=cupy.cuda.get_current_stream())


def per_token_cast_to_fp8(x: Any) -> tuple[Any, Any]:
    """Quantize ``x`` [m, n] to e4m3fn with one FP32 scale per row and 128 columns (1x128 groups).

    Returns ``(q, s)``: ``q`` uint8 [m, n] (e4m3fn bits), ``s`` float32 [m, ceil(n/128)] row-major, in the
    framework of ``x``. Bit-exact with :func:`cupygemm.reference.per_token_cast_to_fp8_reference`.
    """
    cupy = require_cupy()
    xc, m, n, ld = _prepare(x)
    nb = (n + _GROUP - 1) // _GROUP
    q = cupy.empty((m, n), dtype=np.uint8)
    s = cupy.empty((m, nb), dtype=np.float32)
    items = m * nb
    if items:
        warps = _THREADS // 32
        _launch("per_token_cast_to_fp8", xc, q, s, (items + warps - 1) // warps, (m, n, ld, nb))
    fw = framework_of(x)
    return export_like(q, fw), export_like(s, fw)


def per_block_cast_to_fp8(x: Any) -> tuple[Any, Any]:
    """Quantize ``x`` [m, n] to e4m3fn with one FP32 scale per 128x128 block.

    Returns ``(q, s)``: ``q`` uint8 [m, n] (e4m3fn bits), ``s`` float32 [ceil(m/128), ceil(n/128)] row-major,
    in the framework of ``x``. Bit-exact with :func:`cupygemm.reference.per_block_cast_to_fp8_reference`.
    """
    cupy = require_cupy()
    xc, m, n, ld = _prepare(x)
    mb = (m + _GROUP - 1) // _GROUP
    nb = (n + _GROUP - 1) // _GROUP
    q = cupy.empty((m, n), dtype=np.uint8)
    s = cupy.empty((mb, nb), dtype=np.float32)
    if mb * nb:
        _launch("per_block_cast_to_fp8", xc, q, s, mb * nb, (m, n, ld, nb))
    fw = framework_of(x)
    return export_like(q, fw), export_like(s, fw)
