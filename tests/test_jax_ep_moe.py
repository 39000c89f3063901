"""The expert-parallel MoE layer's dispatch and combine (:func:`cupygemm.jax.parallel_bench.ep_moe`, issue 47) on
XLA's CPU backend with 1, 2 and 4 host devices, and the real layer (cupygemm's GEMMs) traced there.

The expert FFN is the layer's argument: here a float32 ``jnp`` one on the dequantized rows and the unquantized
weights, so the layer must match :func:`~cupygemm.jax.parallel_bench.moe_reference` of the dequantized tokens to
float32 rounding (any token sent to the wrong device, any pair in the wrong slot, lost or counted twice shows). The
FFN returns NaN past each expert's ``masked_m`` (a row read there poisons the result) and reports, per device, the
``masked_m`` and the slots per expert it ran with, which are checked against the counts from the routing.

Each case runs in a subprocess (the device count is an XLA flag read when JAX starts its CPU backend).
"""
from __future__ import annotations

import textwrap

import pytest
from jax_host_devices import run_on_host_devices

pytest.importorskip("jax")

_PRELUDE = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax import lax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import cupygemm.jax as cj
    from cupygemm import reference as ref
    from cupygemm.jax import parallel_bench as mg

    H, I = 256, 128
    seen = []  # (device, masked_m, slots per expert) of every expert step that ran

    def report(dev, masked_m, m):
        seen.append((int(dev), np.asarray(masked_m).tolist(), int(m)))

    def jnp_ffn(a, sfa, masked_m, params):
        w_up, w_down = params
        g, m, h = a.shape
        x = a.astype(jnp.float32) * jnp.repeat(sfa, 128, axis=2)[:, :, :h]
        hi = lax.Precision.HIGHEST
        out = jnp.einsum("gmi,gji->gmj", mg._silu_glu(jnp.einsum("gmh,gnh->gmn", x, w_up, precision=hi)), w_down,
                         precision=hi)
        jax.debug.callback(report, lax.axis_index("ep"), masked_m, m)
        return jnp.where((jnp.arange(m)[None, :] < masked_m[:, None])[..., None], out, jnp.nan)

    def dequantized(x):
        q, s = cj.per_token_cast_to_fp8(x)
        return np.asarray(q.astype(jnp.float32) * jnp.repeat(s, 128, axis=1)[:, :x.shape[1]])

    def run(d, el, t, experts, weights, slots=None, combine=jnp.float32, seed=0, chunks=1, **layer):
        '''The layer on d devices with the jnp FFN (``layer``: moe_layer's overlap, decide, transport); returns
        (y, reference, routing counts per expert).'''
        seen.clear()
        mesh = Mesh(np.array(jax.devices()[:d]), ("ep",))
        x = jax.random.normal(jax.random.key(seed), (d * t, H), jnp.float32).astype(jnp.bfloat16)
        rng = np.random.default_rng(seed)  # float32 weights: this FFN has no use for FP8 ones
        params = {"w_up": jnp.asarray(rng.standard_normal((d * el, 2 * I, H), np.float32) / np.sqrt(H)),
                  "w_down": jnp.asarray(rng.standard_normal((d * el, H, I), np.float32) / np.sqrt(I))}
        f = mg.moe_layer(mesh, el, jnp_ffn, slots, combine, chunks, **layer)
        put = lambda v: jax.device_put(v, NamedSharding(mesh, P("ep")))
        y = f(put(x), put(jnp.asarray(experts, jnp.int32)), put(jnp.asarray(weights, jnp.float32)),
              (put(params["w_up"]), put(params["w_down"])))
        y = np.asarray(jax.block_until_ready(y))
        want = mg.moe_reference(dequantized(x), {"experts": jnp.asarray(experts), "weights": jnp.asarray(weights)},
                                params)
        counts = np.bincount(np.asarray(experts).ravel(), minlength=d * el)
        return y, want, counts

    def check(d, el, t, experts, weights, slots=None, combine=jnp.float32, tol=1e-9, chunks=1):
        y, want, counts = run(d, el, t, experts, weights, slots, combine, chunks=chunks)
        assert np.isfinite(y).all(), "a row past masked_m was read"
        assert ref.calc_diff(y, want) < tol, ref.calc_diff(y, want)
        bounds = mg.chunk_bounds(t, chunks)
        ex = np.asarray(experts).reshape(d, t, -1)
        per_chunk = [np.bincount(ex[:, a:b].ravel(), minlength=d * el) for a, b in bounds]
        small = slots is not None and slots < d * max(b - a for a, b in bounds)
        everywhere = small and max(c.max() for c in per_chunk) <= slots  # chunks > 1: one choice for all
        for dev in range(d):  # one expert step a chunk and device, with its chunk's exact counts as masked_m
            ran = sorted((masked_m, m) for di, masked_m, m in seen if di == dev)
            want_steps = []
            for (a, b), c in zip(bounds, per_chunk):
                mine = c[dev * el:(dev + 1) * el]
                fits = everywhere if chunks > 1 else small and mine.max() <= slots
                want_steps.append((mine.tolist(), slots if fits else d * (b - a)))
            assert ran == sorted(want_steps), (dev, ran, want_steps)
        assert len(seen) == d * chunks, seen
        return y, counts

    def check_overlap(d, el, t, experts, weights, slots=None, overlap="split", decide="after",
                      transport="all_to_all", combine=jnp.float32, tol=1e-9):
        '''The overlapped layer against the reference, and its expert steps: per device one a local part (the own
        tokens [a, b) on the own experts) and, with d > 1, one remote step (the other devices' tokens), each with
        its exact counts as masked_m and the small or exact layout as ``decide`` says.'''
        y, want, _ = run(d, el, t, experts, weights, slots, combine, overlap=overlap, decide=decide,
                         transport=transport)
        assert np.isfinite(y).all(), "a row past masked_m was read"
        assert ref.calc_diff(y, want) < tol, (overlap, decide, transport, ref.calc_diff(y, want))
        ex = np.asarray(experts).reshape(d, t, -1)
        parts = mg.chunk_bounds(t, 2) if overlap == "split" and t >= 2 else [(0, t)]
        steps = {}  # device -> [(counts, exact rows, small rows)]
        for dev in range(d):
            mine = slice(dev * el, (dev + 1) * el)
            for a, b in parts:
                c = np.bincount(ex[dev, a:b].ravel(), minlength=d * el)[mine]
                steps.setdefault(dev, []).append((c, b - a, mg.part_slots(slots, b - a, d * t)))
            if d > 1:
                others = np.delete(ex, dev, axis=0)
                c = np.bincount(others.ravel(), minlength=d * el)[mine]
                steps[dev].append((c, (d - 1) * t, mg.part_slots(slots, (d - 1) * t, d * t)))
        everywhere = all(c.max() <= sm for st in steps.values() for c, _, sm in st)
        for dev in range(d):
            want_steps = []
            for c, exact, small in steps[dev]:
                fits = {"after": c.max() <= small, "before": everywhere, "never": False}[decide]
                want_steps.append((c.tolist(), small if fits else exact))
            ran = sorted((masked_m, m) for di, masked_m, m in seen if di == dev)
            assert ran == sorted(want_steps), (dev, overlap, decide, transport, ran, want_steps)
        assert len(seen) == sum(len(st) for st in steps.values()), seen
        return y

    def random_routing(d, el, t, topk, seed=1):
        logits = jax.random.normal(jax.random.key(seed), (d * t, d * el), jnp.float32)
        r = mg.route(logits, topk)
        return np.array(r["experts"]), np.array(r["weights"])
