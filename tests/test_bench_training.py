"""``cupygemm bench`` on the weight-gradient kinds (wgrad, k_grouped_wgrad), on CPU: kinds and shapes read from the
descriptors, the k-grouped sizes (test_core's draw), the work formulas, the operands (built with NumPy and the
reference casts, as the GPU path builds them with CuPy), the calls made to cupygemm and to DeepGEMM (stand-ins that
compute the products with NumPy, asserting DeepGEMM's argument forms), the checks, the report and the whole run
loop with the GPU parts stubbed."""
from __future__ import annotations

import argparse
import json
import math
import types

import numpy as np
import pytest

import cupygemm
from cupygemm import reference as ref
from cupygemm.bench import cases, kinds, metrics, providers, report, run, training
from cupygemm.bench.cases import Shape, Sizes
from cupygemm.kinds import KINDS, kind_named
from cupygemm.kinds.training import check_column_sizes, check_k_grouped_wgrad, check_k_grouped_wgrad_columns, check_wgrad
from cupygemm.tensors import View

WGRAD_SEED = {(m, n, k) for k in (4096, 8192) for m, n in ((7168, 2112), (1536, 24576), (512, 32768), (16384, 7168),
                                                           (7168, 4096), (2048, 7168))}
K_GROUPED_SEED = {(g, m, n, k) for g, k in ((4, 4096), (4, 8192), (8, 4096)) for m, n in ((7168, 4096), (2048, 7168))}

WG = Shape("wgrad", (64, 96, 512))
KG = Shape("k_grouped_wgrad", (3, 64, 96, 512))


# ---- kinds and shapes from the descriptors ------------------------------------------------------------------------

def test_every_registered_kind_has_bench_code_and_seed_shapes():
    assert [k.name for k in kinds.bench_kinds()] == [k.name for k in KINDS]
    for k in KINDS:
        assert kinds.bench_kind(k) is kinds.lookup(k.name) and k.seed_shapes
        assert all(len(d) == len(k.shape_dims) for d in k.seed_shapes)
    assert [k.name for k in kinds.default_kinds()] == ["normal", "contiguous", "masked"]
    assert kinds.bench_kind("wgrad") is kinds.bench_kind("k_grouped_wgrad") is training.TRAINING_BENCH
    assert kinds.shape_format(kind_named("k_grouped_wgrad")) == "GxMxNxK"


def test_parse_kinds_takes_every_registered_kind_and_alias():
    assert cases.parse_kinds("wgrad,k_grouped_wgrad") == ["wgrad", "k_grouped_wgrad"]
    assert cases.parse_kinds("WGRAD, contig, wgrad") == ["wgrad", "contiguous"]
    assert cases.parse_kinds(",".join(k.name for k in KINDS)) == [k.name for k in KINDS]
    with pytest.raises(cases.BenchUsageError, match="unknown kind 'dgrad'.*wgrad,k_grouped_wgrad.*contig"):
        cases.parse_kinds("dgrad")


def test_default_run_is_the_28_forward_shapes_and_training_kinds_run_test_cores_shapes():
    default = cases.select_shapes(None, None)
    assert len(default) == 28 and {s.kind for s in default} == {"normal", "contiguous", "masked"}
    assert default == cases.select_shapes(cases.parse_kinds("normal,contiguous,masked"), None)
    train = cases.select_shapes(cases.parse_kinds("wgrad,k_grouped_wgrad"), None)
    assert [s.kind for s in train] == ["wgrad"] * 12 + ["k_grouped_wgrad"] * 6
    assert {s.dims for s in train if s.kind == "wgrad"} == WGRAD_SEED
    assert {s.dims for s in train if s.kind == "k_grouped_wgrad"} == K_GROUPED_SEED
    # the order follows the kinds' registration, not the order --kinds names them
    assert cases.select_shapes(["k_grouped_wgrad", "wgrad"], None) == train
    both = cases.select_shapes(cases.parse_kinds("masked,wgrad"), None)
    assert [s.kind for s in both] == ["masked"] * 6 + ["wgrad"] * 12


def test_shape_fields_of_the_training_kinds():
    s = Shape("wgrad", (7168, 2112, 4096))
    assert (s.groups, s.m, s.n, s.k, s.label) == (1, 7168, 2112, 4096, "7168x2112x4096")
    s = Shape("k_grouped_wgrad", (4, 7168, 4096, 8192))
    assert (s.groups, s.m, s.n, s.k, s.label) == (4, 7168, 4096, 8192, "4x7168x4096x8192")
    assert cases.shape_seed(s, 5) == [5, 4, 4, 7168, 4096, 8192]  # the kind enters by its kernel id
    assert cases.shape_seed(Shape("masked", (2, 512, 7168, 2048)), 0)[:2] == [0, 2]  # forward seeds as before


