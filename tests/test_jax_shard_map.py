"""cupygemm.jax inside ``jax.shard_map`` over a mesh of two CPU devices (issue 47).

The casts' ``lax.platform_dependent`` branches (the CUDA custom call, the ``jnp`` code) must have one type there,
varying along the mesh axes as the input does; the GEMMs' results must vary as their operands do. With the default
(CUDA) backend the casts trace both branches and run the ``jnp`` one on the CPU; the GEMMs run on the CPU tests' host
plans (tests/test_xla_ffi.py), one call per device on its own shard, checked against the NumPy references.

Each case runs in a subprocess: the device count is an XLA flag read when JAX starts its CPU backend, which the
rest of the suite has started already.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from jax_host_devices import run_on_host_devices

pytest.importorskip("jax")

TESTS = Path(__file__).resolve().parent

_PRELUDE = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import jax, jax.numpy as jnp, ml_dtypes, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    assert len(jax.devices()) == 2, jax.devices()
    import cupygemm.jax as cj
    from cupygemm import reference as ref
    from cupygemm.jax import backend, vma
    from test_xla_ffi import HostPlanner, _masked_operands, _operands
    mesh = Mesh(np.array(jax.devices()), ("x",))

    def shard_map(f, in_specs, out_specs):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)

    def varies(*xs, along=frozenset({{"x"}})):
        for x in xs:
            assert vma.varying(x) == along, (jax.typeof(x), along)
        return xs if len(xs) > 1 else xs[0]
""")


def _run(body: str) -> None:
    run_on_host_devices(_PRELUDE.format(tests=str(TESTS)) + textwrap.dedent(body), 2, timeout=300)


def test_casts_trace_and_run_in_shard_map():
    """Both casts, rows sharded over the mesh: the trace holds the CUDA branch (the custom call) and the jnp branch
    with one type; on the CPU the jnp branch runs, bit-exact with the reference on the whole array."""
    _run("""
        rng = np.random.default_rng(0)
        x = (rng.standard_normal((512, 300)) * 10).astype(np.float32)
        for cast, reference in ((cj.per_token_cast_to_fp8, ref.per_token_cast_to_fp8_reference),
                                (cj.per_block_cast_to_fp8, ref.per_block_cast_to_fp8_reference)):
            f = shard_map(lambda x: varies(*cast(x)), P("x"), (P("x"), P("x")))
            jaxpr = str(jax.make_jaxpr(f)(x))
            assert "ffi_call" in jaxpr and "platform_index" in jaxpr, jaxpr
            q, s = jax.jit(f)(x)
            rq, rs = reference(x)
            np.testing.assert_array_equal(np.asarray(q).view(np.uint8), rq)
            np.testing.assert_array_equal(np.asarray(s).view(np.uint32), rs.view(np.uint32))
        # replicated input: replicated (invariant) results
        f = shard_map(lambda x: varies(*cj.per_token_cast_to_fp8(x), along=frozenset()), P(), (P(), P()))
        jax.make_jaxpr(f)(x)
    """)


def test_gemms_trace_and_run_in_shard_map():
    """Dense (A's rows sharded, weights replicated), masked (groups sharded), contiguous (rows and out sharded) and
    vmap inside shard_map: results vary along the mesh axis and equal the references; replicated operands give a
    replicated result."""
    _run("""
        with backend.use_backend("cpu", HostPlanner(floats=64, counters=4)):
            a, sfa, b, sfb = _operands(256, 128, 256)
            r = ref.gemm_reference(a.view(np.uint8), sfa, b.view(np.uint8), sfb)
            dense = shard_map(lambda a, sfa, b, sfb: varies(cj.gemm_fp8_fp8_bf16_nt(a, sfa, b, sfb)),
                              (P("x"), P("x"), P(), P()), P("x"))
            d = np.asarray(jax.jit(dense)(a, sfa, b, sfb)).astype(np.float64)
            assert ref.calc_diff(d, r) < 1e-5
            same = shard_map(lambda a, sfa, b, sfb: varies(cj.gemm_fp8_fp8_bf16_nt(a, sfa, b, sfb), along=frozenset()),
                             (P(), P(), P(), P()), P())
            assert ref.calc_diff(np.asarray(jax.jit(same)(a, sfa, b, sfb)).astype(np.float64), r) < 1e-5

            ga, gsa, gb, gsb = _masked_operands(4, 64, 128, 256)
            mm = jnp.asarray([64, 0, 17, 33], jnp.int32)
            masked = shard_map(lambda *ops: varies(cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(*ops, 32)),
                               (P("x"),) * 5, P("x"))
            d = np.asarray(jax.jit(masked)(ga, gsa, gb, gsb, mm)).astype(np.float64)
            full = ref.grouped_masked_reference(ga.view(np.uint8), gsa, gb.view(np.uint8), gsb, np.full(4, 64))
            for g, rows in enumerate([64, 0, 17, 33]):
                assert (rows == 0 or ref.calc_diff(d[g, :rows], full[g, :rows]) < 1e-5) and (d[g, rows:] == 0).all()

            idx = jnp.asarray(np.concatenate([np.full(128, 1), np.full(100, 0), np.full(28, -1)]).astype(np.int32))
            filler = jnp.full((256, 128), 7.0, jnp.bfloat16)
            contiguous = shard_map(
                lambda a, sfa, idx, out: varies(cj.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(a, sfa, gb, gsb, idx,
                                                                                            out=out)),
                (P("x"), P("x"), P("x"), P("x")), P("x"))
            d = np.asarray(jax.jit(contiguous)(a, sfa, idx, filler)).astype(np.float64)
            rc = ref.grouped_contiguous_reference(a.view(np.uint8), sfa, gb.view(np.uint8), gsb, np.asarray(idx))
            ok = np.asarray(idx) >= 0
            assert ref.calc_diff(d[ok], rc[ok]) < 1e-5 and (d[~ok] == 7.0).all()

            a3, sfa3 = np.stack([a[:64], a[64:128]]), np.stack([sfa[:64], sfa[64:128]])
            mapped = shard_map(lambda a3, sfa3: varies(jax.vmap(cj.gemm_fp8_fp8_bf16_nt, in_axes=(0, 0, None, None))(
                a3, sfa3, b, sfb)), (P(None, "x"), P(None, "x")), P(None, "x"))
            d = np.asarray(jax.jit(mapped)(a3, sfa3)).astype(np.float64)
            assert ref.calc_diff(d.reshape(128, 128), r[:128]) < 1e-5
    """)
