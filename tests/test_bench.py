"""Tests of ``cupygemm bench``: the pure parts on CPU (shape lists, sizes, formulas, checks, writers, argparse),
and one GPU run on two small normal shapes (``-m gpu``, Hopper only)."""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from cupygemm import config as C
from cupygemm import reference as ref
from cupygemm.bench import cases, checks, environment, inputs, metrics, options, plot, providers, report, run
from cupygemm.bench.cases import Shape, Sizes

REPO = Path(__file__).resolve().parents[1]


# ---- shapes ---------------------------------------------------------------------------------------------------------

def test_default_shapes_are_the_28_seed_shapes():
    shapes = cases.default_shapes()
    assert len(shapes) == 28
    kinds = [s.kind for s in shapes]
    assert kinds.count("normal") == 18 and kinds.count("contiguous") == 4 and kinds.count("masked") == 6
    order = ["normal", "contiguous", "masked"]
    assert kinds == sorted(kinds, key=order.index)  # normal, then contiguous, then masked
    assert len(set(shapes)) == 28
    normal = {s.dims for s in shapes if s.kind == "normal"}
    assert normal == {(m, n, k) for m in (64, 128, 4096) for n, k in
                      [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]}
    contig = {s.dims for s in shapes if s.kind == "contiguous"}
    assert contig == {(4, 8192, 4096, 7168), (4, 8192, 7168, 2048), (8, 4096, 4096, 7168), (8, 4096, 7168, 2048)}
    masked = {s.dims for s in shapes if s.kind == "masked"}
    assert masked == {(g, m, n, k) for g, m in [(1, 1024), (2, 512), (4, 256)] for n, k in [(4096, 7168), (7168, 2048)]}
    assert shapes[0].label == "64x2112x7168"
    s = Shape("masked", (2, 512, 7168, 2048))
    assert (s.groups, s.m, s.n, s.k, s.label) == (2, 512, 7168, 2048, "2x512x7168x2048")
    s = Shape("normal", (128, 4096, 7168))
    assert (s.groups, s.m, s.n, s.k) == (1, 128, 4096, 7168)


def test_default_shapes_by_kind():
    assert [s.kind for s in cases.default_shapes(["masked"])] == ["masked"] * 6
    assert len(cases.default_shapes(["normal", "contiguous"])) == 22


def test_parse_kinds():
    assert cases.parse_kinds(None) is None
    assert cases.parse_kinds("normal,contiguous,masked") == ["normal", "contiguous", "masked"]
    assert cases.parse_kinds("masked, contig") == ["masked", "contiguous"]
    assert cases.parse_kinds("normal,normal") == ["normal"]
    with pytest.raises(cases.BenchUsageError, match="unknown kind"):
        cases.parse_kinds("normal,dense")
    with pytest.raises(cases.BenchUsageError):
        cases.parse_kinds(",")


def test_parse_shape_texts():
    assert cases.parse_shape_texts(None) is None
    assert cases.parse_shape_texts(["64x2112x7168", "128X7168x2048,4096x4096x7168"]) == [
        (64, 2112, 7168), (128, 7168, 2048), (4096, 4096, 7168)]
    assert cases.parse_shape_texts(["4x8192x4096x7168"]) == [(4, 8192, 4096, 7168)]
    for bad in (["64x2112"], ["axbxc"], ["1x2x3x4x5"], [","]):
        with pytest.raises(cases.BenchUsageError):
            cases.parse_shape_texts(bad)


def test_select_shapes():
    assert len(cases.select_shapes(None, None)) == 28
    assert len(cases.select_shapes(["contiguous"], None)) == 4
    got = cases.select_shapes(None, [(64, 2112, 7168)])
    assert got == [Shape("normal", (64, 2112, 7168))]
    got = cases.select_shapes(["masked"], [(2, 512, 4096, 7168)])
    assert got == [Shape("masked", (2, 512, 4096, 7168))]
    got = cases.select_shapes(["normal", "contiguous"], [(64, 256, 512), (4, 256, 512, 1024)])
    assert [s.kind for s in got] == ["normal", "contiguous"]
    with pytest.raises(cases.BenchUsageError, match="exactly one of contiguous, masked to say"):
        cases.select_shapes(None, [(4, 8192, 4096, 7168)])
    with pytest.raises(cases.BenchUsageError, match="exactly one of contiguous, masked to say"):
        cases.select_shapes(["contiguous", "masked"], [(4, 8192, 4096, 7168)])
    with pytest.raises(cases.BenchUsageError, match="is MxNxK, a shape of normal.*, but --kinds excludes"):
        cases.select_shapes(["masked"], [(64, 2112, 7168)])
    with pytest.raises(cases.BenchUsageError, match="multiple of 16"):
        cases.select_shapes(None, [(64, 2112, 7000)])
    with pytest.raises(cases.BenchUsageError, match="multiple of 8"):
        cases.select_shapes(None, [(64, 2113, 7168)])
    with pytest.raises(cases.BenchUsageError, match="positive"):
        cases.select_shapes(None, [(0, 2112, 7168)])


# ---- sizes, layouts, configs ------------------------------------------------------------------------------------------

def test_make_sizes_normal():
    s = cases.make_sizes(Shape("normal", (64, 2112, 7168)), 0)
    assert s == Sizes((64,), 64) and s.valid_m == 64


@pytest.mark.parametrize("shape", [s for s in cases.default_shapes() if s.kind == "contiguous"])
def test_make_sizes_contiguous(shape):
    s = cases.make_sizes(shape, 0)
    assert len(s.group_rows) == shape.groups
    for r in s.group_rows:
        assert int(0.7 * shape.m) <= r <= int(1.3 * shape.m)
    assert s.a_rows == sum(cases.round_up(r, 128) for r in s.group_rows)
    assert s.a_rows % 128 == 0
    assert s == cases.make_sizes(shape, 0)  # deterministic
    assert s != cases.make_sizes(shape, 1)  # the seed matters


