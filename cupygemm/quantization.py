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

The casts training needs also write transposed copies, in the same pass over ``x`` (``cuda_src/cast_transpose.cu``):
:func:`per_token_cast_to_fp8_transposed` gives ``per_token_cast_to_fp8(x.T)`` (the K-major operands of the wgrad
GEMM: activations and output gradients quantized along the token axis), optionally with ``per_token_cast_to_fp8(x)``
too and with its scales straight in the GEMMs' M-major layout; ``per_block_cast_to_fp8(w, with_transpose=True)``
gives ``per_block_cast_to_fp8(w.T)`` as well (dgrad's B operand). Each is bit-exact with the composition it names.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from .device import get_num_sms, on_device, single_gpu
from .errors import CupygemmDeviceError
from .frameworks import adapter
from .jit.loader import PackedParams, SmallKernel
from .launch import I64, PTR
from .streams import resolve
from .tensors import BF16, F16, F32, FP8_E4M3, Framework, View, empty, framework_of, gpu_device_of, \
    is_torch_tensor, read, require_cupy
from .util import ceil_div, round_up

__all__ = ["per_token_cast_to_fp8", "per_block_cast_to_fp8", "per_token_cast_to_fp8_transposed"]

_GROUP = 128
_THREADS = 256
# Input dtype -> CUPYGEMM_QUANT_IN_KIND in cuda_src/quantize.cu.
_IN_KINDS = {F32: 0, BF16: 1, F16: 2}
# Entry point -> CUPYGEMM_QUANT_KERNEL.
_ENTRIES = {"per_token_cast_to_fp8": 0, "per_block_cast_to_fp8": 1}

_checked_devices: set[int] = set()


# The fused casts of cuda_src/cast_transpose.cu: entry point -> CUPYGEMM_CT_MODE.
TRANSPOSED = "per_token_cast_to_fp8_transposed"
TRANSPOSED_ROWWISE = "per_token_cast_to_fp8_transposed_rowwise"
BLOCK_WITH_TRANSPOSE = "per_block_cast_to_fp8_with_transpose"
_FUSED = {TRANSPOSED: 0, TRANSPOSED_ROWWISE: 1, BLOCK_WITH_TRANSPOSE: 2}
# Their parameters: x, q_t, s_t, q, s, then m, n, ld_x, s_t's row and column strides, s_t's rows (all 64-bit).
_FUSED_KINDS = (PTR,) * 11
_U64 = (1 << 64) - 1
# Per entry: tiles whose loads are in flight while a CTA casts another (CUPYGEMM_CT_STAGES). With stages, CTAs are
# persistent (as many as fit on the SMs, each taking every grid-th tile); without, one CTA per tile.
# CUPYGEMM_CT_L2_PREFETCH: the L2 fetch size the stages' copies ask for (0, 128, 256). On an H100 (bf16, 4096 tokens
# x 512..32768, benchmarks/results/casts-ab-h100-2026-11-27.json) one stage with 256-byte fetches took the transposed
# cast from 0.82 to 0.87 of a copy's bandwidth (geometric mean; 0.89 at 16384 columns) and the row-wise one from 0.79
# to 0.83; one stage without the hint 0.81 and 0.79, two stages 0.86 and 0.82; the per-block cast gained nothing
# from a stage (0.919 either way) and keeps one CTA per tile.
_FUSED_STAGES = {TRANSPOSED: 1, TRANSPOSED_ROWWISE: 1, BLOCK_WITH_TRANSPOSE: 0}
_FUSED_L2_PREFETCH = 256
_SM_SMEM = 228 * 1024  # shared memory of an H100 SM
_CTA_SMEM_EXTRA = 6 * 1024  # per CTA beside the ring: the row maxima and factors (<= 4.5 KiB), 1 KiB reserved

def _kernel_source(dtype: Any, entry: str):
    """The rendered kernel source (``quantize.cu`` or, for the fused casts, ``cast_transpose.cu``) for one input
    dtype and entry point (compiles without a GPU)."""
    from .jit.source import render

    dtype = np.dtype(dtype)
    if dtype not in _IN_KINDS:
        raise TypeError(f"no quantization kernel for input dtype {dtype}; expected float32, bfloat16 or float16")
    if entry in _FUSED:
        return render("cast_transpose.cu", entry, fused_cast_defines(dtype, entry))
    if entry not in _ENTRIES:
        raise ValueError(f"unknown quantization entry point {entry!r}; expected one of {sorted(_ENTRIES | _FUSED)}")
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


def run_cast(entry: str, x: Any, stream: Any, framework: Framework, m_major_scales: bool = False) -> tuple[Any, ...]:
    """One cast on the caller's tensor (CuPy, torch, or another DLPack producer, whose results are CuPy arrays);
    returns its results made by that framework: (q, s) for quantize.cu's casts, the fused casts' as
    :func:`fused_cast_outputs` lists them. ``m_major_scales``: the fused per-token casts' s_t in the GEMMs' M-major
    layout."""
    if framework in (Framework.TORCH, Framework.CUPY):
        v, m, n, ld = _prepare(x)
        launch_stream = resolve(stream, framework, v.device)
    else:  # DLPack producers order their pending writes before the stream we launch on
        launch_stream = resolve(stream, framework, gpu_device_of(x, "x"))
        v, m, n, ld = _prepare(read(x, "x", launch_stream))
    alloc_stream = None if stream is None else launch_stream  # allocated in the order of the stream writing them
    if entry in _FUSED:
        return _run_fused(entry, v, m, n, ld, launch_stream, framework, m_major_scales, alloc_stream)
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
        _CASTS.launch(device, stream, grid, _THREADS, 0, params, dtype, entry)


def _ptr(x: Any) -> int:
    return x.data_ptr() if is_torch_tensor(x) else x.data.ptr


# ---- the fused casts (cuda_src/cast_transpose.cu) ---------------------------------------------------------------

class CastOutput(NamedTuple):
    """One result of a fused cast: its name, shape and dtype (``FP8_E4M3`` or ``F32``), and the dense buffer
    holding it. ``buffer == shape`` for every result but M-major scales, whose buffer is
    ``(ceil(m/128), round_up(n, 4))`` float32 and which are ``buffer[:, :n].T`` (strides ``(1, round_up(n, 4))``
    elements, exactly what :func:`cupygemm.get_col_major_tma_aligned_tensor` returns; the padding columns of the
    buffer are written with zeros)."""

    name: str
    shape: tuple[int, int]
    dtype: np.dtype
    buffer: tuple[int, int]


def fused_cast_outputs(entry: str, m: int, n: int, m_major_scales: bool = False) -> tuple[CastOutput, ...]:
    """The results of fused cast ``entry`` of an ``[m, n]`` input, in the order the cast returns them:

    * ``per_token_cast_to_fp8_transposed``: ``q_t`` e4m3 [n, m], ``s_t`` f32 [n, ceil(m/128)]
    * ``per_token_cast_to_fp8_transposed_rowwise``: those, then ``q`` e4m3 [m, n], ``s`` f32 [m, ceil(n/128)]
    * ``per_block_cast_to_fp8_with_transpose``: ``q`` e4m3 [m, n], ``s`` f32 [ceil(m/128), ceil(n/128)], ``q_t``
      e4m3 [n, m], ``s_t`` f32 [ceil(n/128), ceil(m/128)] (= ``s.T``, dense)

    ``m_major_scales`` (per-token entries only): ``s_t`` in the M-major layout (see :class:`CastOutput`).
    """
    if entry not in _FUSED:
        raise ValueError(f"unknown fused cast {entry!r}; expected one of {sorted(_FUSED)}")
    mb, nb = ceil_div(m, _GROUP), ceil_div(n, _GROUP)
    q_t = CastOutput("q_t", (n, m), FP8_E4M3, (n, m))
    if entry == BLOCK_WITH_TRANSPOSE:
        if m_major_scales:
            raise ValueError("m_major_scales: the per-block cast's scales have one layout (s_t = s.T, dense)")
        return (CastOutput("q", (m, n), FP8_E4M3, (m, n)), CastOutput("s", (mb, nb), F32, (mb, nb)), q_t,
                CastOutput("s_t", (nb, mb), F32, (nb, mb)))
    s_t = CastOutput("s_t", (n, mb), F32, (mb, round_up(n, 4)) if m_major_scales else (n, mb))
    if entry == TRANSPOSED:
        return q_t, s_t
    return q_t, s_t, CastOutput("q", (m, n), FP8_E4M3, (m, n)), CastOutput("s", (m, nb), F32, (m, nb))


#: :func:`fused_cast_outputs` memoized for the call path (ints only: torch's fake implementations pass SymInts).
_fused_outputs = functools.lru_cache(maxsize=1024)(fused_cast_outputs)


# ---- the host contract of cast_transpose.cu: its compile-time constants, block, shared memory and grid ----

def fused_cast_defines(dtype: Any, entry: str, stages: int | None = None,
                       l2_prefetch: int | None = None) -> dict[str, int]:
    """The CUPYGEMM_* constants cast_transpose.cu is rendered with for input ``dtype`` and fused cast ``entry``
    (``stages`` and ``l2_prefetch`` override the defaults, for probes)."""
    return {"CUPYGEMM_QUANT_IN_KIND": _IN_KINDS[np.dtype(dtype)], "CUPYGEMM_CT_MODE": _FUSED[entry],
            "CUPYGEMM_CT_STAGES": _FUSED_STAGES[entry] if stages is None else stages,
            "CUPYGEMM_CT_L2_PREFETCH": _FUSED_L2_PREFETCH if l2_prefetch is None else l2_prefetch}


def fused_cast_threads(dtype: Any) -> int:
    """Threads of a fused cast's CTA: 128 for 16-bit inputs, 256 for float32 (``kThreads`` in cast_transpose.cu)."""
    return 128 if np.dtype(dtype).itemsize == 2 else 256


def fused_cast_smem(dtype: Any, entry: str, stages: int | None = None) -> int:
    """Dynamic shared memory of a launch (``kRingBytes``): ``stages`` 128 x 128 tiles of x."""
    return (_FUSED_STAGES[entry] if stages is None else stages) * _GROUP * _GROUP * np.dtype(dtype).itemsize


#: The most dynamic shared memory any fused cast is launched with (the kernels are allowed it when loaded).
_FUSED_MAX_SMEM = max(fused_cast_smem(d, e) for d in _IN_KINDS for e in _FUSED)


def fused_cast_ctas_per_sm(dtype: Any, entry: str, stages: int | None = None) -> int:
    """CTAs of a fused cast one SM holds: 512 threads by registers (``kMinBlocks``), fewer where the ring does not
    fit the shared memory of that many."""
    regs = 512 // fused_cast_threads(dtype)
    return max(1, min(regs, _SM_SMEM // (fused_cast_smem(dtype, entry, stages) + _CTA_SMEM_EXTRA)))


def fused_cast_grid(entry: str, dtype: Any, m: int, n: int, num_sms: int, stages: int | None = None) -> int:
    """CTAs of one launch: one per 128 x 128 tile without stages, else the tiles or as many CTAs as the SMs hold,
    whichever is fewer."""
    tiles = ceil_div(m, _GROUP) * ceil_div(n, _GROUP)
    if (_FUSED_STAGES[entry] if stages is None else stages) == 0:
        return tiles
    return min(tiles, num_sms * fused_cast_ctas_per_sm(dtype, entry, stages))


def fused_cast_args(entry: str, x: int, q_t: int, s_t: int, q: int, s: int, m: int, n: int, ld: int,
                    m_major_scales: bool = False) -> tuple[int, ...]:
    """The kernel arguments of one launch of fused cast ``entry``, as unsigned 64-bit values (``ld`` may be
    negative: two's complement, which the kernel reads back)."""
    mb, nb = ceil_div(m, _GROUP), ceil_div(n, _GROUP)
    if entry == BLOCK_WITH_TRANSPOSE:
        st = (mb, 1, nb)  # s_t [nb, mb] dense
    elif m_major_scales:
        n_pad = round_up(n, 4)
        st = (1, n_pad, n_pad)  # s_t[c, j] at c + j * n_pad; rows n .. n_pad - 1 get zeros
    else:
        st = (mb, 1, n)
    return (x, q_t, s_t, q, s, m, n, ld & _U64, *st)


_FUSED_CASTS = SmallKernel(_kernel_source, _FUSED_KINDS, dynamic_smem=_FUSED_MAX_SMEM,
                           check=lambda dev: _check_device(require_cupy(), dev))
_fused_launches = PackedParams()  # as _params, for the fused casts: (grid, block, smem, packed parameters)


def load_fused_cast(entry: str, dtype: Any, device: int) -> None:
    """Build (or fetch from the cache) and load fused cast ``entry`` for input ``dtype`` on ``device`` now, e.g.
    before an XLA or CUDA-graph capture; :func:`launch_fused_cast` does it on first use otherwise."""
    if entry not in _FUSED:
        raise ValueError(f"unknown fused cast {entry!r}; expected one of {sorted(_FUSED)}")
    _FUSED_CASTS.get(device, np.dtype(dtype), entry)


def launch_fused_cast(entry: str, dtype: np.dtype, x: int, q_t: int, s_t: int, q: int, s: int, m: int, n: int,
                      ld: int, stream: int, device: int, m_major_scales: bool = False) -> None:
    """Launch fused cast ``entry`` over device pointers on ``stream`` (a raw ``cudaStream_t``) of ``device``: the
    framework adapters' entry point (no allocation, no validation beyond what the arguments say).

    ``x``: [m, n] of ``dtype`` (float32, bfloat16 or float16), unit inner stride, a row stride of ``ld`` elements
    (any sign). The outputs are the buffers of :func:`fused_cast_outputs` (``entry``, ``m``, ``n``,
    ``m_major_scales``): dense, ``q`` and ``s`` pass 0 for ``per_token_cast_to_fp8_transposed``. Any alignment
    works; 16-byte aligned buffers (and x rows) take the vector path. Nothing is launched for m = 0 or n = 0. Loads
    the kernel on first use.
    """
    if m <= 0 or n <= 0:
        return
    key = (entry, dtype, device, x, q_t, s_t, q, s, m, n, ld, m_major_scales)  # the allocators hand the same
    launch = _fused_launches.get(key)                                          # buffers back step after step
    if launch is None:
        args = fused_cast_args(entry, x, q_t, s_t, q, s, m, n, ld, m_major_scales)
        launch = _fused_launches.put(key, (fused_cast_grid(entry, dtype, m, n, get_num_sms(device)),
                                           fused_cast_threads(dtype), fused_cast_smem(dtype, entry),
                                           _FUSED_CASTS.pack(device, args, dtype, entry)))
    if single_gpu():
        _FUSED_CASTS.launch(device, stream, *launch, dtype, entry)
    else:
        with on_device(device):
            _FUSED_CASTS.launch(device, stream, *launch, dtype, entry)


def _make_output(framework: Framework, out: CastOutput, device: int, alloc_stream: int | None) -> Any:
    buf = empty(framework, out.buffer, out.dtype, device, alloc_stream)
    return buf if out.buffer == out.shape else buf[:, :out.shape[0]].T


def _run_fused(entry: str, v: View, m: int, n: int, ld: int, stream: int, framework: Framework,
               m_major_scales: bool, alloc_stream: int | None = None) -> tuple[Any, ...]:
    outs = _fused_outputs(entry, m, n, m_major_scales)
    arrays = tuple(_make_output(framework, o, v.device, alloc_stream) for o in outs)
    ptrs = {o.name: _ptr(a) for o, a in zip(outs, arrays)}
    launch_fused_cast(entry, v.dtype, v.ptr, ptrs["q_t"], ptrs["s_t"], ptrs.get("q", 0), ptrs.get("s", 0), m, n, ld,
                      stream, v.device, m_major_scales)
    return arrays


def per_token_cast_to_fp8(x: Any, *, stream: Any = None) -> tuple[Any, Any]:
    """Quantize ``x`` [m, n] to e4m3fn with one FP32 scale per row and 128 columns (1x128 groups).

    Returns ``(q, s)``: ``q`` e4m3fn [m, n] (uint8 bits for CuPy callers), ``s`` float32 [m, ceil(n/128)]
    row-major, made by the framework of ``x``, on the caller's stream (``stream=`` overrides it). Bit-exact with
    :func:`cupygemm.reference.per_token_cast_to_fp8_reference`.
    """
    return _route("per_token_cast_to_fp8", x, stream)


def per_block_cast_to_fp8(x: Any, *, with_transpose: bool = False, stream: Any = None) -> tuple[Any, ...]:
    """Quantize ``x`` [m, n] to e4m3fn with one FP32 scale per 128x128 block.

    Returns ``(q, s)``: ``q`` e4m3fn [m, n] (uint8 bits for CuPy callers), ``s`` float32
    [ceil(m/128), ceil(n/128)] row-major, made by the framework of ``x``, on the caller's stream (``stream=``
    overrides it). Bit-exact with :func:`cupygemm.reference.per_block_cast_to_fp8_reference`.

    ``with_transpose=True`` returns ``(q, s, q_t, s_t)`` from one pass over ``x``: also ``q_t`` e4m3fn [n, m] and
    ``s_t = s.T`` (float32 [ceil(n/128), ceil(m/128)], C-contiguous), which equal ``per_block_cast_to_fp8(x.T)``
    bit for bit (a block's scale is the same for x and x.T): the FP8 W^T that the dgrad GEMM reads (a torch operator
    for torch tensors, an XLA custom call of the same kernel in ``cupygemm.jax``).
    """
    if with_transpose:
        return _route_fused(BLOCK_WITH_TRANSPOSE, "per_block_cast_to_fp8", x, stream, False)
    return _route("per_block_cast_to_fp8", x, stream)


def per_token_cast_to_fp8_transposed(x: Any, *, rowwise: bool = False, m_major_scales: bool = False,
                                     stream: Any = None) -> tuple[Any, ...]:
    """Quantize ``x.T`` for ``x`` [T, d] (tokens x features) with 1x128 groups along T, reading ``x`` once.

    Returns ``(q_t, s_t)``: ``q_t`` e4m3fn [d, T] (uint8 bits for CuPy callers), ``s_t`` float32
    [d, ceil(T/128)], bit for bit ``per_token_cast_to_fp8(x.T)``: the K-major operand (K = T) of the wgrad GEMM.
    ``rowwise=True`` returns ``(q_t, s_t, q, s)``, with ``(q, s) = per_token_cast_to_fp8(x)`` from the same pass
    (the forward's layout). T and d need not be multiples of 128.

    ``m_major_scales=True`` returns ``s_t`` in the layout the GEMM kernels read (what
    :func:`cupygemm.get_col_major_tma_aligned_tensor` would make of it: shape [d, ceil(T/128)], element strides
    ``(1, round_up(d, 4))``, 16-byte aligned), so a GEMM on ``(q_t, s_t)`` copies no scales; otherwise ``s_t`` is
    row-major. Results are made by the framework of ``x``, on the caller's stream (``stream=`` overrides it).
    ``x`` is bfloat16, float16 or float32 with unit inner stride and any row stride. torch tensors go through a
    torch operator; JAX arrays through ``cupygemm.jax`` (the same kernel as an XLA custom call; JAX arrays have no
    strides, so ``m_major_scales=True`` is a TypeError there).
    """
    return _route_fused(TRANSPOSED_ROWWISE if rowwise else TRANSPOSED, "per_token_cast_to_fp8_transposed", x, stream,
                        m_major_scales)


def _route_fused(entry: str, name: str, x: Any, stream: Any, m_major_scales: bool) -> tuple[Any, ...]:
    framework = framework_of(x)
    if framework is Framework.TORCH or framework is Framework.JAX:
        return adapter(framework).cast(entry, x, stream, m_major_scales=m_major_scales)
    return run_cast(entry, x, stream, framework, m_major_scales)


def _route(entry: str, x: Any, stream: Any) -> tuple[Any, Any]:
    """torch tensors and JAX arrays go to their framework's adapter (the torch operators; cupygemm.jax's jittable
    casts, bit-exact with these kernels), the rest straight to the kernels."""
    framework = framework_of(x)
    if framework is Framework.TORCH or framework is Framework.JAX:
        return adapter(framework).cast(entry, x, stream)
    return run_cast(entry, x, stream, framework)
