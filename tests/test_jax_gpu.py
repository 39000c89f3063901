"""cupygemm.jax on the GPU: eager, jit, scan, vmap, shard_map, traced masked_m / m_indices, XLA command buffers (in
a subprocess with XLA_FLAGS), trace-time validation, errors from inside the handler, no derivative, and the FP8
casts bit-exact with the reference. Results are compared bit for bit with the CuPy path
(same shapes: same plan, same kernel) or, where the kernel config may differ (vmap folding), by calc_diff."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

# CuPy shares the GPU with JAX here: keep JAX from taking 75 % of the memory up front (before its backend starts).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

jax = pytest.importorskip("jax")
cp = pytest.importorskip("cupy")
try:
    jax.devices("gpu")
except RuntimeError as _e:  # a CPU-only jaxlib
    pytest.skip(f"JAX has no GPU backend ({_e})", allow_module_level=True)

import jax.numpy as jnp  # noqa: E402

import cupygemm  # noqa: E402
import cupygemm.jax as cj  # noqa: E402
from cupygemm import reference as ref  # noqa: E402

F8 = ml_dtypes.float8_e4m3fn


def _quantized(m, n, k, seed=0, g=None):
    """Host-quantized operands (NumPy): a, sfa, b, sfb; grouped B when g is given."""
    rng = np.random.default_rng(seed)
    a, sfa = ref.per_token_cast_to_fp8_reference(rng.standard_normal((m, k)).astype(np.float32))
    if g is None:
        b, sfb = ref.per_block_cast_to_fp8_reference(rng.standard_normal((n, k)).astype(np.float32))
    else:
        ws = [ref.per_block_cast_to_fp8_reference(rng.standard_normal((n, k)).astype(np.float32)) for _ in range(g)]
        b, sfb = np.stack([w[0] for w in ws]), np.stack([w[1] for w in ws])
    return a, sfa, b, sfb


def _jx(*arrs):
    """Device copies of host arrays, ready. XLA makes them asynchronously (its TFRT GPU client allocates the pinned
    staging buffer and the device buffer on a thread pool), so a test that ends before using them (errors at trace
    time) would leave that work running into the next test of the process."""
    return jax.block_until_ready([jnp.asarray(x.view(F8)) if x.dtype == np.uint8 else jnp.asarray(x) for x in arrs])


def _bits(x) -> np.ndarray:
    return np.asarray(x).view(np.uint16) if not isinstance(x, cp.ndarray) else x.view(cp.uint16).get()


@pytest.mark.parametrize("m, n, k", [(64, 2112, 7168), (128, 7168, 2048), (256, 512, 1024), (72, 136, 576),
                                     (4096, 2112, 7168)])
def test_dense_bitwise_equal_to_cupy(m, n, k):
    a, sfa, b, sfb = _quantized(m, n, k)
    want = cupygemm.gemm_fp8_fp8_bf16_nt((cp.asarray(a), cp.asarray(sfa)), (cp.asarray(b), cp.asarray(sfb)))
    d = cj.gemm_fp8_fp8_bf16_nt(*_jx(a, sfa, b, sfb))
    assert d.shape == (m, n) and d.dtype == jnp.bfloat16
    np.testing.assert_array_equal(_bits(d), _bits(want))
    d2 = jax.jit(cj.gemm_fp8_fp8_bf16_nt)(*_jx(a, sfa, b, sfb))
    np.testing.assert_array_equal(_bits(d2), _bits(want))


def test_scan_of_gemms():
    steps, m, n, k = 10, 64, 2112, 7168
    rng = np.random.default_rng(1)
    q = [ref.per_token_cast_to_fp8_reference(rng.standard_normal((m, k)).astype(np.float32)) for _ in range(steps)]
    _, _, b, sfb = _quantized(8, n, k, seed=2)
    A, SA = np.stack([x[0] for x in q]), np.stack([x[1] for x in q])

    @jax.jit
    def run(A, SA, b, sfb):
        return jax.lax.scan(lambda c, xs: (c, cj.gemm_fp8_fp8_bf16_nt(xs[0], xs[1], b, sfb)), 0, (A, SA))[1]
    ds = run(*_jx(A, SA, b, sfb))
    for i in range(steps):
        want = cupygemm.gemm_fp8_fp8_bf16_nt((cp.asarray(A[i]), cp.asarray(SA[i])), (cp.asarray(b), cp.asarray(sfb)))
        np.testing.assert_array_equal(_bits(ds[i]), _bits(want))


def test_fori_loop_chain():
    """Each step's output feeds the next step's (re-quantized) input: the handler sees new data every step."""
    m, n = 64, 1024
    _, _, b, sfb = _quantized(8, n, n, seed=3)
    x0 = jnp.asarray(np.random.default_rng(4).standard_normal((m, n)).astype(np.float32))
    jb, jsfb = _jx(b, sfb)

    def step(_, x):
        a, sa = cj.per_token_cast_to_fp8(x)
        y = cj.gemm_fp8_fp8_bf16_nt(a, sa, jb, jsfb).astype(jnp.float32)
        return y / jnp.max(jnp.abs(y))
    got = jax.jit(lambda x: jax.lax.fori_loop(0, 5, step, x))(x0)
    x = x0
    for i in range(5):
        x = step(i, x)  # eager: same kernels, same results
    np.testing.assert_array_equal(np.asarray(got), np.asarray(x))


def test_vmap_dense():
    v, m, n, k = 3, 64, 1024, 2048
    ops = [_quantized(m, n, k, seed=10 + i) for i in range(v)]
    A, SA, B, SB = (np.stack([o[i] for o in ops]) for i in range(4))
    shared = jax.vmap(cj.gemm_fp8_fp8_bf16_nt, in_axes=(0, 0, None, None))(*_jx(A, SA, B[0], SB[0]))
    per = jax.jit(jax.vmap(cj.gemm_fp8_fp8_bf16_nt))(*_jx(A, SA, B, SB))
    for i in range(v):
        for got, bi in ((shared[i], 0), (per[i], i)):
            want = cupygemm.gemm_fp8_fp8_bf16_nt((cp.asarray(A[i]), cp.asarray(SA[i])),
                                                 (cp.asarray(B[bi]), cp.asarray(SB[bi])))
            assert cupygemm.calc_diff(cp.asarray(np.asarray(got)), want) < 1e-6


def test_masked_traced_masked_m_changes_between_calls():
    g, max_m, n, k = 4, 128, 7168, 2048
    rng = np.random.default_rng(5)
    q = [ref.per_token_cast_to_fp8_reference(rng.standard_normal((max_m, k)).astype(np.float32)) for _ in range(g)]
    A, SA = np.stack([x[0] for x in q]), np.stack([x[1] for x in q])
    _, _, B, SB = _quantized(8, n, k, seed=6, g=g)
    ja, jsa, jb, jsb = _jx(A, SA, B, SB)
    f = jax.jit(lambda mm, out: cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(ja, jsa, jb, jsb, mm, 64, out=out))
    filler = jnp.full((g, max_m, n), 3.0, jnp.bfloat16)
    for mm in ([64, 0, 128, 17], [1, 100, 64, 64], [128, 128, 128, 128]):
        got = np.asarray(f(jnp.asarray(mm, jnp.int32), filler))
        want = cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked(
            (cp.asarray(A), cp.asarray(SA)), (cp.asarray(B), cp.asarray(SB)), None, cp.asarray(mm, cp.int32), 64)
        want = want.view(cp.uint16).get()
        for i, r in enumerate(mm):
            np.testing.assert_array_equal(got[i, :r].view(np.uint16), want[i, :r])
            assert (got[i, r:].astype(np.float32) == 3.0).all()
    default = np.asarray(cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(ja, jsa, jb, jsb, jnp.asarray([0, 1, 2, 3], jnp.int32), 64))
    assert (default[0].astype(np.float32) == 0).all()


def test_contiguous_traced_m_indices():
    n, k, g = 4096, 7168, 3
    a, sfa, _, _ = _quantized(512, 8, k, seed=7)
    _, _, b, sfb = _quantized(8, n, k, seed=8, g=g)
    f = jax.jit(cj.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous)
    layouts = [np.repeat([0, 1, 2, -1], 128), np.concatenate([np.full(256, 2), np.full(200, 0), np.full(56, -1)])]
    for idx in layouts:
        idx = idx.astype(np.int32)
        got = np.asarray(f(*_jx(a, sfa, b, sfb), jnp.asarray(idx))).view(np.uint16)
        want = cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(
            (cp.asarray(a), cp.asarray(sfa)), (cp.asarray(b), cp.asarray(sfb)), None, cp.asarray(idx))
        ok = idx >= 0
        np.testing.assert_array_equal(got[ok], want.view(cp.uint16).get()[ok])
        assert (got[~ok] == 0).all()


def test_bad_shapes_raise_at_trace_time():
    a, sfa, b, sfb = _jx(*_quantized(64, 256, 512))
    with pytest.raises(ValueError, match=r"sfb: expected shape \(2, 4\)"):
        jax.jit(cj.gemm_fp8_fp8_bf16_nt)(a, sfa, b, sfb[:, :3])
    with pytest.raises(ValueError, match="K must be a multiple of 16"):
        cj.gemm_fp8_fp8_bf16_nt(a[:, :504], sfa, b[:, :504], sfb)


def test_error_inside_the_handler_reaches_the_user():
    class Refusing:
        sfa_m_pad, scratch_floats, scratch_counters = 64, 0, 0

        def launch(self, *args, **kwargs):
            raise ValueError("test hook: launch refused")

    a, sfa, b, sfb = _jx(*_quantized(64, 256, 512))
    with cj._use_backend("CUDA", lambda *args: {0: Refusing()}, use_stream=True):
        with pytest.raises(Exception, match="INVALID_ARGUMENT: cupygemm .*test hook: launch refused"):
            jax.block_until_ready(cj.gemm_fp8_fp8_bf16_nt(a, sfa, b, sfb))
    # the handler keeps working afterwards (waited for: nothing of this test runs on into the next one)
    assert jax.block_until_ready(cj.gemm_fp8_fp8_bf16_nt(a, sfa, b, sfb)).shape == (64, 256)


def test_grad_is_a_clear_error():
    a, sfa, b, sfb = _jx(*_quantized(64, 256, 512))
    with pytest.raises(TypeError, match="has no derivative"):
        jax.grad(lambda s: cj.gemm_fp8_fp8_bf16_nt(a, s, b, sfb).astype(jnp.float32).sum())(sfa)


def test_shard_map_over_the_local_gpus():
    """A cast and a GEMM inside jax.shard_map over the local GPUs (rows sharded, weights replicated; issue 47):
    each device's calls on its shard are bit for bit the unsharded calls on those rows (same shapes, same plan)."""
    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:
        pytest.skip(f"JAX {jax.__version__} has no jax.shard_map")
    gpus = jax.devices("gpu")
    mesh = jax.sharding.Mesh(np.array(gpus), ("x",))
    spec = jax.sharding.PartitionSpec("x")
    rows, n, k = 128, 512, 1024
    x = np.random.default_rng(12).standard_normal((rows * len(gpus), k)).astype(np.float32)
    _, _, b, sfb = _quantized(8, n, k, seed=13)
    jb, jsfb = _jx(b, sfb)

    def layer(x):
        a, sa = cj.per_token_cast_to_fp8(x)
        return cj.gemm_fp8_fp8_bf16_nt(a, sa, jb, jsfb)

    got = jax.jit(shard_map(layer, mesh=mesh, in_specs=spec, out_specs=spec))(jnp.asarray(x))
    assert got.shape == (rows * len(gpus), n)
    for i in range(len(gpus)):
        want = layer(jnp.asarray(x[i * rows:(i + 1) * rows]))
        np.testing.assert_array_equal(_bits(got[i * rows:(i + 1) * rows]), _bits(want))


