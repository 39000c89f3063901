"""cupygemm inside JAX: FP8 GEMMs as XLA FFI custom calls that work under ``jax.jit``, ``lax.scan``, ``vmap``.

Import this module explicitly (``import cupygemm.jax``); ``import cupygemm`` never imports JAX. Functions:

- :func:`gemm_fp8_fp8_bf16_nt`\\ ``(a, sfa, b, sfb) -> d``
- :func:`m_grouped_gemm_fp8_fp8_bf16_nt_contiguous`\\ ``(a, sfa, b, sfb, m_indices, out=None) -> d``
- :func:`m_grouped_gemm_fp8_fp8_bf16_nt_masked`\\ ``(a, sfa, b, sfb, masked_m, expected_m, out=None) -> d``
- :func:`per_token_cast_to_fp8`, :func:`per_block_cast_to_fp8`: jittable FP8 casts in ``jnp`` returning
  ``jnp.float8_e4m3fn`` values and float32 scales, bit-exact with :mod:`cupygemm.reference`.

Operands are JAX arrays (concrete or traced) with DeepGEMM's shapes: A ``float8_e4m3fn`` (or ``uint8`` e4m3 bits),
row-major SFA ``[M, ceil(K/128)]`` float32 (per group for the masked kind), SFB ``[..., ceil(N/128), ceil(K/128)]``;
``m_indices`` / ``masked_m`` are int32 device arrays that may be traced and change from call to call. Results
are BF16. Shapes and dtypes are checked at trace time (ValueError/TypeError naming the argument).

How it runs: at trace time (shapes are static) the kernel config is chosen, compiled and loaded on every local
GPU (:func:`cupygemm.plan.plan_gemm`) and stored as an entry of one FFI handler, registered once for the CUDA
platform under the target name :data:`TARGET`. The traced program holds a ``jax.ffi.ffi_call`` carrying the
entry id. When XLA runs it, the handler (pure Python through ctypes, :mod:`cupygemm.xla_ffi`) reads the buffers'
pointers and XLA's stream from the call frame and launches the kernel on that stream: no compilation,
allocation or synchronization per call. The transposed, padded SFA the kernel reads is made by a small XLA op
in the traced program; split-K/stream-K scratch is an extra result that XLA allocates (its tile counters are
zeroed by a memset on XLA's stream before each launch). Errors inside the handler come back as
``JaxRuntimeError: INVALID_ARGUMENT: cupygemm ...`` (or ``INTERNAL``).

**Small GEMMs need XLA command buffers.** The handler costs tens of microseconds of host time per call (Python);
XLA replays it inside CUDA graphs only when custom calls are captured, which JAX's default flags do only here and
there (2 of 510 calls in tests/test_jax_gpu.py's scan).
Set, before JAX initializes its GPU backend (i.e. before the first JAX computation, best in the environment)::

    XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"

The handler declares itself command-buffer compatible; with these flags a jitted function (or a ``lax.scan``
body) runs the Python handler only when XLA (re)records its graph, e.g. the first calls or when buffer addresses
change, and replays the kernels after that. Addresses stay put where the GEMM's result is a ``lax.scan`` carry
(a layer's activations) and each step's other operands are small per-step arrays. Each of these gave the steps
new addresses, so XLA recorded (ran the handler) on every step: stacking every step's result as the scan's
``ys``, slicing each step's A out of a stacked array, the masked GEMM with ``out=`` aliased to the carry, and
adding ``WHILE,CONDITIONAL`` to the command-buffer list. Measured on an H100 (``cupygemm jax-scan``,
``benchmarks/results/jax-scan-h100-*.json``): a scan step of 64x2112x7168 took 32-55 us without the flags (two
runs) and 14-15 us with them, against 8.4 us of kernel time and 16-17 us per step of the same scan around
``jnp.dot`` in BF16: the rest is XLA's own per-step cost of the loop.

``vmap``: the dense GEMM batched over A only (shared weights) folds the mapped axis into M (one GEMM with
``V*M`` rows); batched over B (per-element weights) it becomes one masked grouped GEMM with a group per element
and every row valid. The grouped GEMMs under ``vmap`` run sequentially (``lax.map``: a loop of kernel launches).
Results of a folded call can differ from separate calls in the last BF16 bit (another kernel config may split K
differently); each is within the kernels' accuracy.

``jax.grad`` (any differentiation) raises TypeError: these are inference kernels without a VJP.

**Packed weights.** :func:`cupygemm.pack_weights` packs a JAX B into an XLA buffer (L2-side-aware, see
:mod:`cupygemm.packing`); pass the :class:`~cupygemm.PackedWeights` as ``b`` with ``sfb=None`` (its scales are
used). The class is a pytree here (leaves: the packed bytes and the scales), so it passes through ``jit`` and
``scan`` as an argument; its layout (shape, offsets, hash) is static. A copy XLA makes of the bytes computes the same
results, only from the wrong L2 sides. Under ``vmap`` packed weights must not be mapped (each element's call then
runs in sequence).

Eager calls (concrete arrays outside ``jit``) take the same path: each public function is itself jitted, so the
result is ordered on XLA's stream like any JAX result.
"""
from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

try:
    import jax
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError('cupygemm.jax needs JAX with CUDA: pip install "jax[cuda12]" (or "jax[cuda13]")') from e
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import xla_ffi
from ..config import KIND_CONTIGUOUS, KIND_MASKED, KIND_NAMES, KIND_NORMAL
from ..errors import CupygemmDeviceError
from ..packing import PackedLayout, PackedWeights
from ..util import ceil_div