@pytest.mark.parametrize("shape", [s for s in cases.default_shapes() if s.kind == "masked"])
def test_make_sizes_masked(shape):
    s = cases.make_sizes(shape, 0)
    assert s.a_rows == 4096  # max_m
    assert len(s.group_rows) == shape.groups
    for r in s.group_rows:
        assert int(0.7 * shape.m) <= r <= int(1.3 * shape.m)
    assert s.valid_m == sum(s.group_rows)


@pytest.mark.parametrize("shape", [s for s in cases.default_shapes() if s.kind == "masked"])
def test_full_groups_hold_every_row_and_plan_for_them(shape):
    s = cases.make_sizes(shape, 0, valid_rows=None, full_groups=True)
    assert s.group_rows == (shape.m,) * shape.groups and s.a_rows == shape.m
    sizes = cases.shape_sizes([shape], 0, None, full_groups=True)
    assert sizes[shape] == s
    # The config the bench times is the one the API plans for max_m = expected_m.
    assert cases.shape_config(shape, s, 132) == C.choose_config(C.KIND_MASKED, shape.m, shape.n, shape.k,
                                                                shape.groups, 132, max_m=shape.m)
    # Normal and contiguous shapes keep their sizes.
    other = Shape("contiguous", (4, 8192, 4096, 7168))
    assert cases.make_sizes(other, 0, full_groups=True) == cases.make_sizes(other, 0)


def test_sizes_do_not_depend_on_the_shape_list():
    shape = Shape("contiguous", (8, 4096, 7168, 2048))
    assert cases.make_sizes(shape, 3) == cases.make_sizes(Shape("contiguous", (8, 4096, 7168, 2048)), 3)
    assert cases.make_sizes(shape, 3) != cases.make_sizes(Shape("contiguous", (8, 4096, 4096, 7168)), 3)


def _peer_table(path, rows_by_shape):
    """A peer table with DeepGEMM rows whose TFLOPS x time encode the given valid rows."""
    rows = []
    for (kind, dims), valid in rows_by_shape.items():
        us = 100.0
        rows.append({"kind": {"contiguous": "contig"}.get(kind, kind), "shape": list(dims), "provider": "deepgemm",
                     "us": us, "tflops": 2 * valid * dims[-2] * dims[-1] / (us * 1e-6) / 1e12})
        rows.append({"kind": kind, "shape": list(dims), "provider": "cublas_block", "us": us, "tflops": 1.0})
    path.write_text(json.dumps({"device": "test", "rows": rows}))
    return path


def test_peer_valid_rows_reads_deepgemm_rows(tmp_path):
    want = {("contiguous", (4, 8192, 4096, 7168)): 34151, ("masked", (1, 1024, 4096, 7168)): 1006}
    assert cases.peer_valid_rows(_peer_table(tmp_path / "p.json", want)) == want


