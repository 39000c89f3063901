"""``cupygemm chain`` without a GPU: its options, the chains they select, the floors (the bench's), the CUPTI record
arithmetic and the report, on made-up rows."""
from __future__ import annotations

import pytest

from cupygemm.bench import chain, metrics
from cupygemm.bench.cases import Shape, Sizes
from cupygemm.cli import build_parser


def _args(*argv):
    return build_parser().parse_args(["chain", *argv])


def test_defaults_run_both_ms_both_weights_and_the_moe_step():
    args = _args()
    assert args.m is None and args.weights == ["plain", "packed"] and not args.no_moe
    assert (args.chains, args.rounds, args.json, args.shapes) == (50, 7, None, [])
    chains = chain.decode_chains(args.m, args.shapes, not args.no_moe)
    assert [c.name for c in chains] == ["dense M=64", "dense M=128", "moe 8x32"]
    assert chains[0].label == "64x2112x7168 -> 64x24576x1536 -> 64x32768x512 -> 64x7168x16384"
    assert chains[1].shapes[-1] == Shape("normal", (128, 7168, 16384))
    moe = chains[2]
    assert moe.shapes == (Shape("masked", (8, 32, 4096, 7168)), Shape("masked", (8, 32, 7168, 2048)))
    # one draw of masked_m for both GEMMs, around expected_m 32 as the bench draws it; max_m the bench's
    assert moe.sizes[0] is moe.sizes[1] and moe.sizes[0].a_rows == 4096 and len(moe.sizes[0].group_rows) == 8
    assert all(22 <= r <= 41 for r in moe.sizes[0].group_rows)
    assert chain.decode_chains(None, None, True)[2].sizes == moe.sizes  # fixed seed


def test_options_select_the_chains():
    args = _args("--m", "128", "128", "--weights", "packed", "--no-moe", "--chains", "3", "--rounds", "2",
                 "--json", "x.json")
    assert args.m == [128, 128] and args.weights == ["packed"] and args.no_moe
    assert [c.name for c in chain.decode_chains(args.m, args.shapes, not args.no_moe)] == ["dense M=128"]
    custom = _args("64x2112x7168", "64x7168x2048", "--no-moe")
    chains = chain.decode_chains(custom.m, custom.shapes, not custom.no_moe)
    assert [c.name for c in chains] == ["custom"] and chains[0].label == "64x2112x7168 -> 64x7168x2048"
    assert chains[0].sizes == (Sizes((64,), 64), Sizes((64,), 64))


@pytest.mark.parametrize("argv", [["--m", "0"], ["--weights", "both"], ["--chains", "0"], ["64x2112"]])
def test_bad_options_are_refused_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit) as e:
        _args(*argv)
    assert e.value.code == 2


@pytest.mark.parametrize("argv,why", [(["64x2112x7168", "--m", "64"], "not both"),
                                      (["64x2100x7168"], "N must be a multiple of 8"),
                                      (["64x2112x7170"], "K must be a multiple of 16")])