__all__ = [
    "TARGET",
    "gemm_fp8_fp8_bf16_nt",
    "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
    "m_grouped_gemm_fp8_fp8_bf16_nt_masked",
    "per_token_cast_to_fp8",
    "per_block_cast_to_fp8",
]

#: The FFI target name (one handler serves every kind and shape; the call's ``entry_id`` attribute picks).
TARGET = "cupygemm_fp8_gemm"

_GROUP = 128
_FP8_MAX = 448.0
_MIN_AMAX = 1e-4
_INT32_LIMIT = 2**31
_FP8_DTYPES = (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.uint8))


# --- packed weights ----------------------------------------------------------------------------------------------

class _PackedSpec(NamedTuple):
    """What a side-aware launch needs of packed weights besides their bytes: static under ``jit``."""

    shape: tuple[int, ...]
    data_offset: int
    launch_sides: tuple[int, ...]  # PackedWeights.launch_sides


def _flatten_packed(p: PackedWeights) -> tuple[tuple[Any, Any], tuple]:
    return (p.data, p.scales), (p.shape, p.side_aware, p.base_low, p.hash_bits, p.data_offset, p.page_words)


def _unflatten_packed(aux: tuple, leaves: tuple[Any, Any]) -> PackedWeights:
    return PackedWeights(leaves[0], leaves[1], *aux)


jax.tree_util.register_pytree_node(PackedWeights, _flatten_packed, _unflatten_packed)


def _unpack(b: Any, sfb: Any, grouped: bool) -> tuple[Any, Any, _PackedSpec | None]:
    """``(b, sfb, spec)``: plain weights as given (spec None), or packed weights' bytes and scales and their spec;
    weights that fell back to plain B (no side info) as ``(B, SFB)``."""
    if not isinstance(b, PackedWeights):
        return b, sfb, None
    if sfb is not None:
        raise TypeError("sfb: packed weights carry their scales; pass sfb=None with PackedWeights as b")
    if not b.side_aware:
        return b.data, b.scales, None
    if len(b.shape) != (3 if grouped else 2):
        raise ValueError(f"b: packed weights of shape {b.shape}, expected {'[G, N, K]' if grouped else '[N, K]'}")
    lay = PackedLayout(b.shape[-2], b.shape[-1])
    groups = b.shape[0] if grouped else 1
    shape, dtype = _shape_dtype(b.data, "b.data")
    need = b.data_offset + lay.buffer_bytes(b.base_low, groups)
    if dtype != jnp.uint8 or len(shape) != 1 or shape[0] < need:
        raise ValueError(f"b.data: packed weights {b.shape} need a uint8 vector of at least {need} bytes, got "
                         f"{dtype} {shape}")
    return b.data, b.scales, _PackedSpec(tuple(b.shape), b.data_offset, b.launch_sides)


# --- backends: the CUDA one, and a test double --------------------------------------------------------------