@pytest.mark.parametrize("rows,total,expected", [([1109], 1006, 1024), ([300, 500, 200], 1085, 256 * 4 // 3),
                                                 ([9000, 6000, 10000, 8000], 34151, 8192), ([7, 7], 18, 10)])
def test_match_total_hits_the_total_within_the_spread(rows, total, expected):
    out = cases.match_total(rows, total, expected)
    assert sum(out) == total and len(out) == len(rows)
    assert all(int(0.7 * expected) <= r <= int(1.3 * expected) for r in out)


def test_match_total_rejects_impossible_totals():
    with pytest.raises(ValueError, match="cannot be split"):
        cases.match_total([100, 100], 500, 100)


@pytest.mark.parametrize("shape,valid", [(Shape("masked", (1, 1024, 4096, 7168)), 1006),
                                         (Shape("masked", (4, 256, 7168, 2048)), 973),
                                         (Shape("contiguous", (8, 4096, 7168, 2048)), 38239)])
def test_make_sizes_with_matched_rows(shape, valid):
    s = cases.make_sizes(shape, 0, valid)
    assert s.valid_m == valid and len(s.group_rows) == shape.groups
    if shape.kind == "contiguous":
        assert s.a_rows == sum(cases.round_up(r, 128) for r in s.group_rows)
    else:
        assert s.a_rows == 4096


def test_shape_sizes_match_rows_from_a_peer_table(tmp_path):
    shapes = cases.default_shapes(["contiguous", "masked"])
    table = _peer_table(tmp_path / "p.json", {("masked", (2, 512, 4096, 7168)): 1037})
    sizes = cases.shape_sizes(shapes, 0, str(table))
    for s in shapes:  # shapes the table lacks keep their seeded draw
        want = 1037 if s.dims == (2, 512, 4096, 7168) else cases.make_sizes(s, 0).valid_m
        assert sizes[s].valid_m == want
    with pytest.raises(cases.BenchUsageError, match="--match-rows"):
        cases.shape_sizes(shapes, 0, str(tmp_path / "missing.json"))
    bad = _peer_table(tmp_path / "bad.json", {("masked", (1, 1024, 4096, 7168)): 5000})
    with pytest.raises(cases.BenchUsageError, match="cannot be split"):
        cases.shape_sizes(shapes, 0, str(bad))


def test_masked_max_m():
    assert cases.masked_max_m(1024) == 4096
    assert cases.masked_max_m(4000) == cases.round_up(math.ceil(4000 * 1.3), 128)


def test_contiguous_m_indices():
    idx = cases.contiguous_m_indices([3, 128, 130])
    assert idx.dtype == np.int32
    assert len(idx) == 128 + 128 + 256
    assert (idx[:3] == 0).all() and (idx[3:128] == -1).all()
    assert (idx[128:256] == 1).all()
    assert (idx[256:386] == 2).all() and (idx[386:] == -1).all()
    assert len(cases.contiguous_m_indices([])) == 0


def test_config_m_rows_matches_the_api():
    n = Shape("normal", (64, 2112, 7168))
    assert cases.config_m_rows(n, cases.make_sizes(n, 0)) == 64
    c = Shape("contiguous", (4, 8192, 4096, 7168))
    sc = cases.make_sizes(c, 0)
    assert cases.config_m_rows(c, sc) == sc.a_rows  # total (padded) rows, like gemm._launch(p, p.m)
    m = Shape("masked", (2, 512, 4096, 7168))
    assert cases.config_m_rows(m, cases.make_sizes(m, 0)) == 512  # expected_m
    big = Shape("masked", (1, 9000, 4096, 7168))
    sb = cases.make_sizes(big, 0)
    assert cases.config_m_rows(big, sb) == min(9000, sb.a_rows)


def test_shape_config_agrees_with_warmup_configs():
    from cupygemm.cli import warmup_configs
    from cupygemm.config import GemmConfig

    for kind in ("normal", "masked"):
        shapes = cases.default_shapes([kind])
        dims = [s.dims for s in shapes]
        want = warmup_configs(kind, dims, 132)
        # Explicit masked warm-up shapes are full groups (max_m = expected_m = M): the bench's --full-groups.
        got = [cases.shape_config(s, cases.make_sizes(s, 0, full_groups=True), 132) for s in shapes]
        assert got == want
    c = cases.default_shapes(["contiguous"])[0]
    cfg = cases.shape_config(c, cases.make_sizes(c, 0), 132)
    assert isinstance(cfg, GemmConfig) and cfg.block_m in (128, 256) and "contiguous" in cfg.describe()


def test_check_rows_normal():
    s = Shape("normal", (64, 256, 512))
    rows, groups = cases.check_rows(s, cases.make_sizes(s, 0), 16, 0)
    assert len(rows) == 16 and (np.diff(rows) > 0).all() and rows.max() < 64 and (groups == 0).all()
    small = Shape("normal", (5, 256, 512))
    rows, _ = cases.check_rows(small, cases.make_sizes(small, 0), 16, 0)
    assert list(rows) == [0, 1, 2, 3, 4]


def test_check_rows_contiguous_only_valid_rows():
    s = Shape("contiguous", (8, 4096, 7168, 2048))
    sizes = cases.make_sizes(s, 0)
    idx = cases.contiguous_m_indices(sizes.group_rows)
    rows, groups = cases.check_rows(s, sizes, 16, 0)
    assert len(rows) == 16
    assert (idx[rows] == groups).all()  # never a padding row (-1), group matches m_indices


def test_check_rows_masked_only_valid_rows():
    s = Shape("masked", (4, 256, 7168, 2048))
    sizes = cases.make_sizes(s, 0)
    rows, groups = cases.check_rows(s, sizes, 16, 0)
    assert len(rows) == 16
    assert (rows // sizes.a_rows == groups).all()
    for r, g in zip(rows, groups):
        assert r % sizes.a_rows < sizes.group_rows[g]


# ---- formulas ---------------------------------------------------------------------------------------------------------

def test_work_normal():
    s = Shape("normal", (64, 2112, 7168))
    flops, nbytes = metrics.work(s, cases.make_sizes(s, 0))
    assert flops == 2 * 64 * 2112 * 7168
    assert nbytes == 64 * 7168 + 2112 * 7168 + 2 * 64 * 2112


def test_work_grouped_counts_valid_rows_only():
    s = Shape("contiguous", (4, 8192, 4096, 7168))
    sizes = Sizes((8000, 9000, 7000, 10000), 0)
    vm = 34000
    assert metrics.work(s, sizes) == (2 * vm * 4096 * 7168, vm * 7168 + 4 * 4096 * 7168 + 2 * vm * 4096)
    m = Shape("masked", (2, 512, 7168, 2048))
    assert metrics.work(m, Sizes((400, 600), 4096)) == (2 * 1000 * 7168 * 2048,
                                                      1000 * 2048 + 2 * 7168 * 2048 + 2 * 1000 * 7168)


def test_floor_matches_the_peer_tables():
    # shared/peers/README.md, H200 table (copy bandwidth 4.3 TB/s): 64x2112x7168 floor 3.7 us (bytes),
    # 4096x7168x16384 floor 486.1 us (FLOPs / 1979 TFLOPS).
    s = Shape("normal", (64, 2112, 7168))
    flops, nbytes = metrics.work(s, cases.make_sizes(s, 0))
    assert metrics.floor_us(flops, nbytes, 4.3e12) == pytest.approx(nbytes / 4.3e12 * 1e6)
    assert round(metrics.floor_us(flops, nbytes, 4.3e12), 1) == 3.7
    s = Shape("normal", (4096, 7168, 16384))
    flops, nbytes = metrics.work(s, cases.make_sizes(s, 0))
    assert metrics.floor_us(flops, nbytes, 4.3e12) == pytest.approx(flops / 1979e12 * 1e6)
    assert round(metrics.floor_us(flops, nbytes, 4.3e12), 1) == 486.1


def test_throughput_matches_the_peer_json():
    # h200-2026-11-21.json, deepgemm 64x2112x7168: us 10.6591 -> 181.79 TFLOPS, 1488.67 GB/s
    s = Shape("normal", (64, 2112, 7168))
    flops, nbytes = metrics.work(s, cases.make_sizes(s, 0))
    t = metrics.throughput(10.6591, flops, nbytes, 3.7)
    assert t["tflops"] == pytest.approx(181.7947, rel=1e-4)
    assert t["gbs"] == pytest.approx(1488.672, rel=1e-4)
    assert t["pct_floor"] == pytest.approx(100 * 3.7 / 10.6591)


def test_summarize_times_and_geomean():
    st = metrics.summarize_times([float(i) for i in range(1, 101)])
    assert st["us"] == pytest.approx(50.5) and st["min"] == 1 and st["max"] == 100
    assert st["p10"] == pytest.approx(10.9) and st["p90"] == pytest.approx(90.1)
    assert metrics.summarize_times([3.0])["us"] == 3.0
    assert metrics.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert metrics.geomean([None, math.nan, 0.0]) is None


# ---- checks -----------------------------------------------------------------------------------------------------------

def test_bf16_bits_rounds_like_ml_dtypes():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(10000).astype(np.float32),
                        np.array([1.0, -2.5, 1.00390625, 1.01171875, 0.0, -0.0, 3e38], dtype=np.float32)])
    want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert (inputs.bf16_bits(x) == want).all()
    back = inputs.bf16_bits_to_f64(want)
    assert (back == x.astype(ml_dtypes.bfloat16).astype(np.float64)).all()


