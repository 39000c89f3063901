"""cupygemm.jax.fp8_linear / fp8_grouped_linear on the GPU: the gradients of the FP8 layers at training sizes against
the unquantized float64 math (calc_diff <= 2e-3 for y, dx and dW), bitwise repeatable from run to run, and jax.grad
inside jit(scan(...)) (gradient accumulation over micro-batches) equal to the separate gradients summed."""
from __future__ import annotations

import os

import numpy as np
import pytest

# Training-size steps hold GBs in the frameworks' pools: one xdist worker runs both layer files, one test at a
# time (scripts/device_check.sh passes --dist loadgroup), or twelve workers' pools exhaust the GPU.
pytestmark = [pytest.mark.gpu, pytest.mark.xdist_group("training-sizes")]

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

jax = pytest.importorskip("jax")
try:
    jax.devices("gpu")
except RuntimeError as _e:  # a CPU-only jaxlib
    pytest.skip(f"JAX has no GPU backend ({_e})", allow_module_level=True)

import jax.numpy as jnp  # noqa: E402

import cupygemm.jax as cj  # noqa: E402
from cupygemm import reference as ref  # noqa: E402

TOL = 2e-3


def _data(t, n, k, g=None, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((t, k), np.float32), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((n, k) if g is None else (g, n, k), np.float32) / np.sqrt(k))
    c = jnp.asarray(rng.standard_normal((t, n), np.float32), jnp.bfloat16)  # dy of the loss sum(y * c)
    return x, w, c


def _loss(layer):
    def loss(x, w, c, *rest):
        return jnp.sum(layer(x, w, *rest).astype(jnp.float32) * c.astype(jnp.float32))
    return loss


def _f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def _bits(tree) -> list[np.ndarray]:
    return [np.asarray(a).view(np.uint16 if a.dtype == jnp.bfloat16 else np.uint32) for a in tree]


@pytest.mark.parametrize("t, n, k", [(4096, 2112, 7168), (4096, 7168, 2048), (1001, 2112, 7168)])
@pytest.mark.parametrize("save", ["fp8", "input"])
def test_dense_gradients(t, n, k, save):
    x, w, c = _data(t, n, k)
    layer = lambda a, b: cj.fp8_linear(a, b, save=save)  # noqa: E731
    step = jax.jit(jax.value_and_grad(_loss(layer), argnums=(0, 1)))
    _, (dx, dw) = step(x, w, c)
    y = jax.jit(layer)(x, w)
    assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
    x64, w64, dy64 = _f64(x), _f64(w), _f64(c)
    assert ref.calc_diff(_f64(y), x64 @ w64.T) <= TOL
    assert ref.calc_diff(_f64(dx), dy64 @ w64) <= TOL
    assert ref.calc_diff(_f64(dw), dy64.T @ x64) <= TOL
    again = step(x, w, c)[1]
    for a, b in zip(_bits((dx, dw)), _bits(again)):
        np.testing.assert_array_equal(a, b)


def _groups(sizes, t, k, n, g_seed=1):
    x, w, c = _data(t, n, k, g=len(sizes), seed=g_seed)
    used = int(sum(sizes))
    x = x.at[used:].set(0)  # padding rows past the groups are zeros
    return x, w, c, jnp.asarray(sizes, jnp.int32)


@pytest.mark.parametrize("n, k", [(2112, 7168), (7168, 2048)])
def test_grouped_gradients(n, k):
    sizes = [1024, 640, 1536, 768]  # uneven multiples of 128, 128 padding rows after them
    x, w, c, gs = _groups(sizes, 4096, k, n)
    step = jax.jit(jax.grad(_loss(cj.fp8_grouped_linear), argnums=(0, 1)))
    dx, dw = step(x, w, c, gs)
    y = jax.jit(cj.fp8_grouped_linear)(x, w, gs)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    assert not _f64(y[starts[-1]:]).any() and not _f64(dx[starts[-1]:]).any()
    for g in range(len(sizes)):
        rows = slice(starts[g], starts[g + 1])
        x64, dy64, w64 = _f64(x[rows]), _f64(c[rows]), _f64(w[g])
        assert ref.calc_diff(_f64(y[rows]), x64 @ w64.T) <= TOL, g
        assert ref.calc_diff(_f64(dx[rows]), dy64 @ w64) <= TOL, g
        assert ref.calc_diff(_f64(dw[g]), dy64.T @ x64) <= TOL, g
    again = step(x, w, c, gs)
    for a, b in zip(_bits((dx, dw)), _bits(again)):
        np.testing.assert_array_equal(a, b)
    # other sizes, same compiled step: an empty expert gets a zero gradient
    dx2, dw2 = step(x, w, c, jnp.asarray([2048, 0, 1024, 896], jnp.int32))
    assert not np.asarray(dw2[1]).any()
    assert ref.calc_diff(_f64(dw2[0]), _f64(c[:2048]).T @ _f64(x[:2048])) <= TOL


def test_grad_inside_jit_scan_accumulates_micro_batches():
    """Gradient accumulation: jax.grad of dense and grouped layers inside a jitted lax.scan over four micro-batches
    gives the sum of the micro-batches' own gradients."""
    mb, t, n, k = 4, 1024, 2112, 7168
    x, w, c = _data(mb * t, n, k, seed=2)
    xs, cs = x.reshape(mb, t, k), c.reshape(mb, t, n)
    sizes = jnp.asarray([256, 512, 128, 128], jnp.int32)
    _, wg, _ = _data(8, n, k, g=4, seed=3)
    dense = jax.grad(_loss(cj.fp8_linear), argnums=1)
    grouped = jax.grad(_loss(cj.fp8_grouped_linear), argnums=1)

    @jax.jit
    def accumulate(w, wg, xs, cs):
        def body(acc, batch):
            xb, cb = batch
            return (acc[0] + dense(xb, w, cb), acc[1] + grouped(xb, wg, cb, sizes)), None
        return jax.lax.scan(body, (jnp.zeros_like(w), jnp.zeros_like(wg)), (xs, cs))[0]

    acc, acc_g = accumulate(w, wg, xs, cs)
    one = jax.jit(dense)
    one_g = jax.jit(grouped)
    want, want_g = np.zeros(w.shape), np.zeros(wg.shape)
    for i in range(mb):
        want += _f64(one(xs[i], w, cs[i]))
        want_g += _f64(one_g(xs[i], wg, cs[i], sizes))
    assert ref.calc_diff(_f64(acc), want) < 1e-9
    assert ref.calc_diff(_f64(acc_g), want_g) < 1e-9
    x64, c64 = _f64(x), _f64(c)
    assert ref.calc_diff(_f64(acc), c64.T @ x64) <= TOL