@dataclass
class _Backend:
    """Where calls are lowered and how they are planned.

    ``plan(kind, m, n, k, num_groups, expected_m)`` returns ``{xla_device_ordinal: plan}`` with the attributes and
    ``launch`` of :func:`cupygemm.plan.plan_gemm`'s plans. The CPU tests install a backend whose plans compute
    on the host (``_use_backend``), which runs this whole module, the handler included, without a GPU.
    """
    platform: str
    plan: Callable[..., dict[int, Any]]
    use_stream: bool = True
    handler: xla_ffi.FfiHandler | None = None
    entries: dict[tuple, tuple[int, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _plan_cuda(kind: int, m: int, n: int, k: int, num_groups: int, expected_m: int | None,
               sides: bool = False) -> dict[int, Any]:
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as e:
        raise CupygemmDeviceError(
            f"cupygemm.jax needs JAX with a CUDA GPU backend (e.g. pip install 'jax[cuda12]'): {e}") from e
    import cupy

    from ..plan import plan_gemm

    plans = {}
    for dev in gpus:
        if dev.process_index != jax.process_index():
            continue
        ordinal = int(getattr(dev, "local_hardware_id", None) or dev.id)
        with cupy.cuda.Device(ordinal):
            plans[ordinal] = plan_gemm(kind, m, n, k, num_groups, ordinal, expected_m=expected_m, sides=sides)
    return plans


_cuda_backend = _Backend("CUDA", _plan_cuda)
_backend = _cuda_backend
_register_lock = threading.Lock()


class _use_backend:
    """Test hook: ``with _use_backend(platform, plan, use_stream):`` routes new traces to another backend."""

    def __init__(self, platform: str, plan: Callable[..., dict[int, Any]], use_stream: bool = False):
        self.backend = _Backend(platform, plan, use_stream)

    def __enter__(self) -> _Backend:
        global _backend
        self._previous, _backend = _backend, self.backend
        jax.clear_caches()  # jitted callers traced under the previous backend hold its entry ids
        return self.backend

    def __exit__(self, *exc: object) -> None:
        global _backend
        _backend = self._previous
        jax.clear_caches()


_handlers: dict[str, xla_ffi.FfiHandler] = {}  # by platform: XLA refuses a second handler under one name


def _handler(backend: _Backend) -> xla_ffi.FfiHandler:
    """The platform's FFI handler, registered with XLA on first use (once per process and platform)."""
    if backend.handler is None:
        with _register_lock:
            handler = _handlers.get(backend.platform.lower())
            if handler is None:
                version = xla_ffi.header_api_version(jax.ffi.include_dir())
                handler = xla_ffi.FfiHandler(TARGET, version, use_stream=backend.use_stream)
                jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(handler.address), platform=backend.platform)
                _handlers[backend.platform.lower()] = handler
            backend.handler = handler
    return backend.handler


def _check_inputs() -> bool:
    from ..env import check_inputs_enabled

    return check_inputs_enabled()


def _entry(kind: int, m: int, n: int, k: int, g: int, expected_m: int | None, operands: list[Any],
           out_shape: tuple[int, ...], packed: _PackedSpec | None = None) -> tuple[int, int, int, int]:
    """Plan (at trace time) and register the handler entry of one static problem (``packed``: B is packed
    weights, operand 2 their bytes).

    Returns ``(entry_id, sfa_m_pad, scratch_floats, scratch_counters)``.
    """
    backend = _backend
    handler = _handler(backend)
    check = _check_inputs()
    key = (kind, m, n, k, g, expected_m, tuple(str(x.dtype) for x in operands), check, packed)
    with backend.lock:
        hit = backend.entries.get(key)
    if hit is not None:
        return hit
    plans = backend.plan(kind, m, n, k, g, expected_m, **({"sides": True} if packed is not None else {}))
    if not plans:
        raise CupygemmDeviceError("cupygemm.jax: no local GPU to plan the GEMM for")
    first = next(iter(plans.values()))
    m_pad = first.sfa_m_pad
    floats = max(p.scratch_floats for p in plans.values())
    counters = max(p.scratch_counters for p in plans.values())
    if any(p.sfa_m_pad != m_pad for p in plans.values()):
        raise CupygemmDeviceError("cupygemm.jax: the local GPUs disagree on the A-scale layout; use one GPU model")
    has_layout = kind != KIND_NORMAL
    ip = 1 if floats else 0
    ic = (ip + 1) if counters else 0

    def make_launch(plan: Any) -> Callable:
        run = plan.launch
        if packed is not None:  # B: the packed bytes at their offset in the operand
            off, sides = packed.data_offset, packed.launch_sides

            def launch(stream: int, a: list[int], r: list[int]) -> None:
                run(stream, a[0], a[1], a[2] + off, a[3], r[0], layout=a[4] if has_layout else 0,
                    partials=r[ip] if ip else 0, counters=r[ic] if ic else 0, zero_counters=bool(ic),
                    page_sides=sides)
        elif has_layout:
            def launch(stream: int, a: list[int], r: list[int]) -> None:
                # r[0] is the aliased ``out`` (also a[5]): rows the kernel skips keep its contents.
                run(stream, a[0], a[1], a[2], a[3], r[0], layout=a[4], partials=r[ip] if ip else 0,
                    counters=r[ic] if ic else 0, zero_counters=bool(ic))
        else:
            def launch(stream: int, a: list[int], r: list[int]) -> None:
                run(stream, a[0], a[1], a[2], a[3], r[0], partials=r[ip] if ip else 0,
                    counters=r[ic] if ic else 0, zero_counters=bool(ic))
        return launch

    expected = None
    if check:
        shapes = [(xla_ffi.ffi_dtype(x.dtype), tuple(x.shape)) for x in operands]
        shapes[1] = (xla_ffi.ffi_dtype("float32"), _sfa_shape(kind, m, k, g, m_pad))
        shapes.append((xla_ffi.ffi_dtype("bfloat16"), out_shape))
        if floats:
            shapes.append((xla_ffi.ffi_dtype("float32"), (floats,)))
        if counters:
            shapes.append((xla_ffi.ffi_dtype("uint32"), (counters,)))
        expected = tuple(shapes)
    name = f"{KIND_NAMES[kind]} GEMM M={m} N={n} K={k} G={g}"
    entry = xla_ffi.FfiEntry(name, len(operands), 1 + bool(floats) + bool(counters),
                             {dev: make_launch(p) for dev, p in plans.items()}, expected)
    result = (handler.add(entry), m_pad, floats, counters)
    with backend.lock:
        backend.entries.setdefault(key, result)
    return result


def _sfa_shape(kind: int, m: int, k: int, g: int, m_pad: int) -> tuple[int, ...]:
    kb = ceil_div(k, _GROUP)
    return (g, kb, m_pad) if kind == KIND_MASKED else (kb, m_pad)


def _sfa_m_major(sfa: jax.Array, m_pad: int) -> jax.Array:
    """Row-major SFA [..., M, KB] -> the M-major buffer the kernel reads, [..., KB, m_pad] (a small XLA op)."""
    t = jnp.swapaxes(sfa, -1, -2)
    pad = [(0, 0)] * (t.ndim - 1) + [(0, m_pad - t.shape[-1])]
    return jnp.pad(t, pad)


def _ffi_gemm(kind: int, a: jax.Array, sfa: jax.Array, b: jax.Array, sfb: jax.Array, layout: jax.Array | None,
              out: jax.Array | None, m: int, n: int, k: int, g: int, expected_m: int | None,
              packed: _PackedSpec | None = None) -> jax.Array:
    out_shape = (g, m, n) if kind == KIND_MASKED else (m, n)
    operands = [a, sfa, b, sfb] + ([layout, out] if layout is not None else [])
    eid, m_pad, floats, counters = _entry(kind, m, n, k, g, expected_m, operands, out_shape, packed)
    operands[1] = _sfa_m_major(sfa, m_pad)
    results = [jax.ShapeDtypeStruct(out_shape, jnp.bfloat16)]
    if floats:
        results.append(jax.ShapeDtypeStruct((floats,), jnp.float32))
    if counters:
        results.append(jax.ShapeDtypeStruct((counters,), jnp.uint32))
    call = jax.ffi.ffi_call(TARGET, results, vmap_method="sequential",
                            input_output_aliases={5: 0} if layout is not None else None)
    return call(*operands, entry_id=np.int64(eid))[0]


# --- trace-time checks ---------------------------------------------------------------------------------------

def _shape_dtype(x: Any, name: str) -> tuple[tuple[int, ...], Any]:
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name}: expected a JAX array, got {type(x).__name__}")
    return tuple(int(d) for d in x.shape), jnp.dtype(x.dtype)