def test_compare():
    rng = np.random.default_rng(1)
    ref_q = rng.standard_normal((4, 64))
    ref_x = ref_q * (1 + 1e-3 * rng.standard_normal((4, 64)))
    ok = checks.compare(ref_q * (1 + 1e-3 * rng.standard_normal((4, 64))), ref_q, ref_x)
    assert ok["check"] == "ok" and ok["rel_err"] < 1e-2 and ok["calc_diff"] < 1e-3
    bad = checks.compare(ref_q * 1.1 + 0.2, ref_q, ref_x)
    assert bad["check"] == "FAIL"
    nan = ref_q.copy()
    nan[0, 0] = np.nan
    assert checks.compare(nan, ref_q, ref_x)["check"] == "FAIL"


def _host_inputs(shape: Shape, seed: int = 0) -> inputs.Inputs:
    """The bench's Inputs built on the host with the reference casts (what make_inputs does on the GPU)."""
    sizes = cases.make_sizes(shape, seed)
    rng = np.random.default_rng(seed)
    k = shape.k
    if shape.kind == "normal":
        a_shape, b_shape = (shape.m, k), (shape.n, k)
    elif shape.kind == "contiguous":
        a_shape, b_shape = (sizes.a_rows, k), (shape.groups, shape.n, k)
    else:
        a_shape, b_shape = (shape.groups, sizes.a_rows, k), (shape.groups, shape.n, k)
    x = inputs.bf16_bits(rng.standard_normal(a_shape).astype(np.float32))
    y = inputs.bf16_bits(rng.standard_normal(b_shape).astype(np.float32))
    a, sfa = ref.per_token_cast_to_fp8_reference(x.reshape(-1, k).view(ml_dtypes.bfloat16))
    a, sfa = a.reshape(a_shape), sfa.reshape(a_shape[:-1] + (-1,))
    yb = y.reshape((-1,) + b_shape[-2:])
    parts = [ref.per_block_cast_to_fp8_reference(yb[g].view(ml_dtypes.bfloat16)) for g in range(len(yb))]
    b = np.stack([p[0] for p in parts]).reshape(b_shape)
    sfb = np.stack([p[1] for p in parts])
    if shape.kind == "normal":
        sfb = sfb[0]
    return inputs.Inputs(shape, sizes, a, sfa, None, b, sfb, x, y)


@pytest.mark.parametrize("shape", [Shape("normal", (40, 256, 384)), Shape("contiguous", (3, 100, 128, 256)),
                                   Shape("masked", (2, 50, 136, 256))])
def test_reference_rows_and_check_on_host(shape):
    inp = _host_inputs(shape)
    rows, groups = cases.check_rows(shape, inp.sizes, 16, 0)
    ref_q, ref_x = checks.reference_rows(inp, rows, groups)
    a2, s2 = inp.a.reshape(-1, shape.k), inp.sfa.reshape(len(inp.a.reshape(-1, shape.k)), -1)
    for i, (r, g) in enumerate(zip(rows, groups)):
        b = inp.b if inp.b.ndim == 2 else inp.b[g]
        sb = inp.sfb if inp.sfb.ndim == 2 else inp.sfb[g]
        want = ref.gemm_reference(a2[r:r + 1], s2[r:r + 1], b, sb)[0]
        np.testing.assert_allclose(ref_q[i], want, rtol=1e-12, atol=1e-12)
    # A perfect kernel (the float64 reference rounded to BF16) passes both checks.
    got_bits = inputs.bf16_bits(ref_q.astype(np.float32))
    res = checks.compare(inputs.bf16_bits_to_f64(got_bits), ref_q, ref_x)
    assert res["check"] == "ok", res
    assert 1e-4 < res["calc_diff"] < 1e-3  # the FP8 quantization error, about 7e-4
    # output_rows reads sampled rows of a uint16 [rows, N] buffer.
    out = np.full((len(inp.a.reshape(-1, shape.k)), shape.n), 0xFFFF, dtype=np.uint16)
    out[rows] = got_bits
    np.testing.assert_array_equal(checks.output_rows(out, rows), inputs.bf16_bits_to_f64(got_bits))
    # A row the kernel did not write (still NaN-poisoned) fails.
    unwritten = np.setdiff1d(np.arange(len(out)), rows)[:1]
    assert checks.compare(checks.output_rows(out, unwritten), ref_q[:1], ref_x[:1])["check"] == "FAIL"


