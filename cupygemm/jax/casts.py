"""FP8 casts in JAX: bit-exact with :mod:`cupygemm.reference`, jittable, on every platform.

On CUDA a cast is cupygemm's own CUDA kernel (the one the CuPy and torch paths run) as an XLA custom call; on
other platforms the same arithmetic in ``jnp``, with the float32 -> e4m3 rounding written out in integer
arithmetic. ``lax.platform_dependent`` picks between the two when XLA lowers the program (both are traced). The
input is checked by the eager cast's own check (:mod:`cupygemm.quantization`).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import quantization, xla_ffi
from .. import sharding as rules
from ..util import ceil_div
from . import backend, checks, vma

_GROUP = 128
_FP8_MAX = 448.0
_MIN_AMAX = 1e-4


def f32_to_e4m3fn(y: jax.Array) -> jax.Array:
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
    # not amax / 448 in the last bit; a divisor it cannot see through keeps the IEEE division. The divisor is made
    # from amax so that under vmap it is batched like amax: a constant would leave the barrier unbatched and be
    # broadcast after it, which XLA rewrites again (A / broadcast(B) -> A * broadcast(1 / B)).
    divisor = jnp.where(amax == amax, jnp.float32(_FP8_MAX), jnp.float32(_FP8_MAX))
    amax, divisor = lax.optimization_barrier((amax, divisor))
    scale = amax / divisor
    factor = jnp.float32(_FP8_MAX) / amax
    y = jnp.clip(x * factor, jnp.float32(-_FP8_MAX), jnp.float32(_FP8_MAX))
    return f32_to_e4m3fn(y), scale


def per_token_jnp(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """1x128 FP8 cast of ``x`` [m, n] (bf16/f16/f32) in ``jnp``: ``(q float8_e4m3fn [m, n], s float32
    [m, ceil(n/128)])``.

    Per row and 128 columns: ``amax = max(max|x|, 1e-4)`` (float32), ``q = e4m3fn(x * (448 / amax))`` rounded to
    nearest even, ``s = amax / 448``; bit-exact with :func:`cupygemm.reference.per_token_cast_to_fp8_reference`.
    """
    x32 = jnp.asarray(x).astype(jnp.float32)  # exact for all three input dtypes
    m, n = x32.shape
    nb = ceil_div(n, _GROUP)
    g = jnp.pad(x32, ((0, 0), (0, nb * _GROUP - n))).reshape(m, nb, _GROUP)
    q, s = _quantize_groups(g, jnp.max(jnp.abs(g), axis=2, keepdims=True, initial=0.0))
    return q.reshape(m, nb * _GROUP)[:, :n], s.reshape(m, nb)


def per_block_jnp(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """128x128 FP8 cast of ``x`` [m, n] (bf16/f16/f32) in ``jnp``: ``(q float8_e4m3fn [m, n], s float32
    [ceil(m/128), ceil(n/128)])``, bit-exact with :func:`cupygemm.reference.per_block_cast_to_fp8_reference`."""
    x32 = jnp.asarray(x).astype(jnp.float32)
    m, n = x32.shape
    mb, nb = ceil_div(m, _GROUP), ceil_div(n, _GROUP)
    g = jnp.pad(x32, ((0, mb * _GROUP - m), (0, nb * _GROUP - n))).reshape(mb, _GROUP, nb, _GROUP)
    q, s = _quantize_groups(g, jnp.max(jnp.abs(g), axis=(1, 3), keepdims=True, initial=0.0))
    return q.reshape(mb * _GROUP, nb * _GROUP)[:m, :n], s.reshape(mb, nb)


def _launches(load: Callable[[int], Any], run: Callable[..., None]) -> dict[int, Callable]:
    """Per local GPU, the cast kernel loaded now (``load(ordinal)``) and its launch ``run(ordinal, stream, args,
    rets)``; none where JAX has no GPU (``platform_dependent`` traces the CUDA branch everywhere)."""
    try:
        gpus = backend.local_gpus()
    except RuntimeError:
        gpus = []
    launches = {}
    for ordinal in gpus:
        load(ordinal)
        launches[ordinal] = functools.partial(run, ordinal)
    return launches


_cast_entries: dict[tuple, int] = {}


def _custom_call(entry: str, x: jax.Array, results: list[jax.ShapeDtypeStruct],
                 make_launches: Callable[[], dict[int, Callable]]) -> tuple[jax.Array, ...]:
    """A cast of ``x`` as an XLA custom call of cupygemm's kernel (its handler entry made once per entry point,
    dtype and shape); under ``shard_map`` the results vary as ``x`` does (as the ``jnp`` branch's do)."""
    m, n = x.shape
    key = (entry, str(np.dtype(x.dtype)), m, n)
    eid = _cast_entries.get(key)
    if eid is None:
        handler = backend.handler(backend.CUDA)
        eid = handler.add(xla_ffi.FfiEntry(f"{entry} {m}x{n} {key[1]}", 1, len(results), make_launches()))
        _cast_entries[key] = eid
    got = jax.ffi.ffi_call(backend.TARGET, results, vmap_method="sequential")(x, entry_id=np.int64(eid))
    axes = vma.varying(x)
    return tuple(vma.to_varying(r, axes) for r in got)


def ffi_cast(entry: str, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The cast as an XLA custom call of cupygemm's CUDA kernel: bit-exact with the CuPy/torch paths (XLA's own
    float division on the GPU is not IEEE-exact, so a jnp version can differ in the last bit of a scale)."""
    m, n = x.shape
    dtype = np.dtype(x.dtype)

    def run(ordinal: int, stream: int, a: list[int], r: list[int]) -> None:
        quantization.launch_cast(entry, dtype, a[0], r[0], r[1], m, n, n, stream, ordinal)

    results = [jax.ShapeDtypeStruct((m, n), jnp.float8_e4m3fn),
               jax.ShapeDtypeStruct((quantization.scale_rows(entry, m), ceil_div(n, _GROUP)), jnp.float32)]
    return _custom_call(entry, x, results,
                        lambda: _launches(lambda o: quantization._get_kernel(dtype, entry, o), run))


def ffi_fused_cast(entry: str, x: jax.Array) -> tuple[jax.Array, ...]:
    """A fused transpose cast (cuda_src/cast_transpose.cu) as an XLA custom call: one pass over ``x``, bit for bit
    the eager fused cast's results, in :func:`cupygemm.quantization.fused_cast_outputs`'s order, dense."""
    m, n = x.shape
    dtype = np.dtype(x.dtype)
    outs = quantization.fused_cast_outputs(entry, m, n)
    names = [o.name for o in outs]

    def run(ordinal: int, stream: int, a: list[int], r: list[int]) -> None:
        p = dict(zip(names, r))
        quantization.launch_fused_cast(entry, dtype, a[0], p["q_t"], p["s_t"], p.get("q", 0), p.get("s", 0), m, n, n,
                                       stream, ordinal)

    results = [jax.ShapeDtypeStruct(o.shape, jnp.float8_e4m3fn if o.dtype == quantization.FP8_E4M3 else jnp.float32)
               for o in outs]
    return _custom_call(entry, x, results,
                        lambda: _launches(lambda o: quantization.load_fused_cast(entry, dtype, o), run))


def transposed_jnp(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``per_token_jnp(x.T)``."""
    return per_token_jnp(jnp.swapaxes(x, 0, 1))


def transposed_rowwise_jnp(x: jax.Array) -> tuple[jax.Array, ...]:
    return (*per_token_jnp(jnp.swapaxes(x, 0, 1)), *per_token_jnp(x))


def block_with_transpose_jnp(x: jax.Array) -> tuple[jax.Array, ...]:
    """A 128x128 block's scale is the same for ``x`` and ``x.T``: the transposes of ``per_block_jnp(x)``."""
    q, s = per_block_jnp(x)
    return q, s, jnp.swapaxes(q, 0, 1), jnp.swapaxes(s, 0, 1)


_FUSED_JNP = {quantization.TRANSPOSED: transposed_jnp, quantization.TRANSPOSED_ROWWISE: transposed_rowwise_jnp,
              quantization.BLOCK_WITH_TRANSPOSE: block_with_transpose_jnp}


def fused_cast(entry: str, x: Any) -> tuple[jax.Array, ...]:
    """One fused cast: checked as the eager cast checks its input, then the CUDA kernel or ``jnp`` by platform,
    with its partitioning rule and a ``vmap`` rule (one call per mapped element)."""
    x = jnp.asarray(x) if not isinstance(x, jax.Array) else x
    quantization._prepare(checks.view(x, "x"))
    jnp_impl = _FUSED_JNP[entry]
    if backend.current() is not backend.CUDA or 0 in x.shape:
        return jnp_impl(x)
    return _partitioned_fused(entry)(x)


@functools.lru_cache(maxsize=None)
def _partitioned_fused(entry: str) -> Callable:
    from . import sharding  # jax.experimental, imported where it is used

    jnp_impl = _FUSED_JNP[entry]

    def run(x: jax.Array) -> tuple[jax.Array, ...]:
        return lax.platform_dependent(x, cuda=functools.partial(ffi_fused_cast, entry), default=jnp_impl)

    def impl(x: jax.Array) -> tuple[jax.Array, ...]:
        rule = rules.fused_cast_rule(run, entry, tuple(x.shape))
        return tuple(sharding.apply(rule, x))

    op = jax.custom_batching.custom_vmap(impl)

    @op.def_vmap
    def rule(axis_size: int, in_batched: list[bool], x: jax.Array) -> tuple[tuple, tuple[bool, ...]]:
        count = len(rules.FUSED_CAST_RESULTS[entry])
        if not in_batched[0]:
            return op(x), (False,) * count
        return lax.map(op, x), (True,) * count
    return op


def cast(entry: str, jnp_impl: Callable, x: Any) -> tuple[jax.Array, jax.Array]:
    """One cast: checked as the eager cast checks its input, then the CUDA kernel or ``jnp`` by platform."""
    x = jnp.asarray(x) if not isinstance(x, jax.Array) else x
    quantization._prepare(checks.view(x, "x"))  # trace-time checks, the eager path's
    if backend.current() is not backend.CUDA or 0 in x.shape:
        return jnp_impl(x)
    return _partitioned(entry, jnp_impl)(x)


@functools.lru_cache(maxsize=None)
def _partitioned(entry: str, jnp_impl: Callable) -> Callable:
    """The cast by platform, with its partitioning rule (:mod:`.sharding`) and a ``vmap`` rule (custom partitioning
    has none): a mapped 1x128 cast is one cast of the stacked rows (rows are independent), a mapped 128x128 cast one
    cast per element (its blocks must not straddle two elements)."""
    from . import sharding  # jax.experimental, imported where it is used

    def run(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return lax.platform_dependent(x, cuda=functools.partial(ffi_cast, entry), default=jnp_impl)

    def impl(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        rule = rules.cast_rule(run, tuple(x.shape), block_rows=entry == "per_block_cast_to_fp8")
        return tuple(sharding.apply(rule, x))

    op = jax.custom_batching.custom_vmap(impl)

    @op.def_vmap
    def rule(axis_size: int, in_batched: list[bool], x: jax.Array) -> tuple[tuple, tuple[bool, bool]]:
        if not in_batched[0]:
            return op(x), (False, False)
        if entry == "per_token_cast_to_fp8":
            v, m, n = x.shape
            q, s = op(x.reshape(v * m, n))
            return (q.reshape(v, m, n), s.reshape(v, m, s.shape[-1])), (True, True)
        return lax.map(op, x), (True, True)
    return op


@jax.jit
def per_token_cast_to_fp8(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """1x128 FP8 cast of ``x`` [m, n] (bf16/f16/f32), jittable: ``(q float8_e4m3fn [m, n], s float32 [m, ceil(n/128)])``.

    Per row and 128 columns: ``amax = max(max|x|, 1e-4)`` (float32), ``q = e4m3fn(x * (448 / amax))`` rounded to
    nearest even, ``s = amax / 448``; bit-exact with :func:`cupygemm.reference.per_token_cast_to_fp8_reference`.
    On CUDA it runs cupygemm's cast kernel as a custom call; elsewhere the same arithmetic in ``jnp``.
    """
    return cast("per_token_cast_to_fp8", per_token_jnp, x)


@jax.jit
def per_block_cast_to_fp8(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """128x128 FP8 cast of ``x`` [m, n] (bf16/f16/f32), jittable: ``(q float8_e4m3fn [m, n], s float32 [ceil(m/128),
    ceil(n/128)])``, bit-exact with :func:`cupygemm.reference.per_block_cast_to_fp8_reference`. On CUDA it runs
    cupygemm's cast kernel as a custom call; elsewhere the same arithmetic in ``jnp``."""
    return cast("per_block_cast_to_fp8", per_block_jnp, x)


for _f in (per_token_cast_to_fp8, per_block_cast_to_fp8):
    try:  # help() and the docs name them where users find them
        _f.__module__ = "cupygemm.jax"
    except (AttributeError, TypeError):  # pragma: no cover - a jitted function that keeps its own
        pass


@jax.jit
def per_token_cast_to_fp8_transposed(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``per_token_cast_to_fp8(x.T)``: the K-major FP8 copy of ``x.T`` (``x`` [T, d]) with 1x128 scales along T, the
    weight-gradient GEMM's operand; on CUDA the fused transpose cast (one pass over ``x``, bit for bit the eager
    one's results)."""
    return fused_cast(quantization.TRANSPOSED, x)


@jax.jit
def per_token_cast_to_fp8_transposed_rowwise(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(*per_token_cast_to_fp8(x.T), *per_token_cast_to_fp8(x))``: both layouts a linear layer's step needs, from one
    pass over ``x`` on CUDA."""
    return fused_cast(quantization.TRANSPOSED_ROWWISE, x)


@jax.jit
def per_block_cast_to_fp8_with_transpose(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(q, s, q_t, s_t)``: ``per_block_cast_to_fp8(x)`` and ``per_block_cast_to_fp8(x.T)`` (a 128x128 block's
    scale is the same for ``x`` and ``x.T``, so ``s_t = s.T``), from one pass over ``x`` on CUDA: the dgrad GEMM's
    W^T."""
    return fused_cast(quantization.BLOCK_WITH_TRANSPOSE, x)