def _fp8(x: Any, name: str, ndim: int) -> tuple[int, ...]:
    shape, dtype = _shape_dtype(x, name)
    if dtype not in _FP8_DTYPES:
        raise TypeError(f"{name}: expected float8_e4m3fn (or uint8 holding e4m3 bits), got {dtype}")
    if len(shape) != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got shape {shape}")
    return shape


def _f32(x: Any, name: str, shape: tuple[int, ...]) -> None:
    got, dtype = _shape_dtype(x, name)
    if dtype != jnp.float32:
        raise TypeError(f"{name}: expected float32 scales, got {dtype}")
    if got != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {got}")


def _int32_vector(x: Any, name: str, length: int) -> None:
    got, dtype = _shape_dtype(x, name)
    if dtype != jnp.int32:
        raise TypeError(f"{name}: expected int32, got {dtype}")
    if got != (length,):
        raise ValueError(f"{name}: expected shape ({length},), got {got}")


def _bf16_out(x: Any, name: str, shape: tuple[int, ...]) -> None:
    got, dtype = _shape_dtype(x, name)
    if dtype != jnp.bfloat16:
        raise TypeError(f"{name}: expected bfloat16, got {dtype}")
    if got != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {got}")


def _check_dims(k: int, n: int, **dims: int) -> None:
    for what, v in dims.items():
        if v >= _INT32_LIMIT:
            raise ValueError(f"{what} = {v} is too large: dimensions must be below 2^31")
    if k % 16:
        raise ValueError(f"K must be a multiple of 16 (16-byte aligned FP8 rows for TMA), got K = {k}")
    if n % 8:
        raise ValueError(f"N must be a multiple of 8 (16-byte aligned BF16 output rows for TMA), got N = {n}")


def _grouped_b(b: Any, sfb: Any, k: int, packed: _PackedSpec | None = None) -> tuple[int, int]:
    g, n, kb_ = _fp8(b, "b", 3) if packed is None else packed.shape
    if kb_ != k:
        raise ValueError(f"a has K = {k} but b is [G, N, K] = {(g, n, kb_)}")
    _f32(sfb, "sfb", (g, ceil_div(n, _GROUP), ceil_div(k, _GROUP)))
    return g, n


def _check_expected_m(expected_m: Any) -> int:
    if isinstance(expected_m, bool) or not isinstance(expected_m, (int, np.integer)) or expected_m < 0:
        raise TypeError(f"expected_m: expected a non-negative Python int (static: it picks the kernel config), "
                        f"got {expected_m!r}")
    return int(expected_m)


# --- the differentiable-looking, vmappable ops ---------------------------------------------------------------

def _no_derivative(name: str) -> Callable:
    def jvp(primals: tuple, tangents: tuple) -> Any:
        raise TypeError(f"cupygemm.jax.{name} has no derivative: it is an FP8 inference kernel without a VJP/JVP. "
                        "Apply jax.lax.stop_gradient to its inputs, or differentiate a float reference instead.")
    return jvp


def _broadcast(x: jax.Array, batched: bool, size: int) -> jax.Array:
    return x if batched else jnp.broadcast_to(x, (size,) + x.shape)


def _sequential_rule(op: Callable) -> Callable:
    """A vmap rule running ``op`` once per mapped element (``lax.map``), unbatched operands closed over."""
    def rule(axis_size: int, in_batched: list[bool], *args: jax.Array) -> tuple[jax.Array, bool]:
        mapped = tuple(x for x, bt in zip(args, in_batched) if bt)

        def one(xs: tuple) -> jax.Array:
            it = iter(xs)
            return op(*(next(it) if bt else x for x, bt in zip(args, in_batched)))
        return lax.map(one, mapped), True
    return rule


def _dense_impl(a: jax.Array, sfa: jax.Array, b: jax.Array, sfb: jax.Array) -> jax.Array:
    m, k = a.shape
    n = b.shape[0]
    if m == 0 or n == 0 or k == 0:
        return jnp.zeros((m, n), jnp.bfloat16)
    return _ffi_gemm(KIND_NORMAL, a, sfa, b, sfb, None, None, m, n, k, 1, None)


_dense_vmappable = jax.custom_batching.custom_vmap(_dense_impl)


