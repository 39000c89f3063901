"""A jitted FP8 MLP stack in JAX: ``lax.scan`` over layers of quantize -> GEMM -> SiLU -> quantize -> GEMM, with
cupygemm's kernels as XLA custom calls (``cupygemm.jax``), checked against the same math in float32 on the
unquantized weights. Hopper GPU and JAX with CUDA.

Small per-layer GEMMs are host-bound without XLA command buffers; run with
``XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"`` to replay
the whole scan as CUDA graphs.
"""
import cupygemm

cupygemm.device.require_hopper_or_exit()  # one clear line, not CuPy's driver error, where there is no Hopper GPU

import os  # noqa: E402

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import cupygemm.jax as cj  # noqa: E402

layers, tokens, hidden, ffn = 4, 128, 2048, 4096
k0, k1, k2 = jax.random.split(jax.random.key(0), 3)
x = jax.random.normal(k0, (tokens, hidden), jnp.float32)
w_up = jax.random.normal(k1, (layers, ffn, hidden), jnp.float32) / np.sqrt(hidden)
w_down = jax.random.normal(k2, (layers, hidden, ffn), jnp.float32) / np.sqrt(ffn)

# Weights are quantized once (128x128 blocks), outside the forward pass.
up_q, up_s = jax.vmap(cj.per_block_cast_to_fp8)(w_up)
down_q, down_s = jax.vmap(cj.per_block_cast_to_fp8)(w_down)


def rms_norm(h):
    return h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6)


@jax.jit
def forward_fp8(x, up_q, up_s, down_q, down_s):
    def layer(h, w):
        uq, us, dq, ds = w
        a, sa = cj.per_token_cast_to_fp8(rms_norm(h))        # activations: 1x128 groups
        u = cj.gemm_fp8_fp8_bf16_nt(a, sa, uq, us)            # [tokens, ffn] bf16
        a2, sa2 = cj.per_token_cast_to_fp8(jax.nn.silu(u.astype(jnp.float32)))
        return h + cj.gemm_fp8_fp8_bf16_nt(a2, sa2, dq, ds).astype(jnp.float32), None
    return jax.lax.scan(layer, x, (up_q, up_s, down_q, down_s))[0]


@jax.jit
def forward_reference(x, w_up, w_down):
    def layer(h, w):
        wu, wd = w
        dot = lambda p, q: jnp.dot(p, q.T, precision=jax.lax.Precision.HIGHEST)  # noqa: E731
        return h + dot(jax.nn.silu(dot(rms_norm(h), wu)), wd), None
    return jax.lax.scan(layer, x, (w_up, w_down))[0]


out = forward_fp8(x, up_q, up_s, down_q, down_s)
want = forward_reference(x, w_up, w_down)
diff = cupygemm.calc_diff(np.asarray(out, np.float64), np.asarray(want, np.float64))
print(f"{layers} layers, {tokens} tokens, hidden {hidden}, ffn {ffn}: FP8 vs float32 calc_diff {diff:.2e}")
assert diff < 1e-2, diff