@pytest.mark.parametrize("shape", [(64, 7168), (300, 1000), (4096, 2112)])
def test_casts_bit_exact_on_gpu(shape):
    rng = np.random.default_rng(shape[0])
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-10, 10, shape))).astype(np.float32)
    x[0, :7] = 0
    for ours, theirs in ((cj.per_token_cast_to_fp8, ref.per_token_cast_to_fp8_reference),
                         (cj.per_block_cast_to_fp8, ref.per_block_cast_to_fp8_reference)):
        for xin in (x, x.astype(ml_dtypes.bfloat16)):
            q, s = ours(jnp.asarray(xin))
            rq, rs = theirs(xin)
            np.testing.assert_array_equal(np.asarray(q).view(np.uint8), rq)
            np.testing.assert_array_equal(np.asarray(s).view(np.uint32), rs.view(np.uint32))


_COMMAND_BUFFER_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    import numpy as np, jax, jax.numpy as jnp, ml_dtypes
    import cupygemm.jax as cj
    from cupygemm import reference as ref
    rng = np.random.default_rng(0)
    g, max_m, n, k = 4, 128, 1024, 2048
    q = [ref.per_token_cast_to_fp8_reference(rng.standard_normal((max_m, k)).astype(np.float32)) for _ in range(g)]
    w = [ref.per_block_cast_to_fp8_reference(rng.standard_normal((n, k)).astype(np.float32)) for _ in range(g)]
    F8 = ml_dtypes.float8_e4m3fn
    A = jnp.asarray(np.stack([x[0] for x in q]).view(F8)); SA = jnp.asarray(np.stack([x[1] for x in q]))
    B = jnp.asarray(np.stack([x[0] for x in w]).view(F8)); SB = jnp.asarray(np.stack([x[1] for x in w]))

    @jax.jit
    def f(mm, sa_steps):
        dense = cj.gemm_fp8_fp8_bf16_nt(A[0], SA[0], B[0], SB[0])
        masked = cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(A, SA, B, SB, mm, 64)
        # The GEMM's result is the loop carry (as a layer's activations are) and each step reads its own A scales
        # (a jit argument, so XLA cannot hoist the call as loop-invariant): buffers keep their addresses from step to
        # step and XLA replays the recorded graph. Stacking every step's result as the scan's ys, or slicing each
        # step's A out of a stacked array, measured a new recording on every step.
        last = jax.lax.scan(lambda c, sa: (cj.gemm_fp8_fp8_bf16_nt(A[1], sa, B[1], SB[1]), None),
                            jnp.zeros((max_m, n), jnp.bfloat16), sa_steps)[0]
        return dense, masked, last

    STEPS, CALLS = 100, 5
    sa_steps = jnp.asarray(np.broadcast_to(np.asarray(SA[1]), (STEPS,) + SA.shape[1:]).copy())
    outs = []
    for i in range(CALLS):
        mm = jnp.asarray([(i * 7 + j * 31) % (max_m + 1) for j in range(g)], jnp.int32)
        d, m_, s = f(mm, sa_steps)
        outs.append([np.asarray(x).view(np.uint16).tolist() for x in (d, m_, s)] + [np.asarray(mm).tolist()])
    h = cj._handlers["cuda"]
    digest = [hash(json.dumps(o)) for o in outs]
    print(json.dumps({"executes": h.executes, "handshakes": h.handshakes, "digest": digest}))