@_dense_vmappable.def_vmap
def _dense_rule(axis_size: int, in_batched: list[bool], a: jax.Array, sfa: jax.Array, b: jax.Array,
                sfb: jax.Array) -> tuple[jax.Array, bool]:
    a_b, sfa_b, b_b, sfb_b = in_batched
    a, sfa = _broadcast(a, a_b, axis_size), _broadcast(sfa, sfa_b, axis_size)
    v, m, k = a.shape
    if not (b_b or sfb_b):
        # Shared weights: the mapped axis is more rows of one GEMM.
        d = _dense_vmappable(a.reshape(v * m, k), sfa.reshape(v * m, sfa.shape[-1]), b, sfb)
        return d.reshape(v, m, b.shape[0]), True
    # Weights per element: a masked grouped GEMM, one group per element, all rows valid.
    b, sfb = _broadcast(b, b_b, axis_size), _broadcast(sfb, sfb_b, axis_size)
    masked_m = jnp.full((v,), m, jnp.int32)
    return _masked_vmappable(m)(a, sfa, b, sfb, masked_m, jnp.zeros((v, m, b.shape[1]), jnp.bfloat16)), True


_dense_op = jax.custom_jvp(_dense_vmappable)
_dense_op.defjvp(_no_derivative("gemm_fp8_fp8_bf16_nt"))


def _contiguous_impl(a: jax.Array, sfa: jax.Array, b: jax.Array, sfb: jax.Array, m_indices: jax.Array,
                     out: jax.Array) -> jax.Array:
    m, k = a.shape
    g, n, _ = b.shape
    if m == 0 or n == 0 or g == 0:
        return out
    if k == 0:
        return jnp.zeros_like(out)
    return _ffi_gemm(KIND_CONTIGUOUS, a, sfa, b, sfb, m_indices, out, m, n, k, g, None)


_contiguous_vmappable = jax.custom_batching.custom_vmap(_contiguous_impl)
_contiguous_vmappable.def_vmap(_sequential_rule(_contiguous_vmappable))
_contiguous_op = jax.custom_jvp(_contiguous_vmappable)
_contiguous_op.defjvp(_no_derivative("m_grouped_gemm_fp8_fp8_bf16_nt_contiguous"))


@functools.lru_cache(maxsize=None)
def _masked_vmappable(expected_m: int) -> Callable:
    def impl(a: jax.Array, sfa: jax.Array, b: jax.Array, sfb: jax.Array, masked_m: jax.Array,
             out: jax.Array) -> jax.Array:
        g, m, k = a.shape
        n = b.shape[1]
        if m == 0 or n == 0 or g == 0:
            return out
        if k == 0:
            return jnp.zeros_like(out)
        return _ffi_gemm(KIND_MASKED, a, sfa, b, sfb, masked_m, out, m, n, k, g, expected_m)

    op = jax.custom_batching.custom_vmap(impl)
    op.def_vmap(_sequential_rule(op))
    return op


@functools.lru_cache(maxsize=None)
def _masked_op(expected_m: int) -> Callable:
    op = jax.custom_jvp(_masked_vmappable(expected_m))
    op.defjvp(_no_derivative("m_grouped_gemm_fp8_fp8_bf16_nt_masked"))
    return op


@functools.lru_cache(maxsize=None)
def _packed_op(kind: int, packed: _PackedSpec, expected_m: int | None) -> Callable:
    """The op of one kind on packed weights of one static layout (B's bytes as operand 2)."""
    n, k = packed.shape[-2:]
    g = packed.shape[0] if len(packed.shape) == 3 else 1
    if kind == KIND_NORMAL:
        def impl(a: jax.Array, sfa: jax.Array, b: jax.Array, sfb: jax.Array) -> jax.Array:
            m = a.shape[0]
            if m == 0:
                return jnp.zeros((m, n), jnp.bfloat16)
            return _ffi_gemm(KIND_NORMAL, a, sfa, b, sfb, None, None, m, n, k, 1, None, packed)
    else:
        def impl(a: jax.Array, sfa: jax.Array, b: jax.Array, sfb: jax.Array, layout: jax.Array,
                 out: jax.Array) -> jax.Array:
            m = a.shape[1] if kind == KIND_MASKED else a.shape[0]
            if m == 0:
                return out
            return _ffi_gemm(kind, a, sfa, b, sfb, layout, out, m, n, k, g, expected_m, packed)
    op = jax.custom_batching.custom_vmap(impl)
    op.def_vmap(_sequential_rule(op))
    public = {KIND_NORMAL: "gemm_fp8_fp8_bf16_nt", KIND_CONTIGUOUS: "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
              KIND_MASKED: "m_grouped_gemm_fp8_fp8_bf16_nt_masked"}[kind]
    op = jax.custom_jvp(op)
    op.defjvp(_no_derivative(public))
    return op


# --- public API ----------------------------------------------------------------------------------------------

@jax.jit
def _gemm_jit(a: jax.Array, sfa: jax.Array, b: Any, sfb: jax.Array | None) -> jax.Array:
    b, sfb, packed = _unpack(b, sfb, grouped=False)
    m, k = _fp8(a, "a", 2)
    n, kb_ = _fp8(b, "b", 2) if packed is None else packed.shape
    if kb_ != k:
        raise ValueError(f"a is [M, K] = {(m, k)} and b is [N, K] = {(n, kb_)}: K differs")
    _check_dims(k, n, M=m, N=n, K=k)
    kb = ceil_div(k, _GROUP)
    _f32(sfa, "sfa", (m, kb))
    _f32(sfb, "sfb", (ceil_div(n, _GROUP), kb))
    return (_dense_op if packed is None else _packed_op(KIND_NORMAL, packed, None))(a, sfa, b, sfb)


