"""Grouped GEMMs on the GPU: contiguous and masked layouts, padding, CUDA graphs, bad indices."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

import cupygemm  # noqa: E402
from gpu_helpers import (  # noqa: E402
    check_against_reference,
    dequant_rows,
    grouped_weights,
    poison_bf16,
    randn_bf16,
)

POISON = 0xFFFF


def contiguous_layout(g, expected, rng_np, empty_groups=(), sizes=None):
    if sizes is None:
        sizes = [0 if i in empty_groups else int(expected * rng_np.uniform(0.7, 1.3)) for i in range(g)]
    idx = []
    for i, s in enumerate(sizes):
        padded = -(-s // 128) * 128
        idx += [i] * s + [-1] * (padded - s)
    return np.array(idx, np.int32), sizes


def run_contiguous(g, expected, n, k, seed, empty_groups=(), sizes=None, idx_host=None):
    rng, rng_np = cp.random.default_rng(seed), np.random.default_rng(seed)
    if idx_host is None:
        idx_host, _ = contiguous_layout(g, expected, rng_np, empty_groups, sizes)
    m = len(idx_host)
    a, sfa = cupygemm.per_token_cast_to_fp8(randn_bf16((m, k), rng))
    b, sfb = grouped_weights(g, n, k, rng)
    idx = cp.asarray(idx_host)
    out = poison_bf16((m, n))
    cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sfa), (b, sfb), out, idx)
    da = dequant_rows(a, sfa, 1)
    for gi in range(g):
        rows = cp.asarray(np.nonzero(idx_host == gi)[0])
        if rows.size == 0:
            continue
        db = dequant_rows(b[gi], sfb[gi], 128)
        want = da[rows] @ db.T
        stats = check_against_reference(out[rows], want, cp.abs(da[rows]) @ cp.abs(db).T)
        assert stats["finite"] and stats["beyond_one_ulp"] == 0 and stats["rel_fro"] < 3e-3, (gi, stats)
    pad = cp.asarray(np.nonzero(idx_host == -1)[0])
    if pad.size:
        assert (out[pad].view(cp.uint16) == POISON).all(), "padding rows were written"
    return out


@pytest.mark.parametrize("g,expected,n,k", [(1, 300, 512, 1024), (4, 700, 1024, 2048), (8, 256, 2112, 576),
                                            (32, 128, 512, 512), (4, 8192, 4096, 7168), (8, 512, 7168, 7168)])
def test_contiguous(g, expected, n, k):
    run_contiguous(g, expected, n, k, seed=g + n)


@pytest.mark.parametrize("mc", [0, 1])
def test_grouped_multicast_on_a(mc):
    from cupygemm import config as C

    n, k = 1024, 1024
    for kind in ("contiguous", "masked"):
        C.override_config(kind, n, k, block_m=128, block_n=128, multicast=mc)
    try:
        run_contiguous(4, 300, n, k, seed=5 + mc)
        run_masked(3, 384, n, k, [384, 0, 129], seed=6 + mc)
    finally:
        for kind in ("contiguous", "masked"):
            C.override_config(kind, n, k)


def test_grouped_interleave_k():
    from cupygemm import config as C

    n, k = 768, 1408
    for kind in ("contiguous", "masked"):
        C.override_config(kind, n, k, block_m=64, block_n=96, interleave_k=True)
    try:
        run_contiguous(3, 300, n, k, seed=21)
        run_masked(3, 200, n, k, [200, 0, 65], seed=22)
    finally:
        for kind in ("contiguous", "masked"):
            C.override_config(kind, n, k)


@pytest.mark.parametrize("raster", [3, 8])
def test_grouped_raster_stripes(raster):
    """Raster stripes narrower than N within each group's (masked) or all groups' (contiguous) row blocks: 13
    multicast pairs of 160-column blocks in stripes of 3 or 8, the last one partial."""
    from cupygemm import config as C

    n, k = 26 * 160, 1408
    for kind in ("contiguous", "masked"):
        C.override_config(kind, n, k, block_m=128, block_n=160, multicast=1, raster_n=raster)
    try:
        run_contiguous(3, 300, n, k, seed=43 + raster)
        run_masked(4, 384, n, k, [300, 0, 384, 129], seed=41 + raster, expected_m=256)
    finally:
        for kind in ("contiguous", "masked"):
            C.override_config(kind, n, k)


@pytest.mark.parametrize("mc", [0, 1])
def test_masked_serial_m(mc):
    """256-row tiles (serial m64 sub-tiles) in the masked layout: rows past masked_m inside a 256-row block."""
    from cupygemm import config as C

    n, k = 1024, 1408
    C.override_config("masked", n, k, block_m=256, block_n=128, multicast=mc, serial_m=True)
    try:
        run_masked(3, 640, n, k, [640, 0, 300], seed=31 + mc)
    finally:
        C.override_config("masked", n, k)


# Group sizes ending in every m64 sub-tile of a 256-row block (1..4 sub-tiles with rows), empty and full groups.
PARTIAL_BLOCK_SIZES = [1, 64, 65, 128, 129, 192, 193, 255, 256, 0, 257, 320, 449, 512]


@pytest.mark.parametrize("bm,bn,mc,serial", [(256, 128, 0, True), (256, 128, 1, True), (256, 112, 1, True),
                                             (128, 160, 1, False), (128, 128, 0, False)])
def test_masked_partial_blocks(bm, bn, mc, serial):
    """A group's last block with some m64 sub-tiles past masked_m: those sub-tiles' A boxes, MMAs and promotions are
    skipped (cuda_src/fp8_gemm.cu)."""
    from cupygemm import config as C

    n, k = 8 * bn, 1408  # an even number of n blocks (multicast pairs)
    C.override_config("masked", n, k, block_m=bm, block_n=bn, multicast=mc, serial_m=serial)
    try:
        run_masked(len(PARTIAL_BLOCK_SIZES), 512, n, k, PARTIAL_BLOCK_SIZES, seed=bm + bn + mc, expected_m=256)
    finally:
        C.override_config("masked", n, k)


# Stream-K tail cases on a 16-CTA grid (G = 16 clusters, or 8 pairs with multicast), T units in all: fewer units
# than clusters (all split along K), a remainder R >= G/2 (R units split), R < G/2 (R + G split), none (whole
# units only); partial last blocks, straddling scale blocks, 256-row tiles, 2 and 1 K blocks.
SK_CASES = [
    (128, 128, 0, False, 5, [300], 1408),  # T = 15 < 16
    (128, 128, 0, False, 5, [300, 200], 1408),  # T = 25, R = 9
    (128, 128, 0, False, 5, [300, 200, 256], 1408),  # T = 35, R = 3: 19 split
    (128, 128, 0, False, 5, [512, 512, 512, 512], 1408),  # T = 80, R = 0
    (128, 128, 1, False, 6, [300, 300], 1408),  # pairs: T = 18, G = 8, R = 2: 10 split
    (128, 160, 1, False, 8, [100], 1408),  # T = 4 < 8
    (128, 160, 1, False, 8, [300, 0], 256),  # T = 12, R = 4; pieces of 2 K blocks
    (256, 128, 1, True, 6, [300, 520, 1], 1408),  # T = 18, R = 2: 10 split
    (128, 128, 0, False, 5, [300, 200], 128),  # one K block: every piece is a whole unit
]


@pytest.mark.parametrize("bm,bn,mc,serial,n_blocks,masked,k", SK_CASES)
def test_masked_stream_k_tail(bm, bn, mc, serial, n_blocks, masked, k):
    """The last round's units split along K over all clusters (cuda_src/scheduler.cuh): correct, deterministic
    (a second run is bitwise identical whichever CTA reduces) and every arrival counter back at zero."""
    from cupygemm import config as C
    from cupygemm import workspace

    n = n_blocks * bn
    C.override_config("masked", n, k, block_m=bm, block_n=bn, multicast=mc, serial_m=serial, stream_k=True,
                      num_sms=16)
    try:
        a, sfa, b, sfb, out = run_masked(len(masked), max(masked), n, k, masked, seed=bm + bn + n + k)
        again = poison_bf16(out.shape)
        cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sfa), (b, sfb), again,
                                                       cp.asarray(np.array(masked, np.int32)), max(masked))
        assert (again.view(cp.uint16) == out.view(cp.uint16)).all(), "repeated run differs"
    finally:
        C.override_config("masked", n, k)
    for s in workspace._SCRATCH.sets.values():
        assert int(s.counters.sum()) == 0


@pytest.mark.parametrize("mc,serial", [(0, True), (1, True), (0, False)])
def test_contiguous_256_row_tiles(mc, serial):
    """256-row tiles in the contiguous layout. Padded group sizes 384, 0, 128, 256, 256, 128 put the 128-row blocks
    in the order g0 g0 | g0 g2 | g3 g3 | g4 g4 | g5 -: one block holds two groups (two half tiles), the last one
    ends after its first half."""
    from cupygemm import config as C

    n, k = 1024, 1408
    C.override_config("contiguous", n, k, block_m=256, block_n=128, multicast=mc, serial_m=serial)
    try:
        run_contiguous(6, 0, n, k, seed=41 + mc, sizes=[300, 0, 100, 256, 129, 1])
    finally:
        C.override_config("contiguous", n, k)


@pytest.mark.parametrize("mc,serial", [(0, True), (1, True), (0, False)])
def test_contiguous_half_tiles(mc, serial):
    """Half tiles, where both math warpgroups take one m64 sub-tile of a 256-row block's half: 128-row blocks
    g0 g0 | g0 g1 | g2 g1' with g1' the last 70 rows (M = 710, not a multiple of 128), so the second half tile of
    the last block has rows past the end; a row of g0's is padding (-1) inside the lower half of block 1."""
    from cupygemm import config as C

    n, k = 768, 1024
    idx = np.array([0] * 384 + [1] * 128 + [2] * 128 + [1] * 70, np.int32)
    idx[300] = -1
    C.override_config("contiguous", n, k, block_m=256, block_n=128, multicast=mc, serial_m=serial)
    try:
        run_contiguous(3, 0, n, k, seed=5 + mc, idx_host=idx)
    finally:
        C.override_config("contiguous", n, k)


