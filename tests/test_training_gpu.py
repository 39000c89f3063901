"""The weight-gradient GEMMs through the public API (CuPy, torch, JAX): every scale form DeepGEMM takes, the residual
accumulate, host and device group sizes, CUDA graphs with sizes changed between replays, bitwise repeatability, the
DeepGEMM 2.x names, and bad inputs refused before any launch. The kernels' own configs and edges:
tests/test_wgrad_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

import cupygemm  # noqa: E402
from cupygemm.reference import k_grouped_wgrad_reference, wgrad_reference  # noqa: E402
from gpu_helpers import calc_diff, randn_bf16  # noqa: E402


def _wgrad_operands(m, n, k, seed):
    rng = cp.random.default_rng(seed)
    x, y = randn_bf16((m, k), rng), randn_bf16((n, k), rng)
    a, sfa = cupygemm.per_token_cast_to_fp8(x)
    b, sfb = cupygemm.per_token_cast_to_fp8(y)
    residual = rng.standard_normal((m, n), dtype=cp.float32) * 10
    return a, sfa, b, sfb, residual, x, y


def _close_to_reference(out, a, sfa, b, sfb, residual):
    want = wgrad_reference(a, sfa, b, sfb, residual)
    got = cp.asnumpy(out).astype(np.float64)
    prod_want, prod_got = want - cp.asnumpy(residual), got - cp.asnumpy(residual)
    rel = np.linalg.norm(prod_got - prod_want) / max(np.linalg.norm(prod_want), 1e-30)
    assert rel < 1e-3, rel  # FP8 products summed by the tensor cores, promoted every 128 of K


@pytest.mark.parametrize("m,n,k", [(256, 384, 4096), (200, 136, 1024 + 48), (7168 // 8, 2112 // 4, 512)])
def test_every_scale_form_gives_the_same_bits(m, n, k):
    a, sfa, b, sfb, residual, x, y = _wgrad_operands(m, n, k, m + n)
    outs = []
    forms = [
        (sfa, sfb),  # the casts' row-major [rows, kb]: copied into the kernel's layout per call
        (cupygemm.get_col_major_tma_aligned_tensor(sfa), cupygemm.get_col_major_tma_aligned_tensor(sfb)),  # in place
        (cp.ascontiguousarray(sfa.T), cp.ascontiguousarray(sfb.T)),  # DeepGEMM's transposed stack [kb, rows]
    ]
    for fa, fb in forms:
        out = residual.copy()
        assert cupygemm.wgrad_gemm_fp8_fp8_fp32_nt((a, fa), (b, fb), out) is out
        outs.append(out)
    for o in outs[1:]:
        assert (o.view(cp.uint32) == outs[0].view(cp.uint32)).all()
    _close_to_reference(outs[0], a, sfa, b, sfb, residual)
    xf, yf = x.astype(cp.float32), y.astype(cp.float32)
    assert calc_diff(outs[0] - residual, xf @ yf.T) < 1e-3


def test_bitwise_repeatable_and_accumulating():
    a, sfa, b, sfb, residual, _, _ = _wgrad_operands(384, 512, 2048, 3)
    o1, o2 = residual.copy(), residual.copy()
    cupygemm.wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b, sfb), o1)
    cupygemm.wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b, sfb), o2)
    assert (o1.view(cp.uint32) == o2.view(cp.uint32)).all()
    twice = residual.copy()
    for _ in range(2):
        cupygemm.wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b, sfb), twice)
    _close_to_reference(twice - (o1 - residual), a, sfa, b, sfb, residual)


def test_k_zero_leaves_out_as_it_was_and_strided_out():
    a = cp.zeros((64, 0), cp.uint8)
    sfa = cp.zeros((64, 0), cp.float32)
    b = cp.zeros((96, 0), cp.uint8)
    sfb = cp.zeros((96, 0), cp.float32)
    out = cp.full((64, 96), 3.0, cp.float32)
    cupygemm.wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b, sfb), out)
    assert (out == 3.0).all()
    a, sfa, b, sfb, residual, _, _ = _wgrad_operands(128, 200, 1024, 4)
    store = cp.full((128, 256), 7.0, cp.float32)
    store[:, :200] = residual
    cupygemm.wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b, sfb), store[:, :200])
    assert (store[:, 200:] == 7.0).all()
    _close_to_reference(store[:, :200], a, sfa, b, sfb, residual)


def _grouped_operands(m, n, sizes, seed):
    rng = cp.random.default_rng(seed)
    a_parts, b_parts, sa_parts, sb_parts, xs, ys = [], [], [], [], [], []
    for k in sizes:
        x, y = randn_bf16((m, k), rng), randn_bf16((n, k), rng)
        qa, sa = cupygemm.per_token_cast_to_fp8(x)
        qb, sb = cupygemm.per_token_cast_to_fp8(y)
        a_parts.append(qa.reshape(-1)), b_parts.append(qb.reshape(-1))
        sa_parts.append(sa.T), sb_parts.append(sb.T)
        xs.append(x), ys.append(y)
    a = cp.concatenate(a_parts) if a_parts else cp.zeros(0, cp.uint8)
    b = cp.concatenate(b_parts)
    sfa = cp.ascontiguousarray(cp.concatenate(sa_parts, axis=0))
    sfb = cp.ascontiguousarray(cp.concatenate(sb_parts, axis=0))
    out = rng.standard_normal((len(sizes), m, n), dtype=cp.float32)
    return a, sfa, b, sfb, out, xs, ys


def test_k_grouped_host_and_device_sizes_agree_and_match_the_reference():
    m, n, sizes = 256, 384, [1024, 0, 512 + 48, 2048]
    a, sfa, b, sfb, residual, xs, ys = _grouped_operands(m, n, sizes, 5)
    host = residual.copy()
    cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b, sfb), host, sizes)
    dev = residual.copy()
    cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b, sfb), dev, cp.asarray(sizes, cp.int32))
    assert (host.view(cp.uint32) == dev.view(cp.uint32)).all()
    assert (host[1] == residual[1]).all()  # the empty group is untouched
    want = k_grouped_wgrad_reference(a, sfa, b, sfb, residual, np.asarray(sizes))
    got = cp.asnumpy(host).astype(np.float64)
    base = cp.asnumpy(residual).astype(np.float64)
    for g, k in enumerate(sizes):
        if k:
            rel = np.linalg.norm((got - want)[g]) / np.linalg.norm((want - base)[g])
            assert rel < 1e-3, (g, rel)
            xf, yf = xs[g].astype(cp.float32), ys[g].astype(cp.float32)
            assert calc_diff(host[g] - residual[g], xf @ yf.T) < 1e-3


def test_k_grouped_in_a_cuda_graph_follows_new_sizes():
    """One capture, replayed with batch_sizes changed on the device between replays: each replay computes the
    groups of its moment (the host never reads them)."""
    m, n, cap = 128, 256, [1024, 1024, 1024]
    a, sfa, b, sfb, residual, _, _ = _grouped_operands(m, n, cap, 6)
    sizes = cp.asarray(cap, cp.int32)
    out = residual.copy()
    s = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    with s:
        cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b, sfb), out, sizes)  # plans, buffers: not captured
        s.begin_capture()
        cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b, sfb), out, sizes)
        graph = s.end_capture()
    for new in ([512, 0, 1024], [1024, 1024, 1024], [0, 0, 128]):
        with s:
            out[...] = residual
            sizes.set(np.asarray(new, np.int32))
            graph.launch(s)
            want = residual.copy()
            cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b, sfb), want, cp.asarray(new, cp.int32))
        s.synchronize()
        assert (out.view(cp.uint32) == want.view(cp.uint32)).all(), new


def test_deepgemm2_names():
    a, sfa, b, sfb, residual, _, _ = _wgrad_operands(128, 256, 1024, 7)
    want = residual.copy()
    cupygemm.wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b, sfb), want)
    d = residual.copy()
    cupygemm.fp8_gemm_nt((a, sfa), (b, sfb), d, c=d, recipe=(1, 1, 128))
    assert (d.view(cp.uint32) == want.view(cp.uint32)).all()
    d2 = cp.zeros_like(residual)
    cupygemm.fp8_gemm_nt((a, sfa), (b, sfb), d2, c=residual, recipe=(1, 1, 128))
    assert (d2.view(cp.uint32) == want.view(cp.uint32)).all()
    ga, gsa, gb, gsb, gres, _, _ = _grouped_operands(128, 256, [256, 384], 8)
    want_g = gres.copy()
    cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((ga, gsa), (gb, gsb), want_g, [256, 384])
    dg = cp.zeros_like(gres)
    cupygemm.k_grouped_fp8_gemm_nt_contiguous((ga, gsa), (gb, gsb), dg, [256, 384], c=gres)
    assert (dg.view(cp.uint32) == want_g.view(cp.uint32)).all()


def test_bad_inputs_are_refused_before_a_launch():
    a, sfa, b, sfb, residual, _, _ = _wgrad_operands(128, 256, 1024, 9)
    with pytest.raises(TypeError, match="accumulate"):
        cupygemm.wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b, sfb), None)
    with pytest.raises(TypeError, match="float32"):
        cupygemm.wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b, sfb), residual.astype(cp.float16))
    with pytest.raises(ValueError, match="K .* differs"):
        cupygemm.wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b[:, :512], sfb[:, :4]), residual)
    with pytest.raises(ValueError, match="overlaps"):
        cupygemm.wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b, sfb), a.view(cp.float32))  # [128, 1024] FP8 = [128, 256] FP32
    ga, gsa, gb, gsb, gres, _, _ = _grouped_operands(128, 256, [256, 384], 10)
    with pytest.raises(ValueError, match="batch_sizes\\[1\\]"):
        cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((ga, gsa), (gb, gsb), gres, [256, 383])
    # a device size past what A holds is clamped by the kernel: nothing is read past the operands
    out = gres.copy()
    cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((ga, gsa), (gb, gsb), out, cp.asarray([256, 1 << 20], cp.int32))
    cp.cuda.Device().synchronize()


def test_torch_tensors_and_graph_capture():
    torch = pytest.importorskip("torch")
    a, sfa, b, sfb, residual, _, _ = _wgrad_operands(256, 384, 2048, 11)
    want = residual.copy()
    cupygemm.wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b, sfb), want)
    ta, tb = torch.from_dlpack(a).view(torch.float8_e4m3fn), torch.from_dlpack(b).view(torch.float8_e4m3fn)
    tsa, tsb, tres = torch.from_dlpack(sfa), torch.from_dlpack(sfb), torch.from_dlpack(residual)
    out = tres.clone()
    cupygemm.wgrad_gemm_fp8_fp8_fp32_nt((ta, tsa), (tb, tsb), out)
    assert torch.equal(out.view(torch.int32).cpu(), torch.from_dlpack(want).view(torch.int32).cpu())
    torch.library.opcheck(torch.ops.cupygemm.wgrad_gemm_fp8_fp8_fp32_nt_out.default,
                          (ta.view(torch.uint8), tsa, tb.view(torch.uint8), tsb, tres.clone(), -1))
    ga, gsa, gb, gsb, gres, _, _ = _grouped_operands(128, 256, [512, 512], 12)
    tga, tgb = torch.from_dlpack(ga), torch.from_dlpack(gb)
    tgsa, tgsb = torch.from_dlpack(gsa), torch.from_dlpack(gsb)
    sizes = torch.tensor([512, 512], dtype=torch.int32, device="cuda")
    gout = torch.from_dlpack(gres).clone()
    cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((tga, tgsa), (tgb, tgsb), gout, sizes)  # warm: plans, kernels
    graph = torch.cuda.graph_pool_handle()
    g = torch.cuda.CUDAGraph()
    base = torch.from_dlpack(gres).clone()
    with torch.cuda.graph(g, pool=graph):
        cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((tga, tgsa), (tgb, tgsb), gout, sizes)
    for new in ([256, 0], [512, 384]):
        gout.copy_(base)
        sizes.copy_(torch.tensor(new, dtype=torch.int32))
        g.replay()
        want_g = torch.from_dlpack(gres).clone()
        cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((tga, tgsa), (tgb, tgsb), want_g,
                                                      torch.tensor(new, dtype=torch.int32, device="cuda"))
        torch.cuda.synchronize()
        assert torch.equal(gout.view(torch.int32), want_g.view(torch.int32)), new


def test_jax_matches_the_eager_bits():
    jax = pytest.importorskip("jax")
    try:
        jax.devices("gpu")
    except RuntimeError:
        pytest.skip("JAX has no GPU backend")
    import jax.numpy as jnp

    import cupygemm.jax as cj

    a, sfa, b, sfb, residual, _, _ = _wgrad_operands(256, 384, 1024 + 48, 13)
    want = residual.copy()
    cupygemm.wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b, sfb), want)
    cp.cuda.Device().synchronize()
    ja = jnp.asarray(cp.asnumpy(a)).view(jnp.float8_e4m3fn)
    jb = jnp.asarray(cp.asnumpy(b)).view(jnp.float8_e4m3fn)
    got = jax.jit(cj.wgrad_gemm_fp8_fp8_fp32_nt)(ja, jnp.asarray(cp.asnumpy(sfa)), jb, jnp.asarray(cp.asnumpy(sfb)),
                                                 jnp.asarray(cp.asnumpy(residual)))
    assert (np.asarray(got).view(np.uint32) == cp.asnumpy(want).view(np.uint32)).all()


def test_jax_k_grouped_kinds_match_the_eager_bits():
    """Both k-grouped kinds through cupygemm.jax (jit, sizes traced) give the eager call's bits: the flat kind (its
    stacked scale rows reach the plan from the operand's shape) and the columns kind (the transposed casts' operands,
    row-major scales made M-major by an XLA op)."""
    jax = pytest.importorskip("jax")
    try:
        jax.devices("gpu")
    except RuntimeError:
        pytest.skip("JAX has no GPU backend")
    import jax.numpy as jnp

    import cupygemm.jax as cj

    def j(x):
        x = cp.asnumpy(x)
        return jnp.asarray(x).view(jnp.float8_e4m3fn) if x.dtype == np.uint8 else jnp.asarray(x)

    ga, gsa, gb, gsb, gres, _, _ = _grouped_operands(128, 256, [256, 384], 14)
    want = gres.copy()
    cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((ga, gsa), (gb, gsb), want, [256, 384])
    got = jax.jit(cj.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt)(j(ga), j(gsa), j(gb), j(gsb),
                                                            jnp.asarray([256, 384], jnp.int32), j(gres))
    assert (np.asarray(got).view(np.uint32) == cp.asnumpy(want).view(np.uint32)).all()

    rng = cp.random.default_rng(15)
    sizes = [384, 0, 256, 80]
    dy = rng.standard_normal((sum(sizes), 192), dtype=cp.float32).astype(cp.float16)
    x = rng.standard_normal((sum(sizes), 320), dtype=cp.float32).astype(cp.float16)
    a, sa = cupygemm.per_token_cast_to_fp8_transposed(dy)
    b, sb = cupygemm.per_token_cast_to_fp8_transposed(x)
    res = rng.standard_normal((4, 192, 320), dtype=cp.float32)
    want = res.copy()
    cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns((a, sa), (b, sb), want, sizes)
    got = jax.jit(cj.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns)(j(a), j(sa), j(b), j(sb),
                                                                    jnp.asarray(sizes, jnp.int32), j(res))
    assert (np.asarray(got).view(np.uint32) == cp.asnumpy(want).view(np.uint32)).all()


@pytest.mark.parametrize("m,n,k", [(2048, 7168, 4096), (7168, 2112, 4096), (512, 32768, 1024)])
def test_wgrad_store_at_training_sizes(m, n, k):
    """The storing kernel (the chooser's configs at DeepSeek-V3 sizes: 128x152 with one unswizzled staging slab, and
    128x144 with B multicast at 512x32768) writes every
    element: bitwise the accumulating kernel's result on zeros, over a NaN-filled out."""
    a, sfa, b, sfb, _, _, _ = _wgrad_operands(m, n, k, 17)
    want = cp.zeros((m, n), cp.float32)
    cupygemm.wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b, sfb), want)
    out = cp.full((m, n), cp.nan, cp.float32)
    cupygemm.wgrad_gemm_fp8_fp8_fp32_nt_store((a, sfa), (b, sfb), out)
    cp.cuda.Device().synchronize()
    assert (out.view(cp.uint32) == want.view(cp.uint32)).all()