# ---- rows and writers ---------------------------------------------------------------------------------------------------

def _synthetic_rows() -> list[dict]:
    rows = []
    n = Shape("normal", (64, 2112, 7168))
    sn = cases.make_sizes(n, 0)
    f, b = metrics.work(n, sn)
    fl = metrics.floor_us(f, b, 4.3e12)
    stats = lambda us: {"us": us, "p10": us * 0.98, "p90": us * 1.03, "min": us * 0.97, "max": us * 1.1}  # noqa: E731
    ok = {"check": "ok", "rel_err": 2e-3, "calc_diff": 6.9e-4}
    rows.append(report.make_row(n, sn, "cupygemm", stats(10.0), f, b, fl, "normal N=2112 K=7168: block 64x...", ok))
    rows.append(report.make_row(n, sn, "cublas_block", stats(20.0), f, b, fl, None, ok))
    rows.append(report.make_row(n, sn, "deepgemm", stats(12.5), f, b, fl, None, ok))
    m = Shape("masked", (2, 512, 7168, 2048))
    sm = Sizes((400, 600), 4096)
    f, b = metrics.work(m, sm)
    fl = metrics.floor_us(f, b, 4.3e12)
    bad = {"check": "FAIL", "rel_err": 0.5, "calc_diff": 0.3}
    rows.append(report.make_row(m, sm, "cupygemm", stats(40.0), f, b, fl, "masked N=7168 K=2048: ...", bad))
    rows.append(report.make_row(m, sm, "deepgemm", None, f, b, fl, None, None, error="RuntimeError: boom"))
    return rows


def test_make_row_fields():
    rows = _synthetic_rows()
    r = rows[0]
    for key in ("kind", "shape", "provider", "us", "p10", "p90", "tflops", "gbs", "pct_floor", "config", "check",
                "calc_diff", "rel_err", "floor_us", "valid_m"):
        assert key in r
    assert r["shape"] == [64, 2112, 7168] and r["kind"] == "normal"
    assert r["tflops"] == pytest.approx(2 * 64 * 2112 * 7168 / 10e-6 / 1e12)
    assert r["pct_floor"] == pytest.approx(100 * r["floor_us"] / 10.0)
    assert rows[-1]["check"] == "FAIL" and rows[-1]["us"] is None and report.row_failed(rows[-1])
    assert not report.row_failed(rows[0]) and report.row_failed(rows[3])


def test_speedup():
    rows = _synthetic_rows()
    assert report.speedup(rows[0], rows[1]) == pytest.approx(2.0)
    assert report.speedup(rows[0], rows[2]) == pytest.approx(1.25)
    assert report.speedup(rows[3], rows[4]) is None  # the peer errored
    assert report.speedup(rows[0], None) is None


def test_format_table():
    rows = _synthetic_rows()
    text = report.format_table(rows, ["cublas_block", "deepgemm"])
    lines = text.splitlines()
    assert len(lines) == 4  # header, rule, two shapes
    head = lines[0]
    for h in ("kind", "shape", "floor us", "cupygemm us", "p10-p90", "TFLOPS", "GB/s", "% floor",
              "cuBLAS-block us", "DeepGEMM us", "vs cuBLAS-block", "vs DeepGEMM", "calc_diff", "check"):
        assert h in head
    assert "2.00x" in lines[2] and "1.25x" in lines[2] and "ok" in lines[2] and "10.0" in lines[2]
    assert "masked" in lines[3] and "FAIL" in lines[3] and "err" in lines[3]
    assert len({len(line) for line in lines[:2]}) == 1  # header and rule aligned
    # Without peers: no peer columns.
    solo = report.format_table([r for r in rows if r["provider"] == "cupygemm"])
    assert "cuBLAS" not in solo and "DeepGEMM" not in solo
    # A peer column with no result for a shape shows '-' (cuBLAS has no grouped API).
    headers, body = report.table_data(rows, ["cublas_block", "deepgemm"])
    assert body[1][headers.index("cuBLAS-block us")] == "-"
    assert body[1][headers.index("vs cuBLAS-block")] == "-"


def test_format_markdown():
    rows = _synthetic_rows()
    md = report.format_markdown(rows, ["cublas_block", "deepgemm"]).splitlines()
    assert md[0].startswith("| kind | shape |") and md[0].endswith("|")
    assert set(md[1]) <= set("|-")
    ncols = md[0].count("|")
    assert all(line.count("|") == ncols for line in md)
    assert len(md) == 4


def test_configs_notes_summary():
    rows = _synthetic_rows()
    cfg = report.format_configs(rows)
    assert "normal 64x2112x7168: normal N=2112" in cfg and "masked 2x512x7168x2048" in cfg
    notes = report.format_notes(rows)
    assert "DeepGEMM on masked 2x512x7168x2048: error: RuntimeError: boom" in notes
    assert "cupygemm on masked 2x512x7168x2048: check FAIL" in notes
    s = report.summary(rows, ["cublas_block", "deepgemm"])
    assert s["shapes"] == 2 and s["failed"] == 1
    assert s["speedup_geomean"]["cublas_block"] == {"geomean": pytest.approx(2.0), "shapes": 1}
    assert s["pct_floor_geomean"] == pytest.approx(rows[0]["pct_floor"])
    text = report.format_summary(rows, ["cublas_block", "deepgemm"])
    assert "FAILED: 1 of 2" in text and "2.00x vs cuBLAS-block" in text


