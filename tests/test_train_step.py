"""``cupygemm train-step`` (cupygemm/bench/train_step.py): options and report on CPU; one small run on the GPU."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from cupygemm.bench import train_step

REPO = Path(__file__).resolve().parents[1]


def test_subcommand_parses_without_importing_a_framework():
    code = ("import json, sys, cupygemm.cli as c; a = c.build_parser().parse_args(['train-step', '--tokens', '256', "
            "'--nk', '256x384', '--iters', '3', '--jax', '--json', 'x.json']); print(json.dumps([a.tokens, a.nk, "
            "a.iters, a.jax, a.json, a.func.__module__, 'torch' in sys.modules, 'jax' in sys.modules]))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == [256, [[256, 384]], 3, True, "x.json", "cupygemm.bench.train_step", False, False]


def _row(n, k, bf16, ours, peer):
    return {"n": n, "k": k, "us": {"bf16": bf16, "cupygemm": ours, "scaled_mm": peer},
            "speedup_vs_bf16": bf16 / ours, "speedup_vs_scaled_mm": peer / ours,
            "parts_us": {p: float(i + 1) for i, p in enumerate(train_step.PARTS)}}


def test_summary_and_table():
    rows = [_row(2112, 7168, 400.0, 200.0, 300.0), _row(32768, 512, 500.0, 625.0, 500.0)]
    s = train_step.summary(rows)
    assert math.isclose(s["speedup_vs_bf16_geomean"], math.sqrt(2.0 * 0.8))
    assert s["speedup_vs_bf16_min"] == 0.8 and math.isclose(s["speedup_vs_scaled_mm_min"], 0.8)
    table = train_step.markdown(rows)
    assert "| 2112 x 7168 | 400 | 200 | 300 | 2.00x | 1.50x | 1 | 2 | 3 | 4 | 5 | 6 |" in table
    assert "geomean: 1.26x BF16 (min 0.80x)" in table


@pytest.mark.gpu
def test_small_run_checks_every_step(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "ts.json"
    res = subprocess.run([sys.executable, "-m", "cupygemm", "train-step", "--tokens", "384", "--nk", "256x640",
                          "--iters", "3", "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert data["all_checks_pass"] and set(row["us"]) == set(train_step.STEPS)
    assert set(row["parts_us"]) == set(train_step.PARTS) and all(v > 0 for v in row["parts_us"].values())