def test_wgrad_store_overwrites_out_with_the_accumulating_kernels_bits():
    """The storing kind gives the bits of accumulating into zeros, whatever out held (NaN here), in CuPy, through
    fp8_gemm_nt(c=None) and torch (its operator, functional); K == 0 gives zeros."""
    a, sfa, b, sfb, _, x, y = _wgrad_operands(256, 384, 2048 + 48, 16)
    want = cp.zeros((256, 384), cp.float32)
    cupygemm.wgrad_gemm_fp8_fp8_fp32_nt((a, sfa), (b, sfb), want)
    out = cp.full((256, 384), cp.nan, cp.float32)
    assert cupygemm.wgrad_gemm_fp8_fp8_fp32_nt_store((a, sfa), (b, sfb), out) is out
    new = cupygemm.wgrad_gemm_fp8_fp8_fp32_nt_store((a, sfa), (b, sfb))
    d = cp.full((256, 384), cp.nan, cp.float32)
    cupygemm.fp8_gemm_nt((a, sfa), (b, sfb), d, recipe=(1, 1, 128))
    cp.cuda.Device().synchronize()
    for got in (out, new, d):
        assert (got.view(cp.uint32) == want.view(cp.uint32)).all()
    empty = cp.full((256, 384), cp.nan, cp.float32)
    cupygemm.wgrad_gemm_fp8_fp8_fp32_nt_store((a[:, :0], sfa[:, :0]), (b[:, :0], sfb[:, :0]), empty)
    cp.cuda.Device().synchronize()
    assert not empty.any()
    torch = pytest.importorskip("torch")
    from cupygemm import torch as _  # noqa: F401 - defines torch.ops.cupygemm

    ta, tb = torch.from_dlpack(a).view(torch.float8_e4m3fn), torch.from_dlpack(b).view(torch.float8_e4m3fn)
    got = torch.ops.cupygemm.wgrad_gemm_fp8_fp8_fp32_nt_store(ta.view(torch.uint8), torch.from_dlpack(sfa),
                                                              tb.view(torch.uint8), torch.from_dlpack(sfb))
    assert torch.equal(got.view(torch.int32).cpu(), torch.from_dlpack(want).view(torch.int32).cpu())
    torch.library.opcheck(torch.ops.cupygemm.wgrad_gemm_fp8_fp8_fp32_nt_store.default,
                          (ta.view(torch.uint8), torch.from_dlpack(sfa), tb.view(torch.uint8), torch.from_dlpack(sfb)))
