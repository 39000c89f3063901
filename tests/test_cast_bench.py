"""``cupygemm cast-bench`` (cupygemm/bench/casts.py): its cases, byte counts and report on CPU; one small run on the
GPU (``-m gpu``)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cupygemm.bench import casts

REPO = Path(__file__).resolve().parents[1]


def test_subcommand_parses():
    code = ("import json, cupygemm.cli as c; a = c.build_parser().parse_args(['cast-bench', '--tokens', '256', '--nk', "
            "'256x384,512x128', '--iters', '3', '--json', 'x.json']); print(json.dumps([a.tokens, a.nk, a.iters, "
            "a.json, a.dtype, a.func.__module__]))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == [256, [[256, 384], [512, 128]], 3, "x.json", "bfloat16", "cupygemm.bench.casts"]


def test_tensors_are_the_recipes():
    t = casts.tensors_for(4096)
    acts = [(name, shape) for kind, name, shape in t if kind == "act"]
    assert [s for _, s in acts] == [(4096, w) for w in (512, 1536, 2048, 2112, 4096, 7168, 16384, 24576, 32768)]
    assert dict(acts)["x/dy"] == (4096, 7168) and ("dy", (4096, 32768)) in acts and ("x", (4096, 512)) in acts
    assert [s for kind, _, s in t if kind == "weight"] == [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384),
                                                          (4096, 7168), (7168, 2048)]


def test_cast_bytes():
    t, d = 4096, 7168
    assert casts.cast_bytes("per_token", t, d, 2) == t * d * 3 + 4 * t * 56
    assert casts.cast_bytes("transposed", t, d, 2) == casts.cast_bytes("unfused", t, d, 2) == t * d * 3 + 4 * d * 32
    assert casts.cast_bytes("transposed_rowwise", t, d, 2) == t * d * 4 + 4 * (d * 32 + t * 56)
    assert casts.cast_bytes("per_block", 300, 200, 4) == 300 * 200 * 5 + 4 * 3 * 2
    assert casts.cast_bytes("per_block_with_transpose", 300, 200, 4) == 300 * 200 * 6 + 8 * 3 * 2
    with pytest.raises(ValueError):
        casts.cast_bytes("nope", 1, 1, 2)


def test_report():
    rows = [{"tensor": "act", "name": "x", "shape": [4096, 512], "dtype": "bfloat16", "method": m, "us": us,
             "bytes": 1000, "gbs": 1000 / us / 1e3, "copy_us": 8.0, "copy_ratio": 8.0 / us, "peak_ratio": 0.5,
             "check": c}
            for m, us, c in (("per_token", 10.0, None), ("transposed", 8.0, True), ("unfused", 40.0, True))]
    s = casts.summary(rows)
    assert s["transposed"]["copy_ratio"] == pytest.approx(1.0) and s["unfused"]["copy_ratio"] == pytest.approx(0.2)
    text = casts.markdown(rows, 3000.0)
    assert "| x | 4096x512 | transposed | 8.0 |" in text and "| unfused | 0.20 |" in text


@pytest.mark.gpu
def test_small_run(tmp_path):
    pytest.importorskip("cupy")
    out = tmp_path / "casts.json"
    res = subprocess.run([sys.executable, "-m", "cupygemm", "cast-bench", "--tokens", "384", "--nk", "256x640,384x128",
                          "--iters", "3", "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["all_bitwise_equal"] is True and report["copy_gbs"] > 100
    methods = [r["method"] for r in report["rows"]]
    assert methods.count("transposed_rowwise") == 4 and methods.count("per_block_with_transpose") == 2
    assert all(r["us"] > 0 and r["copy_us"] > 0 for r in report["rows"])