def test_contiguous_with_empty_groups():
    run_contiguous(6, 300, 768, 1024, seed=11, empty_groups=(0, 3, 5))


def run_masked(g, max_m, n, k, masked, seed, expected_m=None):
    rng = cp.random.default_rng(seed)
    a = cp.empty((g, max_m, k), cp.uint8)
    sfa = cp.empty((g, max_m, -(-k // 128)), cp.float32)
    for i in range(g):
        a[i], sfa[i] = cupygemm.per_token_cast_to_fp8(randn_bf16((max_m, k), rng))
    b, sfb = grouped_weights(g, n, k, rng)
    out = poison_bf16((g, max_m, n))
    mm = cp.asarray(np.array(masked, np.int32))
    cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sfa), (b, sfb), out, mm,
                                                   expected_m if expected_m is not None else max(1, max(masked)))
    check_masked(a, sfa, b, sfb, out, masked)
    return a, sfa, b, sfb, out


def test_masked_b_evict_first(monkeypatch):
    """Groups of one row block and of several, with B tiles first to evict (CUPYGEMM_B_EVICT_FIRST=1) where a
    group's rows fit one block: checked, and bit-identical to the normal priority."""
    outs = []
    for mode in ("1", "0"):
        monkeypatch.setenv("CUPYGEMM_B_EVICT_FIRST", mode)
        outs.append(run_masked(6, 512, 1024, 2048, [1, 64, 0, 200, 512, 130], seed=21, expected_m=100)[4])
    assert (outs[0].view(cp.uint16) == outs[1].view(cp.uint16)).all()


def check_masked(a, sfa, b, sfb, out, masked):
    for gi, mg in enumerate(masked):
        mg = max(0, min(mg, a.shape[1]))
        if mg:
            da = dequant_rows(a[gi, :mg], sfa[gi, :mg], 1)
            db = dequant_rows(b[gi], sfb[gi], 128)
            stats = check_against_reference(out[gi, :mg], da @ db.T, cp.abs(da) @ cp.abs(db).T)
            assert stats["finite"] and stats["beyond_one_ulp"] == 0 and stats["rel_fro"] < 3e-3, (gi, stats)
        assert (out[gi, mg:].view(cp.uint16) == POISON).all(), f"group {gi}: rows past masked_m written"


@pytest.mark.parametrize("g,max_m,n,k,masked", [
    (1, 256, 512, 1024, [200]),
    (2, 512, 1024, 2048, [0, 512]),
    (4, 384, 2112, 576, [1, 383, 128, 64]),
    (32, 128, 256, 512, list(range(0, 128, 4))),
    (4, 4096, 4096, 7168, [256, 300, 190, 222]),
])
def test_masked(g, max_m, n, k, masked):
    run_masked(g, max_m, n, k, masked, seed=g + max_m)


def test_masked_decode_interleave_k_deep_tiles():
    """MoE decode: 8 groups of 11-20 rows, N=4096, K=7168 pick 64x128 interleaved-K tiles over 56 K blocks. With an
    odd stage count a warpgroup's parity wait passes early and the kernel crashes now and then (benchmarks/NOTES.md,
    "Interleaved K"), so the count must be even. Several calls, each checked."""
    from cupygemm import config as C

    cfg = C.choose_config(C.KIND_MASKED, 16, 4096, 7168, 8, 132)
    assert cfg.interleave_k and cfg.block_n == 128 and cfg.num_stages % 2 == 0
    for seed in range(3):
        masked = [int(v) for v in np.random.default_rng(seed).integers(11, 21, 8)]
        run_masked(8, 256, 4096, 7168, masked, seed=40 + seed, expected_m=16)


def test_masked_cuda_graph_replay_with_changing_masks():
    g, max_m, n, k = 4, 512, 1024, 1024
    a, sfa, b, sfb, out = run_masked(g, max_m, n, k, [10, 20, 30, 40], seed=3)
    sfa_cm = cupygemm.get_col_major_tma_aligned_tensor(sfa)
    mm = cp.zeros(g, cp.int32)
    # sfa_cm and mm's zeros are written on the default stream; the stream is non-blocking (and sets mm itself).
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sfa_cm), (b, sfb), out, mm, 256)  # load the kernel
        stream.begin_capture()
        cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a, sfa_cm), (b, sfb), out, mm, 256)
        graph = stream.end_capture()
    rng = np.random.default_rng(0)
    for trial in range(4):
        masked = [int(v) for v in rng.integers(0, max_m + 1, g)]
        if trial == 0:
            masked[0] = max_m
        with stream:
            out.view(cp.uint16).fill(POISON)
            mm.set(np.array(masked, np.int32), stream=stream)
            graph.launch(stream)
        stream.synchronize()
        check_masked(a, sfa, b, sfb, out, masked)


