"""The config cost model: legal, deterministic choices within the hardware budgets."""
from __future__ import annotations

import dataclasses

import pytest

from cupygemm import config as C
from cupygemm import contract
from cupygemm.config import cost, overrides
from cupygemm.util import ceil_div
from seed_shapes import CONTIGUOUS, MASKED, NORMAL, NORMAL_NK


def _all_seed_configs():
    for m, n, k in NORMAL:
        yield C.choose_config(C.KIND_NORMAL, m, n, k, 1, 132)
    for g, m, n, k in CONTIGUOUS:
        yield C.choose_config(C.KIND_CONTIGUOUS, g * m, n, k, g, 132)
    for g, m, n, k in MASKED:
        yield C.choose_config(C.KIND_MASKED, m, n, k, g, 132)


@pytest.mark.parametrize("cfg", list(_all_seed_configs()), ids=lambda c: c.describe().split(":")[0])
def test_seed_configs_are_legal(cfg):
    assert cfg.block_m in (64, 128, 256) or (cfg.block_m == 192 and cfg.kind == C.KIND_NORMAL)
    assert cfg.block_n % 8 == 0 and 16 <= cfg.block_n <= 256
    assert cfg.block_n % cfg.wgmma_n == 0
    assert 1 <= cfg.num_stages <= (12 if cfg.interleave_k else 8)
    assert cfg.smem_bytes + 1024 <= C.SM90_MAX_SMEM_PER_BLOCK
    assert cfg.smem_bytes == contract.smem_bytes(cfg.block_m, cfg.block_n, cfg.num_stages, cfg.interleave_k,
                                                 cfg.split_cluster)
    # More stages would not fit (the model fills shared memory), unless already at a cap: 8, 12 for interleaved-K tiles of
    # up to 64 K blocks, one tile's K blocks (3 or more) when CTAs run several tiles.
    step = 2 if cfg.interleave_k else 1  # interleaved-K stage counts are even
    if contract.smem_bytes(cfg.block_m, cfg.block_n, cfg.num_stages + step, cfg.interleave_k,
                           cfg.split_cluster) + 1024 <= 232448:
        k_blocks = -(-cfg.shape_k // 128) // cfg.split_k
        assert cfg.num_stages in (8, 12 if cfg.interleave_k and k_blocks <= 64 else 8, max(k_blocks, 3))
    assert 1 <= cfg.num_sms <= 132
    assert cfg.num_math_wg == (1 if cfg.block_m == 64 and not cfg.interleave_k else 3 if cfg.block_m == 192 else 2)
    assert not cfg.interleave_k or (cfg.block_m == 64 and -(-cfg.shape_k // 128) >= 32 and cfg.kind != C.KIND_CONTIGUOUS)
    if cfg.kind == C.KIND_CONTIGUOUS:  # 256-row blocks holding two groups run as two half tiles
        assert 128 % cfg.block_m == 0 or (cfg.block_m == 256 and cfg.num_math_wg == 2)


def test_contiguous_block_m_is_a_divisor_or_twice_the_alignment():
    for bm in (64, 128, 256):
        assert C.make_config(C.KIND_CONTIGUOUS, 1024, 1024, bm, 128, 132, serial_m=bm == 256).block_m == bm


def test_contiguous_model_charges_half_tiles_for_groups_ending_mid_block():
    """A 256-row block holding two groups runs as two tiles: the model counts about one per two groups."""
    one = C.estimate(C.KIND_CONTIGUOUS, 8192, 4096, 7168, 1, 256, 128, 132)
    many = C.estimate(C.KIND_CONTIGUOUS, 8192, 4096, 7168, 8, 256, 128, 132)
    assert many.tiles == one.tiles + 3 * (4096 // 128)
    assert C.estimate(C.KIND_CONTIGUOUS, 8192, 4096, 7168, 8, 128, 128, 132).tiles == 64 * 32


def test_every_problem_gets_a_legal_config():
    """choose_config over a grid of problems of every kind: no model option that make_config refuses (contiguous
    GEMMs of two or more waves once weighed a stream-K tail, which that kernel lacks, and raised ValueError)."""
    for kind in (C.KIND_NORMAL, C.KIND_CONTIGUOUS, C.KIND_MASKED):
        for groups in ((1,) if kind == C.KIND_NORMAL else (1, 2, 8, 32)):
            for m in (1, 64, 100, 512, 2048, 4096):
                for n in (256, 2112, 4096, 7168):
                    for k in (512, 2048, 7168):
                        rows = m * groups if kind == C.KIND_CONTIGUOUS else m
                        cfg = C.choose_config(kind, rows, n, k, groups, 132)
                        assert cfg.kind == kind and cfg.shape_n == n and cfg.shape_k == k
                        assert not (cfg.stream_k and kind == C.KIND_CONTIGUOUS)
    # One of the shapes that raised: 8 groups of 512 rows, N = K = 7168.
    cfg = C.choose_config(C.KIND_CONTIGUOUS, 8 * 512, 7168, 7168, 8, 132)
    assert not cfg.stream_k


def test_no_a_multicast_on_one_row_block():
    """Where all of A is one 128-row block (every CTA reads it from L2), the pick's tile runs without A multicast
    (measured 2-4 % faster, benchmarks/NOTES.md, "Multicast"); B multicast and larger M keep theirs."""
    for n, k in ((32768, 512), (24576, 1536), (16384, 7168)):
        for m in (65, 128):
            cfg = C.choose_config(C.KIND_NORMAL, m, n, k, 1, 132)
            assert cfg.block_m == 128 and cfg.multicast == 0, (m, n, k, cfg.describe())
        assert C.choose_config(C.KIND_NORMAL, 4096, n, k, 1, 132).multicast == 1
    assert C.choose_config(C.KIND_NORMAL, 128, 7168, 2048, 1, 132).multicast == 2  # 64-row tiles sharing B
    C.override_config("normal", 32768, 512, multicast=1)  # still reachable
    try:
        assert C.choose_config(C.KIND_NORMAL, 128, 32768, 512, 1, 132).multicast == 1
    finally:
        C.override_config("normal", 32768, 512)


def test_fewest_ctas_keep_the_rounds():
    for tiles in range(1, 1200, 7):
        for grid, cluster in ((132, 1), (132, 2), (128, 2), (17, 1)):
            got = C.fewest_ctas_for_rounds(tiles, grid, cluster)
            units, clusters = -(-tiles // cluster), grid // cluster
            rounds = -(-units // clusters)
            assert got % cluster == 0 and got <= grid
            assert -(-units // (got // cluster)) == rounds  # as many rounds as on the whole grid
            if got > cluster:  # one cluster fewer would need another round
                assert -(-units // (got // cluster - 1)) > rounds
    assert C.fewest_ctas_for_rounds(16 * 56, 132, 2) == 128  # 4096x7168x16384 on 256x128 tiles
    assert C.fewest_ctas_for_rounds(16 * 22, 132, 2) == 118  # 4096x2112x7168 on 256x96 tiles
    assert C.choose_config(C.KIND_NORMAL, 4096, 7168, 16384, 1, 132).num_sms == 128
    assert C.choose_config(C.KIND_CONTIGUOUS, 8 * 4096, 4096, 7168, 8, 132).num_sms == 132  # measured slower there


def test_choice_is_deterministic():
    a = [c for c in _all_seed_configs()]
    b = [c for c in _all_seed_configs()]
    assert a == b


def test_small_m_uses_one_math_warpgroup_and_fills_the_gpu():
    cfg = C.choose_config(C.KIND_NORMAL, 64, 2112, 7168, 1, 132)
    assert cfg.block_m == 64
    units = -(-2112 // cfg.block_n) * cfg.split_k
    assert units >= 100, "a 64-row GEMM must spread N (and K) over most SMs"


@pytest.mark.parametrize("m,n,k,want", [(64, 2112, 7168, (64, 32, 2)), (128, 2112, 7168, (128, 32, 2)),
                                        (1, 2112, 7168, (64, 32, 2)), (200, 512, 7168, (128, 48, 4)),
                                        (64, 576, 7168, (64, 48, 4)), (64, 1536, 7168, (64, 48, 4)),
                                        (64, 4096, 7168, None), (64, 2112, 1024, None), (4096, 2112, 7168, None)])
def test_split_k_only_where_tiles_cannot_fill_the_gpu(m, n, k, want):
    """Split-K across CTAs when 64x64 tiles would fill at most half the SMs, with splits of 8+ K blocks (on
    32-column tiles split two ways where that keeps as many SMs busy)."""
    assert C.split_k_tile(C.KIND_NORMAL, m, n, k, 132) == want
    cfg = C.choose_config(C.KIND_NORMAL, m, n, k, 1, 132)
    assert (cfg.block_m, cfg.block_n, cfg.split_k) == want if want else cfg.split_k == 1
    if want:
        tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
        assert cfg.num_sms == min(132, tiles * cfg.split_k) and not cfg.multicast
    assert C.split_k_tile(C.KIND_MASKED, m, n, k, 132) is None


@pytest.mark.parametrize("m,n,k,sides,want", [
    (64, 2112, 7168, True, (64, 32, 2, True)),  # units of 28 K blocks: interleaved K on two warpgroups
    (32, 2112, 7168, True, (64, 32, 2, True)),
    (64, 2112, 7168, False, (64, 32, 2, True)),  # plain weights: the same tile
    (64, 1536, 7168, False, (64, 48, 4, False)),  # plain weights: 14 K blocks per unit, one warpgroup
    (128, 2112, 7168, True, (128, 32, 2, False)), (128, 2112, 7168, False, (128, 32, 2, False)),
    (64, 576, 7168, True, (64, 32, 4, False))])
def test_split_k_tiles_for_packed_weights(m, n, k, sides, want):
    """Packed weights take 64x32 split-K tiles (whole 32-row chunks), whose units of INTERLEAVE_K_MIN_BLOCKS or more
    run interleaved K; their 128-row split-K tiles are the plain ones (128x32 split 2 as clusters with two
    accumulator sets on N = 2112)."""
    cfg = C.choose_config(C.KIND_NORMAL, m, n, k, 1, 132, sides=sides)
    assert (cfg.block_m, cfg.block_n, cfg.split_k, cfg.interleave_k) == want
    assert cfg.num_math_wg == (2 if cfg.interleave_k or cfg.block_m == 128 else 1)
    if cfg.interleave_k:
        assert -(-k // 128) // cfg.split_k >= C.cost.INTERLEAVE_K_MIN_BLOCKS
    if sides:
        assert C.side_aware_config(cfg, 132).sides


@pytest.mark.parametrize("k", [2048, 16384])
def test_one_wave_prefers_widths_with_compiled_scale_offsets(k):
    """64x7168: 56-wide tiles (odd multiple of 8: run-time scale selects) measured 2-7 % slower than 64-wide ones,
    both one wave (benchmarks/NOTES.md, "Tile choice and the cost model"); the model charges the selects on the
    load-bound tile too."""
    cfg = C.choose_config(C.KIND_NORMAL, 64, 7168, k, 1, 132)
    assert (cfg.block_m, cfg.block_n) == (64, 64)
    assert cost.tile_seconds(64, 56, k) > cost.tile_seconds(64, 64, k) * 56 / 64


def test_fewer_sms_never_gives_a_larger_grid():
    for sms in (132, 100, 66, 8, 1):
        cfg = C.choose_config(C.KIND_NORMAL, 4096, 7168, 2048, 1, sms)
        assert cfg.num_sms <= sms


def test_output_swizzle_divides_block_n():
    for bn in range(8, 257, 8):
        sw = C.output_swizzle(bn)
        assert sw in (0, 32, 64, 128)
        if sw:
            assert (bn * 2) % sw == 0
        if bn % 64 == 0:
            assert sw == 128


def test_wgmma_n_fits_register_budget():
    for bm in (64, 128, 192, 256):
        for bn in range(16, 257, 8):
            wn = C.wgmma_n_for(bm, bn)
            if wn is not None:
                assert bn % wn == 0 and wn % 8 == 0


def test_override_config_and_reset():
    base = C.choose_config(C.KIND_NORMAL, 4096, 4096, 7168, 1, 132)
    C.override_config("normal", 4096, 7168, block_m=128, block_n=128, num_stages=3)
    try:
        cfg = C.choose_config(C.KIND_NORMAL, 4096, 4096, 7168, 1, 132)
        assert (cfg.block_m, cfg.block_n, cfg.num_stages) == (128, 128, 3)
    finally:
        C.override_config("normal", 4096, 7168)
    assert C.choose_config(C.KIND_NORMAL, 4096, 4096, 7168, 1, 132) == base


def test_override_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown fields"):
        C.override_config("normal", 1, 1, block_q=3)
    with pytest.raises(ValueError, match="kind"):
        C.override_config("sparse", 1, 1, block_m=64)


@pytest.mark.parametrize("bm,bn,msg", [(96, 128, "block_m"), (128, 20, "block_n"), (128, 264, "block_n")])
def test_make_config_rejects_bad_blocks(bm, bn, msg):
    with pytest.raises(ValueError, match=msg):
        C.make_config(C.KIND_NORMAL, 4096, 4096, bm, bn, 132)


def test_make_config_rejects_oversized_pipeline():
    with pytest.raises(ValueError, match="shared memory"):
        C.make_config(C.KIND_NORMAL, 4096, 4096, 128, 128, 132, num_stages=8)


def test_print_configs(monkeypatch, capsys):
    monkeypatch.setenv("CUPYGEMM_PRINT_CONFIGS", "1")
    C.choose_config(C.KIND_NORMAL, 333, 4096, 7168, 1, 77)
    err = capsys.readouterr().err
    assert "[cupygemm] M=321..384" in err and "block" in err and "waves" in err


def test_defines_cover_every_template_constant():
    cfg = C.choose_config(C.KIND_NORMAL, 4096, 4096, 7168, 1, 132)
    from cupygemm.kernels import gemm_source

    src = open(__import__("cupygemm.jit.source", fromlist=["x"]).cuda_src_dir() / "fp8_gemm.cu").read()
    rendered = gemm_source(cfg).text.split(src)[0]  # the #define lines the kernel source gets
    names = [line.split()[1] for line in rendered.splitlines()]
    for name in names:
        assert name in src, name
    assert contract.defines(dataclasses.replace(cfg, num_sms=1)) == contract.defines(cfg)


def test_warmup_picks_what_the_api_picks():
    """`cupygemm warmup` must pre-compile the config a call will use (contiguous: padded total rows)."""
    from cupygemm.cli import warmup_configs

    (cfg,) = warmup_configs("contiguous", [(4, 300, 2048, 7168)], 132)
    assert cfg == C.choose_config(C.KIND_CONTIGUOUS, C.model_rows(C.KIND_CONTIGUOUS, 4 * 384), 2048, 7168, 4, 132)
    (cfg,) = warmup_configs("masked", [(4, 256, 2048, 7168)], 132)  # A [4, 256, K], expected_m 256
    assert cfg == C.choose_config(C.KIND_MASKED, 256, 2048, 7168, 4, 132, max_m=256)
    assert C.model_rows(C.KIND_MASKED, 4096, 50000) == 4096 and C.model_rows(C.KIND_MASKED, 4096, 0) == 1
    assert C.model_rows(C.KIND_NORMAL, 77) == 77


@pytest.mark.parametrize("kind,k,ks,msg", [(C.KIND_NORMAL, 1024, 0, r"\[1, 8\]"), (C.KIND_NORMAL, 1024, 9, r"\[1, 8\]"),
                                           (C.KIND_NORMAL, 1000, 2.0, "int"),
                                           (C.KIND_MASKED, 1024, 2, "normal GEMM"),
                                           (C.KIND_CONTIGUOUS, 1024, 2, "normal GEMM")])
def test_make_config_rejects_bad_split_k(kind, k, ks, msg):
    with pytest.raises(ValueError, match=msg):
        C.make_config(kind, 2048, k, 128, 128, 132, split_k=ks)


def test_b_evict_first_rule(monkeypatch):
    """B tiles may be first to evict from L2 on an H100 or H200 whatever B's size, elsewhere when B (all groups) is
    larger than L2 (auto), always (1) or never (0); other values are refused with the variable's name."""
    l2 = 50 << 20
    h100, h200, other = "NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA H800"
    monkeypatch.delenv(C.B_EVICT_FIRST_ENV, raising=False)
    for name in (h100, h200):
        assert C.b_evict_first(1, 32768, 512, l2, name) and C.b_evict_first(1, 7168, 16384, l2, name)
    assert C.b_evict_first(1, 7168, 16384, l2, other)  # 112 MiB of weights
    assert not C.b_evict_first(1, 32768, 512, l2, other)  # 16 MiB: may stay in L2 for the next call
    assert C.b_evict_first(8, 4096, 7168, l2, other) and not C.b_evict_first(1, 4096, 7168, l2, other)
    monkeypatch.setenv(C.B_EVICT_FIRST_ENV, "1")
    assert C.b_evict_first(1, 32768, 512, l2, other)
    monkeypatch.setenv(C.B_EVICT_FIRST_ENV, "0")
    assert not C.b_evict_first(1, 7168, 16384, l2, h100) and not C.b_evict_first(1, 7168, 16384, l2, h200)
    monkeypatch.setenv(C.B_EVICT_FIRST_ENV, " Yes ")  # the boolean spellings of 1/0 (cupygemm.env)
    assert C.b_evict_first(1, 32768, 512, l2, other)
    monkeypatch.setenv(C.B_EVICT_FIRST_ENV, "off")
    assert not C.b_evict_first(1, 32768, 512, l2, h100)
    monkeypatch.setenv(C.B_EVICT_FIRST_ENV, "")  # empty = the default
    assert C.b_evict_first(1, 32768, 512, l2, h200) and not C.b_evict_first(1, 32768, 512, l2, other)
    assert [C.b_evict_first_rule(d) for d in (h100, h200, other)] == ["any B", "any B", "B larger than L2"]
    monkeypatch.setenv(C.B_EVICT_FIRST_ENV, "0")
    assert C.b_evict_first_rule(h100) == "no B"
    monkeypatch.setenv(C.B_EVICT_FIRST_ENV, "maybe")
    with pytest.raises(ValueError, match="CUPYGEMM_B_EVICT_FIRST: expected one of auto, 1, 0"):
        C.b_evict_first(1, 7168, 16384, l2, h100)


def test_split_k_override_grid_and_scratch():
    """Each tile's K splits are separate work units: the grid covers them; the scratch holds one FP32 partial
    tile per unit and one counter per tile and row group."""
    from cupygemm.contract import scratch_sizes

    C.override_config("normal", 2112, 7168, block_m=64, block_n=128, split_k=4, split_cluster=False)
    try:
        cfg = C.choose_config(C.KIND_NORMAL, 64, 2112, 7168, 1, 132)
    finally:
        C.override_config("normal", 2112, 7168)
    assert (cfg.block_m, cfg.block_n, cfg.split_k) == (64, 128, 4)
    assert cfg.num_sms == 17 * 4
    assert "K over 4 CTAs" in cfg.describe()
    assert scratch_sizes(cfg, 64) == (17 * 4 * 64 * 128, 17 * cfg.num_math_wg)
    assert scratch_sizes(cfg, 65) == (34 * 4 * 64 * 128, 34 * cfg.num_math_wg)
    assert scratch_sizes(dataclasses.replace(cfg, split_k=1), 64) == (0, 0)
    with pytest.raises(ValueError, match="smaller split_k"):  # 32-bit scratch offsets: refused before any launch
        scratch_sizes(cfg, 1 << 22)


def test_split_k_clusters():
    """Split-K picks of two splits whose units all run in one round meet as 2-CTA clusters: the grid a multiple of
    two, no global scratch, a partial tile of shared memory more, as many stages; three splits, a forced smaller grid
    (whole clusters, several tiles each) or forced off as asked; make_config refuses what the kernel cannot run."""
    from cupygemm.contract import cluster_size, grid, scratch_sizes

    packed = C.side_aware_config(C.choose_config(C.KIND_NORMAL, 64, 2112, 7168, 1, 132, sides=True), 132)
    assert packed.split_cluster and packed.split_k == 2 and cluster_size(packed) == 2 and packed.num_sms == 132
    assert "one cluster per tile" in packed.describe()
    assert scratch_sizes(packed, 64) == (0, contract.SIDE_TICKET_COUNTERS)
    assert contract.side_unit_tiles(packed, 64, 1) == 1  # a cluster takes a tile's splits at once
    assert contract.side_unit_tiles(dataclasses.replace(packed, split_cluster=False), 64, 1) == 2
    three = C.choose_config(C.KIND_NORMAL, 64, 200, 3000, 1, 132)
    assert three.split_k == 3 and not three.split_cluster and cluster_size(three) == 1
    C.override_config("normal", 2112, 7168, block_m=64, block_n=32, split_k=2)
    try:
        two = C.choose_config(C.KIND_NORMAL, 64, 2112, 7168, 1, 132)
        assert two.split_cluster and two.num_sms == 132 and scratch_sizes(two, 64) == (0, 0)
        assert two.smem_bytes == contract.smem_bytes(64, 32, two.num_stages, two.interleave_k) + 32 + 64 * 32 * 4
        assert grid(two, 60) == 120 and grid(two, 66) == 132  # whole clusters that fit at once
        C.override_config("normal", 2112, 7168, block_m=64, block_n=32, split_k=2, num_sms=67)
        small = C.choose_config(C.KIND_NORMAL, 64, 2112, 7168, 1, 132)
        assert small.split_cluster and small.num_sms == 66
        C.override_config("normal", 2112, 7168, block_m=64, block_n=32, split_k=2, split_cluster=False)
        assert not C.choose_config(C.KIND_NORMAL, 64, 2112, 7168, 1, 132).split_cluster
    finally:
        C.override_config("normal", 2112, 7168)
    for bad in (dict(split_k=1), dict(split_k=3), dict(split_k=2, multicast=1), dict(split_k=2, stream_k=True)):
        with pytest.raises(ValueError, match="split_cluster"):
            C.make_config("normal", 2112, 7168, 64, 48, 132, split_cluster=True, **bad)
    with pytest.raises(ValueError, match="multiple"):
        C.make_config("normal", 2112, 7168, 64, 48, 131, split_k=2, split_cluster=True)


def test_128_row_split_k_clusters_take_two_accumulator_sets():
    """One 128-row block of N = 2112, K = 7168 on 132 SMs: 128x32 tiles split two ways (132 units, as many as the
    48-column rule's 44 x 3) as clusters with two accumulator sets, plain and packed; where the 32-column tiles
    would keep fewer SMs busy (N = 2048: 128 < 129; 114 SMs: 132 units) the 48-column rule stands."""
    for sides in (False, True):
        cfg = C.choose_config(C.KIND_NORMAL, 128, 2112, 7168, 1, 132, sides=sides)
        assert (cfg.block_m, cfg.block_n, cfg.split_k, cfg.split_cluster, cfg.two_acc_sets) == (128, 32, 2, True, True)
        assert "two accumulator sets" in cfg.describe()
        assert contract.defines(cfg)["CUPYGEMM_TWO_ACC_SETS"] == 1
    for m, n, sms in ((128, 2048, 132), (128, 2112, 114)):
        cfg = C.choose_config(C.KIND_NORMAL, m, n, 7168, 1, sms)
        assert not cfg.two_acc_sets and "CUPYGEMM_TWO_ACC_SETS" not in contract.defines(cfg)
    for bad in (dict(block_n=128), dict(block_n=64, interleave_k=True), dict(block_n=32, stream_k=True)):
        with pytest.raises(ValueError, match="two_acc_sets"):
            C.make_config("normal", 2112, 7168, 64 if bad.get("interleave_k") else 128, bad.pop("block_n"), 132,
                          two_acc_sets=True, **bad)


def test_64_row_split_k_clusters_of_32_columns():
    """One 64-row block of N = 2112, K = 7168 on 132 SMs, any M in its memo class: 64x32 tiles split two ways as
    clusters on two interleaved warpgroups (132 units, as many as the 48-column rule's 44 x 3), the tile packed B
    takes too; N = 1536 takes them on 114 SMs (48 x 2 = 96 units against 32 x 3) and not on 132 (128 units on 64x48
    split 4), nor does N = 2112 on 114 SMs (132 units would not fit: 64x48 split 2, as clusters)."""
    for m in (1, 16, 48, 64):
        for sides in (False, True):
            cfg = C.choose_config(C.KIND_NORMAL, m, 2112, 7168, 1, 132, sides=sides)
            assert (cfg.block_m, cfg.block_n, cfg.split_k, cfg.split_cluster, cfg.interleave_k, cfg.num_sms) == (
                64, 32, 2, True, True, 132), (m, sides)
    assert C.choose_config(C.KIND_NORMAL, 64, 1536, 7168, 1, 114).block_n == 32
    for n, sms, want in ((1536, 132, (48, 4, False)), (2112, 114, (48, 2, True))):
        cfg = C.choose_config(C.KIND_NORMAL, 64, n, 7168, 1, sms)
        assert (cfg.block_n, cfg.split_k, cfg.split_cluster) == want, (n, sms)


def test_two_accumulator_sets_where_one_warpgroup_bounds_the_loop():
    """One-warpgroup tiles take two accumulator sets (where they fit); two-warpgroup tiles only as the 128-row
    split-K clusters; interleaved K and tiles wider than 96 never; an override turns them off."""
    one_wg = C.choose_config(C.KIND_NORMAL, 64, 7168, 2048, 1, 132)
    assert (one_wg.num_math_wg, one_wg.block_n, one_wg.two_acc_sets) == (1, 64, True)
    assert C.choose_config(C.KIND_NORMAL, 64, 24576, 1536, 1, 132).two_acc_sets
    assert not C.choose_config(C.KIND_NORMAL, 128, 24576, 1536, 1, 132).two_acc_sets  # 128x96, two warpgroups
    wide = C.choose_config(C.KIND_NORMAL, 64, 32768, 512, 1, 132)  # one warpgroup: up to 128 columns
    assert (wide.block_n, wide.num_math_wg, wide.two_acc_sets) == (128, 1, True)
    with pytest.raises(ValueError, match="two_acc_sets"):
        C.make_config("normal", 4096, 7168, 128, 128, 132, two_acc_sets=True)  # 128 wide on two warpgroups
    ilv = C.choose_config(C.KIND_NORMAL, 64, 4096, 7168, 1, 132)
    assert ilv.interleave_k and not ilv.two_acc_sets
    assert not C.choose_config(C.KIND_NORMAL, 4096, 7168, 2048, 1, 132).two_acc_sets
    C.override_config("normal", 7168, 2048, two_acc_sets=False)
    try:
        assert not C.choose_config(C.KIND_NORMAL, 64, 7168, 2048, 1, 132).two_acc_sets
    finally:
        C.override_config("normal", 7168, 2048)


def test_split_k_extent_is_the_largest_split():
    assert C.split_k_extent(7168, 1) == 7168
    assert C.split_k_extent(7168, 8) == 7 * 128
    assert C.split_k_extent(1408, 4) == 3 * 128  # 11 blocks: 2, 3, 3, 3


def test_packed_launch_parameters_follow_the_driver_layout():
    """The launch packs parameters at the offsets the driver reports (padding before aligned descriptors)."""
    import struct

    from cupygemm.errors import CupygemmDeviceError
    from cupygemm.contract import GEMM_PARAMS
    from cupygemm.launch import DESC, PTR, U32, PackedLauncher

    layout = [(128 * i, 128) for i in range(5)] + [(640 + 8 * i, 8) for i in range(5)] + \
             [(680, 4), (684, 4), (688, 4), (692, 4)]
    launcher = PackedLauncher(0, GEMM_PARAMS, layout, 0)
    values = [bytes([i]) * 128 for i in range(5)] + [1 << 40, 0, 7, 8, 9, 64, 2, 4096, 1]
    packed = bytes(launcher.pack(values))
    assert launcher.param_bytes == len(packed) == 696
    assert packed[512:640] == bytes([4]) * 128
    assert struct.unpack_from("<QQQQQIIII", packed, 640) == (1 << 40, 0, 7, 8, 9, 64, 2, 4096, 1)
    padded = bytes(PackedLauncher(0, (U32, DESC, PTR), [(0, 4), (128, 128), (256, 8)], 0).pack([5, b"\x01" * 128, 6]))
    assert len(padded) == 264 and padded[:4] == b"\x05\0\0\0" and padded[4:128] == bytes(124)
    with pytest.raises(CupygemmDeviceError, match="do not match"):
        PackedLauncher(0, GEMM_PARAMS, layout[:-1] + [(688, 8)], 0)


def test_masked_plan_averages_group_sizes():
    """Masked group sizes are unknown on the host: the estimate averages fixed draws of expected_m x U(0.7, 1.3)."""
    draws = cost.masked_group_rows(1000, 4)
    assert len(draws) == cost.MASKED_DRAWS and all(len(d) == 4 for d in draws)
    assert all(700 <= r <= 1300 for d in draws for r in d)
    assert abs(sum(map(sum, draws)) / (4000 * len(draws)) - 1.0) < 0.02
    assert draws == cost.masked_group_rows(1000, 4)  # deterministic
    # 256x128 tiles fill exactly one wave at 1024 rows (4 x 32 tiles); the draws above 1024 rows need a second.
    est = C.estimate(C.KIND_MASKED, 1024, 4096, 7168, 1, 256, 128, 132, 1)
    single = cost.tile_seconds(256, 128, 7168, 1)
    assert est.waves == 1 and 1.2 * single < est.seconds < 2 * single


def test_masked_plan_caps_group_sizes_at_max_m():
    """With every row valid (max_m = expected_m) no group can be 1.3x expected_m: the draws are capped at max_m, and
    the full-group picks are 256-row tiles, which measured 51.1, 59.3 and 34.5 us against the uncapped 128-row
    picks' 61.9, 71.0 and 43.7 on an H100 (benchmarks/NOTES.md, "Masked GEMMs")."""
    capped = cost.masked_group_rows(256, 4, 256)
    assert max(map(max, capped)) == 256 and min(map(min, capped)) >= int(256 * 0.7)
    assert capped == tuple(tuple(min(r, 256) for r in d) for d in cost.masked_group_rows(256, 4))
    assert cost.largest_masked_draw(256, 4) > 256
    for g, m, n, k in ((2, 512, 4096, 7168), (4, 256, 4096, 7168), (4, 256, 7168, 2048)):
        free = C.choose_config(C.KIND_MASKED, m, n, k, g, 132)
        full = C.choose_config(C.KIND_MASKED, m, n, k, g, 132, max_m=m)
        assert free.block_m == 128 and full.block_m == 256, (free.describe(), full.describe())
        # A cap no draw reaches is no cap: the peers' max_m of 4096 keeps the uncapped pick.
        assert C.choose_config(C.KIND_MASKED, m, n, k, g, 132, max_m=4096) == free
        assert C.choose_config(C.KIND_MASKED, m, n, k, g, 132,
                               max_m=cost.largest_masked_draw(m, g)) == free
    # Other kinds ignore max_m.
    assert (C.choose_config(C.KIND_NORMAL, 64, 4096, 7168, 1, 132, max_m=1)
            == C.choose_config(C.KIND_NORMAL, 64, 4096, 7168, 1, 132))
    with pytest.raises(ValueError, match="max_m"):
        C.choose_config(C.KIND_MASKED, 256, 4096, 7168, 4, 132, max_m=0)


@pytest.mark.parametrize("units,clusters,k_blocks,want", [
    (132, 66, 56, (0, 1)),  # full rounds: nothing to split
    (143, 66, 56, (11, 6)),  # 11 units left over: 6 pieces each fill the 66 clusters
    (224, 66, 16, (26, 2)),
    (104, 66, 56, (0, 1)),  # 38 left over: a split would not fit twice
    (3, 66, 56, (3, 8)),  # fewer units than clusters: at most 8 pieces
    (3, 66, 2, (3, 2)),  # a piece holds at least one K block
    (5, 66, 1, (0, 1)),
])
def test_stream_k_tail_plan(units, clusters, k_blocks, want):
    """The host's copy of the kernel's tail plan (cuda_src/scheduler.cuh): the R units of a partly filled last round
    split into min(clusters // R, K blocks, 8) pieces, one per cluster."""
    tail, split = C.stream_k_tail(units, clusters, k_blocks)
    assert (tail, split) == want
    assert tail * split <= clusters and split <= min(k_blocks, 8)


def test_stream_k_choice_and_validation():
    from cupygemm.contract import scratch_sizes

    # The model weighs the tail where groups' sizes vary (masked) or a normal GEMM runs several waves, and takes it
    # only where its estimate over the spread is lower; one partial wave is left to interleaved K.
    masked = C.choose_config(C.KIND_MASKED, 256, 4096, 7168, 4, 132)
    plain = C.estimate(C.KIND_MASKED, 256, 4096, 7168, 4, masked.block_m, masked.block_n, 132, masked.multicast)
    tail = C.estimate(C.KIND_MASKED, 256, 4096, 7168, 4, masked.block_m, masked.block_n, 132, masked.multicast,
                       stream_k=True)
    assert masked.stream_k and tail.seconds < plain.seconds
    assert not C.choose_config(C.KIND_MASKED, 1024, 7168, 2048, 1, 132).stream_k  # 16 K blocks: the tail does not pay
    assert not C.choose_config(C.KIND_NORMAL, 128, 7168, 16384, 1, 132).stream_k  # one wave
    assert not C.choose_config(C.KIND_CONTIGUOUS, 4 * 8192, 4096, 7168, 4, 132).stream_k
    assert C.choose_config(C.KIND_NORMAL, 6144, 7168, 7168, 1, 132).stream_k  # 10 rounds + 12 units in 5 pieces
    # The kernel factor, refitted per kind (benchmarks/NOTES.md, "Stream-K tail"): 8 masked groups of ~1024 rows at
    # N = 4096, K = 7168 measured 6.6 % faster on 256x128 tiles with the tail than on the 128x160 tiles without that the
    # old 2 % picked; normal GEMMs keep it (4096x2112x7168 on 256x112 with the tail measured 3.5 % slower than 256x96
    # without).
    assert cost.SK_KERNEL_FACTOR[C.KIND_MASKED] < cost.SK_KERNEL_FACTOR[C.KIND_NORMAL]
    masked8 = C.choose_config(C.KIND_MASKED, 1024, 4096, 7168, 8, 132)
    assert masked8.stream_k and (masked8.block_m, masked8.block_n) == (256, 128)
    assert not C.choose_config(C.KIND_NORMAL, 4096, 2112, 7168, 1, 132).stream_k
    C.override_config("normal", 7168, 7168, split_k=2)  # a forced split replaces the model's tail
    try:
        cfg = C.choose_config(C.KIND_NORMAL, 6144, 7168, 7168, 1, 132)
        assert cfg.split_k == 2 and not cfg.stream_k
    finally:
        C.override_config("normal", 7168, 7168)
    C.override_config("masked", 4096, 7168, block_m=128, block_n=160, multicast=1, stream_k=True)
    try:
        cfg = C.choose_config(C.KIND_MASKED, 256, 4096, 7168, 4, 132)
        assert cfg.stream_k and contract.defines(cfg)["CUPYGEMM_STREAM_K"] == 1 and "stream-K tail" in cfg.describe()
        # One partial tile per CTA and a counter per tail tile and math warpgroup, whatever the rows.
        assert scratch_sizes(cfg, 1) == scratch_sizes(cfg, 4096) == (132 * 128 * 160, 132 * 2)
    finally:
        C.override_config("masked", 4096, 7168)
    C.override_config("normal", 2112, 7168, block_m=64, block_n=128, stream_k=True)  # no interleaved K then
    try:
        cfg = C.choose_config(C.KIND_NORMAL, 64, 2112, 7168, 1, 132)
        assert cfg.stream_k and not cfg.interleave_k and cfg.num_sms == 132  # every SM, for the split tail
    finally:
        C.override_config("normal", 2112, 7168)
    with pytest.raises(ValueError, match="stream_k needs a normal or masked GEMM, got contiguous"):
        C.override_config("contiguous", 4096, 7168, stream_k=True)  # refused before any estimate
    for bad in [dict(kind=C.KIND_CONTIGUOUS), dict(split_k=2), dict(interleave_k=True, block_m=64, block_n=64)]:
        args = dict(kind=C.KIND_NORMAL, n=2048, k=1024, block_m=128, block_n=128, num_sms=132, stream_k=True) | bad
        with pytest.raises(ValueError, match="stream_k"):
            C.make_config(**args)


def test_three_warpgroup_tiles():
    """192-row tiles run three math warpgroups (one m64 sub-tile each, 160 registers, the producer at 24); only normal
    GEMMs, and the model proposes them only up to K = 1536, where they measured faster than 256-row tiles."""
    cfg = C.make_config(C.KIND_NORMAL, 32768, 512, 192, 128, 132, multicast=1)
    assert cfg.num_math_wg == 3 and cfg.threads == 512 and cfg.wgmma_n == 128 and not cfg.serial_m
    assert cfg.math_regs * 384 + cfg.producer_regs * 128 <= 65536
    assert C.wgmma_n_for(192, 128) == 128 and C.wgmma_n_for(192, 136) is None
    for bad in [dict(kind=C.KIND_MASKED), dict(kind=C.KIND_CONTIGUOUS), dict(split_k=2), dict(stream_k=True),
                dict(multicast=2)]:
        args = dict(kind=C.KIND_NORMAL, n=2048, k=1024, block_m=192, block_n=128, num_sms=132) | bad
        with pytest.raises(ValueError, match="block_m 192"):
            C.make_config(**args)
    assert C.choose_config(C.KIND_NORMAL, 4096, 32768, 512, 1, 132).block_m == 192
    assert C.choose_config(C.KIND_NORMAL, 4096, 24576, 1536, 1, 132).block_m == 192
    for k in (2048, 7168):  # the extra round of 192-row tiles at M = 4096 costs more than they gain
        assert C.choose_config(C.KIND_NORMAL, 4096, 32768, k, 1, 132).block_m != 192
    assert C.choose_config(C.KIND_NORMAL, 128, 32768, 512, 1, 132).block_m != 192
    # They only challenge a 256-row pick (the comparison measured), not 64/128-row ones at small M.
    for m, n in [(256, 1024), (512, 2112), (1024, 1024)]:
        assert C.choose_config(C.KIND_NORMAL, m, n, 512, 1, 132).block_m != 192
    assert C.choose_config(C.KIND_NORMAL, 2048, 24576, 512, 1, 132).block_m == 192
    for kind in (C.KIND_MASKED, C.KIND_CONTIGUOUS):
        assert 192 not in C.candidate_block_ms(kind, 4096)


def test_setmaxnreg_budgets_fit_the_register_file():
    """The producer's and the math warpgroups' registers (passed to the kernel, which static_asserts the same) fill at
    most the 64K registers of an SM, for one CTA of each thread count."""
    for bm, fields in [(128, {}), (256, {"serial_m": True}), (192, {}), (64, {"interleave_k": True})]:
        cfg = C.make_config(C.KIND_NORMAL, 4096, 1024, bm, 64 if bm == 64 else 128, 132, **fields)
        assert cfg.num_math_wg > 1
        assert cfg.producer_regs * 128 + cfg.math_regs * 128 * cfg.num_math_wg <= 64 * 1024
        assert contract.defines(cfg)["CUPYGEMM_PRODUCER_REGS"] == cfg.producer_regs


def test_stage_caps():
    """Interleaved K over two warpgroups drains stages twice as fast: 12 stages for tiles of up to 64 K blocks, 8 beyond;
    a CTA running several tiles keeps about one tile's K blocks in flight (benchmarks/NOTES.md, "Pipeline depth and
    the L2 flush")."""
    inter = C.choose_config(C.KIND_NORMAL, 64, 4096, 7168, 1, 132)
    assert inter.interleave_k and inter.num_stages == 12
    assert C.choose_config(C.KIND_NORMAL, 64, 7168, 16384, 1, 132).num_stages == 8  # 128 K blocks
    assert C.make_config(C.KIND_NORMAL, 4096, 7168, 64, 32, 132, interleave_k=True).num_stages == 12
    assert C.make_config(C.KIND_NORMAL, 4096, 7168, 64, 32, 132, interleave_k=False).num_stages == 8
    one_round = C.make_config(C.KIND_NORMAL, 32768, 512, 64, 128, 128)
    assert one_round.num_stages == 8  # (fills shared memory)
    two_rounds = C.choose_config(C.KIND_NORMAL, 64, 32768, 512, 1, 132)
    assert (two_rounds.block_m, two_rounds.block_n, two_rounds.num_stages) == (64, 128, 4)
    assert C.make_config(C.KIND_NORMAL, 32768, 256, 64, 128, 128, tile_rounds=2).num_stages == 3  # at least 3
    assert C.make_config(C.KIND_NORMAL, 32768, 2048, 64, 128, 128, tile_rounds=2).num_stages == 8  # 16 K blocks
    # An explicit stage count is kept.
    assert C.make_config(C.KIND_NORMAL, 32768, 512, 64, 128, 128, num_stages=6, tile_rounds=2).num_stages == 6


def test_interleave_k_stage_counts_are_even():
    """Interleaved-K warpgroups take alternate K blocks: with an odd stage count a stage alternates between them and a
    parity wait two phases on passes early (a crash on the GPU, benchmarks/NOTES.md, "Interleaved K"). Every pick over
    a grid of problems has an even count, smem-limited widths round down, and an odd count asked for is refused."""
    picks = 0
    for kind in (C.KIND_NORMAL, C.KIND_MASKED):
        for g in ((1,) if kind == C.KIND_NORMAL else (1, 4, 8, 32)):
            for m in (1, 16, 64, 128):
                for n in (2112, 4096, 7168, 24576):
                    for k in (4096, 7168, 16384):
                        cfg = C.choose_config(kind, m, n, k, g, 132)
                        if cfg.interleave_k:
                            picks += 1
                            assert cfg.num_stages % 2 == 0, cfg.describe()
    assert picks > 20
    assert C.make_config(C.KIND_MASKED, 4096, 7168, 64, 128, 132, interleave_k=True).num_stages == 6  # 7 would fit
    with pytest.raises(ValueError, match="even num_stages"):
        C.make_config(C.KIND_NORMAL, 4096, 7168, 64, 32, 132, interleave_k=True, num_stages=7)


def test_raster_stripes_of_sixteen_n_blocks():
    """Raster stripes span 16 n blocks, so 8 units with A multicast (benchmarks/NOTES.md, "Raster stripes"). A forced
    value is kept; bad ones are refused."""
    seen = set()
    for kind, rows, n, k, g in [(C.KIND_NORMAL, 4096, 7168, 16384, 1), (C.KIND_NORMAL, 4096, 32768, 512, 1),
                                (C.KIND_NORMAL, 64, 32768, 512, 1), (C.KIND_NORMAL, 128, 7168, 2048, 1),
                                (C.KIND_MASKED, 256, 4096, 7168, 4), (C.KIND_MASKED, 1024, 7168, 2048, 1),
                                (C.KIND_CONTIGUOUS, 32768, 4096, 7168, 8), (C.KIND_CONTIGUOUS, 32768, 7168, 2048, 4)]:
        cfg = C.choose_config(kind, rows, n, k, g, 132)
        blocks_per_unit = 2 if cfg.multicast == 1 else 1
        want = 16 // blocks_per_unit
        assert cfg.raster_n == want == contract.defines(cfg)["CUPYGEMM_RASTER_N"], cfg.describe()
        seen.add((kind, cfg.multicast))
    assert {(C.KIND_NORMAL, 1), (C.KIND_NORMAL, 2), (C.KIND_MASKED, 1), (C.KIND_CONTIGUOUS, 1)} <= seen
    assert C.make_config(C.KIND_NORMAL, 7168, 2048, 256, 128, 132, multicast=1, serial_m=True, raster_n=3).raster_n == 3
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match="raster_n"):
            C.make_config(C.KIND_NORMAL, 7168, 2048, 128, 128, 132, raster_n=bad)


def test_interleave_k_refused_where_it_cannot_run():
    """interleave_k asked for a tile it cannot run on raises instead of silently giving the one-warpgroup kernel; the
    model only proposes it where it fits."""
    for args in [dict(block_m=64, block_n=184), dict(block_m=128, block_n=128),
                 dict(block_m=64, block_n=128, wgmma_n=64)]:
        with pytest.raises(ValueError, match="interleave_k needs"):
            C.make_config(C.KIND_NORMAL, 4096, 7168, num_sms=132, interleave_k=True, **args)
    assert not C.interleave_k_pays(64, 184, 7168, 1) and C.interleave_k_pays(64, 176, 7168, 1)
    assert C.interleave_k_regime(64, 7168, 1) and not C.interleave_k_regime(64, 7168, 3)
    C.override_config("normal", 4096, 7168, block_m=64, block_n=128, wgmma_n=64)
    try:  # the model's interleaved-K wish gives way to forced fields that exclude it
        cfg = C.choose_config(C.KIND_NORMAL, 64, 4096, 7168, 1, 132)
        assert cfg.wgmma_n == 64 and not cfg.interleave_k
    finally:
        C.override_config("normal", 4096, 7168)


# ---- issue 32: memo by M class, degenerate inputs, override checks ---------------------------------------------------

def _grid_ms(limit: int) -> list[int]:
    """Every class boundary (64j, 64j + 1) and a few inner points up to ``limit``, plus 1..130 exhaustively."""
    ms = set(range(1, 131))
    for j in range(1, limit // 64 + 1):
        ms.update((64 * j - 1, 64 * j, 64 * j + 1, 64 * j - 32))
    return sorted(m for m in ms if 1 <= m <= limit)


def test_memoized_choice_equals_the_search():
    """choose_config (memoized by m_class) returns what the unmemoized search returns for the exact M: normal over a
    grid of M up to 8192 on the six serving (N, K) pairs and at 78 SMs, contiguous over total rows, masked exact."""
    def search(kind, m, n, k, g, sms):
        return C.choose(kind, m, n, k, g, sms)[0]
    for n, k in NORMAL_NK:
        for m in _grid_ms(8192)[::3] + [4095, 4096, 4097]:
            assert C.choose_config(C.KIND_NORMAL, m, n, k, 1, 132) == search(C.KIND_NORMAL, m, n, k, 1, 132), (m, n, k)
    for m in _grid_ms(2048)[::5]:
        assert C.choose_config(C.KIND_NORMAL, m, 4096, 7168, 1, 78) == search(C.KIND_NORMAL, m, 4096, 7168, 1, 78), m
    for rows in range(128, 8 * 4096 + 1, 128 * 37):
        for g in (4, 8):
            assert C.choose_config(C.KIND_CONTIGUOUS, rows, 7168, 2048, g, 132) == search(
                C.KIND_CONTIGUOUS, rows, 7168, 2048, g, 132), (rows, g)
    for m in (1, 17, 64, 65, 200, 256):
        assert C.choose_config(C.KIND_MASKED, m, 4096, 7168, 4, 132) == search(
            C.KIND_MASKED, m, 4096, 7168, 4, 132)


def test_m_class_matches_every_ceil_div_the_search_reads():
    """The proof behind m_class, checked: equal classes imply equal ceil_div(M, b) for every tile height."""
    for m in range(1, 4 * 4096):
        c = C.m_class(C.KIND_NORMAL, m)
        for b in (64, 128, 192, 256):
            assert ceil_div(c, b // 64) == ceil_div(m, b)
        assert (m <= 64) == (c <= 1) and (m <= 128) == (c <= 2)
    assert C.m_class(C.KIND_MASKED, 77) == 77


def test_memo_serving_loop_has_no_misses_after_the_first_pass():
    """M = 1..4096 over six (N, K) pairs: the first pass misses once per class (6 x 64), the second never."""
    C.clear_memo()
    for n, k in NORMAL_NK:
        for m in range(1, 4097):
            C.choose_config(C.KIND_NORMAL, m, n, k, 1, 132)
    first = C.memo_info()
    assert first.misses == 6 * 64 and first.currsize == 6 * 64
    for n, k in NORMAL_NK:
        for m in range(1, 4097):
            C.choose_config(C.KIND_NORMAL, m, n, k, 1, 132)
    assert C.memo_info().misses == first.misses


@pytest.mark.parametrize("args,name,exc", [
    ((C.KIND_NORMAL, 0, 4096, 7168, 1, 132), "m_rows", ValueError),
    ((C.KIND_NORMAL, -5, 4096, 7168, 1, 132), "m_rows", ValueError),
    ((C.KIND_NORMAL, 64, 0, 7168, 1, 132), "n", ValueError),
    ((C.KIND_NORMAL, 64, 4096, 0, 1, 132), "k", ValueError),
    ((C.KIND_MASKED, 64, 4096, 7168, 0, 132), "num_groups", ValueError),
    ((C.KIND_NORMAL, 64, 4096, 7168, 1, 0), "num_sms", ValueError),
    ((C.KIND_NORMAL, 64.0, 4096, 7168, 1, 132), "m_rows", TypeError),
    ((C.KIND_NORMAL, 64, 4096, 7168, 1, True), "num_sms", TypeError),
    ((7, 64, 4096, 7168, 1, 132), "kind", ValueError),
])
def test_choose_config_rejects_degenerate_problems(args, name, exc):
    with pytest.raises(exc, match=name):
        C.choose_config(*args)


@pytest.mark.parametrize("fields,match,exc", [
    (dict(block_m=100), r"block_m: expected one of 64, 128, 192, 256 for normal GEMMs, got 100", ValueError),
    (dict(block_m="128"), "block_m", TypeError),
    (dict(block_n=100), r"block_n: expected a multiple of 8 in \[8, 256\], got 100", ValueError),
    (dict(block_n=264), "block_n", ValueError),
    (dict(wgmma_n=12), "wgmma_n", ValueError),
    (dict(num_stages=0), "num_stages", ValueError),
    (dict(num_stages=2.0), "num_stages", TypeError),
    (dict(num_sms=0), "num_sms", ValueError),
    (dict(raster_n=-1), "raster_n", ValueError),
    (dict(multicast=3), "multicast", ValueError),
    (dict(split_k=0), "split_k", ValueError),
    (dict(split_k=99), r"split_k: expected an int in \[1, 56\]", ValueError),
    (dict(interleave_k="yes"), "interleave_k", TypeError),
    (dict(interleave_k=2), "interleave_k", TypeError),
    (dict(double_acc=True), r"unknown fields \['double_acc'\]; allowed: \[.*'interleave_k'", ValueError),
    (dict(k_slices=2), "k_slices: the field is split_k", ValueError),
    (dict(split_k=True), "split_k: expected an int .* interleave_k", ValueError),
    (dict(split_k=False), "interleave_k", ValueError),
    (dict(block_m=256, block_n=256), "accumulators do not fit", ValueError),  # the combination, via make_config
    (dict(block_m=128, block_n=128, interleave_k=True), "interleave_k needs block_m == 64", ValueError),
])
def test_override_config_rejects_bad_fields_at_once(fields, match, exc):
    with pytest.raises(exc, match=match):
        C.override_config("normal", 4096, 7168, **fields)
    assert (C.KIND_NORMAL, 4096, 7168) not in overrides._overrides  # nothing half-applied


def test_override_config_grouped_block_m_and_bad_dims():
    with pytest.raises(ValueError, match="block_m: expected one of 64, 128, 256 for contiguous GEMMs, got 192"):
        C.override_config("contiguous", 4096, 7168, block_m=192)
    with pytest.raises(ValueError, match="split_k > 1"):
        C.override_config("masked", 4096, 7168, split_k=2)
    with pytest.raises(ValueError, match="n: expected a positive int"):
        C.override_config("normal", 0, 7168, block_m=64)
    with pytest.raises(TypeError, match="k: expected a positive int"):
        C.override_config("normal", 4096, "7168", block_m=64)
    C.override_config("normal", 4096, 7168, interleave_k=1)  # 0/1 stand for booleans
    try:
        assert overrides._overrides[(C.KIND_NORMAL, 4096, 7168)] == {"interleave_k": True}
    finally:
        C.override_config("normal", 4096, 7168)