def test_json_report(tmp_path):
    rows = _synthetic_rows()
    rows[0]["rel_err"] = math.nan  # non-finite numbers become null
    meta = {"device": "NVIDIA H200", "driver": "580.1", "cuda_runtime": "13.0", "nvrtc": "13.0", "cupy": "14.2.0",
            "torch": None, "cupygemm": "0.1.0", "git_revision": None, "command": "cupygemm bench",
            "date": "2026-11-21T00:00:00+00:00", "copy_gbs": 4300.0}
    doc = report.build_report(meta, rows, ["cublas_block", "deepgemm"])
    path = tmp_path / "out.json"
    report.write_json(path, doc)
    back = json.loads(path.read_text())
    assert back["schema"] == report.SCHEMA
    assert back["device"] == "NVIDIA H200" and back["copy_gbs"] == 4300.0
    assert set(back["providers"]) == {"cupygemm", "cublas_block", "deepgemm"}
    assert back["ok"] is False  # the masked cupygemm row failed
    assert len(back["rows"]) == 5 and back["rows"][0]["rel_err"] is None
    assert back["rows"][0]["provider"] == "cupygemm" and back["rows"][0]["us"] == 10.0
    good = report.build_report(meta, rows[:3], ["cublas_block"])
    assert good["ok"] is True and set(good["providers"]) == {"cupygemm", "cublas_block"}


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    rows = _synthetic_rows()
    path = tmp_path / "bench.png"
    plot.write_plot(path, rows, title="test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    path2 = tmp_path / "solo.png"
    plot.write_plot(path2, [r for r in rows if r["provider"] == "cupygemm"])
    assert path2.stat().st_size > 0


# ---- CLI -----------------------------------------------------------------------------------------------------------------

def test_bench_help_lists_options():
    res = subprocess.run([sys.executable, "-m", "cupygemm", "bench", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    for opt in ("--kinds", "--shapes", "--json", "--markdown", "--plot", "--peers", "--iters", "--seed"):
        assert opt in res.stdout
    top = subprocess.run([sys.executable, "-m", "cupygemm", "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert top.returncode == 0 and "bench" in top.stdout


def test_bench_parser_defaults():
    from cupygemm.cli import build_parser

    args = build_parser().parse_args(["bench"])
    assert args.func is options.run_bench
    assert (args.kinds, args.shapes, args.json, args.markdown, args.plot, args.peers, args.iters, args.seed) == \
        (None, None, None, False, None, "auto", 30, 0)
    args = build_parser().parse_args(["bench", "--kinds", "masked", "--shapes", "2x512x4096x7168", "--iters", "5",
                                      "--seed", "3", "--peers", "none", "--markdown", "--json", "x.json"])
    assert args.shapes == ["2x512x4096x7168"] and args.iters == 5 and args.markdown
    for bad in (["--iters", "0"], ["--seed", "-1"], ["--iters", "x"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["bench", *bad])


@pytest.mark.parametrize("argv", [["--kinds", "dense"], ["--shapes", "4x128x256x512"], ["--shapes", "64x100x7"],
                                  ["--peers", "mkl"], ["--match-rows", "/nonexistent/peers.json"]])
def test_usage_errors_exit_2_before_touching_the_gpu(argv, capsys):
    from cupygemm.cli import main

    assert main(["bench", *argv]) == 2
    assert "cupygemm bench:" in capsys.readouterr().err


def test_plot_without_matplotlib_exits_2(monkeypatch, capsys):
    from cupygemm.cli import main

    monkeypatch.setattr(run, "plot_available", lambda: False)
    assert main(["bench", "--plot", "x.png", "--peers", "none"]) == 2
    assert "pip install 'cupygemm[bench]'" in capsys.readouterr().err


def test_parse_peers():
    assert providers.parse_peers("auto") == (["cupygemm_packed", "cublas_block", "deepgemm", "deepergemm",
                                              "deepergemm_s128"], False)
    assert providers.parse_peers("packed,cublas") == (["cupygemm_packed", "cublas_block"], True)
    assert providers.parse_peers("none") == ([], False)
    assert providers.parse_peers("cublas") == (["cublas_block"], True)
    assert providers.parse_peers("deepgemm,cublas") == (["deepgemm", "cublas_block"], True)
    assert providers.parse_peers("deepergemm-s128,deeper_gemm") == (["deepergemm_s128", "deepergemm"], True)
    with pytest.raises(cases.BenchUsageError):
        providers.parse_peers("cutlass")
    assert providers.load_peers([]) == ({}, [])
    peers, notes = providers.load_peers(["cupygemm_packed"])  # no torch needed
    assert list(peers) == ["cupygemm_packed"] and notes == []


def test_packed_peer_left_out_where_packing_keeps_weights_plain(monkeypatch):
    """On a GPU where pack_weights keeps B plain (an H200), cupygemm-packed would time cupygemm's own kernels: the
    bench leaves it out with the reason instead of failing every shape; where it packs, the peer runs."""
    from cupygemm import l2

    why = "side-aware kernels measured slower than plain ones on NVIDIA H200"
    monkeypatch.setattr(l2, "why_plain", lambda device: why if device == 1 else None)
    peers, notes = providers.load_peers(["cupygemm_packed"], device=1)
    assert peers == {} and len(notes) == 1 and "cupygemm-packed: not run" in notes[0] and why in notes[0]
    peers, notes = providers.load_peers(["cupygemm_packed"], device=0)
    assert list(peers) == ["cupygemm_packed"] and notes == []


def test_command_line_and_git_revision():
    args = argparse.Namespace(kinds="normal", shapes=["64x2112x7168"], peers="none", iters=5, seed=1,
                              json="r.json", markdown=True, plot=None)
    assert environment.command_line(args) == ("cupygemm bench --kinds normal --shapes 64x2112x7168 --peers none "
                                        "--iters 5 --seed 1 --json r.json --markdown")
    rev = environment.git_revision()
    assert rev is None or (isinstance(rev, str) and rev)


def test_git_revision_flags_a_dirty_tree(tmp_path):
    pkg = tmp_path / "repo" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "mod.py").write_text("x = 1\n")

    def git(*args):
        subprocess.run(["git", "-C", str(pkg.parent), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       check=True, capture_output=True, timeout=60)

    assert environment.git_revision(pkg) is None  # not a checkout yet
    git("init", "-q")
    git("add", "pkg/mod.py")
    git("commit", "-q", "-m", "one")
    head = subprocess.run(["git", "-C", str(pkg), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (pkg / "notes.txt").write_text("untracked files do not count\n")
    assert environment.git_revision(pkg) == head
    (pkg / "mod.py").write_text("x = 2\n")
    assert environment.git_revision(pkg) == head + "-dirty"


def test_importing_bench_imports_no_torch():
    code = ("import sys, cupygemm.bench.run, cupygemm.bench.overhead, cupygemm.cli; cupygemm.cli.build_parser(); "
            "print('torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_bench_never_imports_the_cli_and_the_cli_builds_only_the_parser():
    """One direction only: the CLI imports the benchmark's parser when it builds its own; the benchmark's modules
    import neither the CLI nor each other in a cycle, and the run itself loads only when the command runs."""
    code = ("import sys, importlib, pkgutil, cupygemm.bench as b; "
            "[importlib.import_module('cupygemm.bench.' + m.name) for m in pkgutil.iter_modules(b.__path__)]; "
            "print('cupygemm.cli' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"
    code = "import sys, cupygemm.cli; cupygemm.cli.build_parser(); print('cupygemm.bench.run' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


# ---- GPU -------------------------------------------------------------------------------------------------------------------

def _hopper() -> bool:
    try:
        import cupy

        return bool(cupy.cuda.is_available()) and cupy.cuda.Device(0).compute_capability == "90"
    except Exception:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (compute capability 9.0) GPU")
def test_gpu_bench_two_small_normal_shapes(tmp_path, capsys):
    from cupygemm.cli import main

    out = tmp_path / "bench.json"
    rc = main(["bench", "--shapes", "128x512x1024", "256x1024x512", "--peers", "none", "--iters", "5",
               "--json", str(out), "--markdown"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "128x512x1024" in text and "256x1024x512" in text
    report = json.loads(out.read_text())
    assert report["ok"] is True and report["copy_gbs"] > 100
    assert report["device"] and report["cupy"] and report["cupygemm"] and "event_overhead_us" in report
    rows = report["rows"]
    assert [r["provider"] for r in rows] == ["cupygemm", "cupygemm"]
    for r in rows:
        assert r["check"] == "ok" and r["calc_diff"] < 1e-3 and r["rel_err"] < 1e-2
        assert r["us"] > 0 and r["p10"] <= r["us"] <= r["p90"] and r["tflops"] > 0 and r["config"]


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a Hopper (compute capability 9.0) GPU")
def test_gpu_bench_the_training_kinds(tmp_path, capsys):
    """One small wgrad and one k-grouped shape through the whole bench: inputs, cupygemm's calls, the checks
    (calc_diff, the dequantized reference, repeatable bits) and the rows."""
    from cupygemm.cli import main

    out = tmp_path / "train.json"
    rc = main(["bench", "--kinds", "wgrad,k_grouped_wgrad", "--shapes", "256x512x1024", "3x256x512x1024",
               "--peers", "none", "--iters", "3", "--json", str(out), "--markdown"])
    text = capsys.readouterr().out
    report = json.loads(out.read_text())
    rows = report["rows"]
    if any("NotImplementedError" in (r.get("error") or "") for r in rows):
        pytest.skip("the 1D1D kernel's plans are not wired in this tree")
    assert rc == 0, text
    assert [(r["kind"], r["provider"]) for r in rows] == [("wgrad", "cupygemm"), ("k_grouped_wgrad", "cupygemm")]
    for r in rows:
        assert r["check"] == "ok" and r["repeatable"] is True and r["calc_diff"] < 1e-3 and r["rel_err"] < 1e-2
        assert r["us"] > 0 and r["tflops"] > 0 and r.get("kernels_per_call", 1) >= 1
    assert sum(rows[1]["k_sizes"]) == 3 * 1024 and "weight-gradient kinds" in text


def test_jax_scan_subcommand_parses_without_importing_jax():
    """`cupygemm jax-scan` is registered with its options; building the CLI imports no JAX (each flag set runs in its
    own child process, since XLA reads XLA_FLAGS once when its backend starts)."""
    code = ("import sys, cupygemm.cli as c; a = c.build_parser().parse_args(['jax-scan', '--steps', '7', '--json', "
            "'x.json']); print(a.steps, a.repeats, a.json, a.func.__module__, 'jax' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["7", "20", "x.json", "cupygemm.bench.jax_scan", "False"]


def test_jax_scan_step_breakdown_splits_a_scan_timeline():
    """A scan's kernel records split per step into the GEMM (the kernel with the most time), the other kernels and
    the device's idle time: two steps of slice (1 us), counter (1 us), GEMM (7 us), 2 us idle before each GEMM and
    1 us after it."""
    from cupygemm.bench.jax_scan import step_breakdown

    recs, t = [], 0
    for _ in range(2):
        for dur, idle, name in ((1, 0, "loop_dynamic_slice_fusion"), (1, 2, "loop_add_fusion"),
                                (7, 1, "cupygemm_fp8_gemm")):
            recs.append((t * 1000, (t + dur) * 1000, name))
            t += dur + idle
    out = step_breakdown(list(reversed(recs)), 2)
    assert out["kernels_per_step"] == 3 and out["gemm_kernel"] == "cupygemm_fp8_gemm" and out["gemm_us"] == 7
    assert out["other_kernels_us_per_step"] == 2
    assert out["idle_us_per_step"] == 2.5  # 2 us before each GEMM, 1 us after the first (the scan ends on a GEMM)
    assert out["other_kernel_names"] == ["loop_add_fusion", "loop_dynamic_slice_fusion"]
    with pytest.raises(ValueError, match="records"):
        step_breakdown([], 2)


# --- DeeperGEMM peers, against stand-ins for torch and the package (the real ones run on the GPU machine) ---------

class _FakeTensor:
    def __init__(self, tag):
        self.tag = tag

    def view(self, dtype):
        return self


def _fake_torch():
    import types

    return types.SimpleNamespace(from_dlpack=lambda x: _FakeTensor(("operand", id(x))), float8_e4m3fn="f8",
                                 bfloat16="bf16", empty_like=lambda t: _FakeTensor(("reordered", t.tag)))


def _fake_deeper(name, log):
    import types

    def reorder(b, out):
        log.append(("reorder", b.tag, out.tag))

    def reorder_grouped(b, out, masked):
        log.append(("reorder_grouped", masked))

    return types.SimpleNamespace(
        __name__=name, preprocess_reorder_b=reorder, preprocess_reorder_b_grouped=reorder_grouped,
        gemm_fp8_fp8_bf16_nt=lambda lhs, rhs, out: log.append(("gemm", rhs[0].tag)),
        m_grouped_gemm_fp8_fp8_bf16_nt_masked=lambda lhs, rhs, out, mm, e: log.append(("masked", rhs[0].tag, e)),
        sideaware_init=lambda path: log.append(("sideaware_init", name, path)))


def _fake_inputs(kind, m=64, n=256, k=512, g=2):
    import types

    a = np.zeros((g, m, k) if kind == "masked" else (m, k), np.uint8)
    b = np.zeros((g, n, k) if kind == "masked" else (n, k), np.uint8)
    return types.SimpleNamespace(shape=types.SimpleNamespace(kind=kind, n=n, m=m), a=a, b=b, sfa_mn=np.zeros(1),
                                 sfb=np.zeros(1), masked_m=np.zeros(g, np.int32), m_indices=None)


def test_deepergemm_peer_times_the_gemm_on_b_reordered_once(monkeypatch):
    monkeypatch.setattr(providers, "_poisoned", lambda shape: np.full(shape, 0xFFFF, np.uint16))
    log = []
    peer = providers.DeeperGemmPeer(_fake_torch(), _fake_deeper("deeper_gemm", log), "deepergemm")
    inp = _fake_inputs("normal")
    prep = peer.prepare(inp)
    assert [e[0] for e in log] == ["reorder"]  # once, before (and outside) the timed call
    _, src, dst = log[0]
    assert src == ("operand", id(inp.b)) and dst == ("reordered", src)
    prep.call()
    prep.call()
    assert log[1:] == [("gemm", dst), ("gemm", dst)]  # the GEMM reads the reordered B
    log.clear()
    prep = providers.DeeperGemmPeer(_fake_torch(), _fake_deeper("deeper_gemm", log), "deepergemm").prepare(
        _fake_inputs("masked"))
    prep.call()
    assert log[0] == ("reorder_grouped", True) and log[1][0] == "masked"


def test_deepergemm_sideaware_is_set_up_once_and_shared(monkeypatch):
    import types

    log = []
    first, second = _fake_deeper("deeper_gemm", log), _fake_deeper("deeper_gemm_s128", log)
    state = {attr: object() for attr in providers._SIDEAWARE_STATE}
    src = types.SimpleNamespace(**state)
    dst = types.SimpleNamespace(**{attr: None for attr in providers._SIDEAWARE_STATE})
    for name, mod in (("deeper_gemm", first), ("deeper_gemm_s128", second),
                      ("deeper_gemm.jit_kernels.sideaware", src), ("deeper_gemm_s128.jit_kernels.sideaware", dst)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(providers, "_import_torch", lambda: (_fake_torch(), None))
    peers, notes = providers.load_peers(["deepergemm", "deepergemm_s128"], "/x/sideaware.so")
    assert set(peers) == {"deepergemm", "deepergemm_s128"} and not notes
    assert log == [("sideaware_init", "deeper_gemm", "/x/sideaware.so")]  # torch's allocator swapped once
    assert all(getattr(dst, attr) is state[attr] for attr in providers._SIDEAWARE_STATE)
    peers, notes = providers.load_peers(["deepergemm"])
    assert "deepergemm" in peers and any("side logic off" in n for n in notes)


def test_capture_graph_captures_the_calls_and_warms_the_graph():
    from cupygemm.bench.timing import capture_graph

    log = []

    class Graph:
        def launch(self, stream):
            log.append("launch")

    class Stream:
        capturing = False

        def __enter__(self):
            log.append("enter")

        def __exit__(self, *exc):
            log.append("exit")

        def begin_capture(self):
            self.capturing = True

        def end_capture(self):
            self.capturing = False
            return Graph()

        def synchronize(self):
            log.append("sync")

    s = Stream()
    g = capture_graph(s, lambda: log.append("call" if s.capturing else "call outside"), 3)
    assert isinstance(g, Graph) and log == ["enter", "call", "call", "call", "exit", "launch", "sync"]
