"""Smoke tests of ``python -m sass_tools info|dump|interleave``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_helpers as H  # noqa: E402

from sass_tools.elf import Cubin  # noqa: E402
from sass_tools.interleave import is_interleaved  # noqa: E402


def _cli(*args, check=True):
    env = dict(os.environ)
    env["PYTHONPATH"] = H.REPO + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "sass_tools", *args], capture_output=True, text=True, env=env,
                       cwd=H.REPO, timeout=120)
    if check:
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


def _cubin_file(tmp_path, lb=128, cuda=12):
    b = next(b for b in (H.builds_cuda12() if cuda == 12 else H.builds_cuda13()) if b.launch_threads == lb)
    p = tmp_path / f"k{lb}_cu{cuda}.cubin"
    p.write_bytes(b.cubin)
    return p, b


def test_help():
    r = _cli("--help")
    assert "info" in r.stdout and "dump" in r.stdout and "interleave" in r.stdout
    for sub in ("info", "dump", "interleave"):
        assert "usage" in _cli(sub, "--help").stdout
    assert "--fraction" in _cli("interleave", "--help").stdout


def test_info(tmp_path):
    p, b = _cubin_file(tmp_path)
    out = _cli("info", str(p)).stdout
    assert "sm_90a" in out and "ELF ABI 7" in out
    for k in H.GEMM_KERNELS:
        assert f"kernel {k}" in out
    ru = H.res_usage(b.cubin)
    m = re.search(r"kernel qgmma_promote\n  registers\s+(\d+)", out)
    assert m and int(m.group(1)) == ru["qgmma_promote"]["REG"]
    assert "QGMMA 1" in out and "FFMA" in out and "LDL 0" in out
    js = json.loads(_cli("info", "--json", str(p)).stdout)
    assert js["arch"] == "sm_90a" and js["abi_version"] == 7
    kq = next(k for k in js["kernels"] if k["name"] == "qgmma_promote")
    assert kq["registers"] == ru["qgmma_promote"]["REG"] and kq["mix"]["QGMMA"] == 1
    assert kq["ffma_runs"] == 1 and kq["ffmas_in_runs"] == 64 and not kq["already_interleaved"]
    kt = next(k for k in js["kernels"] if k["name"] == "tma_pipeline")
    assert kt["shared_bytes"] == ru["tma_pipeline"]["SHARED"] and kt["mix"]["UTMALDG"] >= 1
    # CUDA 13 cubin + spills in the variants kernel
    p13, _ = _cubin_file(tmp_path, 384, 13)
    js13 = json.loads(_cli("info", "--json", str(p13)).stdout)
    assert js13["abi_version"] == 8 and js13["toolkit"].startswith("13.")
    assert next(k for k in js13["kernels"] if k["name"] == "qgmma_promote")["already_interleaved"]
    pv = tmp_path / "v.cubin"
    pv.write_bytes(H.build_variants().cubin)
    kv = json.loads(_cli("info", "--json", str(pv)).stdout)["kernels"][0]
    assert kv["spill_instructions"] > 0 and kv["mix"]["STL"] > 0 and kv["frame_bytes"] > 0


def test_dump(tmp_path):
    p, b = _cubin_file(tmp_path)
    out = _cli("dump", "--hex", str(p)).stdout
    cb = Cubin.from_bytes(b.cubin)
    n = sum(k.text_size // 16 for k in cb.kernels)
    lines = [l for l in out.splitlines() if l.startswith("/*")]
    assert len(lines) == n
    assert re.search(r"FFMA R\d+, R\d+, R\d+\.reuse, R\d+ +B[-0-5]{6}:R[-0-7]:W[-0-7]:[Y-]:S\d\d", out)
    assert "QGMMA" in out and "UTMALDG" in out and "SYNCS.ARRIVE" in out and "EXIT" in out
    one = _cli("dump", "--kernel", "scalar_forms", str(p)).stdout
    assert "// kernel scalar_forms" in one and "qgmma_promote" not in one
    assert "FFMA" in one and "FADD" in one and "FMUL" in one


def test_interleave(tmp_path):
    p, b = _cubin_file(tmp_path)
    r = _cli("interleave", str(p))
    out_path = tmp_path / "k128_cu12.interleaved.cubin"
    assert out_path.exists() and "qgmma_promote" in r.stdout and "changed=18" in r.stdout
    patched = out_path.read_bytes()
    assert patched != b.cubin and is_interleaved(patched) and not is_interleaved(b.cubin)
    o2 = tmp_path / "custom.cubin"
    js = json.loads(_cli("interleave", "--fraction", "1", "-o", str(o2), "--json", str(p)).stdout)
    assert o2.exists() and js["output"] == str(o2)
    assert next(k for k in js["kernels"] if k["name"] == "qgmma_promote")["changed"] == 32
    # already interleaved cubin: reported, unchanged; --force patches anyway
    p384, b384 = _cubin_file(tmp_path, 384, 13)
    r = _cli("interleave", "-o", str(tmp_path / "n.cubin"), str(p384))
    assert "already interleaved" in r.stdout and (tmp_path / "n.cubin").read_bytes() == b384.cubin
    r = _cli("interleave", "--force", "--fraction", "9/16", "-o", str(tmp_path / "f.cubin"), str(p384))
    assert "forced" in r.stdout


def test_errors(tmp_path):
    bad = tmp_path / "bad.cubin"
    bad.write_bytes(b"definitely not an ELF file")
    for sub in ("info", "dump", "interleave"):
        r = _cli(sub, str(bad), check=False)
        assert r.returncode == 1 and "bad ELF magic" in r.stderr, (sub, r.stderr)
    r = _cli("info", str(tmp_path / "missing.cubin"), check=False)
    assert r.returncode == 1 and "error" in r.stderr
    p, _ = _cubin_file(tmp_path)
    r = _cli("interleave", "--fraction", "2", str(p), check=False)
    assert r.returncode == 2 and "fraction" in r.stderr
    r = _cli("dump", "--kernel", "nope", str(p), check=False)
    assert r.returncode == 1 and "no kernel" in r.stderr