def test_usage_errors_are_one_line_before_the_gpu(argv, why, capsys):
    """Checked before the Hopper check, so they read the same on a machine without a GPU."""
    args = _args(*argv)
    assert args.func(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("cupygemm chain: ") and why in err


def test_floors_are_the_bench_floors_summed():
    bw = 3.0e12
    for c in chain.decode_chains(None, None, True):
        floors = chain.shape_floors(c, bw)
        assert [f["shape"] for f in floors] == [s.label for s in c.shapes]
        for f, s, z in zip(floors, c.shapes, c.sizes):
            flops, nbytes = metrics.work(s, z)
            assert (f["flops"], f["bytes"]) == (flops, nbytes)
            assert f["floor_us"] == metrics.floor_us(flops, nbytes, bw)
    m64 = chain.shape_floors(chain.decode_chains([64], None, False)[0], bw)
    # memory bound: A + B + BF16 D over the copy bandwidth
    assert m64[0]["floor_us"] == pytest.approx((64 * 7168 + 2112 * 7168 + 2 * 64 * 2112) / bw * 1e6)
    moe = chain.decode_chains(None, None, True)[2]
    vm = sum(moe.sizes[0].group_rows)
    down = chain.shape_floors(moe, bw)[1]
    assert down["valid_rows"] == vm and down["bytes"] == vm * 2048 + 8 * 7168 * 2048 + 2 * vm * 7168


def test_kernel_stats_per_shape_sum_span_and_overlap():
    # two chains of two GEMMs (ns): the second GEMM starts 1 us before the first ends (PDL)
    recs = [(0, 10_000, "a"), (9_000, 14_000, "b"), (20_000, 31_000, "a"), (30_000, 34_000, "b")]
    s = chain.kernel_stats(recs, 2, 2)
    assert s["kernels"] == 4 and s["shape_us"] == [10.5, 4.5]
    assert s["kernel_us"] == pytest.approx((10 + 5 + 11 + 4) / 2)
    assert s["span_us"] == pytest.approx(34 / 2) and s["overlap_us"] == pytest.approx((1 + 1) / 2)
    odd = chain.kernel_stats(recs[:3], 2, 2)  # not one kernel per GEMM: no per-shape split
    assert odd["shape_us"] is None and odd["kernel_us"] == pytest.approx(26 / 2)
    assert chain.kernel_stats([], 2, 1)["span_us"] is None


def _row(name, weights, pdl, eager, graph, floor, shape_us=None, differs=(), side_aware=True):
    row = {"chain": name, "weights": weights, "pdl": pdl, "side_aware": weights == "packed" and side_aware,
           "plans_pdl": [pdl], "configs": [], "eager_us": eager, "graph_us": graph, "graph_idle_us": graph + 2.0,
           "eager_differs": list(differs), "graph_differs": [], "floor_us": floor,
           "eager_x_floor": eager / floor, "graph_x_floor": graph / floor}
    if shape_us is not None:
        row["cupti_graph"] = {"kernels": 2, "kernel_us": sum(shape_us), "span_us": graph, "overlap_us": 0.5,
                              "shape_us": shape_us}
    return row


def _meta(equal=True):
    return {"chains": 50, "rounds": 7, "copy_gbs": 3000.0, "packing": "side-aware", "kernel_timer": "CUPTI (x)",
            "outputs_equal": equal}


def _sequences():
    return [{"name": "custom", "label": "64x2112x7168 -> 64x7168x2048",
             "shapes": [{"shape": "64x2112x7168", "floor_us": 5.0}, {"shape": "64x7168x2048", "floor_us": 5.0}],
             "floor_us": 10.0},
            {"name": "moe 8x32", "label": "8x32x4096x7168", "shapes": [{"shape": "8x32x4096x7168", "floor_us": 80.0}],
             "floor_us": 80.0, "masked_m": [30, 34]}]


def test_report_table_ratios_and_per_shape_durations():
    rows = [_row("custom", "plain", False, 20.0, 15.0, 10.0, [6.0, 7.0]),
            _row("custom", "plain", True, 18.0, 14.0, 10.0, [6.5, 7.25]),
            _row("custom", "packed", False, 19.0, 14.5, 10.0, [5.5, 6.5], side_aware=False),
            _row("custom", "packed", True, 17.0, 13.0, 10.0, [6.0, 6.0], side_aware=False)]
    text = chain.report(_sequences(), rows, _meta())
    assert "custom: 64x2112x7168 -> 64x7168x2048; floors 5.0 + 5.0 = 10.0 us" in text
    assert "moe 8x32: 8x32x4096x7168 (masked_m 30, 34); floors 80.0 = 80.0 us" in text
    assert "copy bandwidth 3.00 TB/s" in text and "50 chains per timing, median of 7" in text
    assert "| custom | plain | off | 20.0 | 2.00 | 15.0 | 1.50 | 17.0 | 13.0 | 0.5 | equal |" in text
    assert "| custom | packed (plain here) | on | 17.0 | 1.70 | 13.0 | 1.30 | 15.0 | 12.0 | 0.5 | equal |" in text
    assert "custom plain 0.900, 0.933; custom packed 0.895, 0.897" in text
    assert "| custom | plain | 64x7168x2048 | 7.00 | 7.25 | +0.25 |" in text
    assert "| custom | packed | 64x2112x7168 | 5.50 | 6.00 | +0.50 |" in text
    assert text.rstrip().endswith("eager chain's: all")


def test_report_without_cupti_and_with_a_difference():
    rows = [_row("custom", "plain", False, 20.0, 15.0, 10.0),
            _row("custom", "packed", True, 18.0, 14.0, 10.0, differs=["64x7168x2048"]),
            {**_row("custom", "plain", True, 18.0, 14.0, 10.0), "plans_pdl": [False]}]
    text = chain.report(_sequences()[:1], rows, _meta(equal=False))
    assert "kernels us/chain" not in text and "Kernel durations per shape" not in text
    assert "PDL on / off, eager and graph: custom plain 0.900, 0.933" in text
    assert "| custom | packed | on | 18.0 | 1.80 | 14.0 | 1.40 | 16.0 | DIFFERS: eager 64x7168x2048 |" in text
    assert "| custom | plain | on (not launched) | 18.0 |" in text  # a driver without PDL launches
    assert "NOT ALL (exit status 1)" in text


def test_back_to_back_times_a_run_behind_an_untimed_one(monkeypatch):
    """The graph timing: the start event is recorded after one untimed run, so the timed run's submission overlaps
    the GPU running the first (a graph launch's host time does not count as GPU time)."""
    cupy = pytest.importorskip("cupy")
    from cupygemm.bench import timing

    order = []

    class Event:
        def __init__(self):
            self.name = "start" if not any(e.startswith("event") for e in order) else "end"
            order.append(f"event {self.name}")

        def record(self, stream):
            order.append(f"record {self.name}")

        def synchronize(self):
            order.append(f"sync {self.name}")

    monkeypatch.setattr(cupy.cuda, "Event", Event)
    monkeypatch.setattr(cupy.cuda, "get_elapsed_time", lambda a, b: 5.0)  # ms
    us = timing.back_to_back_us(None, lambda: order.append("run"), per=10)
    assert us == pytest.approx(500.0)
    assert [o for o in order if not o.startswith("event")] == ["run", "record start", "run", "record end", "sync end"]