def test_shapes_on_the_command_line():
    assert cases.select_shapes(["wgrad"], [(7168, 2112, 4096)]) == [Shape("wgrad", (7168, 2112, 4096))]
    got = cases.select_shapes(["k_grouped_wgrad", "normal"], [(4, 2048, 7168, 4096), (64, 2112, 7168)])
    assert got == [Shape("k_grouped_wgrad", (4, 2048, 7168, 4096)), Shape("normal", (64, 2112, 7168))]
    assert cases.select_shapes(["wgrad", "masked"], [(2, 512, 4096, 7168)])[0].kind == "masked"
    with pytest.raises(cases.BenchUsageError, match="exactly one of normal, wgrad"):
        cases.select_shapes(["normal", "wgrad"], [(64, 2112, 7168)])
    with pytest.raises(cases.BenchUsageError, match="exactly one of masked, k_grouped_wgrad"):
        cases.select_shapes(["masked", "k_grouped_wgrad"], [(2, 512, 4096, 7168)])
    with pytest.raises(cases.BenchUsageError, match="a shape of contiguous, masked, k_grouped_wgrad, k_grouped_wgrad_columns, but --kinds"):
        cases.select_shapes(["wgrad"], [(4, 2048, 7168, 4096)])
    for dims, msg in [((7170, 2112, 4096), "multiples of 4"), ((7168, 2110, 4096), "multiples of 4"),
                      ((7168, 2112, 4100), "multiple of 16"), ((0, 2112, 4096), "positive")]:
        with pytest.raises(cases.BenchUsageError, match=msg):
            cases.select_shapes(["wgrad"], [dims])
    with pytest.raises(cases.BenchUsageError, match=r"must exceed 128 x \(G - 1\) = 896"):
        cases.select_shapes(["k_grouped_wgrad"], [(8, 256, 256, 896)])
    assert cases.select_shapes(["k_grouped_wgrad"], [(8, 256, 256, 912)])  # the last group keeps 16 tokens at worst


