"""Dense FP8 GEMM on the GPU: seed and awkward shapes, kernel variants, layouts, frameworks."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from seed_shapes import NORMAL

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

import cupygemm  # noqa: E402
from cupygemm import config as C  # noqa: E402
from gpu_helpers import (  # noqa: E402
    bf16_to_f64,
    calc_diff,
    check_against_reference,
    grouped_weights,
    make_normal,
    poison_bf16,
    randn_bf16,
    ref_normal,
)

BF16 = cupygemm.tensors.BF16


def run_and_check(m, n, k, seed=0, sfa_col_major=False):
    a, sfa, b, sfb, x, y = make_normal(m, n, k, seed)
    if sfa_col_major:
        sfa = cupygemm.get_col_major_tma_aligned_tensor(sfa)
    out = poison_bf16((m, n))
    res = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)
    assert res is out
    want, mag = ref_normal(a, sfa, b, sfb)
    stats = check_against_reference(out, want, mag)
    stats["size"] = m * n
    stats["calc_diff"] = calc_diff(bf16_to_f64(out), bf16_to_f64(x) @ bf16_to_f64(y).T)
    out2 = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    stats["repeat_identical"] = bool((out2.view(cp.uint16) == out.view(cp.uint16)).all())
    return stats


def assert_good(stats, what):
    assert stats["finite"], f"{what}: non-finite output (unwritten elements?) {stats}"
    assert stats["beyond_one_ulp"] == 0, f"{what}: {stats}"
    assert stats["rel_fro"] < 3e-3, f"{what}: {stats}"  # BF16 output rounding is ~1.7e-3
    # DeepGEMM's gate is 1e-3; on outputs of a few elements the statistic itself is noisy.
    assert stats["calc_diff"] < (1e-3 if stats["size"] >= 1024 else 3e-3), f"{what}: {stats}"
    assert stats["repeat_identical"], f"{what}: repeated runs differ"


@pytest.mark.parametrize("m,n,k", NORMAL)
def test_seed_shapes(m, n, k):
    stats = run_and_check(m, n, k)
    print(f"{m}x{n}x{k}: {stats}")
    assert_good(stats, f"{m}x{n}x{k}")


@pytest.mark.parametrize("m,n,k", list(itertools.product((1, 7, 65, 129, 1000), (8, 24, 136, 2056), (128, 576, 7168))))
def test_awkward_shapes(m, n, k):
    assert_good(run_and_check(m, n, k, seed=m * 7 + n + k), f"{m}x{n}x{k}")


# Kernel variants the heuristic may not pick for the seed shapes: every output swizzle, tiles straddling
# 128-column scale blocks (1, 2 or 3 B scales per tile), block_m 256, split-N accumulation.
VARIANTS = [
    (64, 16, None), (64, 24, None), (64, 40, None), (64, 112, None), (64, 144, None), (64, 176, 88),
    (64, 256, 128), (128, 64, None), (128, 112, None), (128, 136, None), (128, 160, None),
    (128, 168, None), (128, 256, 64), (256, 64, None), (256, 80, None), (256, 128, 64),
]


def check_with_override(m, n, k, fields, seed, what):
    """Run and check a normal GEMM with the config fields forced for (N, K), then hand back to the model."""
    C.override_config("normal", n, k, **fields)
    try:
        assert_good(run_and_check(m, n, k, seed=seed), what)
    finally:
        C.override_config("normal", n, k)


@pytest.mark.parametrize("bm,bn,wn", VARIANTS)
def test_kernel_variants(bm, bn, wn):
    m, n, k = 1000, 1160, 1408  # ragged in M and N, K not a multiple of 128 blocks of the tile
    fields = dict(block_m=bm, block_n=bn, **({"wgmma_n": wn} if wn else {}))
    check_with_override(m, n, k, fields, bm + bn, f"block {bm}x{bn}/{wn}")


@pytest.mark.parametrize("bm,bn,mc", [(64, 16, 1), (64, 64, 2), (128, 128, 1), (128, 128, 2), (128, 160, 2),
                                      (128, 112, 1), (256, 64, 2), (64, 80, 2)])
def test_multicast_variants(bm, bn, mc):
    m, n, k = 1024, 1280, 1408  # even block counts along M and N for these tiles
    check_with_override(m, n, k, dict(block_m=bm, block_n=bn, multicast=mc), bm + bn + mc,
                        f"block {bm}x{bn} multicast {mc}")


@pytest.mark.parametrize("bn,mc,k", [(128, 0, 1408), (128, 1, 1408), (128, 2, 1408), (104, 0, 576), (64, 0, 128),
                                     (120, 1, 1408)])
def test_serial_m_variants(bn, mc, k):
    """256-row tiles whose warpgroups run their two m64 sub-tiles one after the other."""
    m, n = 1000 if mc != 2 else 1024, 1280 if bn != 120 else 1200
    check_with_override(m, n, k, dict(block_m=256, block_n=bn, multicast=mc, serial_m=True), bn + mc + k,
                        f"serial 256x{bn} multicast {mc} K={k}")


@pytest.mark.parametrize("raster", [1, 3, 8, 13])
def test_raster_stripes(raster):
    """Raster stripes of any width, the last one partial: 13 multicast pairs of n blocks in stripes of 1, 3, 8, 13."""
    m, n, k = 1000, 26 * 128, 576
    check_with_override(m, n, k, dict(block_m=256, block_n=128, multicast=1, serial_m=True, raster_n=raster),
                        raster, f"raster stripes of {raster} pairs")


@pytest.mark.parametrize("bm,m,extra", [(256, 769, {}), (256, 833, {"multicast": 1}), (256, 897, {}),
                                        (256, 769, {"split_k": 3}), (128, 1025, {}), (128, 1025, {"multicast": 1}),
                                        (192, 1000, {}), (192, 1100, {"multicast": 1}), (192, 1024, {})])
def test_last_block_with_empty_subtiles(bm, m, extra):
    """The last m block ends inside a warpgroup's first sub-tile (or before its rows): the empty m64 sub-tiles are
    skipped (and with A multicast, the A half past the last row is not loaded)."""
    k, n = 1408, 1280
    fields = dict(block_m=bm, block_n=128, serial_m=bm == 256, **extra)
    check_with_override(m, n, k, fields, bm + m, f"{bm}x128 M={m} {extra}")


@pytest.mark.parametrize("bn,mc,k", [(128, 0, 1408), (128, 1, 512), (96, 0, 1408), (120, 1, 576), (16, 0, 128),
                                     (56, 1, 1408)])
def test_three_warpgroup_variants(bn, mc, k):
    """192-row tiles, one m64 sub-tile per math warpgroup (straddling widths, A multicast, a single K block)."""
    m, n = 1000, 1200 if bn == 120 else 1232 if bn == 56 else 1280
    check_with_override(m, n, k, dict(block_m=192, block_n=bn, multicast=mc), bn + mc + k,
                        f"192x{bn} multicast {mc} K={k}")


@pytest.mark.parametrize("bn,mc,k", [(16, 0, 1408), (64, 0, 128), (112, 0, 1408), (128, 2, 1408), (64, 1, 256),
                                     (176, 0, 640)])
def test_interleave_k_variants(bn, mc, k):
    """Two warpgroups on alternate K blocks of one 64-row tile (odd and single K-block counts included)."""
    m, n = 1024, 1280
    check_with_override(m, n, k, dict(block_m=64, block_n=bn, multicast=mc, interleave_k=True), bn + mc + k,
                        f"interleaved K 64x{bn} multicast {mc} K={k}")


@pytest.mark.parametrize("bm,bn,ks,extra,m,k", [
    (64, 128, 2, {}, 1000, 1408), (64, 128, 11, {}, 1000, 1408), (64, 16, 5, {}, 200, 1408),
    (64, 128, 3, {"interleave_k": True}, 1000, 4096), (128, 128, 4, {}, 1000, 1408), (128, 160, 3, {}, 1000, 1408),
    (128, 128, 2, {"multicast": 2}, 1024, 1408), (128, 128, 2, {"multicast": 1}, 1000, 1408),
    (256, 128, 2, {"serial_m": True}, 1000, 1408),
    (64, 128, 4, {}, 64, 7168), (128, 256, 4, {"wgmma_n": 128}, 128, 2112),
])
def test_split_k_variants(bm, bn, ks, extra, m, k):
    """Split-K across CTAs: ragged tiles, one K block per split (11 of 11), uneven splits, with the other
    variants; the repeat check asserts the reduction is deterministic."""
    from cupygemm import workspace

    n = 1280
    check_with_override(m, n, k, dict(block_m=bm, block_n=bn, split_k=ks, **extra), bm + bn + ks,
                        f"{bm}x{bn} K over {ks} CTAs {extra} M={m} K={k}")
    for s in workspace._SCRATCH.sets.values():  # every kernel leaves its tile counters at zero for the next one
        assert int(s.counters.sum()) == 0


@pytest.mark.parametrize("bm,bn,extra,m,n,k", [
    (128, 128, {}, 100, 1280, 1408), (128, 128, {}, 300, 1280, 1408), (128, 128, {}, 1800, 1280, 1408),
    (128, 128, {}, 1000, 1280, 1408), (128, 128, {"multicast": 2}, 768, 1280, 1408),
    (128, 128, {"multicast": 1}, 1800, 1280, 7168), (64, 128, {}, 64, 1280, 7168),
    (256, 128, {"multicast": 1, "serial_m": True}, 1000, 1280, 1408), (128, 160, {}, 300, 1160, 1408),
])
def test_stream_k_tail_variants(bm, bn, extra, m, n, k):
    """Stream-K tail on a 16-CTA grid: fewer tiles than CTAs (10 of 16), R >= G/2 (30 -> 14 split), R < G/2
    (150 -> 22 split), none (80), B and A multicast, one math warpgroup, 256-row and straddling tiles."""
    from cupygemm import workspace

    check_with_override(m, n, k, dict(block_m=bm, block_n=bn, stream_k=True, num_sms=16, **extra), bm + m + k,
                        f"{bm}x{bn} stream-K {extra} M={m} K={k}")
    for s in workspace._SCRATCH.sets.values():
        assert int(s.counters.sum()) == 0


@pytest.mark.parametrize("m,n,k,fields", [
    (64, 2112, 7168, dict(block_m=64, block_n=32, split_k=2, interleave_k=True)),
    (128, 2112, 7168, dict(block_m=128, block_n=32, split_k=2)),
    (100, 1280, 4096, dict(block_m=64, block_n=32, split_k=2, interleave_k=True)),
    (64, 1280, 1408, dict(block_m=64, block_n=64, split_k=2)),
    (300, 1280, 1408, dict(block_m=128, block_n=64, split_k=2, num_sms=12)),
])
def test_split_k_clusters_match_global_memory(m, n, k, fields):
    """Split-K clusters (a tile's two splits as one cluster, met in the leader's shared memory) and two accumulator
    sets (where the tile has no interleaved K) give bit-identical output to the same splits met in global memory on
    one set, and pass the check: interleaved K (also over ragged rows), two row groups, one warpgroup, and a grid of
    6 clusters running 5 tiles each."""
    a, sfa, b, sfb, _, _ = make_normal(m, n, k, 5)
    outs = []
    for split_cluster in (True, False):
        for two in (False, True) if not fields.get("interleave_k") else (False,):
            C.override_config("normal", n, k, split_cluster=split_cluster, two_acc_sets=two, **fields)
            try:
                cfg = C.choose_config(C.KIND_NORMAL, m, n, k, 1, 132)
                assert (cfg.split_cluster, cfg.two_acc_sets) == (split_cluster, two)
                outs += [cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb)) for _ in range(2)]
            finally:
                C.override_config("normal", n, k)
    assert all((o.view(cp.uint16) == outs[0].view(cp.uint16)).all() for o in outs)
    want, mag = ref_normal(a, sfa, b, sfb)
    stats = check_against_reference(outs[0], want, mag)
    assert stats["finite"] and stats["beyond_one_ulp"] == 0, stats


@pytest.mark.parametrize("m,n,k,fields", [
    (100, 1160, 1408, dict(block_m=64, block_n=48)),  # straddling B scale blocks, 11 K blocks (a chunk of 4 and 3)
    (1, 2304, 1536, dict(block_m=64, block_n=96)),
    (200, 1280, 7168, dict(block_m=64, block_n=64, split_k=3)),
    (130, 1280, 1408, dict(block_m=128, block_n=32)),
    (70, 1344, 1408, dict(block_m=64, block_n=112, multicast=2)),  # one warpgroup, up to 128 wide, B multicast
    (33, 1280, 640, dict(block_m=64, block_n=128)),
])
def test_two_accumulator_sets_match_one(m, n, k, fields):
    """The K loop on two accumulator sets (the model's pick for one-warpgroup tiles) gives the one-set loop's output
    bit for bit, on ragged rows, split-K and two warpgroups too, and passes the check."""
    a, sfa, b, sfb, _, _ = make_normal(m, n, k, 7)
    outs = []
    for two in (True, False):
        C.override_config("normal", n, k, two_acc_sets=two, **fields)
        try:
            assert C.choose_config(C.KIND_NORMAL, m, n, k, 1, 132).two_acc_sets == two
            outs.append(cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb)))
        finally:
            C.override_config("normal", n, k)
    assert (outs[0].view(cp.uint16) == outs[1].view(cp.uint16)).all()
    want, mag = ref_normal(a, sfa, b, sfb)
    stats = check_against_reference(outs[0], want, mag)
    assert stats["finite"] and stats["beyond_one_ulp"] == 0, stats


def test_split_k_streams_and_graph():
    """Split-K scratch is per stream: GEMMs on two streams at once, and one replayed from a CUDA graph."""
    m, n, k = 128, 2048, 4096
    C.override_config("normal", n, k, block_m=64, block_n=128, split_k=4)
    try:
        ins = [make_normal(m, n, k, 40 + i)[:4] for i in range(2)]
        # SFA in the kernel's layout already: nothing is allocated while capturing.
        ins = [(a, cupygemm.get_col_major_tma_aligned_tensor(sfa), b, sfb) for a, sfa, b, sfb in ins]
        want = [cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb)) for a, sfa, b, sfb in ins]
        cp.cuda.Device().synchronize()  # inputs and want come from the default stream; the streams are non-blocking
        streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
        outs = [cp.empty((m, n), want[0].dtype) for _ in range(2)]
        for _ in range(20):
            for (a, sfa, b, sfb), s, o in zip(ins, streams, outs):
                with s:
                    cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), o)
            for w, s, o in zip(want, streams, outs):
                s.synchronize()
                assert (o.view(cp.uint16) == w.view(cp.uint16)).all()
        a, sfa, b, sfb = ins[0]
        with streams[0]:
            streams[0].begin_capture()
            cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), outs[0])
            graph = streams[0].end_capture()
            for _ in range(3):
                outs[0].view(cp.uint16).fill(0x7FC0)
                graph.launch(streams[0])
        streams[0].synchronize()
        assert (outs[0].view(cp.uint16) == want[0].view(cp.uint16)).all()
    finally:
        C.override_config("normal", n, k)


@pytest.mark.parametrize("m,n,k,fields", [
    (64, 2048, 1536, {}), (128, 1792, 2048, dict(block_m=64, block_n=112, multicast=2)),
    (100, 1280, 1408, dict(block_m=128, block_n=128, stream_k=True, num_sms=16)), (1000, 1024, 1024, {}),
])
def test_b_evict_first_gives_the_same_result(monkeypatch, m, n, k, fields):
    """B tiles loaded as first to evict from L2 (CUPYGEMM_B_EVICT_FIRST=1; the kernel uses it where one CTA or
    pair reads a B tile, M <= one row block) give bit-identical output to the normal priority, and pass the check."""
    a, sfa, b, sfb, _, _ = make_normal(m, n, k, 11)
    if fields:
        C.override_config("normal", n, k, **fields)
    try:
        outs = {}
        for mode in ("0", "1"):
            monkeypatch.setenv("CUPYGEMM_B_EVICT_FIRST", mode)
            outs[mode] = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    finally:
        C.override_config("normal", n, k)
    assert (outs["0"].view(cp.uint16) == outs["1"].view(cp.uint16)).all()
    want, mag = ref_normal(a, sfa, b, sfb)
    stats = check_against_reference(outs["1"], want, mag)
    assert stats["finite"] and stats["beyond_one_ulp"] == 0, stats


def test_few_stages_and_small_grid():
    m, n, k = 512, 1024, 4096
    check_with_override(m, n, k, dict(block_m=128, block_n=128, num_stages=1, num_sms=3), 0, "1 stage, 3 CTAs")


def test_sfa_layouts_agree():
    """Every SFA layout gives the M-major one's result bit for bit: row-major (the casts'), a padded row stride,
    column-major with an unaligned M stride, a broadcast column (zero stride) and, through the framework's
    copy, a negative stride."""
    m, n, k = 300, 1024, 1536
    a, sfa, b, sfb, _, _ = make_normal(m, n, k, 3)
    colmaj = cupygemm.get_col_major_tma_aligned_tensor(sfa)
    assert colmaj.strides == (4, 4 * cupygemm.get_tma_aligned_size(m, 4))
    col = cupygemm.gemm_fp8_fp8_bf16_nt((a, colmaj), (b, sfb))
    padded = cp.full((m, sfa.shape[1] + 5), cp.nan, cp.float32)[:, :sfa.shape[1]]
    padded[...] = sfa
    flipped = cp.ascontiguousarray(sfa[::-1])[::-1]
    assert flipped.strides[0] < 0
    for name, layout in [("row-major", sfa), ("padded rows", padded), ("column-major", cp.asfortranarray(sfa)),
                         ("negative stride", flipped)]:
        got = cupygemm.gemm_fp8_fp8_bf16_nt((a, layout), (b, sfb))
        assert (got.view(cp.uint16) == col.view(cp.uint16)).all(), name
    one_col = cp.broadcast_to(sfa[:, :1], sfa.shape)
    want = cupygemm.gemm_fp8_fp8_bf16_nt((a, cupygemm.get_col_major_tma_aligned_tensor(cp.ascontiguousarray(one_col))),
                                         (b, sfb))
    got = cupygemm.gemm_fp8_fp8_bf16_nt((a, one_col), (b, sfb))
    assert (got.view(cp.uint16) == want.view(cp.uint16)).all(), "broadcast"


def test_sfa_copy_survives_dropped_module_memos():
    """The SFA copy's launcher holds its module: dropping the build memo (as tests and cache tools do) must not
    unload the kernel under it (a bare function handle then launched as an illegal address)."""
    import gc

    from cupygemm.jit import build

    m, n, k = 64, 256, 1024
    a, sfa, b, sfb, _, _ = make_normal(m, n, k, 8)
    want = cupygemm.gemm_fp8_fp8_bf16_nt((a, cupygemm.get_col_major_tma_aligned_tensor(sfa)), (b, sfb))
    first = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    build._loaded.clear()
    gc.collect()
    again = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    cp.cuda.Device().synchronize()
    assert (first.view(cp.uint16) == want.view(cp.uint16)).all()
    assert (again.view(cp.uint16) == want.view(cp.uint16)).all()


def test_masked_sfa_layouts_agree():
    """Masked A scales [G, max_m, kb] as a slice of a larger array (padded group and row strides) agree bit for
    bit with the M-major layout."""
    rng = cp.random.default_rng(9)
    g, max_m, n, k = 3, 200, 512, 1024
    kb = k // 128
    a = cp.empty((g, max_m, k), cp.uint8)
    sfa = cp.empty((g, max_m, kb), cp.float32)
    for i in range(g):
        a[i], sfa[i] = cupygemm.per_token_cast_to_fp8(randn_bf16((max_m, k), rng))
    b, sfb = grouped_weights(g, n, k, rng)
    mm = cp.asarray(np.array([200, 57, 130], np.int32))
    big = cp.full((g, max_m + 3, kb + 2), cp.nan, cp.float32)
    sliced = big[:, 1:max_m + 1, 2:]
    sliced[...] = sfa
    outs = []
    for layout in (cupygemm.get_col_major_tma_aligned_tensor(sfa), sfa, sliced):
        out = cp.zeros((g, max_m, n), BF16)
        cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, layout), (b, sfb), out, mm, 128)
        outs.append(out.view(cp.uint16))
    assert (outs[0] == outs[1]).all() and (outs[0] == outs[2]).all()


def test_col_major_sfa_is_used_in_place():
    from cupygemm.kinds.forward import check_normal
    from cupygemm.tensors import read

    m, n, k = 260, 256, 512
    a, sfa, b, sfb, _, _ = make_normal(m, n, k, 4)
    colmaj = cupygemm.get_col_major_tma_aligned_tensor(sfa)
    views = [read(x, "x") for x in (a, colmaj, b, sfb)]
    assert check_normal(tuple(views) + (None,)).sfa_m_major  # no transposition kernel runs
    views[1] = read(sfa, "x")
    assert not check_normal(tuple(views) + (None,)).sfa_m_major


def test_padded_row_strides():
    m, n, k = 200, 264, 384
    a, sfa, b, sfb, _, _ = make_normal(m, n, k, 5)
    a_pad = cp.zeros((m, k + 64), dtype=cp.uint8)[:, :k]
    a_pad[...] = a
    out_big = poison_bf16((m, n + 8))
    out = out_big[:, :n]
    cupygemm.gemm_fp8_fp8_bf16_nt((a_pad, sfa), (b, sfb), out)
    ref = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    assert (out.view(cp.uint16) == ref.view(cp.uint16)).all()
    assert (out_big[:, n:].view(cp.uint16) == 0xFFFF).all(), "wrote outside the out view"


def test_empty_problems():
    a, sfa, b, sfb, _, _ = make_normal(64, 128, 256, 6)
    out = cupygemm.gemm_fp8_fp8_bf16_nt((a[:0], sfa[:0]), (b, sfb))
    assert out.shape == (0, 128)
    z = cupygemm.gemm_fp8_fp8_bf16_nt((a[:, :0], cp.zeros((64, 0), cp.float32)),
                                      (b[:, :0], cp.zeros((1, 0), cp.float32)))
    assert (bf16_to_f64(z) == 0).all()


def test_nan_scale_propagates_to_its_rows_only():
    m, n, k = 128, 256, 256
    a, sfa, b, sfb, _, _ = make_normal(m, n, k, 7)
    sfa = sfa.copy()
    sfa[5, 1] = np.nan
    out = bf16_to_f64(cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb)))
    assert cp.isnan(out[5]).all()
    assert cp.isfinite(out[np.r_[0:5, 6:m]]).all()


def test_torch_inputs_zero_copy():
    torch = pytest.importorskip("torch")
    m, n, k = 256, 512, 1024
    a, sfa, b, sfb, _, _ = make_normal(m, n, k, 8)
    ta = torch.from_dlpack(a).view(torch.float8_e4m3fn)
    tb = torch.from_dlpack(b).view(torch.float8_e4m3fn)
    tsfa, tsfb = torch.from_dlpack(sfa), torch.from_dlpack(sfb)
    out = cupygemm.gemm_fp8_fp8_bf16_nt((ta, tsfa), (tb, tsfb))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.is_cuda
    ref = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    assert torch.equal(out.view(torch.int16).cpu(), torch.from_dlpack(ref.view(cp.int16)).cpu())
    # Explicit torch out is written in place.
    tout = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    res = cupygemm.gemm_fp8_fp8_bf16_nt((ta, tsfa), (tb, tsfb), tout)
    assert res is tout and torch.equal(tout, out)


def test_jax_inputs():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    m, n, k = 128, 256, 512
    a, sfa, b, sfb, _, _ = make_normal(m, n, k, 9)
    ja = jax.dlpack.from_dlpack(a.view(cp.uint8))
    ja8 = jax.lax.bitcast_convert_type(ja, jnp.float8_e4m3fn)
    jb8 = jax.lax.bitcast_convert_type(jax.dlpack.from_dlpack(b), jnp.float8_e4m3fn)
    out = cupygemm.gemm_fp8_fp8_bf16_nt((ja8, jax.dlpack.from_dlpack(sfa)), (jb8, jax.dlpack.from_dlpack(sfb)))
    assert isinstance(out, jax.Array) and out.dtype == jnp.bfloat16
    ref = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    assert np.array_equal(np.asarray(jax.lax.bitcast_convert_type(out, jnp.uint16)), ref.view(cp.uint16).get())


def test_packed_launch_matches_cupy_launch():
    """The driver launch with a packed parameter buffer and CuPy's launch give bitwise the same output."""
    import dataclasses

    from cupygemm.contract import GEMM_PARAMS
    from cupygemm.jit.loader import PackedParams
    from cupygemm.launch import CupyLauncher, PackedLauncher
    from cupygemm.plan import plan_gemm

    m, n, k = 200, 2112, 1408
    a, sfa, b, sfb, _, _ = make_normal(m, n, k, 11)
    out_packed = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
    plan = plan_gemm(C.KIND_NORMAL, m, n, k, 1, a.device.id)  # the current device, not always 0
    assert isinstance(plan.launcher, PackedLauncher), "the driver should report parameter offsets (CUDA >= 12.4)"
    # CuPy's launch has no PDL attribute: the plan launches the PDL variant plainly then, as plan_gemm does.
    cupy_plan = dataclasses.replace(plan, launcher=CupyLauncher(plan.kernel.function, GEMM_PARAMS),
                                    _packed=PackedParams(4), pdl=False)
    sfa_mm = cupygemm.get_col_major_tma_aligned_tensor(sfa)
    out_cupy = cp.empty_like(out_packed)
    floats, counters = cupy_plan.scratch_floats, cupy_plan.scratch_counters
    part, cnt = cp.empty(max(floats, 1), cp.float32), cp.zeros(max(counters, 1), cp.uint32)
    cupy_plan.launch(cp.cuda.get_current_stream().ptr, a.data.ptr, sfa_mm.data.ptr, b.data.ptr, sfb.data.ptr,
                     out_cupy.data.ptr, 0, part.data.ptr if floats else 0, cnt.data.ptr if floats else 0)
    assert (out_packed.view(cp.uint16) == out_cupy.view(cp.uint16)).all()
