"""cupygemm inside JAX: FP8 GEMMs as XLA FFI custom calls that work under ``jax.jit``, ``lax.scan``, ``vmap``.

Import this module explicitly (``import cupygemm.jax``); ``import cupygemm`` never imports JAX. Functions:

- one per GEMM kind (:mod:`cupygemm.kinds`), under the eager function's name, made from the kind's descriptor:
  ``NAME(a, sfa, b, sfb, *own, out) -> d``, ``own`` being the kind's layout operand then its static int, ``out``
  there when the kernel keeps rows of it (optional) or accumulates into it (required):

  - :func:`gemm_fp8_fp8_bf16_nt`\\ ``(a, sfa, b, sfb=None) -> d``
  - :func:`m_grouped_gemm_fp8_fp8_bf16_nt_contiguous`\\ ``(a, sfa, b, sfb, m_indices, out=None) -> d``
  - :func:`m_grouped_gemm_fp8_fp8_bf16_nt_masked`\\ ``(a, sfa, b, sfb, masked_m, expected_m, out=None) -> d``
- :func:`per_token_cast_to_fp8_transposed` (of ``x.T``, the weight gradients' operands) and
  :func:`per_block_cast_to_fp8_with_transpose` (W and W^T, the data gradients' B);
- :func:`per_token_cast_to_fp8`, :func:`per_block_cast_to_fp8`: jittable FP8 casts returning
  ``jnp.float8_e4m3fn`` values and float32 scales, bit-exact with :mod:`cupygemm.reference`;
- :func:`fp8_linear`, :func:`fp8_grouped_linear`: differentiable FP8 layers (``jax.custom_vjp``: forward, dgrad
  and wgrad GEMMs in FP8 with the DeepSeek-V3 recipe), dense and MoE (:mod:`.layers`).

Operands are JAX arrays (concrete or traced) with DeepGEMM's shapes: A ``float8_e4m3fn`` (or ``uint8`` e4m3 bits),
row-major SFA ``[M, ceil(K/128)]`` float32 (per group for the masked kind), SFB ``[..., ceil(N/128), ceil(K/128)]``
(per 1x128 like SFA for the kinds that scale B so); a kind's layout operand (``m_indices``, ``masked_m``) is an
int32 device array that may be traced and change from call to call. Results have the kind's output dtype (BF16 for
the forward kinds). Shapes and dtypes are checked at trace time by the eager path's own checks (ValueError/TypeError
naming the argument).

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

or call :func:`enable_command_buffers` before the first JAX computation (it sets them, keeping your other flags, and
warns when JAX has started already).

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
and every row valid. The other kinds (grouped, accumulating) run sequentially under ``vmap`` (``lax.map``: a
loop of kernel launches); :mod:`.batching` says how a kind's descriptor picks its rule.
Results of a folded call can differ from separate calls in the last BF16 bit (another kernel config may split K
differently); each is within the kernels' accuracy.

``jax.grad`` (any differentiation) of the GEMM functions raises TypeError: these are raw kernels without a VJP.
Train through :func:`fp8_linear` and :func:`fp8_grouped_linear`, whose VJPs call them.

``shard_map``: the GEMMs and the casts trace inside it; their results vary along the mesh axes their operands
vary along (:mod:`cupygemm.jax.vma`). Each device runs its own call on its own shard. Under plain ``jit`` over
sharded arrays each op has partitioning rules (:mod:`cupygemm.jax.sharding`): M-sharded activations stay sharded,
N-sharded weights give N-sharded outputs, K-sharded operands give partial products summed by one all-reduce.

**Packed weights.** :func:`cupygemm.pack_weights` packs a JAX B into an XLA buffer (L2-side-aware, see
:mod:`cupygemm.packing`); pass the :class:`~cupygemm.PackedWeights` as ``b`` with ``sfb=None`` (its scales are
used). The class is a pytree here (leaves: the packed bytes and the scales), so it passes through ``jit`` and
``scan`` as an argument; its layout (shape, offsets, hash) is static. A copy XLA makes of the bytes computes the same
results, only from the wrong L2 sides. Under ``vmap`` packed weights must not be mapped (each element's call then
runs in sequence).

Eager calls (concrete arrays outside ``jit``) take the same path: each public function calls a jitted function,
so the result is ordered on XLA's stream like any JAX result.

The package, one job per module: :mod:`.frontend` (the public functions, made from the descriptors),
:mod:`.checks` (trace-time checks: the kinds' own, on Views), :mod:`.batching` (each kind's op: its vmap rule and
no derivative), :mod:`.calls` (trace-time planning, handler entries, the ``ffi_call``), :mod:`.vma` (types under
``shard_map``), :mod:`.casts`, :mod:`.packed` (PackedWeights as a pytree), :mod:`.backend` (FFI target, handler,
planner; the test hook), :mod:`.adapter` (the eager entry points' way in). Not imported here:
:mod:`.parallel_bench` (the expert-parallel MoE and tensor-parallel MLP of ``examples/jax_expert_parallel_moe.py``
and their timing).
"""
from __future__ import annotations

try:
    import jax  # noqa: F401
except ImportError as e:  # a bare "No module named" does not say that the CUDA build is the one needed
    raise type(e)('cupygemm.jax needs JAX with CUDA: pip install "jax[cuda12]" (or "jax[cuda13]")', name=e.name) from e

from ..kinds import KINDS
from . import adapter as _adapter  # noqa: F401 - registers cupygemm.jax with cupygemm.frameworks
from .backend import TARGET
from .backend import handlers as _handlers  # noqa: F401 - the handler per platform (bench, scripts, tests)
from .backend import use_backend as _use_backend  # noqa: F401 - test hook
from .casts import per_block_cast_to_fp8, per_block_cast_to_fp8_with_transpose, per_token_cast_to_fp8
from .casts import per_token_cast_to_fp8_transposed as _transposed
from .casts import per_token_cast_to_fp8_transposed_rowwise as _transposed_rowwise
from .flags import enable_command_buffers
from .frontend import public as _public
from .layers import fp8_grouped_linear, fp8_linear


def per_token_cast_to_fp8_transposed(x, *, rowwise: bool = False):
    """``per_token_cast_to_fp8(x.T)`` for ``x`` [T, d]: ``(q_t [d, T], s_t [d, ceil(T/128)])``, the weight-gradient
    GEMM's K-major operand; ``rowwise=True`` adds ``per_token_cast_to_fp8(x)``: ``(q_t, s_t, q, s)``. Bit for bit
    :func:`cupygemm.per_token_cast_to_fp8_transposed` (jittable)."""
    return _transposed_rowwise(x) if rowwise else _transposed(x)



for _kind in KINDS:
    globals()[_kind.api] = _public(_kind)

__all__ = ["TARGET", "enable_command_buffers", *(_kind.api for _kind in KINDS), "per_token_cast_to_fp8",
           "per_block_cast_to_fp8", "per_token_cast_to_fp8_transposed", "per_block_cast_to_fp8_with_transpose",
           "fp8_linear", "fp8_grouped_linear"]
del _kind
