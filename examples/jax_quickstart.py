"""JAX users: JAX arrays in, a JAX bfloat16 array out (zero-copy via DLPack). Hopper GPU.

Synchronization: cupygemm imports JAX buffers through DLPack, which waits for them to be ready; the result is
handed back through DLPack on CuPy's stream, so use it as any JAX array.
"""
import cupygemm

cupygemm.device.require_hopper_or_exit()  # one clear line, not CuPy's driver error, where there is no Hopper GPU

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

m, n, k = 4096, 4096, 7168
kx, kw = jax.random.split(jax.random.key(0))
x = jax.random.normal(kx, (m, k), jnp.bfloat16)
w = jax.random.normal(kw, (n, k), jnp.bfloat16)

a, sfa = cupygemm.per_token_cast_to_fp8(x)  # jnp.float8_e4m3fn + float32 scales
b, sfb = cupygemm.per_block_cast_to_fp8(w)

d = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
ref = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
got = np.asarray(d, np.float64)
diff = 1 - 2 * (got * ref).sum() / (got * got + ref * ref).sum()
print(f"{type(d).__name__} {d.shape} {d.dtype}; calc_diff {diff:.2e}")