def gemm_fp8_fp8_bf16_nt(a: jax.Array, sfa: jax.Array, b: jax.Array | PackedWeights,
                         sfb: jax.Array | None = None) -> jax.Array:
    """D = A @ B.T with DeepSeek-V3 fine-grained FP8 scaling, BF16 output, as an XLA custom call.

    Args:
        a: float8_e4m3fn (or uint8 e4m3 bits) [M, K].
        sfa: float32 [M, ceil(K/128)], one scale per row and 128 of K (row-major, as the casts return it).
        b: float8_e4m3fn [N, K], or :class:`~cupygemm.PackedWeights` of it (then ``sfb`` is None).
        sfb: float32 [ceil(N/128), ceil(K/128)], one scale per 128x128 block.

    Returns:
        bfloat16 [M, N]. Bitwise equal to :func:`cupygemm.gemm_fp8_fp8_bf16_nt` on the same inputs.

    K % 16 == 0 and N % 8 == 0. Works eagerly and under ``jit``/``scan``; under ``vmap`` a mapped A becomes more
    rows of one GEMM and a mapped B a masked grouped GEMM (module docstring). No derivative.
    """
    return _gemm_jit(a, sfa, b, sfb)


@jax.jit
def _contiguous_jit(a: jax.Array, sfa: jax.Array, b: Any, sfb: jax.Array | None, m_indices: jax.Array,
                    out: jax.Array | None) -> jax.Array:
    b, sfb, packed = _unpack(b, sfb, grouped=True)
    m, k = _fp8(a, "a", 2)
    g, n = _grouped_b(b, sfb, k, packed)
    _check_dims(k, n, M=m, N=n, K=k, G=g)
    _f32(sfa, "sfa", (m, ceil_div(k, _GROUP)))
    _int32_vector(m_indices, "m_indices", m)
    if out is None:
        out = jnp.zeros((m, n), jnp.bfloat16)
    _bf16_out(out, "out", (m, n))
    op = _contiguous_op if packed is None else _packed_op(KIND_CONTIGUOUS, packed, None)
    return op(a, sfa, b, sfb, m_indices, out)


def m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(a: jax.Array, sfa: jax.Array, b: jax.Array | PackedWeights,
                                              sfb: jax.Array | None, m_indices: jax.Array,
                                              out: jax.Array | None = None) -> jax.Array:
    """Grouped GEMM, contiguous layout: row r of A uses B[m_indices[r]] (MoE prefill), as an XLA custom call.

    Args:
        a: float8_e4m3fn [M_sum, K]; sfa: float32 [M_sum, ceil(K/128)].
        b: float8_e4m3fn [G, N, K] (or :class:`~cupygemm.PackedWeights`, sfb None); sfb: float32
            [G, ceil(N/128), ceil(K/128)].
        m_indices: int32 [M_sum] (may be traced): each row's group, -1 for padding rows. Groups are contiguous and
            padded to 128 rows (``cupygemm.get_m_alignment_for_contiguous_layout()``).
        out: optional bfloat16 [M_sum, N] whose rows the kernel skips (m_indices == -1) are kept; default zeros
            (one memset of the output). Passed to XLA as an operand aliased to the result: donate it under
            ``jit`` to make the call in place.

    Returns:
        bfloat16 [M_sum, N]. Under ``vmap``: one grouped GEMM per mapped element, in sequence. No derivative.
    """
    return _contiguous_jit(a, sfa, b, sfb, m_indices, out)


@functools.partial(jax.jit, static_argnames=("expected_m",))
def _masked_jit(a: jax.Array, sfa: jax.Array, b: Any, sfb: jax.Array | None, masked_m: jax.Array,
                expected_m: int, out: jax.Array | None) -> jax.Array:
    b, sfb, packed = _unpack(b, sfb, grouped=True)
    g, m, k = _fp8(a, "a", 3)
    gb, n = _grouped_b(b, sfb, k, packed)
    if gb != g:
        raise ValueError(f"a has {g} groups ([G, max_m, K] = {(g, m, k)}) but b has {gb}")
    _check_dims(k, n, max_m=m, N=n, K=k, G=g, total_rows=g * m)
    _f32(sfa, "sfa", (g, m, ceil_div(k, _GROUP)))
    _int32_vector(masked_m, "masked_m", g)
    if out is None:
        out = jnp.zeros((g, m, n), jnp.bfloat16)
    _bf16_out(out, "out", (g, m, n))
    op = _masked_op(expected_m) if packed is None else _packed_op(KIND_MASKED, packed, expected_m)
    return op(a, sfa, b, sfb, masked_m, out)


