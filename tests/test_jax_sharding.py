"""cupygemm.jax under plain ``jit`` over sharded arrays (partitioning rules, :mod:`cupygemm.jax.sharding`) and the
training kinds inside ``shard_map`` (issue 47), on a mesh of four CPU devices.

Each case runs in a subprocess (the device count is an XLA flag read when JAX starts its CPU backend). GEMM values
come from host plans (tests/test_xla_ffi.py's, and a weight-gradient one here) that compute each device's call
from its own buffers, so a wrong shard, a missing sum or a sum too many shows in the result. Each rule is checked
three ways: the values against the NumPy references, the result's sharding, and the compiled HLO's collectives
(no all-gather where the rule keeps the sharding; a K-sharded GEMM has exactly one all-reduce).
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from jax_host_devices import run_on_host_devices

pytest.importorskip("jax")

TESTS = Path(__file__).resolve().parent

_PRELUDE = textwrap.dedent("""
    import ctypes, re, sys
    sys.path.insert(0, {tests!r})
    import jax, jax.numpy as jnp, ml_dtypes, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    assert len(jax.devices()) == 4, jax.devices()
    import cupygemm.jax as cj
    from cupygemm import reference as ref
    from cupygemm.jax import backend
    from cupygemm.kinds import KINDS
    from test_xla_ffi import HostPlanner, _host, _masked_operands, _operands
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("x", "y"))
    line = Mesh(np.array(jax.devices()), ("d",))
    XY = ("x", "y")

    def put(x, *spec, mesh=mesh):
        return jax.device_put(x, NamedSharding(mesh, P(*spec)))

    def compiled(f, *args):
        return f.lower(*args).compile().as_text()

    def collectives(hlo):
        ops = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")
        return {{op: len(re.findall(r"= [^=]*? " + op + r"(?:-start)?\\(", hlo)) for op in ops}}

    def spec(x):
        s = tuple(x.sharding.spec)
        while s and s[-1] is None:
            s = s[:-1]
        return s

    def close(d, r, tol=1e-5):
        got = np.asarray(d).astype(np.float64)
        assert ref.calc_diff(got, r) < tol, ref.calc_diff(got, r)

    WGRAD = next(k for k in KINDS if k.name == "wgrad")
    KGROUPED = next(k for k in KINDS if k.name == "k_grouped_wgrad")

    class WgradPlan:
        '''The weight-gradient kernels' arithmetic on host buffers: out (+)= A @ B.T, scales M-major padded.'''
        def __init__(self, kind, m, n, k, g):
            self.kind, self.m, self.n, self.k, self.g = kind, m, n, k, g
            grouped = kind is KGROUPED
            self.sfa_m_pad = m if grouped else (m + 3) // 4 * 4
            self.sfb_m_pad = n if grouped else (n + 3) // 4 * 4
            self.scratch_floats = self.scratch_counters = 0

        def launch(self, stream, a, sfa, b, sfb, d, layout=0, partials=0, counters=0, zero_counters=False,
                   page_sides=None):
            m, n, k = self.m, self.n, self.k
            if self.kind is KGROUPED:
                sizes = _host(layout, np.int32, (self.g,)).copy()
                rows = sum(-(-int(s) // 128) for s in sizes)
                out = _host(d, np.float32, (self.g, m, n))
                out[:] = ref.k_grouped_wgrad_reference(
                    _host(a, np.uint8, (m * k,)), _host(sfa, np.float32, (rows, m)), _host(b, np.uint8, (n * k,)),
                    _host(sfb, np.float32, (rows, n)), out.copy(), sizes)
                return
            kb = -(-k // 128)
            out = _host(d, np.float32, (m, n))
            sa = _host(sfa, np.float32, (kb, self.sfa_m_pad))[:, :m].T
            sb = _host(sfb, np.float32, (kb, self.sfb_m_pad))[:, :n].T
            out[:] = ref.wgrad_reference(_host(a, np.uint8, (m, k)), sa, _host(b, np.uint8, (n, k)), sb, out.copy())

    class Planner(HostPlanner):
        def __call__(self, kind, m, n, k, g, expected_m, sides=False, scale_rows=0):
            if kind in (WGRAD, KGROUPED):
                return {{0: WgradPlan(kind, m, n, k, g)}}
            return super().__call__(kind, m, n, k, g, expected_m, sides)

    def token_operands(rows, k, seed):
        x = np.random.default_rng(seed).standard_normal((rows, k)).astype(np.float32)
        q, s = ref.per_token_cast_to_fp8_reference(x)
        return q.view(ml_dtypes.float8_e4m3fn), s
""")


def _run(body: str) -> None:
    run_on_host_devices(_PRELUDE.format(tests=str(TESTS)) + textwrap.dedent(body), 4)


def test_casts_keep_their_sharding_under_jit():
    """Rows sharded -> q and s rows sharded; columns sharded in 128-multiples -> q and s columns sharded; the
    transposed cast of T-sharded x -> q_t, s_t sharded along T; all bit-exact, without any collective. A per-block
    cast whose row shards are not multiples of 128 falls back to whole rows (an all-gather, same bits)."""
    _run("""
        rng = np.random.default_rng(0)
        x = (rng.standard_normal((512, 768)) * 5).astype(np.float32)
        tok, blk = ref.per_token_cast_to_fp8_reference(x), ref.per_block_cast_to_fp8_reference(x)
        tr = ref.per_token_cast_to_fp8_reference(np.ascontiguousarray(x.T))

        def exact(got, want):
            for g, w in zip(got, want):
                np.testing.assert_array_equal(np.asarray(g).view(w.dtype), w.view(w.dtype))

        cases = [
            (cj.per_token_cast_to_fp8, ("x", "y"), tok, [("x", "y"), ("x", "y")]),
            (cj.per_block_cast_to_fp8, ("x", "y"), blk, [("x", "y"), ("x", "y")]),
            (cj.per_token_cast_to_fp8, (("x", "y"),), tok, [(("x", "y"),), (("x", "y"),)]),
            (cj.per_token_cast_to_fp8_transposed, ("x", "y"), tr, [("y", "x"), ("y", "x")]),
        ]
        for f, in_spec, want, out_specs in cases:
            xs = put(x, *in_spec)
            jf = jax.jit(f)
            got = jf(xs)
            exact(got, want)
            assert [spec(g) for g in got] == out_specs, (f, in_spec, [spec(g) for g in got])
            assert not any(collectives(compiled(jf, xs)).values()), collectives(compiled(jf, xs))

        q, s, qt, st = jax.jit(cj.per_block_cast_to_fp8_with_transpose)(put(x, "x", "y"))
        exact((q, s, qt, st), (*blk, np.ascontiguousarray(blk[0].T), np.ascontiguousarray(blk[1].T)))
        assert [spec(v) for v in (q, s, qt, st)] == [("x", "y"), ("x", "y"), ("y", "x"), ("y", "x")]

        # 320 rows over 4 devices: 80-row shards cut 128-row blocks. The per-token cast keeps them, the per-block
        # cast's scales and the transposed cast (T = 320) gather the rows.
        y = x[:320]
        ys = put(y, ("x", "y"))
        q, s = jax.jit(cj.per_token_cast_to_fp8)(ys)
        exact((q, s), ref.per_token_cast_to_fp8_reference(y))
        assert spec(s) == (("x", "y"),)
        jf = jax.jit(cj.per_block_cast_to_fp8)
        q, s = jf(ys)
        exact((q, s), ref.per_block_cast_to_fp8_reference(y))
        assert spec(s) == () and collectives(compiled(jf, ys))["all-gather"] >= 1
        exact(jax.jit(cj.per_token_cast_to_fp8_transposed)(ys),
              ref.per_token_cast_to_fp8_reference(np.ascontiguousarray(y.T)))
    """)


def test_dense_gemm_rules_under_jit():
    """M-sharded A -> M-sharded D; N-sharded B (N/shards a multiple of 128) -> N-sharded D; both at once on a 2-D
    mesh; K sharded on A, B and their scales -> one all-reduce and a replicated D; N shards that cut a 128-row SFB
    block fall back to whole B. Values equal the reference; no all-gather where none is needed."""
    _run("""
        with backend.use_backend("cpu", Planner(floats=64, counters=4)):
            a, sfa, b, sfb = _operands(512, 512, 1024)
            r = ref.gemm_reference(a.view(np.uint8), sfa, b.view(np.uint8), sfb)
            gemm = jax.jit(cj.gemm_fp8_fp8_bf16_nt)
            cases = [  # (a, sfa, b, sfb specs), D's spec, all-gathers, all-reduces
                ([(XY,), (XY,), (), ()], (XY,), 0, 0),
                ([(), (), (XY,), (XY,)], (None, XY), 0, 0),
                ([("x",), ("x",), ("y",), ("y",)], ("x", "y"), 0, 0),
                ([(None, "x")] * 4, (), 0, 1),
                ([("y", "x"), ("y", "x"), (None, "x"), (None, "x")], ("y",), 0, 1),
            ]
            for specs, want, gathers, reduces in cases:
                args = [put(v, *s) for v, s in zip((a, sfa, b, sfb), specs)]
                d = gemm(*args)
                close(d, r)
                assert spec(d) == want, (specs, spec(d))
                c = collectives(compiled(gemm, *args))
                assert c["all-gather"] == gathers and c["all-reduce"] == reduces, (specs, c)

            # N = 384 over 4 devices: 96-row shards cut SFB's 128-row blocks -> B gathered, D by whole columns.
            a2, sfa2, b2, sfb2 = _operands(256, 384, 256, seed=1)
            args = [put(a2, ("x", "y")), put(sfa2, ("x", "y")), put(b2, ("x", "y")), put(sfb2)]
            d = gemm(*args)
            close(d, ref.gemm_reference(a2.view(np.uint8), sfa2, b2.view(np.uint8), sfb2))
            assert spec(d) == (("x", "y"),)

            # A K-sharded step of a row-parallel layer: the sum is float32, rounded to BF16 once more.
            k_split = jax.jit(cj.gemm_fp8_fp8_bf16_nt)(*(put(v, None, ("x", "y")) for v in (a, sfa, b, sfb)))
            close(k_split, r, 1e-4)
    """)


def test_casts_then_gemm_under_jit_keep_activations_sharded():
    """A layer under jit: cast M-sharded activations, GEMM with replicated weights: no collective at all, and the
    result equals the reference on the reference cast."""
    _run("""
        rng = np.random.default_rng(3)
        x = rng.standard_normal((512, 256)).astype(np.float32)
        _, _, b, sfb = _operands(8, 256, 256)
        with backend.use_backend("cpu", Planner(floats=64, counters=4)):
            f = jax.jit(lambda x, b, sfb: cj.gemm_fp8_fp8_bf16_nt(*cj.per_token_cast_to_fp8(x), b, sfb))
            args = (put(x, ("x", "y")), put(b), put(sfb))
            d = f(*args)
            aq, asf = ref.per_token_cast_to_fp8_reference(x)
            close(d, ref.gemm_reference(aq, asf, b.view(np.uint8), sfb))
            assert spec(d) == (("x", "y"),)
            assert not any(collectives(compiled(f, *args)).values())
    """)


def test_grouped_gemm_rules_under_jit():
    """Masked: groups sharded on every operand -> groups of D sharded; contiguous: rows (A, SFA, m_indices, out)
    sharded with replicated weights -> rows of D sharded, skipped rows keep out. No all-gather of activations."""
    _run("""
        with backend.use_backend("cpu", Planner(floats=64, counters=4)):
            ga, gsa, gb, gsb = _masked_operands(4, 64, 256, 256)
            mm = np.asarray([64, 0, 17, 33], np.int32)
            masked = jax.jit(lambda *ops: cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(*ops, 32))
            args = [put(v, ("x", "y")) for v in (ga, gsa, gb, gsb, mm)]
            d = masked(*args)
            assert spec(d) == (("x", "y"),)
            assert collectives(compiled(masked, *args))["all-gather"] == 0
            full = ref.grouped_masked_reference(ga.view(np.uint8), gsa, gb.view(np.uint8), gsb, np.full(4, 64))
            d = np.asarray(d).astype(np.float64)
            for g, rows in enumerate(mm):
                assert (rows == 0 or ref.calc_diff(d[g, :rows], full[g, :rows]) < 1e-5) and (d[g, rows:] == 0).all()

            a, sfa, _, _ = _operands(512, 256, 256)
            idx = np.concatenate([np.full(256, 2), np.full(128, 0), np.full(100, 3), np.full(28, -1)]).astype(np.int32)
            out = np.full((512, 256), 7.0, ml_dtypes.bfloat16)
            contiguous = jax.jit(cj.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous)
            args = [put(a, ("x", "y")), put(sfa, ("x", "y")), put(gb), put(gsb), put(idx, ("x", "y")),
                    put(out, ("x", "y"))]
            d = contiguous(*args)
            assert spec(d) == (("x", "y"),)
            assert collectives(compiled(contiguous, *args))["all-gather"] == 0
            rc = ref.grouped_contiguous_reference(a.view(np.uint8), sfa, gb.view(np.uint8), gsb, idx)
            d, ok = np.asarray(d).astype(np.float64), idx >= 0
            assert ref.calc_diff(d[ok], rc[ok]) < 1e-5 and (d[~ok] == 7.0).all()
    """)


def test_wgrad_rules_under_jit():
    """wgrad: M-sharded and N-sharded operands give sharded out without collectives; K (tokens) sharded gives one
    all-reduce and out + the whole product (out counted once)."""
    _run("""
        with backend.use_backend("cpu", Planner()):
            a, sfa = token_operands(256, 512, 0)
            b, sfb = token_operands(128, 512, 1)
            c = np.random.default_rng(2).standard_normal((256, 128)).astype(np.float32)
            r = ref.wgrad_reference(a.view(np.uint8), sfa, b.view(np.uint8), sfb, c)
            wgrad = jax.jit(cj.wgrad_gemm_fp8_fp8_fp32_nt)
            cases = [
                ([(XY,), (XY,), (), (), (XY,)], (XY,), 0),
                ([(), (), ("x",), ("x",), (None, "x")], (None, "x"), 0),
                ([(None, XY)] * 4 + [()], (), 1),
            ]
            for specs, want, reduces in cases:
                args = [put(v, *s) for v, s in zip((a, sfa, b, sfb, c), specs)]
                d = wgrad(*args)
                close(d, r)
                assert spec(d) == want, (specs, spec(d))
                cl = collectives(compiled(wgrad, *args))
                assert cl["all-gather"] == 0 and cl["all-reduce"] == reduces, (specs, cl)
    """)


def test_training_kinds_in_shard_map():
    """wgrad with tokens sharded (each device its partial, psum'd by the user) and the k-grouped wgrad with
    experts sharded (each device its own groups' flat operands) inside shard_map, against the references."""
    _run("""
        def shard_map(f, in_specs, out_specs, mesh=line):
            return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)

        with backend.use_backend("cpu", Planner()):
            a, sfa = token_operands(128, 1024, 0)
            b, sfb = token_operands(256, 1024, 1)
            c = np.zeros((128, 256), np.float32)
            r = ref.wgrad_reference(a.view(np.uint8), sfa, b.view(np.uint8), sfb, c)
            f = shard_map(lambda a, sfa, b, sfb, c: jax.lax.psum(cj.wgrad_gemm_fp8_fp8_fp32_nt(a, sfa, b, sfb, c), "d"),
                          (P(None, "d"),) * 4 + (P(),), P())
            close(jax.jit(f)(a, sfa, b, sfb, c), r)
            assert "ffi_call" in str(jax.make_jaxpr(f)(a, sfa, b, sfb, c))

            # k-grouped: 2 experts per device, each with its own token count; flat operands per device.
            m, n, ks = 128, 64, [[128, 64], [0, 256], [192, 32], [16, 128]]
            flat_a, flat_b, sa, sb, outs, want = [], [], [], [], [], []
            for dev, sizes in enumerate(ks):
                # per group: A_g [m, k_g] back to back, scales stacked [sum ceil(k_g/128), m]
                fa, fb, fsa, fsb, k0 = [], [], [], [], 0
                for k in sizes:
                    ag, sag = token_operands(m, k, 100 * dev + k) if k else (np.zeros((m, 0), ml_dtypes.float8_e4m3fn), np.zeros((m, 0), np.float32))
                    bg, sbg = token_operands(n, k, 200 * dev + k) if k else (np.zeros((n, 0), ml_dtypes.float8_e4m3fn), np.zeros((n, 0), np.float32))
                    fa.append(ag.reshape(-1)); fb.append(bg.reshape(-1)); fsa.append(sag.T); fsb.append(sbg.T)
                rows = 4  # pad every device's stacked scales to the same row count
                fsa.append(np.zeros((rows - sum(s.shape[0] for s in fsa), m), np.float32))
                fsb.append(np.zeros((rows - sum(s.shape[0] for s in fsb), n), np.float32))
                flat_a.append(np.concatenate(fa)); flat_b.append(np.concatenate(fb))
                sa.append(np.concatenate(fsa)); sb.append(np.concatenate(fsb))
                o = np.random.default_rng(dev).standard_normal((2, m, n)).astype(np.float32)
                outs.append(o)
                want.append(ref.k_grouped_wgrad_reference(flat_a[-1].view(np.uint8), sa[-1], flat_b[-1].view(np.uint8),
                                                          sb[-1], o, np.asarray(sizes)))
            width = max(x.size for x in flat_a)
            A = np.stack([np.pad(x.view(np.uint8), (0, width - x.size)) for x in flat_a]).view(ml_dtypes.float8_e4m3fn)
            width = max(x.size for x in flat_b)
            B = np.stack([np.pad(x.view(np.uint8), (0, width - x.size)) for x in flat_b]).view(ml_dtypes.float8_e4m3fn)
            SA, SB, OUT = np.stack(sa), np.stack(sb), np.concatenate(outs)
            sizes = np.asarray(ks, np.int32).reshape(-1)

            def local(a, sfa, b, sfb, out, bs):
                return cj.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(a[0], sfa[0], b[0], sfb[0], bs, out)
            f = shard_map(local, (P("d"),) * 5 + (P("d"),), P("d"))
            got = np.asarray(jax.jit(f)(A, SA, B, SB, OUT, sizes))
            close(got, np.concatenate(want))
    """)


def test_casts_and_gemm_trace_in_shard_map():
    """make_jaxpr of a layer (casts, then the dense GEMM) inside shard_map over a 2-D mesh: it traces with the
    custom calls in it (kept as a test since the casts once failed to trace there)."""
    _run("""
        rng = np.random.default_rng(5)
        x = rng.standard_normal((256, 256)).astype(np.float32)
        w = rng.standard_normal((256, 256)).astype(np.float32)

        def layer(x, w):
            a, sfa = cj.per_token_cast_to_fp8(x)
            b, sfb = cj.per_block_cast_to_fp8(w)
            return cj.gemm_fp8_fp8_bf16_nt(a, sfa, b, sfb)
        f = jax.shard_map(layer, mesh=mesh, in_specs=(P("x"), P("y")), out_specs=P("x", "y"))
        # the casts' CUDA branches (default backend) ...
        casts = jax.shard_map(lambda x, w: (*cj.per_token_cast_to_fp8(x), *cj.per_block_cast_to_fp8(w)), mesh=mesh,
                              in_specs=(P("x"), P("y")), out_specs=(P("x"), P("x"), P("y"), P("y")))
        assert str(jax.make_jaxpr(casts)(x, w)).count("ffi_call") == 2
        with backend.use_backend("cpu", Planner(floats=64, counters=4)):  # ... and the GEMM's call
            jaxpr = str(jax.make_jaxpr(f)(x, w))
            assert jaxpr.count("ffi_call") == 1 and "custom_partitioning" in jaxpr, jaxpr
            q = ref.per_token_cast_to_fp8_reference(x)
            bq = ref.per_block_cast_to_fp8_reference(w)
            close(jax.jit(f)(x, w), ref.gemm_reference(*q, *bq))
    """)


def test_multigpu_layers_on_host_plans():
    """The example's layers (cupygemm.jax.parallel_bench) at small shapes on four CPU devices: the EP MoE layer
    (all_to_all dispatch, masked GEMMs, combine; unchunked and in 2 chunks) and the TP MLP (one all-reduce, no
    all-gather) match float32."""
    _run("""
        from cupygemm.jax import parallel_bench as mg
        with backend.use_backend("cpu", Planner(floats=64, counters=4)):
            ys = []
            for chunks in (1, 2):
                f, inputs, info = mg.moe_setup(jax.devices(), 128, 256, 128, experts_per_device=2, topk=2,
                                               chunks=chunks)
                ys.append(np.asarray(f(*inputs)))
                assert ref.calc_diff(ys[-1], mg.moe_reference(info["x"], info["routing"], info["params"])) < 3e-3
                # compiled: chunks=1 its dispatch and combine; chunks=2 (a small layout: the cond) each branch's
                # two per chunk, separate ops, and the one all-reduce of the routing histogram deciding the layout
                c = collectives(compiled(f, *inputs))
                assert info["slots"] < 4 * 128 // chunks, info["slots"]
                assert c["all-to-all"] == (2 if chunks == 1 else 2 * 2 * chunks), c
                assert c["all-reduce"] == (0 if chunks == 1 else 1) and c["all-gather"] == 0, c
                assert mg.experts_ms(jax.devices()[0], info, 128, 4, 2, repeats=1) > 0  # the chunks' FFNs alone
            assert ref.calc_diff(ys[1], ys[0]) < 1e-6, ref.calc_diff(ys[1], ys[0])  # GEMMs over other row counts
            f, inputs, info = mg.mlp_setup(jax.devices(), 64, 256, 512)
            y = f(*inputs)
            assert ref.calc_diff(np.asarray(y).astype(np.float64), mg.mlp_reference(info["x"], info["params"])) < 3e-3
            c = collectives(compiled(f, *inputs))
            assert c["all-gather"] == 0 and c["all-reduce"] == 1, c
    """)