def test_match_rows_is_refused_for_the_training_kinds(tmp_path, capsys):
    from cupygemm.cli import main

    shapes = cases.select_shapes(["normal", "wgrad"], None)
    with pytest.raises(cases.BenchUsageError, match="forward seed shapes only; wgrad shapes"):
        cases.shape_sizes(shapes, 0, "benchmarks/peers/h100-2026-11-21.json")
    assert cases.shape_sizes(shapes, 0, None)  # without the table they run
    assert main(["bench", "--kinds", "wgrad,k_grouped_wgrad", "--match-rows", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "--match-rows" in err and "wgrad, k_grouped_wgrad shapes have no valid rows to match" in err


# ---- sizes and work -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dims", sorted(K_GROUPED_SEED))
def test_k_sizes_are_drawn_as_test_core_draws_them(dims):
    shape = Shape("k_grouped_wgrad", dims)
    g, m, _, base = dims
    for seed in range(20):
        s = cases.make_sizes(shape, seed)
        assert s == cases.make_sizes(Shape("k_grouped_wgrad", dims), seed)  # seeded by shape and seed only
        ks = s.group_k
        assert len(ks) == g and sum(ks) == g * base
        assert all(k % 128 == 0 and k > 0 for k in ks)
        assert all(k - base in (-128, 0, 128) for k in ks[:-1])  # base_k + 128 x randint(-1, 1)
        assert abs(ks[-1] - base) <= 128 * (g - 1)  # the last takes the rest
        assert s.group_rows == (m,) * g and s.a_rows == m and s.valid_m == g * m
    draws = {cases.make_sizes(shape, seed).group_k for seed in range(20)}
    assert len(draws) > 1  # the seed matters
    steps = [k - base for seed in range(50) for k in cases.make_sizes(shape, seed).group_k[:-1]]
    assert set(steps) == {-128, 0, 128}


def test_draw_k_sizes_edge_cases():
    rng = np.random.default_rng(0)
    assert training.draw_k_sizes(1, 4096, rng) == [4096]
    assert sum(training.draw_k_sizes(8, 1024, rng)) == 8192
    assert cases.make_sizes(WG, 0) == Sizes((64,), 64)
    assert cases.shape_sizes([WG], 3, None, full_groups=True)[WG] == Sizes((64,), 64)


def test_work_and_floor_of_the_training_kinds():
    s = Shape("wgrad", (7168, 2112, 4096))
    flops, nbytes = metrics.work(s, cases.make_sizes(s, 0))
    assert flops == 2 * 7168 * 2112 * 4096
    assert nbytes == 7168 * 4096 + 2112 * 4096 + 8 * 7168 * 2112  # FP8 A, B; FP32 out read and written
    assert metrics.floor_us(flops, nbytes, 3e12) == pytest.approx(flops / 1979e12 * 1e6)  # compute-bound
    k = Shape("k_grouped_wgrad", (4, 2048, 7168, 4096))
    sizes = Sizes((2048,) * 4, 2048, (3968, 4224, 4096, 4096))
    flops, nbytes = metrics.work(k, sizes)
    assert flops == 2 * 2048 * 7168 * 16384
    assert nbytes == (2048 + 7168) * 16384 + 4 * 8 * 2048 * 7168
    t = metrics.throughput(100.0, flops, nbytes, 50.0)
    assert t["tflops"] == pytest.approx(flops / 100e-6 / 1e12) and t["pct_floor"] == pytest.approx(50.0)
    assert cases.shape_config(k, sizes, 132) is None  # compiled at the first (untimed) call


# ---- operands -----------------------------------------------------------------------------------------------------

def _inputs(shape: Shape, seed: int = 0) -> training.TrainingInputs:
    sizes = cases.make_sizes(shape, seed)
    return training.build_inputs(shape, sizes, np, np.random.default_rng(cases.shape_seed(shape, seed)),
                                 ref.per_token_cast_to_fp8_reference)


def _view(arr: np.ndarray, i: int) -> View:
    """The metadata cupygemm's argument checks read (an aligned stand-in pointer)."""
    return View(0x100000 * (i + 1), tuple(arr.shape), tuple(arr.strides), arr.dtype, 0)


@pytest.mark.parametrize("shape", [WG, KG, Shape("wgrad", (32, 64, 4096))])  # the last: M == ceil(K / 128)
def test_operands_are_quantized_per_group_in_the_forms_each_provider_uses_in_place(shape):
    inp = _inputs(shape)
    m, n = shape.m, shape.n
    ks = inp.k_sizes
    kb_total = sum(-(-k // 128) for k in ks)
    assert inp.sfa_t.shape == (kb_total, m) and inp.sfb_t.shape == (kb_total, n)
    assert inp.sfa_t.flags.c_contiguous and inp.sfb_t.flags.c_contiguous  # DeepGEMM's (kb, mn) form
    assert inp.residual.dtype == np.float32 and 3 < inp.residual.std() < 30  # randn x 10
    for g in inp.groups():
        qa, sa = ref.per_token_cast_to_fp8_reference(g["x"].view(ref._BF16))
        qb, sb = ref.per_token_cast_to_fp8_reference(g["y"].view(ref._BF16))
        np.testing.assert_array_equal(g["a"], qa)
        np.testing.assert_array_equal(g["sfa"], sa)
        np.testing.assert_array_equal(g["b"], qb)
        np.testing.assert_array_equal(g["sfb"], sb)
    (a, sfa), (b, sfb) = training.cupygemm_operands(inp)
    if shape.kind == "wgrad":
        assert inp.residual.shape == (m, n) and a.shape == (m, shape.k) and b.shape == (n, shape.k)
        assert inp.batch_sizes is None
        assert sfa.shape == (m, kb_total) and sfa.strides == (4, 4 * m)  # M-major, in place
        p = check_wgrad(tuple(_view(x, i) for i, x in enumerate((a, sfa, b, sfb, inp.residual))))
        assert (p.m, p.n, p.k) == (m, n, shape.k)
        assert p.sfa_m_major and p.sfb_m_major  # used in place: no per-call copies
    else:
        assert inp.residual.shape == (shape.groups, m, n) and a.ndim == 1 and a.size == m * sum(ks)
        assert inp.batch_sizes.dtype == np.int32 and inp.batch_sizes.tolist() == list(ks)
        assert sfa is inp.sfa_t and sfb is inp.sfb_t
        views = tuple(_view(x, i) for i, x in enumerate((a, sfa, b, sfb, inp.residual, inp.batch_sizes)))
        p = check_k_grouped_wgrad(views)
        assert (p.m, p.n, p.k, p.num_groups) == (m, n, sum(ks), shape.groups)
    again = _inputs(shape)
    np.testing.assert_array_equal(again.a, inp.a)
    np.testing.assert_array_equal(again.residual, inp.residual)


def test_columns_layout_holds_the_k_grouped_groups_side_by_side():
    """The columns kind's operands are the k-grouped kind's, each group's block moved to its own column range of one
    [M, T] matrix (the same draws), with the same stacked scales; the kind's check reads them in place and the
    reference computes each group from its columns. Sizes not starting on 128 columns are refused on the host."""
    flat = _inputs(KG)
    cols = training.build_inputs(Shape("k_grouped_wgrad_columns", KG.dims), flat.sizes, np,
                                 np.random.default_rng(cases.shape_seed(KG, 0)), ref.per_token_cast_to_fp8_reference)
    m, n, ks = KG.m, KG.n, flat.k_sizes
    assert cols.a.shape == (m, sum(ks)) and cols.b.shape == (n, sum(ks)) and cols.k_sizes == ks
    np.testing.assert_array_equal(cols.sfa_t, flat.sfa_t)
    for gf, gc in zip(flat.groups(), cols.groups()):
        for key in ("a", "b", "x", "y", "sfa", "sfb"):
            np.testing.assert_array_equal(gf[key], gc[key])
    (a, sfa), (b, sfb) = training.cupygemm_operands(cols)
    views = tuple(_view(x, i) for i, x in enumerate((a, sfa, b, sfb, cols.residual, cols.batch_sizes)))
    p = check_k_grouped_wgrad_columns(views)
    assert (p.m, p.n, p.k, p.num_groups) == (m, n, sum(ks), KG.groups) and p.sfa_m_major and p.sfb_m_major
    want = ref.k_grouped_wgrad_reference(flat.a, flat.sfa_t, flat.b, flat.sfb_t, flat.residual, ks)
    got = ref.k_grouped_wgrad_columns_reference(cols.a, sfa, cols.b, sfb, cols.residual, ks)
    np.testing.assert_array_equal(got, want)
    check_column_sizes(np.asarray(ks), p)
    with pytest.raises(ValueError, match="group 1 starts at column 48"):
        check_column_sizes(np.asarray([48, 128, 0]), p)
    with pytest.raises(ValueError, match="sum to"):
        check_column_sizes(np.asarray([128, sum(ks)]), p)
    with pytest.raises(TypeError, match="accumulates into out"):
        check_k_grouped_wgrad_columns(views[:4] + (None, views[5]))
    with pytest.raises(ValueError, match=r"expected shape \(3,\)"):
        check_k_grouped_wgrad_columns(views[:5] + (_view(np.zeros(2, np.int32), 6),))


# ---- cupygemm and DeepGEMM with stand-ins ---------------------------------------------------------------------------

_TABLE = training._e4m3_table(np)


def _deq(q, s):
    return training.dequantize(q, s, _TABLE)


def _np_wgrad(log):
    """cupygemm.wgrad_gemm_fp8_fp8_fp32_nt in NumPy: out += A B^T with [rows, kb] scales in any layout."""
    def wgrad(lhs, rhs, out, *, stream=None):
        log.append(("wgrad", lhs, rhs, out))
        out += _deq(*lhs) @ _deq(*rhs).T
        return out
    return wgrad


def _np_k_grouped(log, noise=0.0):
    """cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt in NumPy (stacked transposed scales, device sizes)."""
    rng = np.random.default_rng(1)

    def k_grouped(lhs, rhs, out, batch_sizes, *, stream=None):
        log.append(("k_grouped", lhs, rhs, out, batch_sizes))
        (a, sfa), (b, sfb) = lhs, rhs
        _, m, n = out.shape
        off = kb = 0
        for g, k in enumerate(np.asarray(batch_sizes).tolist()):
            nkb = -(-k // 128)
            out[g] += (_deq(a[m * off:m * (off + k)].reshape(m, k), sfa[kb:kb + nkb].T)
                       @ _deq(b[n * off:n * (off + k)].reshape(n, k), sfb[kb:kb + nkb].T).T)
            off, kb = off + k, kb + nkb
        if noise:
            out += np.float32(noise) * rng.standard_normal(out.shape).astype(np.float32)
        return out
    return k_grouped


def _fake_torch():
    """from_dlpack hands the NumPy array through; FP8 views are the uint8 bits."""
    return types.SimpleNamespace(from_dlpack=lambda x: x, float8_e4m3fn=np.uint8, bfloat16="bf16")


def _fake_deep_gemm(log):
    """DeepGEMM 03d0be3's two wgrad functions, asserting the argument forms the bench promises it: scales as (kb, mn)
    contiguous (its fastest form, no transposes), the k-grouped sizes as a Python list of ints."""
    def wgrad(lhs, rhs, out):
        (a, sfa), (b, sfb) = lhs, rhs
        m, k = a.shape
        kb = -(-k // 128)
        assert sfa.shape == (kb, m) and sfa.flags.c_contiguous and m % 4 == 0
        assert sfb.shape == (kb, b.shape[0]) and sfb.flags.c_contiguous
        log.append(("dg_wgrad", a.shape))
        out += _deq(a, sfa.T) @ _deq(b, sfb.T).T

    def k_grouped(lhs, rhs, out, batch_sizes):
        assert type(batch_sizes) is list and all(type(k) is int for k in batch_sizes)
        log.append(("dg_k_grouped", list(batch_sizes)))
        (a, sfa), (b, sfb) = (lhs[0].reshape(-1), lhs[1]), (rhs[0].reshape(-1), rhs[1])
        _, m, n = out.shape
        off = kb = 0
        for g, k in enumerate(batch_sizes):  # one wgrad launch per group, as 03d0be3 does
            nkb = -(-k // 128)
            wgrad((a[m * off:m * (off + k)].reshape(m, k), sfa[kb:kb + nkb]),
                  (b[n * off:n * (off + k)].reshape(n, k), sfb[kb:kb + nkb]), out[g])
            off, kb = off + k, kb + nkb

    return types.SimpleNamespace(__name__="deep_gemm", gemm_fp8_fp8_bf16_nt=lambda *a: None,
                                 wgrad_gemm_fp8_fp8_fp32_nt=wgrad, k_grouped_wgrad_gemm_fp8_fp8_fp32_nt=k_grouped)


@pytest.fixture
def standins(monkeypatch):
    log = []
    monkeypatch.setattr(cupygemm, "wgrad_gemm_fp8_fp8_fp32_nt", _np_wgrad(log))
    monkeypatch.setattr(cupygemm, "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt", _np_k_grouped(log))
    return log


@pytest.mark.parametrize("shape", [WG, KG])
def test_cupygemm_is_called_with_its_in_place_operands_and_accumulates(shape, standins):
    inp = _inputs(shape)
    prep = providers.prepare_cupygemm(inp)
    assert standins == []  # nothing runs at preparation
    prep.call()
    call = standins[0]
    (a, sfa), (b, sfb), out = call[1], call[2], call[3]
    assert a is inp.a and b is inp.b and out is not inp.residual and out is prep.output()
    if shape.kind == "wgrad":
        assert call[0] == "wgrad" and len(call) == 4 and sfa.base is inp.sfa_t and sfa.shape == (64, 4)
        assert sfb.base is inp.sfb_t and sfb.shape == (96, 4)
    else:
        assert call[0] == "k_grouped" and call[4] is inp.batch_sizes and sfa is inp.sfa_t and sfb is inp.sfb_t
    once = prep.output().copy()
    prep.call()  # each call adds into out: the residual plus twice the product
    np.testing.assert_allclose(prep.output() - inp.residual, 2 * (once - inp.residual), rtol=1e-5, atol=1e-3)
    prep.reset()
    np.testing.assert_array_equal(prep.output(), inp.residual)
    check = kinds.bench_kind(shape.kind).checker(inp, 0)
    res = check("cupygemm", prep)
    assert res["check"] == "ok" and res["repeatable"] is True, res
    assert 1e-4 < res["calc_diff"] < 1e-3  # the FP8 quantization error against the unquantized product
    assert res["rel_err"] < 1e-5  # against the dequantized product (FP32 both)
    assert (res["calc_diff_groups"] is None) == (shape.kind == "wgrad")


def test_checks_catch_a_wrong_product_and_unrepeatable_bits(monkeypatch):
    inp = _inputs(KG)
    maker = kinds.bench_kind(KG.kind)
    log = []
    monkeypatch.setattr(cupygemm, "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt", _np_k_grouped(log, noise=1e-3))
    prep = providers.prepare_cupygemm(inp)
    res = maker.checker(inp, 0)("cupygemm", prep)
    assert res["repeatable"] is False and res["check"] == "FAIL" and res["calc_diff"] < 1e-3
    peer = maker.checker(inp, 0)("deepgemm", prep)  # a peer's bits are recorded, not required
    assert peer["repeatable"] is False and peer["check"] == "ok"

    def overwrite(lhs, rhs, out, batch_sizes, *, stream=None):  # forgets to accumulate
        res_ = out.copy()
        _np_k_grouped([])(lhs, rhs, out, batch_sizes)
        out -= res_
    monkeypatch.setattr(cupygemm, "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt", overwrite)
    bad = maker.checker(inp, 0)("cupygemm", providers.prepare_cupygemm(inp))
    assert bad["check"] == "FAIL" and bad["calc_diff"] > 0.1

    def skip_group(lhs, rhs, out, batch_sizes, *, stream=None):
        sizes = np.asarray(batch_sizes).copy()
        keep = out[1].copy()
        _np_k_grouped([])(lhs, rhs, out, sizes)
        out[1] = keep
    monkeypatch.setattr(cupygemm, "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt", skip_group)
    bad = maker.checker(inp, 0)("cupygemm", providers.prepare_cupygemm(inp))
    assert bad["check"] == "FAIL" and bad["calc_diff_groups"][1] == pytest.approx(1.0)

    def nan(lhs, rhs, out, batch_sizes, *, stream=None):
        out[0, 0, 0] = np.nan
    monkeypatch.setattr(cupygemm, "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt", nan)
    bad = maker.checker(inp, 0)("cupygemm", providers.prepare_cupygemm(inp))
    assert bad["check"] == "FAIL" and math.isnan(bad["calc_diff"])


@pytest.mark.parametrize("shape", [WG, KG])
def test_deepgemm_gets_its_fastest_forms_on_views_of_the_same_operands(shape, standins):
    log = []
    peer = providers.DeepGemmPeer(_fake_torch(), _fake_deep_gemm(log))
    assert peer.supports(shape)
    assert not providers.DeepGemmPeer(_fake_torch(), types.SimpleNamespace()).supports(shape)  # an older DeepGEMM
    inp = _inputs(shape)
    prep = peer.prepare(inp)
    ours = providers.prepare_cupygemm(inp)
    assert prep.output() is not ours.output() and prep.output() is not inp.residual
    prep.call()
    if shape.kind == "wgrad":
        assert log == [("dg_wgrad", (64, 512))]
    else:
        assert log[0] == ("dg_k_grouped", list(inp.k_sizes)) and [e[0] for e in log[1:]] == ["dg_wgrad"] * 3
    res = kinds.bench_kind(shape.kind).checker(inp, 0)("deepgemm", prep)
    assert res["check"] == "ok" and res["repeatable"] is True, res


def test_peers_without_a_weight_gradient_recipe_do_not_run_the_training_kinds():
    torch = _fake_torch()
    for shape in (WG, KG):
        assert not providers.CublasBlockPeer(torch).supports(shape)
        assert not providers.PackedPeer().supports(shape)
        deeper = providers.DeeperGemmPeer(torch, _fake_deep_gemm([]), "deepergemm")
        assert not deeper.supports(shape)
    assert providers.CublasBlockPeer(torch).supports(Shape("normal", (64, 2112, 7168)))
    assert not providers.CublasBlockPeer(torch).supports(Shape("masked", (2, 512, 4096, 7168)))


def test_device_helpers_match_the_reference():
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((5, 40)), rng.standard_normal((5, 40))
    assert training.calc_diff(x, y) == pytest.approx(ref.calc_diff(x, y), rel=1e-12)
    assert training.calc_diff(np.zeros(3), np.zeros(3)) == 0.0
    bits = np.array([0x3F80, 0xC020, 0x0000], np.uint16)
    np.testing.assert_array_equal(training.bf16_to_f32(bits), [1.0, -2.5, 0.0])
    q, s = ref.per_token_cast_to_fp8_reference(rng.standard_normal((6, 300)).astype(np.float32))
    np.testing.assert_allclose(training.dequantize(q, s, _TABLE), ref.dequantize_per_token(q, s), rtol=1e-7)
    a = np.ones(4, np.float32)
    b = a.copy()
    assert training.same_bits(a, b)
    b[2] = np.float32(1.0000001)
    assert not training.same_bits(a, b)


# ---- the run loop and the report ------------------------------------------------------------------------------------

class _FakeTimer:
    """Calls each timed call, as Timer does, and reports kernels per call (DeepGEMM's k-grouped: one per group)."""

    def time(self, call, iters, kernels=None):
        for _ in range(iters):
            call()
        if kernels is not None:
            kernels += [3] * iters
        return [10.0 + i for i in range(iters)]


def _stub_gpu(monkeypatch):
    import cupy

    monkeypatch.setattr(cupy.cuda, "get_current_stream", lambda: types.SimpleNamespace(synchronize=lambda: None))
    monkeypatch.setattr(cupy, "get_default_memory_pool", lambda: types.SimpleNamespace(free_all_blocks=lambda: None))
    monkeypatch.setattr(training.TrainingBench, "make_inputs", lambda self, shape, sizes, seed: _inputs(shape, seed))


def test_bench_shape_rows_for_the_training_kinds(monkeypatch, standins):
    _stub_gpu(monkeypatch)
    peers = {"deepgemm": providers.DeepGemmPeer(_fake_torch(), _fake_deep_gemm([])),
             "cublas_block": providers.CublasBlockPeer(_fake_torch())}
    for shape in (WG, KG):
        sizes = cases.make_sizes(shape, 0)
        rows = run.bench_shape(shape, sizes, 0, 4, _FakeTimer(), 3e12, None, peers)
        assert [r["provider"] for r in rows] == ["cupygemm", "deepgemm"]  # no cuBLAS row
        flops, nbytes = metrics.work(shape, sizes)
        for r in rows:
            assert r["check"] == "ok" and r["error"] is None and r["repeatable"] is True, r
            assert r["flops"] == flops and r["bytes"] == nbytes and r["kernels_per_call"] == 3
            assert r["us"] == pytest.approx(11.5) and r["tflops"] == pytest.approx(flops / 11.5e-6 / 1e12)
            assert r["floor_us"] == pytest.approx(metrics.floor_us(flops, nbytes, 3e12))
        assert ("k_sizes" in rows[0]) == (shape.kind == "k_grouped_wgrad")


def _fake_rows():
    rows = []
    stats = lambda us: {"us": us, "p10": us * 0.98, "p90": us * 1.03, "min": us * 0.97, "max": us * 1.1}  # noqa: E731
    ok = {"check": "ok", "rel_err": 1e-6, "calc_diff": 7e-4, "repeatable": True}
    for shape, ours, dg in ((Shape("normal", (64, 2112, 7168)), 10.0, 12.5),
                            (Shape("wgrad", (7168, 2112, 4096)), 100.0, 110.0),
                            (Shape("wgrad", (1536, 24576, 8192)), 400.0, 400.0),
                            (Shape("k_grouped_wgrad", (4, 7168, 4096, 4096)), 500.0, 600.0)):
        sizes = cases.make_sizes(shape, 0)
        f, b = metrics.work(shape, sizes)
        fl = metrics.floor_us(f, b, 3e12)
        rows.append(report.make_row(shape, sizes, "cupygemm", stats(ours), f, b, fl, None, ok))
        rows.append(report.make_row(shape, sizes, "deepgemm", stats(dg), f, b, fl, None, ok))
        if shape.kind == "normal":
            rows.append(report.make_row(shape, sizes, "cublas_block", stats(20.0), f, b, fl, None, ok))
    return rows


def test_report_has_a_training_table_with_deepgemm_only_and_geomeans_per_kind():
    rows = _fake_rows()
    peers = ["cublas_block", "deepgemm"]
    parts = report.sections(rows, peers)
    assert [p.kinds for p in parts] == [["normal"], ["wgrad", "k_grouped_wgrad"]]
    assert parts[0].peers == peers and parts[1].peers == ["deepgemm"]  # no cuBLAS column for the weight gradients
    assert parts[0].notes == [] and any("cuBLAS-block: no column" in n for n in parts[1].notes)
    assert any(n.startswith("k sizes of k_grouped_wgrad 4x7168x4096x4096: ") for n in parts[1].notes)
    text = report.format_sections(parts)
    assert "weight-gradient kinds" in text and "forward kinds:" in text
    md = report.format_sections(parts, markdown=True)
    train_md = md.split("**weight-gradient kinds")[1]
    head = next(line for line in train_md.splitlines() if line.startswith("| kind"))
    for col in ("kind", "shape", "cupygemm us", "TFLOPS", "% floor", "DeepGEMM us", "vs DeepGEMM", "check"):
        assert f"| {col} |" in head
    assert "cuBLAS" not in head
    assert "| wgrad | 7168x2112x4096 |" in train_md and "1.10x" in train_md and "1.20x" in train_md
    geo = math.sqrt(1.1 * 1.0)
    assert "- cupygemm wgrad: " in train_md and f"{geo:.2f}x vs DeepGEMM (2 shapes)" in train_md
    assert "k_grouped_wgrad: " in train_md and "1.20x vs DeepGEMM (1 shapes)" in train_md
    assert "- work: FLOPs = 2 M N sum(k); bytes = (M + N) sum(k) (FP8 A and B) + 8 M N per group" in train_md
    doc = report.build_report({"device": "NVIDIA H100 80GB HBM3", "command": "cupygemm bench --kinds wgrad"},
                              rows, peers)
    by_kind = doc["summary"]["by_kind"]
    assert by_kind["wgrad"]["speedup_geomean"]["deepgemm"]["geomean"] == pytest.approx(geo)
    assert "cublas_block" not in by_kind["wgrad"]["speedup_geomean"]
    assert by_kind["normal"]["speedup_geomean"]["cublas_block"]["geomean"] == pytest.approx(2.0)
    assert doc["device"] and doc["command"] and list(doc["notes"]) == [training.TrainingBench.title]
    kg = [r for r in doc["rows"] if r["kind"] == "k_grouped_wgrad"][0]
    assert sum(kg["k_sizes"]) == 4 * 4096 and kg["shape"] == [4, 7168, 4096, 4096]
    json.dumps(doc, allow_nan=False)


def test_forward_output_is_unchanged_by_the_sections():
    rows = [r for r in _fake_rows() if r["kind"] == "normal"]
    parts = report.sections(rows, ["cublas_block", "deepgemm"])
    assert len(parts) == 1 and parts[0].notes == []
    assert report.format_sections(parts) == report.format_table(rows, ["cublas_block", "deepgemm"])
    assert report.format_sections(parts, markdown=True) == report.format_markdown(rows, ["cublas_block", "deepgemm"])
    assert "notes" not in report.build_report({}, rows, ["cublas_block", "deepgemm"])


def test_the_run_loop_end_to_end_on_stand_ins(monkeypatch, standins, tmp_path, capsys):
    """run._run on the two training kinds (one small shape each) with DeepGEMM's stand-in: the tables, the summary,
    the markdown and the JSON it writes; GPU parts (bandwidth, CUPTI, flush buffer) stubbed."""
    _stub_gpu(monkeypatch)
    monkeypatch.setattr(run, "measure_copy_bandwidth", lambda: 3e12)
    monkeypatch.setattr(run, "open_cupti_timer", lambda backend: (object(), "stub"))
    monkeypatch.setattr(run, "Timer", lambda flush, kernel_timer: _FakeTimer())
    monkeypatch.setattr(run, "measure_event_overhead", lambda timer: 3.5)
    shapes = cases.select_shapes(["wgrad", "k_grouped_wgrad"], [(64, 96, 512), (3, 64, 96, 512)])
    sizes = cases.shape_sizes(shapes, 0, None)
    peers = {"deepgemm": providers.DeepGemmPeer(_fake_torch(), _fake_deep_gemm([]))}
    out = tmp_path / "train_bench.json"
    args = argparse.Namespace(jobs=2, timing="cupti", seed=0, iters=3, markdown=True, json=str(out), plot=None)
    meta = {"device": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "num_sms": 132, "cupygemm": "0.1.0",
            "git_revision": None, "cupy": "14.2.0", "cuda_runtime": "13.0", "nvrtc": "13.0", "driver": "580",
            "command": "cupygemm bench --kinds wgrad,k_grouped_wgrad --peers deepgemm"}
    info = types.SimpleNamespace(max_smem_per_block=232448, l2_bytes=50 << 20)
    written = []
    monkeypatch.setattr(run, "write_json", lambda path, doc: (written.append(doc), report.write_json(path, doc)))
    assert run._run(args, shapes, sizes, peers, [], meta, info, 132) == 0
    assert written[0]["partial"] == "1 of 2 shapes" and len(written[0]["rows"]) == 2  # kept if the run is cut short
    assert len(written) == 2 and "partial" not in written[1]
    text = capsys.readouterr().out
    assert "weight-gradient kinds" in text and "| k_grouped_wgrad | 3x64x96x512 |" in text
    assert "all cupygemm results checked: ok" in text
    doc = json.loads(out.read_text())
    assert doc["ok"] is True and doc["device"] and doc["command"].startswith("cupygemm bench --kinds wgrad")
    assert [(r["kind"], r["provider"]) for r in doc["rows"]] == [
        ("wgrad", "cupygemm"), ("wgrad", "deepgemm"), ("k_grouped_wgrad", "cupygemm"), ("k_grouped_wgrad", "deepgemm")]
    assert all(r["check"] == "ok" and r["kernels_per_call"] == 3 for r in doc["rows"])
    assert set(doc["summary"]["by_kind"]) == {"wgrad", "k_grouped_wgrad"}
    notes = doc["notes"][training.TrainingBench.title]
    assert "kernels per call (CUPTI) on k_grouped_wgrad: cupygemm 3, DeepGEMM 3" in notes
    assert doc["timing"].startswith("cupti")