def m_grouped_gemm_fp8_fp8_bf16_nt_masked(a: jax.Array, sfa: jax.Array, b: jax.Array | PackedWeights,
                                          sfb: jax.Array | None, masked_m: jax.Array, expected_m: int,
                                          out: jax.Array | None = None) -> jax.Array:
    """Grouped GEMM, masked layout: group g computes its first masked_m[g] rows (MoE decode), as an XLA custom call.

    Args:
        a: float8_e4m3fn [G, max_m, K]; sfa: float32 [G, max_m, ceil(K/128)].
        b: float8_e4m3fn [G, N, K] (or :class:`~cupygemm.PackedWeights`, sfb None); sfb: float32
            [G, ceil(N/128), ceil(K/128)].
        masked_m: int32 [G] on the device (may be traced and change between calls); read by the kernel, clamped
            to [0, max_m].
        expected_m: static Python int, typical rows per group: only picks the kernel config.
        out: optional bfloat16 [G, max_m, N]: rows at or past masked_m[g] keep its values; default zeros.

    Returns:
        bfloat16 [G, max_m, N]. Under ``vmap``: one grouped GEMM per mapped element, in sequence. No derivative.
    """
    return _masked_jit(a, sfa, b, sfb, masked_m, _check_expected_m(expected_m), out)


# --- FP8 casts (jnp, bit-exact with cupygemm.reference) ------------------------------------------------------

def _f32_to_e4m3fn(y: jax.Array) -> jax.Array:
    """float32 -> float8_e4m3fn, round to nearest even, for |y| <= 448 or NaN, in integer arithmetic.

    Written out so that no backend's own conversion (some round through float16 first) can round twice.
    """
    u = lax.bitcast_convert_type(y, jnp.uint32)
    sign = (u >> 24) & jnp.uint32(0x80)
    mag = u & jnp.uint32(0x7FFFFFFF)
    # |y| >= 2^-6 (e4m3 normal): round the 23 mantissa bits to 3, then rebias the exponent (127 -> 7).
    rounded = mag + jnp.uint32(0x7FFFF) + ((mag >> 20) & jnp.uint32(1))
    normal = (rounded >> 20) - jnp.uint32(120 << 3)
    # Below 2^-6: multiples of 2^-9 (scaling by 512 is exact; round() is half to even). 8 = 2^-6, the first normal.
    sub = jnp.round(lax.bitcast_convert_type(mag, jnp.float32) * jnp.float32(512)).astype(jnp.uint32)
    bits = jnp.where(mag >= jnp.uint32(0x3C800000), normal, sub)
    bits = jnp.where(mag > jnp.uint32(0x7F800000), jnp.uint32(0x7F), bits)
    return lax.bitcast_convert_type((bits | sign).astype(jnp.uint8), jnp.float8_e4m3fn)