""")


#: Jaxpr walking for the dataflow tests: sub-jaxprs of an equation, whether one holds a primitive, and per top-level
#: equation the indices of those it depends on (transitively).
_JAXPR_HELPERS = textwrap.dedent("""
    from jax.extend import core as jcore

    def sub_jaxprs(eqn):
        for v in eqn.params.values():
            for u in (v if isinstance(v, (tuple, list)) else [v]):
                if isinstance(u, jcore.ClosedJaxpr):
                    yield u.jaxpr
                elif isinstance(u, jcore.Jaxpr):
                    yield u

    def has(eqn, name):
        return eqn.primitive.name == name or any(has(e, name) for j in sub_jaxprs(eqn) for e in j.eqns)

    def deps(jaxpr):
        made, out = {}, []
        for i, e in enumerate(jaxpr.eqns):
            dep = set()
            for v in e.invars:
                if not isinstance(v, jcore.Literal) and v in made:
                    dep |= {made[v]} | out[made[v]]
            out.append(dep)
            for v in e.outvars:
                made[v] = i
        return out
""")


def _run(body: str, devices: int = 4) -> None:
    run_on_host_devices(_PRELUDE + textwrap.dedent(body), devices)


def test_random_routing_on_1_2_4_devices():
    """Top-1 and top-8 random routing, 1, 2 and 4 devices (odd token counts): the float32 reference, the exact
    counts as masked_m, the exact layout (no slots given)."""
    _run("""
        for d, el, topk in [(1, 8, 8), (1, 8, 1), (2, 4, 8), (2, 4, 1), (4, 2, 8), (4, 2, 1)]:
            t = 24 + d
            check(d, el, t, *random_routing(d, el, t, topk))
    """)


def test_skewed_routing():
    """Every token of every device routed to device 0's experts (the others receive nothing and run empty experts),
    an expert nobody picks, and an expert picked by every token."""
    _run("""
        d, el, t = 2, 4, 20
        rng = np.random.default_rng(2)
        w = rng.dirichlet(np.ones(3), d * t).astype(np.float32)
        ex = np.stack([rng.permutation(el)[:3] for _ in range(d * t)]).astype(np.int32)  # device 0's experts only
        _, counts = check(d, el, t, ex, w)  # check(): device 1's masked_m are all 0
        assert counts[el:].sum() == 0 and counts[:el].min() > 0, counts
        ex = np.stack([rng.permutation([0, 2, 3, 5, 6, 7])[:4] for _ in range(d * t)]).astype(np.int32)
        _, counts = check(d, el, t, ex, rng.dirichlet(np.ones(4), d * t).astype(np.float32))
        assert counts[1] == counts[4] == 0 and counts[[0, 2, 3, 5, 6, 7]].min() > 0, counts
        ex = np.stack([np.r_[5, rng.permutation([0, 1, 2, 3])[:1]] for _ in range(d * t)]).astype(np.int32)
        _, counts = check(d, el, t, ex, rng.dirichlet(np.ones(2), d * t).astype(np.float32))
        assert counts[5] == d * t, counts  # one expert receives every token: the exact layout's every slot
        d, el, t = 4, 2, 9  # tokens of every source to device 3 only, and top-1
        ex = np.full((d * t, 1), 7, np.int32)
        _, counts = check(d, el, t, ex, np.ones((d * t, 1), np.float32))
        assert counts[7] == d * t and counts[:7].sum() == 0
    """)


def test_small_layout_and_its_fallback():
    """With slots per expert below D * T: the small layout runs where every count fits, the exact one where one
    does not (a device decides for itself), both exact."""
    _run("""
        d, el, t = 2, 4, 32
        ex, w = random_routing(d, el, t, 2)
        counts = np.bincount(ex.ravel(), minlength=d * el)
        # check() asserts which layout each device ran: the small one exactly where all its counts fit
        check(d, el, t, ex, w, slots=int(counts.max()))  # both fit, one exactly
        check(d, el, t, ex, w, slots=int(counts.max()) - 1)
        assert d * t in [m for _, _, m in seen]
        ex[:, 0] = 0  # expert 0 on every token: device 0 cannot fit; device 1's experts d * t / 4 tokens each
        ex[:, 1] = el + np.arange(d * t) % el
        check(d, el, t, ex, w, slots=d * t // 2)
        assert [m for _, _, m in sorted(seen)] == [d * t, d * t // 2], seen
    """)


def test_bf16_combine():
    """The default BF16 partial rows on the wire: within one BF16 rounding of the float32 combine."""
    _run("""
        d, el, t = 2, 4, 40
        ex, w = random_routing(d, el, t, 8)
        y32, _ = check(d, el, t, ex, w)
        y16, _ = check(d, el, t, ex, w, combine=jnp.bfloat16, tol=1e-5)
        assert 0 < ref.calc_diff(y16, y32) < 1e-5, ref.calc_diff(y16, y32)
    """)


def test_layer_with_cupygemm_traces_on_cpu():
    """make_jaxpr of the real layer (cupygemm's casts and masked GEMMs, trace-only plans: no GPU here) on 2 and 1
    devices: two all_to_alls, the dispatch's [D, T, H/4 + H/128 + 2 topk] int32 payload (one row per token and
    device) and the combine's [D, T, H] BF16 rows; the GEMMs of both layouts (slots and D * T rows an expert) where
    the slots are fewer than D * T, of the exact one alone on one device; the bytes the bench reports."""
    _run("""
        import re
        H, I, T, EL, TOPK = 512, 256, 256, 4, 4
        for d in (2, 1):
            f, args, info = mg.moe_setup(jax.devices()[:d], T, H, I, EL, TOPK)
            jaxpr = str(jax.make_jaxpr(f)(*args))
            shapes = re.findall(r"(\\w+)\\[([0-9,]+)\\] = all_to_all", jaxpr)
            assert shapes == [("i32", f"{d},{T},{H // 4 + H // 128 + 2 * TOPK}"), ("bf16", f"{d},{T},{H}")], shapes
            gemms = re.findall(r"bf16\\[{},([0-9]+),([0-9]+)\\] = ffi_call".format(EL), jaxpr)  # [E_l, M, N]
            layouts = [T * d, info["slots"]] if d == 2 else [T]
            assert info["slots"] == layouts[-1] and len(gemms) == 2 * len(layouts), (info["slots"], gemms)
            assert sorted(gemms) == sorted((str(m), str(n)) for m in layouts for n in (2 * I, H)), gemms
            want = (d - 1) * T
            assert info["dispatch_bytes"] == want * (H + 4 * H // 128 + 8 * TOPK), info
            assert info["combine_bytes"] == want * 2 * H, info
    """, devices=2)


def test_chunks_match_one_chunk():
    """2 and 4 chunks (uneven ones too) on 2 and 4 devices, exact layout and small layout with its fallback: each
    chunk's expert step sees that chunk's exact counts, and y equals the unchunked layer's up to float32 rounding.
    Tolerance: the same tokens, casts and weights per pair, summed over the topk choices and the devices in the same
    order; only the jnp FFN's einsums run over other row counts (M), which may block their float32 sums otherwise,
    so rtol 1e-5 / atol 1e-6 (a few float32 ulps of these O(1) outputs), not bit equality."""
    _run("""
        for d, el, topk, t in [(2, 4, 8, 26), (2, 4, 3, 25), (4, 2, 1, 27), (4, 2, 2, 24)]:
            ex, w = random_routing(d, el, t, topk)
            y1, _ = check(d, el, t, ex, w)
            for c in (2, 4):
                yc, _ = check(d, el, t, ex, w, chunks=c)
                np.testing.assert_allclose(yc, y1, rtol=1e-5, atol=1e-6)
                # a small layout that fits every chunk, then one that one chunk's expert overflows (where the
                # largest count is below the exact layout's D * T_c: topk < D * E_l)
                ex3 = ex.reshape(d, t, topk)
                bounds = mg.chunk_bounds(t, c)
                most = max(np.bincount(ex3[:, a:b].ravel(), minlength=d * el).max() for a, b in bounds)
                if topk > 1 and most < d * max(b - a for a, b in bounds):
                    for slots in (most, most - 1):
                        yc, _ = check(d, el, t, ex, w, slots=slots, chunks=c)
                        assert [m for _, _, m in seen].count(slots) == (d * c if slots == most else 0), seen
                        np.testing.assert_allclose(yc, y1, rtol=1e-5, atol=1e-6)
    """)


def test_chunked_skew_falls_back_everywhere():
    """Every token's first choice expert 0 (device 0 cannot fit any chunk), device 1's experts evenly: unchunked,
    device 1 still takes the small layout; chunked, every device and chunk takes the exact one (the choice is
    global: the cond holds the collectives)."""
    _run("""
        d, el, t = 2, 4, 32
        ex, w = random_routing(d, el, t, 2)
        ex[:, 0] = 0
        ex[:, 1] = el + np.arange(d * t) % el
        y1, _ = check(d, el, t, ex, w, slots=d * t // 4)
        assert sorted(m for _, _, m in seen) == [d * t // 4, d * t], seen
        y2, _ = check(d, el, t, ex, w, slots=d * t // 4, chunks=2)
        assert [m for _, _, m in seen] == [t] * 4, seen
        np.testing.assert_allclose(y2, y1, rtol=1e-5, atol=1e-6)
    """)


def test_chunk_dataflow_in_jaxpr():
    """The real layer (cupygemm's GEMMs traced) in 2 and 4 chunks on 2 devices: in each branch of the layout cond,
    C dispatch all_to_alls and C combine ones (separate ops, one per chunk), no dispatch depending on any GEMM, and
    chunk i's combine depending on chunk i's two GEMMs only; so XLA may run chunk i+1's dispatch and chunk i's
    combine under the other chunks' GEMMs."""
    _run(_JAXPR_HELPERS + textwrap.dedent("""
        H, I, T, EL, TOPK = 512, 256, 1024, 4, 4

        def find(jaxpr, name):
            for e in jaxpr.eqns:
                if e.primitive.name == name:
                    yield e
                for j in sub_jaxprs(e):
                    yield from find(j, name)

        for c in (2, 4):
            f, args, info = mg.moe_setup(jax.devices()[:2], T, H, I, EL, TOPK, chunks=c)
            assert info["slots"] < 2 * T // c, info["slots"]  # a small layout: the cond is there
            jaxpr = jax.make_jaxpr(f)(*args).jaxpr
            [cond] = [e for e in find(jaxpr, "cond") if has(e, "all_to_all")]
            for branch in cond.params["branches"]:
                b = branch.jaxpr
                # the layer's calls may sit in pjit wrappers: top-level eqns are classed by what they hold
                a2a = [i for i, e in enumerate(b.eqns) if e.primitive.name == "all_to_all"]
                dispatch = [i for i in a2a if b.eqns[i].outvars[0].aval.dtype == jnp.int32]
                combine = [i for i in a2a if b.eqns[i].outvars[0].aval.dtype == jnp.bfloat16]
                gemms = [i for i, e in enumerate(b.eqns) if has(e, "ffi_call") and len(e.outvars[0].aval.shape) == 3
                         and e.outvars[0].aval.shape[0] == EL and e.outvars[0].aval.dtype == jnp.bfloat16]
                assert len(dispatch) == len(combine) == c and len(gemms) == 2 * c, (dispatch, combine, gemms)
                dep = deps(b)
                for i in dispatch:
                    assert not dep[i] & set(gemms), ("a dispatch waits for a GEMM", i)
                for n, i in enumerate(combine):
                    assert dep[i] & set(gemms) == set(gemms[2 * n:2 * n + 2]), ("combine", n, dep[i] & set(gemms))
    """), devices=2)


def test_overlap_matches_reference_on_1_2_4_devices():
    """The overlapped layer (local tokens under the all_to_alls; split: half under each), each transport and
    layout choice on 2 devices with a small layout that fits, some combinations on 4 and 1: the float32
    reference, every expert step's exact counts as masked_m, the layout each step ran; the result equal to the
    plain layer's up to float32 rounding."""
    _run("""
        d, el, t = 2, 4, 33
        ex, w = random_routing(d, el, t, 2)
        y1, _ = check(d, el, t, ex, w)
        ex3 = ex.reshape(d, t, -1)
        # the least slots that every step of both overlaps fits (a step's share of them: its rows / (d * t))
        need = [(np.bincount(ex3[i, a:b].ravel(), minlength=d * el)[i * el:(i + 1) * el].max(), b - a)
                for i in range(d) for a, b in [(0, t), *mg.chunk_bounds(t, 2)]]
        need += [(np.bincount(ex3[1 - i].ravel(), minlength=d * el)[i * el:(i + 1) * el].max(), t) for i in range(d)]
        fit = max(-(-int(c) * d * t // rows) for c, rows in need)
        assert fit < d * t, fit
        for overlap in ("local", "split"):
            for transport in ("all_to_all", "ppermute"):
                for decide in ("after", "before", "never"):
                    y = check_overlap(d, el, t, ex, w, slots=fit, overlap=overlap, decide=decide,
                                      transport=transport)
                    np.testing.assert_allclose(y, y1, rtol=1e-5, atol=1e-6)
                    small = [m for _, _, m in seen if m not in (t, t // 2, t - t // 2)]
                    assert (len(small) == len(seen)) == (decide != "never"), (decide, seen)  # all small, or none
        for d, el, topk, overlap, transport, decide in [(4, 2, 8, "split", "ppermute", "after"),
                                                        (4, 2, 1, "split", "all_to_all", "before"),
                                                        (4, 2, 3, "local", "all_to_all", "never"),
                                                        (4, 2, 3, "local", "ppermute", "before"),
                                                        (1, 8, 8, "split", "all_to_all", "after"),
                                                        (1, 8, 2, "local", "ppermute", "before")]:
            t = 20 + d
            ex, w = random_routing(d, el, t, topk)
            check_overlap(d, el, t, ex, w, slots=d * t // 2, overlap=overlap, decide=decide, transport=transport)
            check_overlap(d, el, t, ex, w, overlap=overlap, decide=decide, transport=transport)
    """)


def test_overlap_skew_and_fallback():
    """Every token of every device routed to device 0's experts (device 1's steps all empty), an expert chosen by
    every token (no small layout fits it: 'after' falls back in that step only, 'before' everywhere), top-1 to the
    last device from every source, and the BF16 combine."""
    _run("""
        d, el, t = 2, 4, 20
        rng = np.random.default_rng(2)
        w = rng.dirichlet(np.ones(3), d * t).astype(np.float32)
        ex = np.stack([rng.permutation(el)[:3] for _ in range(d * t)]).astype(np.int32)  # device 0's experts only
        for transport in ("all_to_all", "ppermute"):
            for decide in ("after", "before"):
                check_overlap(d, el, t, ex, w, slots=d * t, overlap="split", decide=decide, transport=transport)
                assert all(masked_m == [0] * el for dev, masked_m, _ in seen if dev == 1), seen
        ex = np.stack([np.r_[5, rng.permutation([0, 1, 2, 3])[:1]] for _ in range(d * t)]).astype(np.int32)
        w2 = rng.dirichlet(np.ones(2), d * t).astype(np.float32)
        check_overlap(d, el, t, ex, w2, slots=d * t // 2, overlap="split", decide="after")
        # device 1's three steps fall back (expert 5 fills each), device 0's fit: halves 5 of 10, remote 10 of 20
        assert sorted(m for _, _, m in seen) == [5, 5, 10, 10, 10, 20], seen
        check_overlap(d, el, t, ex, w2, slots=d * t // 2, overlap="split", decide="before")
        assert sorted(m for _, _, m in seen) == [10, 10, 10, 10, 20, 20], seen  # everyone exact
        d, el, t = 4, 2, 9
        ex = np.full((d * t, 1), 7, np.int32)
        for transport in ("all_to_all", "ppermute"):
            check_overlap(d, el, t, ex, np.ones((d * t, 1), np.float32), slots=d * t // 2, overlap="local",
                          transport=transport)
        d, el, t = 2, 4, 40
        ex, w = random_routing(d, el, t, 8)
        y32 = check_overlap(d, el, t, ex, w, overlap="split")
        y16 = check_overlap(d, el, t, ex, w, overlap="split", combine=jnp.bfloat16, tol=1e-5)
        assert 0 < ref.calc_diff(y16, y32) < 1e-5, ref.calc_diff(y16, y32)
    """)


def test_broken_overlap_is_caught():
    """The checks fail on a broken overlapped layer: the own device's block sent by the all_to_all as well (its
    tokens run both locally and as received ones: counted twice), and the remote partial rows lost on the way back
    (all_to_all and ppermute)."""
    _run("""
        d, el, t = 2, 4, 24
        ex, w = random_routing(d, el, t, 4)
        dispatch_slots, combine, ppermute = mg.dispatch_slots, mg._combine, lax.ppermute
        breaks = {
            "twice": ("all_to_all", lambda: setattr(mg, "dispatch_slots",
                                                    lambda experts, n, el, skip=None: dispatch_slots(experts, n, el))),
            "dropped": ("all_to_all", lambda: setattr(mg, "_combine", lambda partial, needs, slot, axis: jnp.zeros(
                (slot.shape[0], partial.shape[1]), jnp.float32))),
            "dropped-pp": ("ppermute", lambda: setattr(lax, "ppermute", lambda x, axis, perm: jnp.zeros_like(x) if
                                                       x.dtype == jnp.bfloat16 else ppermute(x, axis, perm))),
        }
        for name, (transport, brk) in breaks.items():
            brk()
            try:
                check_overlap(d, el, t, ex, w, overlap="split", transport=transport, combine=jnp.bfloat16, tol=1e-5)
            except AssertionError:
                pass
            else:
                raise SystemExit(f"a broken layer ({name}) passed the check")
            finally:
                mg.dispatch_slots, mg._combine, lax.ppermute = dispatch_slots, combine, ppermute
        for transport in ("all_to_all", "ppermute"):  # restored: both pass
            check_overlap(d, el, t, ex, w, overlap="split", transport=transport, combine=jnp.bfloat16, tol=1e-5)
    """, devices=2)


def test_overlap_dataflow_in_jaxpr():
    """The real overlapped layer (cupygemm's GEMMs traced) on 2 devices, split, exact layout: the dispatch
    all_to_all depends on no GEMM and the first local part's GEMMs not on the dispatch (they can run while it is in
    flight); the remote GEMMs on the dispatch and (the barrier) on the first local GEMMs; the second local part's
    GEMMs on the remote ones (the barrier), and the combine all_to_all not on them (they can run while it is in
    flight)."""
    _run(_JAXPR_HELPERS + textwrap.dedent("""
        H, I, T, EL, TOPK = 512, 256, 256, 4, 4

        def body_with(jaxpr, name):  # the innermost jaxpr holding `name` at its top level
            if any(e.primitive.name == name for e in jaxpr.eqns):
                return jaxpr
            for e in jaxpr.eqns:
                for j in sub_jaxprs(e):
                    found = body_with(j, name)
                    if found is not None:
                        return found

        f, args, info = mg.moe_setup(jax.devices()[:2], T, H, I, EL, TOPK, overlap="split", decide="never")
        b = body_with(jax.make_jaxpr(f)(*args).jaxpr, "all_to_all")
        a2a = [i for i, e in enumerate(b.eqns) if e.primitive.name == "all_to_all"]
        dispatch, combine = a2a
        assert b.eqns[dispatch].outvars[0].aval.dtype == jnp.int32, "the dispatch comes first"
        gemms = [i for i, e in enumerate(b.eqns) if has(e, "ffi_call") and len(e.outvars[0].aval.shape) == 3
                 and e.outvars[0].aval.shape[0] == EL and e.outvars[0].aval.dtype == jnp.bfloat16]
        rows = [b.eqns[i].outvars[0].aval.shape[1] for i in gemms]
        assert rows == [T // 2, T // 2, T, T, T // 2, T // 2], rows  # first half, remote, second half (exact)
        first, remote, second = set(gemms[:2]), set(gemms[2:4]), set(gemms[4:])
        dep = deps(b)
        assert not dep[dispatch] & set(gemms), "the dispatch waits for a GEMM"
        assert all(dispatch not in dep[i] for i in first), "the first local part waits for the dispatch"
        assert all(dispatch in dep[i] and first <= dep[i] for i in remote), "the remote step's order"
        assert all(remote <= dep[i] for i in second), "the second local part does not wait for the remote step"
        assert remote <= dep[combine] and not dep[combine] & second, "the combine's order"
    """), devices=2)


def test_variant_bench_on_cpu():
    """variant_bench's machinery with a jnp FFN on 2 host devices: every variant checked against the first and
    against float32, timed, its compiled HLO dumped and summarized (the collectives found in it)."""
    _run("""
        import os, tempfile
        def ffn_for(_m):
            def ffn(a, sfa, masked_m, params):
                up_q, up_s, down_q, down_s = params
                deq = lambda q, s: q.astype(jnp.float32) * jnp.repeat(jnp.repeat(s, 128, 1), 128, 2)[:, :q.shape[1], :q.shape[2]]
                x = a.astype(jnp.float32) * jnp.repeat(sfa, 128, axis=2)[:, :, :a.shape[2]]
                h = mg._silu_glu(jnp.einsum("gmh,gnh->gmn", x, deq(up_q, up_s)))
                return jnp.einsum("gmi,gji->gmj", h, deq(down_q, down_s))
            return ffn
        with tempfile.TemporaryDirectory() as tmp:
            variants = ["base", "split", "local+pp+before", "none+never"]
            r = mg.variant_bench(jax.devices()[:2], variants, 64, 256, 128, 4, 4, repeats=2, rounds=2, dump=tmp,
                                 ffn_factory=ffn_for, log=lambda s: None)
            assert sorted(os.listdir(tmp)) == sorted(f"{v}_d{n}.hlo.txt" for v in variants for n in (1, 2))
        assert [(row["variant"], row["devices"]) for row in r["rows"]] == [(v, n) for n in (1, 2) for v in variants]
        for row in r["rows"]:
            assert row["finite"] and row["calc_diff_base"] < 1e-5 and row["calc_diff_ref"] < 5e-3, row
            assert len(row["ms_rounds"]) == 2 and row["ms"] > 0
            ops = " ".join(e for events in row["schedule"].values() for e in events)
            want = {"base": "all-to-all", "split": "all-to-all", "local+pp+before": "collective-permute",
                    "none+never": "all-to-all"}[row["variant"]]
            assert (want in ops) == (row["devices"] == 2), (row["variant"], row["devices"], row["schedule"])
        assert set(r["summary"]) == set(variants) and r["summary"]["base"]["weak_scaling_vs_base_1"] > 0
        try:
            mg.parse_variant("split+bogus")
        except ValueError as e:
            assert "bogus" in str(e)
        else:
            raise SystemExit("parse_variant took an unknown word")
        assert mg.parse_variant("split+pp+before+sms=124") == {"overlap": "split", "decide": "before",
                                                               "transport": "ppermute", "sms": 124, "chunks": 1}
    """, devices=2)