""")


def _run_script(flags: str | None) -> dict:
    import json

    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    if flags:
        env["XLA_FLAGS"] = flags
    env["PYTHONHASHSEED"] = "0"
    res = subprocess.run([sys.executable, "-c", _COMMAND_BUFFER_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_command_buffers_replay_the_handler():
    """With custom calls captured into XLA's CUDA graphs, the same 5 calls give the same bits and the Python handler
    runs far fewer times than the 5 x (1 + 1 + 100) launches: a lax.scan body whose GEMM result is the carry is
    recorded once and replayed for its 100 steps. Without command buffers it runs for every launch. (XLA's default
    flags capture some custom calls too: 508 of 510 here once the dense GEMM's split-K clusters need no scratch
    memset between the calls.)"""
    plain = _run_script("--xla_gpu_enable_command_buffer=")
    graphs = _run_script("--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1")
    assert plain["digest"] == graphs["digest"]
    assert plain["executes"] == 5 * 102
    assert graphs["executes"] < plain["executes"] // 4, graphs


# --- packed (L2-side-aware) weights -----------------------------------------------------------------------------

@pytest.fixture
def pack_on_any_hopper(monkeypatch):
    """Side-aware packing wherever two L2 sides are measured (auto leaves an H200's weights plain)."""
    monkeypatch.setenv("CUPYGEMM_L2_SIDES", "1")


def _packed_or_skip(b, sfb):
    p = cupygemm.pack_weights(b, sfb)
    if not p.side_aware:
        from cupygemm import l2

        pytest.skip(f"no L2 side info: {l2.unavailable_reason(cp.cuda.runtime.getDevice())}")
    return p


@pytest.mark.parametrize("m, n, k", [(64, 2112, 7168), (128, 7168, 2048)])
def test_packed_weights_in_jit_equal_cupy_packed(m, n, k, pack_on_any_hopper):
    """JAX B packed into an XLA buffer, passed to a jitted function (a pytree argument) and eagerly: bit for bit
    the CuPy call on CuPy-packed weights (same shapes: same side-aware plan and kernel)."""
    a, sfa, b, sfb = _quantized(m, n, k, seed=4)
    ja, jsfa, jb, jsfb = _jx(a, sfa, b, sfb)
    packed = _packed_or_skip(jb, jsfb)
    assert isinstance(packed.data, jax.Array) and packed.data.dtype == jnp.uint8
    want = cupygemm.gemm_fp8_fp8_bf16_nt((cp.asarray(a), cupygemm.get_col_major_tma_aligned_tensor(
        cp.asarray(sfa))), _packed_or_skip(cp.asarray(b), cp.asarray(sfb)))
    got = jax.jit(cj.gemm_fp8_fp8_bf16_nt)(ja, jsfa, packed)
    assert np.array_equal(_bits(got), _bits(want))
    eager = cupygemm.gemm_fp8_fp8_bf16_nt((ja, jsfa), packed)  # the public entry routes JAX to cupygemm.jax
    assert np.array_equal(_bits(eager), _bits(want))
    r = ref.gemm_reference(a, sfa, b, sfb)
    assert ref.calc_diff(np.asarray(got).astype(np.float64), r) < 1e-3


def test_packed_weights_masked_traced_in_scan(pack_on_any_hopper):
    g, max_m, n, k = 4, 64, 4096, 7168
    a, sfa, b, sfb = _quantized(g * max_m, n, k, seed=6, g=g)
    a3, sfa3 = a.reshape(g, max_m, k), sfa.reshape(g, max_m, -1)
    ja, jsfa, jb, jsfb = _jx(a3, sfa3, b, sfb)
    packed = _packed_or_skip(jb, jsfb)
    steps = jnp.asarray([[64, 0, 17, 5], [1, 64, 64, 0]], jnp.int32)

    @jax.jit
    def run(w, mms):
        return jax.lax.scan(lambda c, mm: (c, cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(ja, jsfa, w, None, mm, 32)),
                            0, mms)[1]
    got = np.asarray(run(packed, steps)).astype(np.float64)
    full = ref.grouped_masked_reference(a3, sfa3, b, sfb, np.full(g, max_m))
    for s, mm in enumerate(np.asarray(steps)):
        for gi, rows in enumerate(mm):
            if rows:
                assert ref.calc_diff(got[s, gi, :rows], full[gi, :rows]) < 1e-3
            assert (got[s, gi, rows:] == 0).all()