def _quantize_groups(x: jax.Array, amax: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(e4m3 values of x scaled by 448/amax, scales amax/448), x already grouped with amax broadcastable."""
    amax = jnp.maximum(amax, jnp.float32(_MIN_AMAX))
    # XLA rewrites a division by a broadcast constant into a multiplication by its rounded reciprocal, which is
    # not amax / 448 in the last bit; a divisor it cannot see through keeps the IEEE division.
    amax, divisor = lax.optimization_barrier((amax, jnp.full(amax.shape, _FP8_MAX, jnp.float32)))
    scale = amax / divisor
    factor = jnp.float32(_FP8_MAX) / amax
    y = jnp.clip(x * factor, jnp.float32(-_FP8_MAX), jnp.float32(_FP8_MAX))
    return _f32_to_e4m3fn(y), scale


def _cast_input(x: Any, name: str = "x") -> jax.Array:
    shape, dtype = _shape_dtype(x, name)
    if len(shape) != 2:
        raise ValueError(f"{name}: expected a 2-D [m, n] array, got shape {shape}")
    if dtype not in (jnp.float32, jnp.bfloat16, jnp.float16):
        hint = " (already FP8?)" if dtype in _FP8_DTYPES else ""
        raise TypeError(f"{name}: expected bfloat16, float32 or float16, got {dtype}{hint}")
    return jnp.asarray(x).astype(jnp.float32)  # exact for all three


def _per_token_jnp(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """1x128 FP8 cast of ``x`` [m, n] (bf16/f16/f32), jittable: ``(q float8_e4m3fn [m, n], s float32 [m, ceil(n/128)])``.

    Per row and 128 columns: ``amax = max(max|x|, 1e-4)`` (float32), ``q = e4m3fn(x * (448 / amax))`` rounded to
    nearest even, ``s = amax / 448``; bit-exact with :func:`cupygemm.reference.per_token_cast_to_fp8_reference`.
    """
    x32 = _cast_input(x)
    m, n = x32.shape
    nb = ceil_div(n, _GROUP)
    g = jnp.pad(x32, ((0, 0), (0, nb * _GROUP - n))).reshape(m, nb, _GROUP)
    q, s = _quantize_groups(g, jnp.max(jnp.abs(g), axis=2, keepdims=True, initial=0.0))
    return q.reshape(m, nb * _GROUP)[:, :n], s.reshape(m, nb)


def _per_block_jnp(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """128x128 FP8 cast of ``x`` [m, n] (bf16/f16/f32), jittable: ``(q float8_e4m3fn [m, n], s float32 [ceil(m/128),
    ceil(n/128)])``, bit-exact with :func:`cupygemm.reference.per_block_cast_to_fp8_reference`."""
    x32 = _cast_input(x)
    m, n = x32.shape
    mb, nb = ceil_div(m, _GROUP), ceil_div(n, _GROUP)
    g = jnp.pad(x32, ((0, mb * _GROUP - m), (0, nb * _GROUP - n))).reshape(mb, _GROUP, nb, _GROUP)
    q, s = _quantize_groups(g, jnp.max(jnp.abs(g), axis=(1, 3), keepdims=True, initial=0.0))
    return q.reshape(mb * _GROUP, nb * _GROUP)[:m, :n], s.reshape(mb, nb)


def _cast_plan_cuda(entry: str, dtype: np.dtype, m: int, n: int) -> dict[int, Callable]:
    """Per local GPU, the launch of the CUDA cast kernel (the one the CuPy and torch paths run), loaded now."""
    from .. import quantization

    launches = {}
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:  # traced for CUDA where JAX has none (platform_dependent traces every branch)
        gpus = []
    for dev in gpus:
        if dev.process_index != jax.process_index():
            continue
        ordinal = int(getattr(dev, "local_hardware_id", None) or dev.id)
        quantization._get_kernel(dtype, entry, ordinal)

        def launch(stream: int, a: list[int], r: list[int], ordinal: int = ordinal) -> None:
            quantization.launch_cast(entry, dtype, a[0], r[0], r[1], m, n, n, stream, ordinal)

        launches[ordinal] = launch
    return launches


_cast_entries: dict[tuple, int] = {}


def _ffi_cast(entry: str, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The cast as an XLA custom call of cupygemm's CUDA kernel: bit-exact with the CuPy/torch paths (XLA's own
    float division on the GPU is not IEEE-exact, so a jnp version can differ in the last bit of a scale)."""
    from .. import quantization

    m, n = x.shape
    dtype = np.dtype(x.dtype)
    key = (entry, str(dtype), m, n)
    eid = _cast_entries.get(key)
    if eid is None:
        handler = _handler(_cuda_backend)
        eid = handler.add(xla_ffi.FfiEntry(f"{entry} {m}x{n} {dtype}", 1, 2, _cast_plan_cuda(entry, dtype, m, n)))
        _cast_entries[key] = eid
    results = [jax.ShapeDtypeStruct((m, n), jnp.float8_e4m3fn),
               jax.ShapeDtypeStruct((quantization.scale_rows(entry, m), ceil_div(n, _GROUP)), jnp.float32)]
    q, s = jax.ffi.ffi_call(TARGET, results, vmap_method="sequential")(x, entry_id=np.int64(eid))
    return q, s


def _cast(entry: str, jnp_impl: Callable, x: Any) -> tuple[jax.Array, jax.Array]:
    x = jnp.asarray(x) if not isinstance(x, jax.Array) else x
    _cast_input(x)  # trace-time checks
    if _backend is not _cuda_backend or 0 in x.shape:
        return jnp_impl(x)
    return lax.platform_dependent(x, cuda=functools.partial(_ffi_cast, entry), default=jnp_impl)


@jax.jit
def per_token_cast_to_fp8(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """1x128 FP8 cast of ``x`` [m, n] (bf16/f16/f32), jittable: ``(q float8_e4m3fn [m, n], s float32 [m, ceil(n/128)])``.

    Per row and 128 columns: ``amax = max(max|x|, 1e-4)`` (float32), ``q = e4m3fn(x * (448 / amax))`` rounded to
    nearest even, ``s = amax / 448``; bit-exact with :func:`cupygemm.reference.per_token_cast_to_fp8_reference`.
    On CUDA it runs cupygemm's cast kernel as a custom call; elsewhere the same arithmetic in ``jnp``.
    """
    return _cast("per_token_cast_to_fp8", _per_token_jnp, x)


@jax.jit
def per_block_cast_to_fp8(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """128x128 FP8 cast of ``x`` [m, n] (bf16/f16/f32), jittable: ``(q float8_e4m3fn [m, n], s float32 [ceil(m/128),
    ceil(n/128)])``, bit-exact with :func:`cupygemm.reference.per_block_cast_to_fp8_reference`. On CUDA it runs
    cupygemm's cast kernel as a custom call; elsewhere the same arithmetic in ``jnp``."""
    return _cast("per_block_cast_to_fp8", _per_block_jnp, x)


# --- the core's way into this module (cupygemm.frameworks) ----------------------------------------------------

class _JaxAdapter:
    @staticmethod
    def gemm(kind: Any, a: Any, sfa: Any, b: Any, sfb: Any, out: Any, layout: Any, static: int | None, stream: Any,
             packed: PackedWeights | None) -> Any:
        from ..gemm import same_framework

        if stream is not None:
            raise TypeError("stream: JAX calls run on XLA's stream, in JAX's order; stream= is for CuPy and torch")
        same_framework(a, sfa, b, sfb, out, layout)
        own = ((layout,) if kind.layout else ()) + ((static,) if kind.static else ())
        if out is not None and not kind.layout and not kind.accumulates:
            raise TypeError("out: JAX arrays are immutable, so a dense GEMM cannot write into one; call without out "
                            "and use the result")
        fn = globals()[kind.api]
        b_arg, sfb_arg = (packed, None) if packed is not None else (b, sfb)
        return fn(a, sfa, b_arg, sfb_arg, *own, **({} if out is None else {"out": out}))

    @staticmethod
    def cast(entry: str, x: Any, stream: Any, **options: Any) -> tuple[Any, ...]:
        if stream is not None:
            raise TypeError("stream: JAX calls run on XLA's stream, in JAX's order; stream= is for CuPy and torch")
        return globals()[entry](x)


def _register_adapter() -> None:
    from .. import frameworks
    from ..tensors import Framework

    frameworks.register(Framework.JAX, _JaxAdapter())


_register_adapter()
