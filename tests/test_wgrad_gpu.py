"""The wgrad kernels on the GPU (tests/wgrad_harness.py: the package's plans on forced configs; cuda_src/fp8_wgrad.cu
and k_grouped_prep.cu):
D += A . B^T with 1x128 scales on both operands, FP32 D accumulated in place, against float64 references.

Every result is checked twice: against the float64 product of the dequantized operands (each element within the
tensor cores' FP8 accumulation allowance, FP8_ACCUM_EPS of the sum of |products| and |D|, and the product part's
relative Frobenius error below REL_LIMIT), and, where the inputs came from unquantized BF16 data, DeepGEMM's
calc_diff against the float64 product of that data (< 1e-3). The relative errors are printed (pytest -s): with FP32
output they show the tensor cores' accumulation error alone (expected 1e-5 to a few 1e-4). Configs other than the chooser's run on a few SMs, so each CTA
computes several tiles (the persistent loop, the stage ring's phases and the staging buffer's reuse)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

import cupygemm  # noqa: E402
from cupygemm import contract_wgrad as cw  # noqa: E402
from cupygemm.device import get_num_sms  # noqa: E402
from wgrad_harness import (k_grouped_wgrad_fp8_fp8_fp32_nt, wgrad_fp8_fp8_fp32_nt,  # noqa: E402
                                   workspace_header)
from gpu_helpers import FP8_ACCUM_EPS, bf16_to_f64, calc_diff, dequant_rows, randn_bf16, rel_fro  # noqa: E402

PAD = 12345.0  # D padding (ld_d > N, gaps between groups): must stay untouched
# The product part's relative Frobenius error against the dequantized float64 product. Hopper's FP8 wgmma keeps about
# 14 bits while it accumulates a K block (the BF16 forward GEMM differs from the rounded reference by one ulp in ~10 %
# of elements: a few 1e-4 relative), so a correct kernel stays well below 1e-3, while a wrong scale, row or K block
# costs 1e-2 or more.
REL_LIMIT = 1e-3


# ------------------------------------------------------------------------------------------------ inputs
def quantize(rows, k, rng):
    """BF16 randn [rows, k], its e4m3 bits and its per-token scales [rows, ceil(k/128)] (row-major)."""
    x = randn_bf16((rows, k), rng)
    if k == 0:
        return x, cp.zeros((rows, 0), cp.uint8), cp.zeros((rows, 0), cp.float32)
    q, s = cupygemm.per_token_cast_to_fp8(x)
    return x, q, s


def m_major(s_rows):
    """[rows, kb] scales -> the kernel's [kb, round_up(rows, 4)] (padding NaN: the kernel must not read it)."""
    rows, kb = s_rows.shape
    out = cp.full((kb, -(-rows // 4) * 4), cp.nan, cp.float32)
    out[:, :rows] = s_rows.T
    return out


def dense_cfg(n, k, bm, bn, **kw):
    sw = kw.pop("swizzle", cw.staging_swizzle(bn))
    slabs = kw.pop("staged_slabs", 0)
    stages = kw.pop("num_stages", None) or min(8, cw.max_stages(bm, bn, sw, slabs or bn // cw.slab_cols(bn, sw)))
    return cw.WgradConfig(cw.KIND_WGRAD, 0, n, k, bm, bn, stages, swizzle=sw, staged_slabs=slabs, **kw)


def grouped_cfg(m, n, bm, bn, **kw):
    sw = kw.pop("swizzle", cw.staging_swizzle(bn))
    slabs = kw.pop("staged_slabs", 0)
    stages = kw.pop("num_stages", None) or min(8, cw.max_stages(bm, bn, sw, slabs or bn // cw.slab_cols(bn, sw)))
    return cw.WgradConfig(cw.KIND_K_GROUPED, m, n, 0, bm, bn, stages, swizzle=sw, staged_slabs=slabs, **kw)


def residual_in(shape, ld, rng, group_gap=0):
    """D's storage (padded columns and, for 3-D, a gap between groups, all PAD) and the residual c written into its
    [.., :n] view. Returns (storage, d view, c)."""
    *lead, m, n = shape
    if lead:
        g = lead[0]
        store = cp.full((g, m + group_gap, ld), PAD, cp.float32)
        d = store[:, :m, :n]
    else:
        store = cp.full((m, ld), PAD, cp.float32)
        d = store[:, :n]
    c = rng.standard_normal(tuple(shape), dtype=cp.float32) * 10
    d[...] = c
    return store, d, c


def check(got, c, da, db, x=None, y=None):
    """got (FP32) against c + da . db^T in float64 (da, db dequantized), and DeepGEMM's metric against the BF16
    data's product when given."""
    got64, c64 = got.astype(cp.float64), c.astype(cp.float64)
    prod = da @ db.T
    want = c64 + prod
    mag = cp.abs(c64) + cp.abs(da) @ cp.abs(db).T
    assert bool(cp.isfinite(got64).all())
    err = cp.abs(got64 - want)
    tol = FP8_ACCUM_EPS * mag + 2.0**-20 * cp.abs(want) + 1e-30
    beyond = int((err > tol).sum())
    rel = rel_fro(got64 - c64, prod) if float(cp.linalg.norm(prod)) else float(cp.abs(got64 - c64).max())
    diff = None
    if x is not None and x.shape[1]:
        ref = c64 + bf16_to_f64(x) @ bf16_to_f64(y).T
        diff = calc_diff(got64, ref)
    print(f"  {tuple(got.shape)}: rel_fro {rel:.2e}, max err / allowance {float((err / tol).max()):.3f}, "
          f"calc_diff {diff if diff is None else f'{diff:.2e}'}")
    assert beyond == 0 and rel < REL_LIMIT, (beyond, rel, float(err.max()))
    assert diff is None or diff < 1e-3, diff
    return rel


# ------------------------------------------------------------------------------------------------ dense
def run_dense(m, n, k, seed, cfg=None, ld_d=None):
    rng = cp.random.default_rng(seed)
    x, a, sa = quantize(m, k, rng)
    y, b, sb = quantize(n, k, rng)
    store, d, c = residual_in((m, n), ld_d or n, rng)
    used = wgrad_fp8_fp8_fp32_nt(a, m_major(sa), b, m_major(sb), d, cfg=cfg)
    cp.cuda.get_current_stream().synchronize()
    check(d, c, dequant_rows(a, sa, 1), dequant_rows(b, sb, 1), x, y)
    if (ld_d or n) > n:
        assert bool((store[:, n:] == PAD).all()), "D's row padding was written"
    return used, (a, sa, b, sb, c)


@pytest.mark.parametrize("m,n,k", [(256, 384, 1024), (300, 200, 4096 + 48), (2048, 7168, 4096), (1, 64, 16),
                                   (77, 2112, 560)])
def test_dense_chosen_config(m, n, k):
    run_dense(m, n, k, seed=m + n + k)


def test_dense_strided_out():
    run_dense(200, 300, 1040, seed=3, ld_d=300 + 20)


DENSE_VARIANTS = {
    # Multicast pairs over an odd block count: the last pair's second tile lies past N (M), writes nothing.
    "128x128-mcA-odd-n": dict(bm=128, bn=128, multicast=1, num_sms=8, n=600),  # 5 n blocks
    "128x128-mcB-odd-m": dict(bm=128, bn=128, multicast=2, num_sms=8, m=850),  # 7 m blocks
    "128x144-2stages": dict(bm=128, bn=144, num_stages=2, num_sms=6),
    "128x152": dict(bm=128, bn=152, num_sms=6),  # the chooser's wide tile: one unswizzled slab of 152 floats
    "128x152-swz32": dict(bm=128, bn=152, swizzle=32, num_sms=6),  # 19 slabs of 8 floats
    "128x152-mcA": dict(bm=128, bn=152, multicast=1, num_sms=6, n=600),  # 4 n blocks, the last partial
    # B shared whole (the first CTA loads all 152 rows into both) over 7 m blocks: the last pair's second tile is
    # past M and reads the peer's B.
    "128x152-mcB-whole-odd-m": dict(bm=128, bn=152, multicast=2, b_whole=True, num_sms=6, m=850),
    # D prefetched into L2 two K blocks before each tile's end (the chooser's short dense kernels), over 7 m blocks:
    # the last pair's second tile prefetches nothing past M.
    "128x152-mcB-whole-dprefetch-odd-m": dict(bm=128, bn=152, multicast=2, b_whole=True, d_prefetch=2, num_sms=6,
                                              m=850),
    "128x144-9slabs-dprefetch-all-k": dict(bm=128, bn=144, swizzle=64, d_prefetch=64, num_sms=6),  # at the first block
    "64x40-unswizzled": dict(bm=64, bn=40, swizzle=0, num_sms=7),
    "128x96-2acc": dict(bm=128, bn=96, two_acc_sets=True, num_sms=6),
    "64x128-2acc": dict(bm=64, bn=128, two_acc_sets=True, num_sms=6),
    "64x160": dict(bm=64, bn=160, num_sms=5),
    "128x128-1slab": dict(bm=128, bn=128, staged_slabs=1, num_sms=6),
    "128x112-swz64-2slabs": dict(bm=128, bn=112, staged_slabs=2, num_sms=6),
    "64x48-swz32": dict(bm=64, bn=48, swizzle=32, num_sms=7),
    "128x64-raster2": dict(bm=128, bn=64, raster=2, num_sms=9),
}


@pytest.mark.parametrize("name", sorted(DENSE_VARIANTS))
def test_dense_config_variants(name):
    fields = dict(DENSE_VARIANTS[name])
    m, n, k = fields.pop("m", 1000), fields.pop("n", 720), 1040 + 4096 * (name == "64x128-2acc")  # 41 K blocks:
    # two-set chunks and a remainder
    cfg = dense_cfg(n, k, fields.pop("bm"), fields.pop("bn"), **fields)
    run_dense(m, n, k, seed=len(name), cfg=cfg, ld_d=n + 4)


@pytest.mark.parametrize("cfg_name", [None, "128x128-mcB-odd-m"])
def test_dense_bitwise_repeatable(cfg_name):
    m, n, k = 600, 520, 2096
    cfg = None
    if cfg_name:
        fields = dict(DENSE_VARIANTS[cfg_name])
        fields.pop("m", None), fields.pop("n", None)
        cfg = dense_cfg(n, k, fields.pop("bm"), fields.pop("bn"), **fields)
    _, (a, sa, b, sb, c) = run_dense(m, n, k, seed=11, cfg=cfg)
    outs = []
    for _ in range(2):
        d = c.copy()
        wgrad_fp8_fp8_fp32_nt(a, m_major(sa), b, m_major(sb), d, cfg=cfg)
        outs.append(d)
    assert bool((outs[0].view(cp.uint32) == outs[1].view(cp.uint32)).all())


def test_dense_d_prefetch_changes_no_bit():
    """The chooser's pick prefetches D for 2096 tokens; without the prefetch every output bit is the same."""
    m, n, k = 600, 520, 2096
    pick = cw.choose_wgrad_config(cw.KIND_WGRAD, m, n, k, 1, get_num_sms())
    assert pick.d_prefetch == 2
    _, (a, sa, b, sb, c) = run_dense(m, n, k, seed=12, cfg=pick)
    outs = []
    for cfg in (pick, dataclasses.replace(pick, d_prefetch=0)):
        d = c.copy()
        wgrad_fp8_fp8_fp32_nt(a, m_major(sa), b, m_major(sb), d, cfg=cfg)
        outs.append(d)
    assert bool((outs[0].view(cp.uint32) == outs[1].view(cp.uint32)).all())


# ------------------------------------------------------------------------------------------------ k-grouped
class Grouped:
    """Flat A/B e4m3 bits, stacked M-/N-major scales and the BF16 data of each group; `extra_k` / `extra_rows`
    leave room to reinterpret the same buffers with other sizes."""

    def __init__(self, m, n, sizes, rng, extra_k=0, extra_rows=0):
        self.m, self.n, self.sizes = m, n, list(sizes)
        self.x, self.y, a_parts, b_parts, sa_parts, sb_parts = [], [], [], [], [], []
        for k in sizes:
            x, a, sa = quantize(m, k, rng)
            y, b, sb = quantize(n, k, rng)
            self.x.append(x), self.y.append(y)
            a_parts.append(a.reshape(-1)), b_parts.append(b.reshape(-1))
            sa_parts.append(m_major(sa)), sb_parts.append(m_major(sb))
        # Spare room: valid e4m3 bits (a cast of randn) and positive scales.
        _, spare_a, _ = quantize(1, (m + n) * extra_k + 16, rng)
        spare = spare_a.reshape(-1)
        a_parts.append(spare[:m * extra_k]), b_parts.append(spare[m * extra_k:(m + n) * extra_k])
        mp, np_ = -(-m // 4) * 4, -(-n // 4) * 4
        sa_parts.append(rng.uniform(0.5, 2.0, (extra_rows, mp), dtype=cp.float32) / 448)
        sb_parts.append(rng.uniform(0.5, 2.0, (extra_rows, np_), dtype=cp.float32) / 448)
        self.a, self.b = cp.concatenate(a_parts), cp.concatenate(b_parts)
        self.sfa = cp.ascontiguousarray(cp.concatenate([s.reshape(-1, mp) for s in sa_parts]))
        self.sfb = cp.ascontiguousarray(cp.concatenate([s.reshape(-1, np_) for s in sb_parts]))

    def operands(self, sizes):
        """Per group (da, db) dequantized from the flat buffers as the kernel reads them for `sizes` (None: empty)."""
        out, k0, r0 = [], 0, 0
        for k in sizes:
            kb = -(-k // 128)
            if k == 0:
                out.append(None)
            else:
                a = self.a[self.m * k0:self.m * (k0 + k)].reshape(self.m, k)
                b = self.b[self.n * k0:self.n * (k0 + k)].reshape(self.n, k)
                sa = cp.ascontiguousarray(self.sfa[r0:r0 + kb, :self.m].T)
                sb = cp.ascontiguousarray(self.sfb[r0:r0 + kb, :self.n].T)
                out.append((dequant_rows(a, sa, 1), dequant_rows(b, sb, 1)))
            k0, r0 = k0 + k, r0 + kb
        return out

    def check(self, d, c, sizes, with_data=True):
        for g, ops in enumerate(self.operands(sizes)):
            if ops is None:
                assert bool((d[g].view(cp.uint32) == c[g].view(cp.uint32)).all()), f"empty group {g} was written"
            else:
                xy = (self.x[g], self.y[g]) if with_data else (None, None)
                check(d[g], c[g], *ops, *xy)


def run_grouped(m, n, sizes, seed, cfg=None, ld_d=None, group_gap=0):
    rng = cp.random.default_rng(seed)
    grp = Grouped(m, n, sizes, rng)
    store, d, c = residual_in((len(sizes), m, n), ld_d or n, rng, group_gap)
    ws = k_grouped_wgrad_fp8_fp8_fp32_nt(grp.a, grp.sfa, grp.b, grp.sfb, d, cp.asarray(sizes, dtype=cp.int32),
                                         cfg=cfg, expected_k=max(sizes))
    cp.cuda.get_current_stream().synchronize()
    grp.check(d, c, sizes)
    assert workspace_header(ws) == (sum(1 for s in sizes if s), 0)
    if (ld_d or n) > n:
        assert bool((store[:, :, n:] == PAD).all()), "D's row padding was written"
    if group_gap:
        assert bool((store[:, m:, :] == PAD).all()), "the gap between D's groups was written"
    return grp, store, d, c, ws


@pytest.mark.parametrize("m,n,sizes", [(300, 200, [4096 + 48, 0, 128, 16]), (2048, 7168, [4096, 3968, 4224, 4096]),
                                       (7168, 4096, [0, 512]), (129, 72, [16, 32, 48, 0, 0, 272, 1040, 16, 4096])])
def test_k_grouped_chosen_config(m, n, sizes):
    run_grouped(m, n, sizes, seed=m + n + len(sizes))


def test_k_grouped_strided_out_and_group_gap():
    run_grouped(200, 136, [160, 0, 1040], seed=5, ld_d=136 + 8, group_gap=3)


GROUPED_VARIANTS = {
    "128x128": dict(bm=128, bn=128, num_sms=6),
    "128x144-2stages": dict(bm=128, bn=144, num_stages=2, num_sms=5),
    "128x96-2acc": dict(bm=128, bn=96, two_acc_sets=True, num_sms=6),
    "64x128-2acc": dict(bm=64, bn=128, two_acc_sets=True, num_sms=6),
    "64x160": dict(bm=64, bn=160, num_sms=4),
    "128x128-1slab": dict(bm=128, bn=128, staged_slabs=1, num_sms=6),
    "64x48-swz32": dict(bm=64, bn=48, swizzle=32, num_sms=7),
    # the 16-token group's one K block prefetches D at its first
    "128x128-dprefetch": dict(bm=128, bn=128, d_prefetch=2, num_sms=6),
}


@pytest.mark.parametrize("name", sorted(GROUPED_VARIANTS))
def test_k_grouped_config_variants(name):
    m, n, sizes = 300, 400, [1040, 0, 16, 4096 + 48, 272]
    fields = dict(GROUPED_VARIANTS[name])
    cfg = grouped_cfg(m, n, fields.pop("bm"), fields.pop("bn"), **fields)
    run_grouped(m, n, sizes, seed=len(name), cfg=cfg, ld_d=n + 4)


@pytest.mark.parametrize("multicast,m,n,bn", [(1, 300, 400, 128), (2, 500, 136, 144), (2, 500, 300, 152)])
def test_k_grouped_multicast(multicast, m, n, bn):
    """2-CTA clusters sharing A (pairs of n blocks: 4 of 128) or B (pairs of m blocks: 4 of 128; 152 wide: the
    first CTA loads the whole B tile, the chooser's k-grouped pick), across empty groups and groups of a few K blocks,
    so that a pair's CTAs change group together."""
    cfg = grouped_cfg(m, n, 128, bn, multicast=multicast, num_sms=6, b_whole=multicast == 2 and bn % 16 != 0)
    run_grouped(m, n, [1040, 0, 16, 4096 + 48, 272], seed=multicast + bn, cfg=cfg, ld_d=n + 4)


def test_k_grouped_changed_sizes_on_the_same_buffers():
    """A second launch on the same buffers (and workspace) with other sizes reads them as the new sizes say."""
    m, n = 300, 200
    first, second = [4096 + 48, 0, 128, 16], [16, 272, 0, 4000]
    rng = cp.random.default_rng(21)
    grp = Grouped(m, n, first, rng, extra_rows=8)
    batch = cp.asarray(first, dtype=cp.int32)
    _, d, c = residual_in((4, m, n), n, rng)
    ws = k_grouped_wgrad_fp8_fp8_fp32_nt(grp.a, grp.sfa, grp.b, grp.sfb, d, batch)
    cp.cuda.get_current_stream().synchronize()
    grp.check(d, c, first)
    batch.set(np.asarray(second, np.int32))
    d[...] = c
    k_grouped_wgrad_fp8_fp8_fp32_nt(grp.a, grp.sfa, grp.b, grp.sfb, d, batch, workspace=ws)
    cp.cuda.get_current_stream().synchronize()
    grp.check(d, c, second, with_data=False)
    assert workspace_header(ws) == (3, 0)


def test_k_grouped_bitwise_repeatable():
    grp, _, d, c, _ = run_grouped(250, 330, [1040, 16, 0, 2000 + 48], seed=8, ld_d=332)  # FP32 rows: 16-byte aligned
    outs = []
    for _ in range(2):
        e = cp.zeros(c.shape[:-1] + (332,), cp.float32)[..., :330]  # FP32 rows 16-byte aligned, as d's
        e[...] = c
        k_grouped_wgrad_fp8_fp8_fp32_nt(grp.a, grp.sfa, grp.b, grp.sfb, e, cp.asarray(grp.sizes, dtype=cp.int32))
        outs.append(e)
    assert bool((outs[0].view(cp.uint32) == outs[1].view(cp.uint32)).all())
    assert bool((outs[0].view(cp.uint32) == d.view(cp.uint32)).all())


def test_k_grouped_all_empty():
    rng = cp.random.default_rng(2)
    grp = Grouped(64, 64, [0, 0, 0], rng, extra_k=128, extra_rows=1)
    _, d, c = residual_in((3, 64, 64), 64, rng)
    ws = k_grouped_wgrad_fp8_fp8_fp32_nt(grp.a, grp.sfa, grp.b, grp.sfb, d, cp.zeros(3, cp.int32))
    cp.cuda.get_current_stream().synchronize()
    assert bool((d.view(cp.uint32) == c.view(cp.uint32)).all())
    assert workspace_header(ws) == (0, 0)


def test_k_grouped_invalid_sizes_are_skipped():
    """A size that is not a multiple of 16 is skipped and counted, and so is every later group (its A would not be
    16-byte aligned); so is a group reaching past the operands. D of skipped groups stays as it was."""
    m, n = 64, 48
    rng = cp.random.default_rng(4)
    grp = Grouped(m, n, [32], rng, extra_k=96, extra_rows=2)
    _, d, c = residual_in((4, m, n), n, rng)
    sizes = [32, 24, 16, 0]
    ws = k_grouped_wgrad_fp8_fp8_fp32_nt(grp.a, grp.sfa, grp.b, grp.sfb, d, cp.asarray(sizes, dtype=cp.int32))
    cp.cuda.get_current_stream().synchronize()
    assert workspace_header(ws) == (1, 2)
    grp.check(d, c, [32, 0, 0, 0], with_data=False)
    d[...] = c
    too_long = [32, 4096, 16, -5]  # the flat buffers hold 128 tokens (group 2 starts past them); negative: invalid
    k_grouped_wgrad_fp8_fp8_fp32_nt(grp.a, grp.sfa, grp.b, grp.sfb, d, cp.asarray(too_long, dtype=cp.int32),
                                    workspace=ws)
    cp.cuda.get_current_stream().synchronize()
    assert workspace_header(ws) == (1, 3)
    grp.check(d, c, [32, 0, 0, 0], with_data=False)


def test_k_grouped_many_groups():
    """300 groups (more than one scan chunk of the prep kernel, 38 prep CTAs), most of them empty or tiny."""
    sizes = [0 if i % 3 else 16 * (1 + i % 5) for i in range(300)]
    sizes[7] = 400
    run_grouped(72, 56, sizes, seed=9)


def test_k_grouped_cuda_graph_replay_with_new_sizes():
    """Captured once (prep kernel + GEMM), replayed with batch_sizes changed in place between replays: each replay
    computes with the sizes the device holds at replay time."""
    m, n = 260, 300
    sets = [[1040, 0, 272, 16], [16, 2096, 0, 0], [0, 0, 0, 0], [400, 400, 400, 128]]
    rng = cp.random.default_rng(13)
    grp = Grouped(m, n, sets[0], rng, extra_k=max(map(sum, sets)), extra_rows=16)
    stream = cp.cuda.Stream(non_blocking=True)
    batch = cp.asarray(sets[0], dtype=cp.int32)
    ws = cp.empty(cw.workspace_bytes(4), cp.uint8)
    _, d, c = residual_in((4, m, n), n, rng)
    cfg = cw.choose_wgrad_config(cw.KIND_K_GROUPED, m, n, 1024, 4, 132)
    with stream:
        k_grouped_wgrad_fp8_fp8_fp32_nt(grp.a, grp.sfa, grp.b, grp.sfb, d, batch, workspace=ws, cfg=cfg,
                                        stream=stream)  # loads the kernels before the capture
        stream.synchronize()
        stream.begin_capture()
        k_grouped_wgrad_fp8_fp8_fp32_nt(grp.a, grp.sfa, grp.b, grp.sfb, d, batch, workspace=ws, cfg=cfg,
                                        stream=stream)
        graph = stream.end_capture()
    for i, sizes in enumerate(sets):
        with stream:
            batch.set(np.asarray(sizes, np.int32), stream=stream)
            d[...] = c
        graph.launch(stream)
        stream.synchronize()
        grp.check(d, c, sizes, with_data=i == 0)
        assert workspace_header(ws) == (sum(1 for s in sizes if s), 0)


# ------------------------------------------------------------------------------------------------ k-grouped, columns
def moe_operands(t, m, n, seed):
    """A MoE layer's weight-gradient operands: dY [T, M] and X [T, N] in BF16, cast transposed (A = dY^T [M, T],
    B = X^T [N, T], scales [rows, ceil(T/128)] row-major), as the layers make them."""
    rng = cp.random.default_rng(seed)
    dy, x = randn_bf16((t, m), rng), randn_bf16((t, n), rng)
    a, sa = cupygemm.per_token_cast_to_fp8_transposed(dy)
    b, sb = cupygemm.per_token_cast_to_fp8_transposed(x)
    return dy, x, a, sa, b, sb, rng


@pytest.mark.parametrize("m,n,sizes", [(256, 384, [512, 0, 128, 384 + 48]), (2048, 7168, [1024, 896, 1152, 1024]),
                                       (300, 200, [128, 128, 0, 0, 256, 16])])
def test_k_grouped_columns_against_each_groups_columns(m, n, sizes):
    """out[g] += A[:, cols_g] . B[:, cols_g]^T for the consecutive column ranges of the transposed casts, with the
    sizes on the device (the last group ends anywhere; an empty group keeps out[g])."""
    t = sum(sizes) + 32  # columns past the groups are never read
    dy, x, a, sa, b, sb, rng = moe_operands(t, m, n, seed=m + len(sizes))
    _, d, c = residual_in((len(sizes), m, n), n, rng)
    got = cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns((a, sa), (b, sb), d, cp.asarray(sizes, cp.int32))
    assert got is d
    cp.cuda.get_current_stream().synchronize()
    da, db = dequant_rows(a, sa, 1), dequant_rows(b, sb, 1)
    off = 0
    for g, k in enumerate(sizes):
        if k:
            check(d[g], c[g], da[:, off:off + k], db[:, off:off + k], dy[off:off + k].T, x[off:off + k].T)
        else:
            assert bool((d[g].view(cp.uint32) == c[g].view(cp.uint32)).all())
        off += k
    again = cp.array(c)
    cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns((a, sa), (b, sb), again, sizes)  # a host list
    assert bool((again.view(cp.uint32) == d.view(cp.uint32)).all()), "not bitwise repeatable"


def test_k_grouped_columns_misaligned_group_is_skipped_on_the_device_and_refused_on_the_host():
    """A group starting off a 128-column boundary would read another group's scale blocks: the kernel skips it (and
    every later one, which starts off the boundary too), a host list is refused before any launch."""
    m, n, sizes = 64, 96, [128, 48, 128]
    _, _, a, sa, b, sb, rng = moe_operands(512, m, n, seed=3)
    _, d, c = residual_in((3, m, n), n, rng)
    cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns((a, sa), (b, sb), d, cp.asarray(sizes, cp.int32))
    cp.cuda.get_current_stream().synchronize()
    check(d[0], c[0], dequant_rows(a, sa, 1)[:, :128], dequant_rows(b, sb, 1)[:, :128])
    assert bool((d[2].view(cp.uint32) == c[2].view(cp.uint32)).all())
    with pytest.raises(ValueError, match="group 2 starts at column 176"):
        cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns((a, sa), (b, sb), d, sizes)
