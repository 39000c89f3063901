"""The framework-neutral split rules (cupygemm.sharding) that JAX's partitioner and torch's DTensor rules apply:
which factors an op may be split along at given shapes and mesh sizes, and where each operand and result is split."""
from __future__ import annotations

import pytest

from cupygemm import sharding as rules
from cupygemm.kinds import KINDS
from cupygemm.quantization import BLOCK_WITH_TRANSPOSE, TRANSPOSED, TRANSPOSED_ROWWISE

KIND = {k.name: k for k in KINDS}


def _dense(m, n, k, stacked=False, kind="normal", packed=False):
    kb = -(-k // 128)
    kd = KIND[kind]
    sfb = ((-(-n // 128), kb) if kd.b_block_scales else (kb, n) if stacked else (n, kb))
    return rules.gemm_rule(kd, None, [(m, k), (kb, m) if stacked else (m, kb), (n, k), sfb], packed, stacked,
                           stacked and not kd.b_block_scales)


def _by_factor(rule, shards):
    return {s.factor: s for s in rules.splits(rule, shards)}


def test_dense_gemm_splits_rows_columns_and_k():
    got = _by_factor(_dense(256, 512, 1024), 2)
    assert list(got) == ["m", "k", "n"]  # the rule's priority order: activations first
    assert got["m"] == rules.Split("m", (0, 0, None, None), (0,), False)
    assert got["k"] == rules.Split("k", (1, 1, 1, 1), (None,), True)  # partial sums, to be added up
    assert got["n"] == rules.Split("n", (None, None, 0, 0), (1,), False)  # column-parallel: B and its SFB rows


@pytest.mark.parametrize("m,n,k,shards,want", [
    (256, 384, 1024, 2, ["m", "k"]),  # 384 / 2 = 192: half a scale block on each side
    (256, 512, 1152, 2, ["m", "n"]),  # K = 9 blocks of 128
    (7, 512, 1024, 2, ["k", "n"]),  # 7 rows do not split in two equal parts
    (256, 512, 1024, 4, ["m", "k", "n"]),  # K / 4 = 256, N / 4 = 128: whole blocks
    (256, 512, 1024, 8, ["m", "k"]),  # K / 8 = 128 is one block each, N / 8 = 64 half of one
    (256, 512, 1024, 1, []),  # one device: nothing to split
])
def test_a_factor_splits_only_into_whole_shards(m, n, k, shards, want):
    assert [s.factor for s in rules.splits(_dense(m, n, k), shards)] == want


def test_weight_gradient_scales_of_both_operands_follow_their_rows():
    """The 1D1D kinds' B scales are per 1x128 row block: B's rows split with them (no 128 alignment on N), and
    scales given as the transposed stack [KB, rows] split along their other dimension."""
    plain = _by_factor(_dense(256, 200, 1024, kind="wgrad_store"), 2)
    assert plain["n"].operands == (None, None, 0, 0)
    stacked = _by_factor(_dense(256, 200, 1024, stacked=True, kind="wgrad_store"), 2)
    assert stacked["m"].operands == (0, 1, None, None) and stacked["n"].operands == (None, None, 0, 1)
    assert stacked["k"].operands == (1, 0, 1, 0) and stacked["k"].partial


def test_grouped_kinds():
    g, m, n, k = 4, 256, 512, 1024
    masked = rules.gemm_rule(KIND["masked"], None, [(g, m, k), (g, m, k // 128), (g, n, k), (g, n // 128, k // 128),
                                                   (g,)], False, False, False)
    got = _by_factor(masked, 2)
    assert list(got) == ["g", "n"]  # each group's rows stay together (masked_m counts them)
    assert got["g"] == rules.Split("g", (0, 0, 0, 0, 0), (0,), False)  # expert parallel: masked_m split too
    contiguous = rules.gemm_rule(KIND["contiguous"], None, [(384, k), (384, k // 128), (g, n, k),
                                                            (g, n // 128, k // 128), (384,)], False, False, False)
    assert [s.factor for s in rules.splits(contiguous, 2)] == ["n"]  # 384 / 2 rows: a group would straddle
    contiguous = rules.gemm_rule(KIND["contiguous"], None, [(512, k), (512, k // 128), (g, n, k),
                                                            (g, n // 128, k // 128), (512,)], False, False, False)
    assert _by_factor(contiguous, 2)["m"] == rules.Split("m", (0, 0, None, None, 0), (0,), False)


def test_packed_weights_stay_whole_and_flat_operands_do_not_split():
    assert [s.factor for s in rules.splits(_dense(256, 512, 1024, packed=True), 2)] == ["m"]
    kg = KIND["k_grouped_wgrad"]
    assert rules.gemm_rule(kg, None, [(8192,), (64,), (8192,), (64,)], False, False, False) is None


def test_casts():
    token = _by_factor(rules.cast_rule(None, (512, 1024), block_rows=False), 2)
    assert token["m"].results == (0, 0) and token["k"].results == (1, 1)
    assert [s.factor for s in rules.splits(rules.cast_rule(None, (200, 1024), block_rows=False), 2)] == ["m", "k"]
    # the per-block cast's scales count 128-blocks of rows too: 200 rows do not split
    assert [s.factor for s in rules.splits(rules.cast_rule(None, (200, 1024), block_rows=True), 2)] == ["k"]


@pytest.mark.parametrize("entry", [TRANSPOSED, TRANSPOSED_ROWWISE, BLOCK_WITH_TRANSPOSE])
def test_fused_casts_split_their_transposed_results_along_the_other_dimension(entry):
    got = _by_factor(rules.fused_cast_rule(None, entry, (512, 1024)), 2)
    count = len(rules.FUSED_CAST_RESULTS[entry])
    for factor, operand_dim in (("m", 0), ("k", 1)):
        s = got[factor]
        assert s.operands == (operand_dim,) and not s.partial and len(s.results) == count
        for dims, d in zip(rules.FUSED_CAST_RESULTS[entry], s.results):
            assert dims[d].rstrip("/") == factor
    if entry != BLOCK_WITH_TRANSPOSE:
        assert got["m"].results[0] == 1  # the first result is x^T: its columns are x's rows
    # tokens (x's rows) that split into halves of 128-block scales along x^T only where whole blocks
    assert "m" not in _by_factor(rules.fused_cast_rule(None, entry, (200, 1024)), 2)
