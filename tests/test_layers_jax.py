"""cupygemm.jax.fp8_linear / fp8_grouped_linear on XLA's CPU platform (no GPU): the whole custom_vjp wiring, with
host plans that compute each kernel's result from cupygemm.reference (the forward kinds as tests/test_xla_ffi.py's
HostPlan does, the weight-gradient kinds here).

Each layer's y, dx and dW are checked bit for bit against a NumPy model of the same FP8 recipe (reference casts,
reference GEMMs on the padded token axis) and, by calc_diff, against the unquantized float64 math; then under
jit(scan) over two layers, jax.checkpoint, vmap, a hand-written Adam step, and make_jaxpr (tracing plans nothing on
a device and launches nothing)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cupygemm import reference as ref
from test_xla_ffi import HostPlan, _host

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import cupygemm.jax as cj  # noqa: E402
from cupygemm.jax import backend, layers  # noqa: E402

BF16 = ml_dtypes.bfloat16
COLUMNS = "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns"


# --- host plans for the 1D1D kinds ------------------------------------------------------------------------------

class WgradHostPlan:
    """The weight-gradient kinds on host buffers, read as the kernel reads them: SFA [kb][sfa_m_pad] and SFB
    [kb][sfb_m_pad] (1x128 scales along K, M- and N-major), FP32 out accumulated (stored by the storing kind). The columns kind adds
    ``out[g] += A[:, o_g:o_g+k_g] @ B[:, o_g:o_g+k_g].T`` with the group sizes read from the layout operand."""

    def __init__(self, kind, m, n, k, g):
        self.kind, self.m, self.n, self.k, self.g = kind, m, n, k, g
        self.sfa_m_pad, self.sfb_m_pad = -(-m // 4) * 4, -(-n // 4) * 4
        self.scratch_floats = self.scratch_counters = 0
        self.calls = 0

    def launch(self, stream, a, sfa, b, sfb, d, layout=0, partials=0, counters=0, zero_counters=False, **_):
        self.calls += 1
        m, n, k, g = self.m, self.n, self.k, self.g
        kb = -(-k // 128)
        A, B = _host(a, np.uint8, (m, k)), _host(b, np.uint8, (n, k))
        SA = _host(sfa, np.float32, (kb, self.sfa_m_pad))[:, :m].T
        SB = _host(sfb, np.float32, (kb, self.sfb_m_pad))[:, :n].T
        if self.kind.api != COLUMNS:
            D = _host(d, np.float32, (m, n))
            # the storing kind writes A @ B.T over whatever out held (XLA gives it an uninitialized buffer)
            D[:] = ref.wgrad_reference(A, SA, B, SB, D if self.kind.accumulates else np.zeros_like(D))
            return
        D = _host(d, np.float32, (g, m, n))
        o = 0
        for i, size in enumerate(_host(layout, np.int32, (g,))):
            size = int(size)
            assert size % 128 == 0 and o + size <= k, (i, size, k)
            if size:
                blocks = slice(o // 128, (o + size) // 128)
                D[i] = ref.wgrad_reference(A[:, o:o + size], SA[:, blocks], B[:, o:o + size], SB[:, blocks], D[i])
            o += size


class Planner:
    def __init__(self):
        self.plans = []

    def __call__(self, kind, m, n, k, g, static, sides=False, scale_rows=0):
        plan = WgradHostPlan(kind, m, n, k, g) if kind.family == "1d1d" else HostPlan(kind, m, n, k, g, static)
        self.plans.append(plan)
        return {0: plan}

    def launches(self) -> int:
        return sum(p.calls for p in self.plans)


@pytest.fixture
def planner():
    p = Planner()
    with backend.use_backend("cpu", p):
        yield p


# --- the recipe in NumPy ----------------------------------------------------------------------------------------

def _bf16(a) -> np.ndarray:
    return np.asarray(a, np.float64).astype(np.float32).astype(BF16)


def _f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def _pad(a: np.ndarray) -> np.ndarray:
    rows = -(-a.shape[0] // 16) * 16
    return np.pad(a, [(0, rows - a.shape[0])] + [(0, 0)] * (a.ndim - 1))


def recipe_dense(x, w, dy):
    """(y bf16, dx bf16, dW f32) of the FP8 recipe on float32 host arrays x [T, K], w [N, K], dy [T, N]."""
    t = x.shape[0]
    xp, dyp = _pad(x), _pad(dy)
    xq, xs = ref.per_token_cast_to_fp8_reference(xp)
    wq, ws = ref.per_block_cast_to_fp8_reference(w)
    wqt, wst = ref.per_block_cast_to_fp8_reference(np.ascontiguousarray(w.T))
    dyq, dys = ref.per_token_cast_to_fp8_reference(dyp)
    y = _bf16(ref.gemm_reference(xq, xs, wq, ws))[:t]
    dx = _bf16(ref.gemm_reference(dyq, dys, wqt, wst))[:t]
    dyqt, dyst = ref.per_token_cast_to_fp8_reference(np.ascontiguousarray(dyp.T))
    xqt, xst = ref.per_token_cast_to_fp8_reference(np.ascontiguousarray(xp.T))
    dw = ref.wgrad_reference(dyqt, dyst, xqt, xst, np.zeros((w.shape[0], w.shape[1]))).astype(np.float32)
    return y, dx, dw


def recipe_grouped(x, w, sizes, dy):
    """The same for the MoE layer: x [T, K], w [G, N, K], sizes [G] (multiples of 128), dy [T, N]."""
    t, g = x.shape[0], w.shape[0]
    xp, dyp = _pad(x), _pad(dy)
    idx = np.full(xp.shape[0], -1, np.int32)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    for i in range(g):
        idx[starts[i]:starts[i + 1]] = i
    ws = [ref.per_block_cast_to_fp8_reference(w[i]) for i in range(g)]
    wts = [ref.per_block_cast_to_fp8_reference(np.ascontiguousarray(w[i].T)) for i in range(g)]
    stack = lambda parts, j: np.stack([p[j] for p in parts])  # noqa: E731
    xq, xs = ref.per_token_cast_to_fp8_reference(xp)
    dyq, dys = ref.per_token_cast_to_fp8_reference(dyp)
    ok = idx >= 0
    y = np.zeros((xp.shape[0], w.shape[1]))
    y[ok] = ref.grouped_contiguous_reference(xq, xs, stack(ws, 0), stack(ws, 1), idx)[ok]
    dx = np.zeros(xp.shape)
    dx[ok] = ref.grouped_contiguous_reference(dyq, dys, stack(wts, 0), stack(wts, 1), idx)[ok]
    dyqt, dyst = ref.per_token_cast_to_fp8_reference(np.ascontiguousarray(dyp.T))
    xqt, xst = ref.per_token_cast_to_fp8_reference(np.ascontiguousarray(xp.T))
    dw = np.zeros(w.shape, np.float32)
    for i in range(g):
        cols, blocks = slice(starts[i], starts[i + 1]), slice(starts[i] // 128, starts[i + 1] // 128)
        dw[i] = ref.wgrad_reference(dyqt[:, cols], dyst[:, blocks], xqt[:, cols], xst[:, blocks], dw[i])
    return _bf16(y)[:t], _bf16(dx)[:t], dw, ok[:t]


def _data(t, n, k, g=None, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((t, k)).astype(np.float32)
    w = (rng.standard_normal((n, k) if g is None else (g, n, k)) / np.sqrt(k)).astype(np.float32)
    c = rng.standard_normal((t, n)).astype(np.float32)  # the loss's weights: dy = bf16(c)
    return x, w, c


def _loss(layer):
    def loss(x, w, c, *rest):
        return jnp.sum(layer(x, w, *rest).astype(jnp.float32) * c)
    return loss


def _same(got, want):
    np.testing.assert_array_equal(np.asarray(got).astype(np.float32), np.asarray(want).astype(np.float32))


# --- dense ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("save", ["fp8", "input"])
@pytest.mark.parametrize("x_dtype, w_dtype", [(jnp.bfloat16, jnp.float32), (jnp.float32, jnp.bfloat16),
                                              (jnp.float16, jnp.float32)])
def test_dense_matches_the_recipe_and_the_float64_math(planner, save, x_dtype, w_dtype):
    # 2 x 37 tokens (padded to 80 inside), N and K multiples of 16 but not of 128 (partial scale blocks)
    x, w, c = _data(74, 144, 272)
    xj, wj = jnp.asarray(x, x_dtype), jnp.asarray(w, w_dtype)
    x, w = _f64(xj).astype(np.float32), _f64(wj).astype(np.float32)  # the values the layer sees
    x3 = xj.reshape(2, 37, 272)
    y = cj.fp8_linear(x3, wj, save=save)
    assert y.shape == (2, 37, 144) and y.dtype == jnp.bfloat16
    dx, dw = jax.jit(jax.grad(_loss(lambda a, b: cj.fp8_linear(a, b, save=save)), argnums=(0, 1)))(
        x3, wj, jnp.asarray(c).reshape(2, 37, 144))
    assert dx.dtype == x_dtype and dx.shape == x3.shape and dw.dtype == w_dtype and dw.shape == w.shape
    dy = _f64(_bf16(c)).astype(np.float32)
    ry, rdx, rdw = recipe_dense(x, w, dy)
    _same(y.reshape(74, 144), ry)
    _same(dx.reshape(74, 272), np.asarray(rdx).astype(np.float32).astype(x_dtype))
    _same(dw, rdw.astype(w_dtype))
    x64, w64, dy64 = _f64(x), _f64(w), _f64(dy)
    assert ref.calc_diff(_f64(y).reshape(74, 144), x64 @ w64.T) < 2e-3
    assert ref.calc_diff(_f64(dx).reshape(74, 272), dy64 @ w64) < 2e-3
    assert ref.calc_diff(_f64(dw), dy64.T @ x64) < 2e-3
    kinds = sorted({p.kind.name for p in planner.plans})
    assert kinds == ["normal", "wgrad_store"]  # forward and dgrad on the forward kernel, dW on the wgrad kernel


def test_dense_save_modes_give_the_same_gradients(planner):
    x, w, c = _data(40, 128, 256, seed=1)
    grads = [jax.grad(_loss(lambda a, b, s=s: cj.fp8_linear(a, b, save=s)), argnums=(0, 1))(
        jnp.asarray(x, jnp.bfloat16), jnp.asarray(w), jnp.asarray(c)) for s in ("fp8", "input")]
    for a, b in zip(*grads):
        _same(a, b)


def test_dense_saves_only_fp8_residuals(planner):
    """save='fp8' keeps x^T and W^T in FP8 (with their float32 scales) and nothing of the inputs; save='input' keeps
    x (padded) and w."""
    x, w = jnp.zeros((40, 256), jnp.bfloat16), jnp.zeros((128, 256), jnp.float32)
    dtypes = {}
    for save in ("fp8", "input"):
        st = layers._Static(save, np.dtype(jnp.bfloat16), np.dtype(jnp.float32))
        res = jax.eval_shape(lambda a, b, st=st: layers._dense_forward(st, a, b)[1], x, w)
        dtypes[save] = [(np.dtype(r.dtype).name, r.shape) for r in res]
    assert dtypes["fp8"] == [("float8_e4m3fn", (256, 48)), ("float32", (256, 1)),
                             ("float8_e4m3fn", (256, 128)), ("float32", (2, 1))]
    assert dtypes["input"] == [("bfloat16", (48, 256)), ("float32", (128, 256))]


def test_dense_jit_scan_over_two_layers_and_checkpoint(planner):
    """Two square layers in lax.scan (weights stacked), jitted: gradients bit for bit those of the unrolled layers
    and of the NumPy recipe chained by hand; the same under jax.checkpoint of the layer."""
    x, _, c = _data(50, 256, 256, seed=2)
    rng = np.random.default_rng(3)
    ws = (rng.standard_normal((2, 256, 256)) / 16).astype(np.float32)

    def stack(h, w_all, layer):
        return jax.lax.scan(lambda h, w: (layer(h, w), None), h, w_all)[0]

    def unrolled(h, w_all):
        for i in range(2):
            h = cj.fp8_linear(h, w_all[i])
        return h

    args = (jnp.asarray(x, jnp.bfloat16), jnp.asarray(ws), jnp.asarray(c))
    scan_g = jax.jit(jax.grad(_loss(lambda h, w: stack(h, w, cj.fp8_linear)), argnums=(0, 1)))(*args)
    ckpt_g = jax.jit(jax.grad(_loss(lambda h, w: stack(h, w, jax.checkpoint(cj.fp8_linear))), argnums=(0, 1)))(*args)
    unr_g = jax.grad(_loss(unrolled), argnums=(0, 1))(*args)
    for a, b, d in zip(scan_g, ckpt_g, unr_g):
        _same(a, d)
        _same(b, d)
    # the recipe, by hand: forward through both layers, then back
    x0 = _f64(args[0]).astype(np.float32)
    h1 = _f64(recipe_dense(x0, ws[0], np.zeros((50, 256), np.float32))[0]).astype(np.float32)
    dy = _f64(_bf16(c)).astype(np.float32)
    _, dh1, dw1 = recipe_dense(h1, ws[1], dy)
    _, dx, dw0 = recipe_dense(x0, ws[0], _f64(dh1).astype(np.float32))
    _same(scan_g[0], dx)
    _same(scan_g[1], np.stack([dw0, dw1]))


def test_dense_vmap(planner):
    """vmap over x with shared weights (per-example gradients) and over both (per-element weights): each element
    as its own call."""
    x, w, c = _data(3 * 24, 128, 256, seed=4)
    xs, cs = jnp.asarray(x, jnp.bfloat16).reshape(3, 24, 256), jnp.asarray(c).reshape(3, 24, 128)
    loss = _loss(cj.fp8_linear)
    g = jax.grad(loss, argnums=(0, 1))
    per_x = jax.jit(jax.vmap(g, in_axes=(0, None, 0)))(xs, jnp.asarray(w), cs)
    w3 = jnp.asarray(np.stack([w, w[::-1], 2 * w]))
    per_w = jax.vmap(g)(xs, w3, cs)
    for i in range(3):
        one = g(xs[i], jnp.asarray(w), cs[i])
        _same(per_x[0][i], one[0])
        _same(per_x[1][i], one[1])
        one = g(xs[i], w3[i], cs[i])
        _same(per_w[0][i], one[0])
        _same(per_w[1][i], one[1])
    _same(jax.vmap(cj.fp8_linear, in_axes=(0, None))(xs, jnp.asarray(w)), cj.fp8_linear(xs, jnp.asarray(w)))


def test_an_adam_step_on_a_pytree_lowers_the_loss(planner):
    """A hand-written Adam step (what optax.adam does) on a two-layer MLP's parameter pytree, jitted: the FP8
    gradients train it (the loss falls), and they are close to the float32 gradients of the same model."""
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((64, 128)), jnp.bfloat16)
    target = jnp.asarray(np.tanh(rng.standard_normal((64, 128))), jnp.float32)
    params = {"up": jnp.asarray(rng.standard_normal((256, 128)) / 11, jnp.float32),
              "down": jnp.asarray(rng.standard_normal((128, 256)) / 16, jnp.float32)}

    def model(p, x, dense):
        h = jax.nn.relu(dense(x, p["up"]).astype(jnp.float32)).astype(jnp.bfloat16)
        return dense(h, p["down"]).astype(jnp.float32)

    def loss(p, dense=cj.fp8_linear):
        return jnp.mean((model(p, x, dense) - target) ** 2)

    f32 = lambda a, b: jnp.dot(a.astype(jnp.float32), b.T)  # noqa: E731
    g8, g32 = jax.grad(loss)(params), jax.grad(lambda p: loss(p, f32))(params)
    for name in params:
        assert ref.calc_diff(_f64(g8[name]), _f64(g32[name])) < 2e-2, name  # two FP8 layers, relu between

    @jax.jit
    def step(p, m, v, t):
        value, g = jax.value_and_grad(loss)(p)
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
        p = jax.tree.map(lambda p, m, v: p - 1e-2 * (m / (1 - 0.9 ** t)) / (jnp.sqrt(v / (1 - 0.999 ** t)) + 1e-8),
                         p, m, v)
        return p, m, v, value

    m = v = jax.tree.map(jnp.zeros_like, params)
    losses = []
    for t in range(1, 21):
        params, m, v, value = step(params, m, v, t)
        losses.append(float(value))
    assert losses[-1] < 0.7 * losses[0], losses


# --- grouped ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [128, 144])  # one stacked weight cast / one cast per expert
@pytest.mark.parametrize("save", ["fp8", "input"])
def test_grouped_matches_the_recipe_and_the_float64_math(planner, n, save):
    k, sizes = 256, np.array([128, 0, 256], np.int32)
    x, w, c = _data(389, n, k, g=3, seed=6)  # 384 rows in groups, 5 padding rows; 389 is padded to 400 inside
    x[384:] = 0  # padding rows are zeros, as a router's dispatch leaves them
    xj, wj = jnp.asarray(x, jnp.bfloat16), jnp.asarray(w)
    x = _f64(xj).astype(np.float32)
    layer = jax.jit(lambda a, b, s: cj.fp8_grouped_linear(a, b, s, save=save))
    y = layer(xj, wj, jnp.asarray(sizes))
    grad = jax.jit(jax.grad(_loss(lambda a, b, s: cj.fp8_grouped_linear(a, b, s, save=save)), argnums=(0, 1)))
    dx, dw = grad(xj, wj, jnp.asarray(c), jnp.asarray(sizes))
    assert y.shape == (389, n) and dx.dtype == jnp.bfloat16 and dw.dtype == jnp.float32 and dw.shape == w.shape
    dy = _f64(_bf16(c)).astype(np.float32)
    ry, rdx, rdw, ok = recipe_grouped(x, w, sizes, dy)
    _same(y, ry)
    _same(dx, rdx)
    _same(dw, rdw)
    assert not np.asarray(y)[~ok].astype(np.float32).any() and not np.asarray(dx)[~ok].astype(np.float32).any()
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for i in range(3):
        rows = slice(starts[i], starts[i + 1])
        x64, dy64, w64 = _f64(x[rows]), _f64(dy[rows]), _f64(w[i])
        if sizes[i]:
            assert ref.calc_diff(_f64(y[rows]), x64 @ w64.T) < 2e-3
            assert ref.calc_diff(_f64(dx[rows]), dy64 @ w64) < 2e-3
            assert ref.calc_diff(_f64(dw[i]), dy64.T @ x64) < 2e-3
        else:
            assert not np.asarray(dw[i]).any()  # an expert without tokens gets no gradient
    names = sorted({p.kind.name for p in planner.plans})
    assert names == ["contiguous", "k_grouped_wgrad_columns"]


def test_grouped_sizes_are_traced(planner):
    """group_sizes is an operand of the jitted step: new sizes run the same program (one trace, no new plans)."""
    x, w, c = _data(256, 128, 128, g=2, seed=7)
    xj, wj, cj_ = jnp.asarray(x, jnp.bfloat16), jnp.asarray(w), jnp.asarray(c)
    grad = jax.jit(jax.grad(_loss(cj.fp8_grouped_linear), argnums=(0, 1)))
    planned = []
    for sizes in ([128, 128], [256, 0], [0, 128]):
        sizes = np.asarray(sizes, np.int32)
        dx, dw = grad(xj, wj, cj_, jnp.asarray(sizes))
        _, rdx, rdw, _ = recipe_grouped(_f64(xj).astype(np.float32), w, sizes, _f64(_bf16(c)).astype(np.float32))
        _same(dx, rdx)
        _same(dw, rdw)
        planned.append(len(planner.plans))
    assert planned[0] >= 2 and planned == planned[:1] * 3  # planned at the first trace only


def test_grouped_scan_checkpoint_vmap(planner):
    """Two MoE layers (square experts) in a jitted scan, with and without jax.checkpoint, against the unrolled
    layers; vmap over x and the loss weights with shared experts and sizes, against separate calls."""
    sizes = jnp.asarray([128, 128], jnp.int32)
    x, _, c = _data(261, 128, 128, seed=8)
    x[256:] = 0
    ws = jnp.asarray((np.random.default_rng(9).standard_normal((2, 2, 128, 128)) / 11).astype(np.float32))
    layer = lambda h, w: cj.fp8_grouped_linear(h, w, sizes)  # noqa: E731

    def stack(h, w_all, f):
        return jax.lax.scan(lambda h, w: (f(h, w), None), h, w_all)[0]

    args = (jnp.asarray(x, jnp.bfloat16), ws, jnp.asarray(c))
    scan_g = jax.jit(jax.grad(_loss(lambda h, w: stack(h, w, layer)), argnums=(0, 1)))(*args)
    ckpt_g = jax.jit(jax.grad(_loss(lambda h, w: stack(h, w, jax.checkpoint(layer))), argnums=(0, 1)))(*args)
    unr_g = jax.grad(_loss(lambda h, w: layer(layer(h, w[0]), w[1])), argnums=(0, 1))(*args)
    for a, b, d in zip(scan_g, ckpt_g, unr_g):
        _same(a, d)
        _same(b, d)
    assert np.asarray(unr_g[1]).any()

    xs = jnp.stack([args[0], args[0][::-1]])
    cs = jnp.stack([args[2], 2 * args[2]])
    g = jax.grad(_loss(layer), argnums=(0, 1))
    per = jax.vmap(g, in_axes=(0, None, 0))(xs, ws[0], cs)
    for i in range(2):
        one = g(xs[i], ws[0], cs[i])
        _same(per[0][i], one[0])
        _same(per[1][i], one[1])


# --- tracing and bad input --------------------------------------------------------------------------------------

def test_make_jaxpr_of_the_gradients_launches_nothing(planner):
    """Tracing the backward of both layers needs no device: the plans are made on the host (the CPU test backend)
    and nothing runs."""
    x, w = jnp.zeros((37, 256), jnp.bfloat16), jnp.zeros((128, 256), jnp.float32)
    jd = jax.make_jaxpr(jax.grad(_loss(cj.fp8_linear), argnums=(0, 1)))(x, w, jnp.zeros((37, 128)))
    wg = jnp.zeros((2, 128, 256), jnp.float32)
    jg = jax.make_jaxpr(jax.grad(_loss(cj.fp8_grouped_linear), argnums=(0, 1)))(
        x, wg, jnp.zeros((37, 128)), jnp.zeros(2, jnp.int32))
    # the three GEMMs of the step, on 37 tokens padded to 48: forward y, dgrad dx, wgrad dW
    for jaxpr, dw in ((jd, "f32[128,256]"), (jg, "f32[2,128,256]")):
        calls = [line.split("=")[0].split(":")[-1].strip() for line in str(jaxpr).splitlines() if "ffi_call[" in line]
        assert calls == ["bf16[48,128]", "bf16[48,256]", dw]
    assert planner.launches() == 0
    assert sorted({p.kind.name for p in planner.plans}) == ["contiguous", "k_grouped_wgrad_columns", "normal",
                                                           "wgrad_store"]


def test_make_jaxpr_with_the_default_backend_needs_no_gpu():
    """With the real (CUDA) backend and no GPU in JAX, the layers' gradients still trace: each GEMM gets a trace-only
    plan (no kernel is compiled or loaded); running the program is what needs the GPU."""
    from cupygemm.jax import backend

    try:
        jax.devices("gpu")
        pytest.skip("JAX has a GPU here: the plans are real ones (tests/test_layers_jax_gpu.py)")
    except RuntimeError:
        pass
    assert backend.current() is backend.CUDA
    x, w = jnp.zeros((37, 256), jnp.bfloat16), jnp.zeros((128, 256), jnp.float32)
    jd = jax.make_jaxpr(jax.grad(_loss(cj.fp8_linear), argnums=(0, 1)))(x, w, jnp.zeros((37, 128)))
    jg = jax.make_jaxpr(jax.grad(_loss(cj.fp8_grouped_linear), argnums=(0, 1)))(
        x, jnp.zeros((2, 128, 256), jnp.float32), jnp.zeros((37, 128)), jnp.zeros(2, jnp.int32))
    for jaxpr, dw in ((jd, "f32[128,256]"), (jg, "f32[2,128,256]")):
        results = [line.split("=")[0].split(":")[-1].strip() for line in str(jaxpr).splitlines()
                   if "ffi_call[" in line]
        # the three GEMMs (forward y, dgrad dx, wgrad dW; 37 tokens padded to 48) among the casts' calls
        assert [r for r in results if r.startswith("bf16") or r == dw] == ["bf16[48,128]", "bf16[48,256]", dw]
    assert backend.CUDA.entries, "no GEMM was planned"
    with pytest.raises(backend.CupygemmDeviceError, match="needs JAX with a CUDA GPU backend"):
        backend.TraceOnlyPlan("no GPU").launch(0)


def test_bad_input_is_refused_at_trace_time(planner):
    x, w = jnp.zeros((16, 256), jnp.bfloat16), jnp.zeros((128, 256), jnp.float32)
    with pytest.raises(ValueError, match="save: expected one of"):
        cj.fp8_linear(x, w, save="bf16")
    with pytest.raises(TypeError, match="x: expected dtype bfloat16 or float16 or float32, got int32"):
        cj.fp8_linear(x.astype(jnp.int32), w)
    with pytest.raises(TypeError, match="w: expected dtype bfloat16 or float32, got float16"):
        cj.fp8_linear(x, w.astype(jnp.float16))
    with pytest.raises(ValueError, match=r"x: expected \[..., K\] with K = 256"):
        cj.fp8_linear(x[:, :128], w)
    with pytest.raises(ValueError, match="N \\(output features\\) must be a positive multiple of 16.*got 120"):
        cj.fp8_linear(x, w[:120])
    with pytest.raises(ValueError, match="K \\(input features\\) must be a positive multiple of 16.*got 200"):
        cj.fp8_linear(x[:, :200], w[:, :200])
    with pytest.raises(ValueError, match="w: expected a 2-D"):
        cj.fp8_linear(x, w[None])
    wg = jnp.zeros((2, 128, 256), jnp.float32)
    with pytest.raises(TypeError, match=r"group_sizes: expected an int32 array of shape \(2,\).*got float32 \(2,\)"):
        cj.fp8_grouped_linear(x, wg, jnp.zeros(2, jnp.float32))
    with pytest.raises(TypeError, match=r"group_sizes: expected an int32 array of shape \(2,\).*got int32 \(3,\)"):
        cj.fp8_grouped_linear(x, wg, jnp.zeros(3, jnp.int32))
    with pytest.raises(ValueError, match="w: expected a 3-D"):
        cj.fp8_grouped_linear(x, w, jnp.zeros(2, jnp.int32))
    assert planner.plans == []  # nothing was planned for a bad call


def test_m_indices_from_sizes():
    idx = layers.m_indices_from_sizes(jnp.asarray([128, 0, 256, 0], jnp.int32), 400)
    want = np.concatenate([np.zeros(128), np.full(256, 2), np.full(16, -1)]).astype(np.int32)
    np.testing.assert_array_equal(np.asarray(idx), want)


def test_no_tokens(planner):
    w = jnp.ones((128, 256), jnp.float32)
    y = cj.fp8_linear(jnp.zeros((0, 256), jnp.bfloat16), w)
    assert y.shape == (0, 128)
    dw = jax.grad(lambda w: cj.fp8_linear(jnp.zeros((2, 0, 256)), w).astype(jnp.float32).sum())(w)
    assert dw.shape == w.shape and not np.asarray(dw).any()
    assert planner.plans == []


def test_casts_under_vmap_are_bit_exact():
    """The layers' casts run batched under vmap: the scales must still be IEEE amax / 448 (a divisor XLA sees as a
    broadcast constant becomes a multiplication by its reciprocal, off by one ulp in about half the scales)."""
    from cupygemm.jax import casts

    x = jnp.asarray(np.random.default_rng(10).standard_normal((3, 24, 256)), jnp.float32)
    for f, r in ((casts.per_token_cast_to_fp8, ref.per_token_cast_to_fp8_reference),
                 (casts.per_block_cast_to_fp8, ref.per_block_cast_to_fp8_reference)):
        q, s = jax.jit(jax.vmap(f))(x)
        for i in range(3):
            rq, rs = r(np.asarray(x[i]))
            np.testing.assert_array_equal(np.asarray(q[i]).view(np.uint8), rq.view(np.uint8))
            np.testing.assert_array_equal(np.asarray(s[i]), rs)