@pytest.mark.parametrize("block_m", [None, 256])
def test_out_of_range_indices_are_safe(block_m):
    """Bad m_indices / masked_m never fault; the context stays usable afterwards. With 256-row tiles the bad
    blocks pair up (7 | -5: skipped) and so do two groups (1 | 2: two half tiles)."""
    from cupygemm import config as C

    g, n, k = 3, 256, 512
    if block_m is not None:
        C.override_config("contiguous", n, k, block_m=block_m, block_n=128, serial_m=True)
    try:
        check_out_of_range_indices(g, n, k)
    finally:
        C.override_config("contiguous", n, k)


def check_out_of_range_indices(g, n, k):
    rng = cp.random.default_rng(0)
    b, sfb = grouped_weights(g, n, k, rng)
    m = 512
    a, sfa = cupygemm.per_token_cast_to_fp8(randn_bf16((m, k), rng))
    idx = cp.asarray(np.array([7] * 128 + [-5] * 128 + [1] * 100 + [99] * 28 + [2] * 128, np.int32))
    out = poison_bf16((m, n))
    cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sfa), (b, sfb), out, idx)
    cp.cuda.Device().synchronize()
    host = out.view(cp.uint16).get()
    assert (host[:256] == POISON).all() and (host[356:384] == POISON).all()
    assert (host[256:356] != POISON).any() and (host[384:] != POISON).any()
    a3 = cp.zeros((g, 128, k), cp.uint8)
    s3 = cp.ones((g, 128, k // 128), cp.float32)
    out3 = poison_bf16((g, 128, n))
    cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a3, s3), (b, sfb), out3,
                                                   cp.asarray(np.array([-3, 1000, 5], np.int32)), 64)
    cp.cuda.Device().synchronize()
    host3 = out3.view(cp.uint16).get()
    assert (host3[0] == POISON).all() and (host3[1] == 0).all() and (host3[2, :5] == 0).all()
    assert (host3[2, 5:] == POISON).all()
    # The context still computes correctly.
    run_contiguous(2, 200, 256, 256, seed=1)


def test_check_inputs_env_reports_bad_entries(monkeypatch):
    monkeypatch.setenv("CUPYGEMM_CHECK_INPUTS", "1")
    rng = cp.random.default_rng(0)
    b, sfb = grouped_weights(2, 256, 256, rng)
    a, sfa = cupygemm.per_token_cast_to_fp8(randn_bf16((256, 256), rng))
    idx = cp.asarray(np.array([0] * 128 + [1] * 127 + [2], np.int32))
    with pytest.raises(ValueError, match=r"m_indices\[255\] = 2"):
        cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sfa), (b, sfb), None, idx)
    a3 = cp.zeros((2, 128, 256), cp.uint8)
    s3 = cp.ones((2, 128, 2), cp.float32)
    with pytest.raises(ValueError, match=r"masked_m\[1\] = 129"):
        cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a3, s3), (b, sfb), None,
                                                       cp.asarray(np.array([3, 129], np.int32)), 64)
