"""Warm-up by M range (cupygemm.warmup / `cupygemm warmup`) and the portable cache (`cupygemm cache export|import`)."""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import cupygemm
from cupygemm import config as C
from cupygemm import serving
from cupygemm.errors import CupygemmCacheError, CupygemmError
from cupygemm.jit import cache, portable
from cupygemm.jit.build import cache_key
from cupygemm.kernels import gemm_source

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPYGEMM_CACHE_DIR", str(tmp_path / "cache"))
    cache.clear_memory()
    yield tmp_path / "cache"
    cache.clear_memory()


def _expected(kind, nk, ms, groups=1, sms=132):
    """Configs and kernels from the unmemoized search, problem by problem."""
    cfgs = {C.choose(kind, m, n, k, groups, sms)[0] for n, k in nk for m in ms}
    return cfgs, {cache_key(gemm_source(c)) for c in cfgs}


def test_warmup_plans_exactly_what_the_chooser_picks(fresh_cache):
    nk = [(2112, 7168), (7168, 2048)]
    report = cupygemm.warmup(nk, "1:300", num_sms=132, dry_run=True)
    cfgs, keys = _expected(C.KIND_NORMAL, nk, range(1, 301))
    assert report.problems == 600 and report.configs == len(cfgs) and set(report.keys) == keys
    assert report.kernels == len(keys) <= len(cfgs)
    assert report.cached == 0 and report.built == 0 and "to build (dry run)" in report.summary()
    # contiguous: total rows, the multiples of 128 in the range; masked: every expected_m
    rep = cupygemm.warmup([(4096, 7168)], [(1, 1024)], kind="contiguous", groups=4, num_sms=132, dry_run=True)
    cfgs, keys = _expected(C.KIND_CONTIGUOUS, [(4096, 7168)], range(128, 1025, 128), groups=4)
    assert rep.problems == 8 and set(rep.keys) == keys
    rep = cupygemm.warmup([(7168, 2048)], "1:40", kind="masked", groups=2, num_sms=132, dry_run=True)
    cfgs, keys = _expected(C.KIND_MASKED, [(7168, 2048)], range(1, 41), groups=2)
    assert rep.problems == 40 and rep.configs == len(cfgs) and set(rep.keys) == keys


def test_warmup_preset_and_shapes(fresh_cache):
    rep = cupygemm.warmup(preset="deepseek-v3", m="64,4096", num_sms=132, dry_run=True)
    assert rep.problems == 12
    full = cupygemm.warmup(preset="deepseek-v3", num_sms=132, dry_run=True)  # M 1..4096 by default
    assert full.problems == 6 * 4096 and full.kernels < full.configs  # configs differing in their grid share a kernel
    seed = [(m, n, k) for m in (64, 4096) for n, k in serving.PRESETS["deepseek-v3"]["normal"]]
    by_shapes = cupygemm.warmup(shapes=seed, num_sms=132, dry_run=True)
    assert set(by_shapes.keys) == set(rep.keys)
    assert serving.PRESETS["deepseek-r1"] == serving.PRESETS["deepseek-v3"]


def test_warmup_builds_the_weight_gradient_kernels_the_calls_plan(fresh_cache):
    """--kind wgrad / k_grouped_wgrad: explicit shapes, the 1D1D kernel's config chooser, its kernels in the cache
    under the keys a call's plan looks up (cupygemm.plan_wgrad)."""
    from cupygemm import contract_wgrad as cw
    from cupygemm.plan_wgrad import wgrad_source

    rep = cupygemm.warmup(kind="wgrad", shapes=[(7168, 2112, 4096), (2048, 7168, 4096)], num_sms=132, jobs=1)
    want = {cache_key(wgrad_source(cw.choose_wgrad_config("wgrad", m, n, k, 1, 132)))
            for m, n, k in ((7168, 2112, 4096), (2048, 7168, 4096))}
    assert set(rep.keys) == want and rep.built == len(want) and all(cache.load(k) for k in want)
    grouped = cupygemm.warmup(kind="k_grouped_wgrad", shapes=[(4, 7168, 4096, 4096)], num_sms=132, dry_run=True)
    assert grouped.keys == [cache_key(wgrad_source(cw.choose_wgrad_config("k_grouped_wgrad", 7168, 4096, 4096, 4,
                                                                          132)))]
    with pytest.raises(ValueError, match="explicit shapes"):
        cupygemm.warmup([(2112, 7168)], "1:64", kind="wgrad", num_sms=132)
    with pytest.raises(ValueError, match="K must be a multiple of 16"):
        cupygemm.warmup(kind="wgrad", shapes=[(64, 64, 100)], num_sms=132)
    with pytest.raises(ValueError, match="GxMxNxK"):
        cupygemm.warmup(kind="k_grouped_wgrad", shapes=[(64, 64, 128)], num_sms=132)


def test_warmup_packed_plans_the_side_aware_kernels_a_packed_call_builds(fresh_cache, monkeypatch):
    """--packed: the chooser's pick among whole-chunk tiles, turned side-aware, under PDL with the weights fetched
    before the wait at up to 64 rows (cupygemm.plan: the kernel a GEMM on pack_weights output builds); none of them
    is a plain kernel."""
    from cupygemm import plan as gemm_plan
    from cupygemm.kernels import GemmVariant

    monkeypatch.delenv("CUPYGEMM_PDL", raising=False)
    monkeypatch.delenv("CUPYGEMM_B_PREFETCH_KIB", raising=False)

    def packed_keys(kind, nk, ms, groups=1):
        out = set()
        for n, k in nk:
            for m in ms:
                cfg = C.side_aware_config(C.choose_config(kind, m, n, k, groups, 132, sides=True), 132)
                out.add(cache_key(gemm_source(cfg, True, gemm_plan.b_prefetch(True, True, m))))
        return out

    nk = [(2112, 7168), (7168, 2048)]
    rep = cupygemm.warmup(nk, "1:200", num_sms=132, dry_run=True, packed=True)
    assert set(rep.keys) == packed_keys(C.KIND_NORMAL, nk, range(1, 201))
    assert not set(rep.keys) & set(cupygemm.warmup(nk, "1:200", num_sms=132, dry_run=True).keys)
    variants = serving.plan(serving.problems_for("normal", nk, [(1, 200)]), 132, packed=True)
    assert all(isinstance(v, GemmVariant) and v.cfg.sides for v in variants)
    assert {v.b_prefetch > 0 for v in variants} == {True, False}  # M <= 64 fetch before the wait, M > 64 do not
    # warm-up plans one M per memo class, so the prefetch's row limit must not cut a class in two
    assert gemm_plan.B_PREFETCH_MAX_ROWS % C.M_CLASS_ROWS == 0
    rep = cupygemm.warmup([(4096, 7168)], "1:80", kind="masked", groups=4, num_sms=132, dry_run=True, packed=True)
    assert set(rep.keys) == packed_keys(C.KIND_MASKED, [(4096, 7168)], range(1, 81), groups=4)
    with pytest.raises(ValueError, match="forward kinds only"):
        cupygemm.warmup(kind="wgrad", shapes=[(7168, 2112, 4096)], num_sms=132, packed=True)


@pytest.mark.parametrize("kind,m,groups", [("normal", "1:20000,100:300,30000,20001:20100", 1),
                                            ("contiguous", "1:20000,5000:30000", 2), ("masked", "1:100,90:110", 4)])
def test_warmup_asks_the_chooser_once_per_memo_class(monkeypatch, kind, m, groups):
    """Planning costs one search per memo class (config.m_class), not one per M, and the counts stay those of
    every M in the ranges."""
    calls = []

    def spy(*args, **kwargs):
        calls.append(args)
        return C.choose_config(*args, **kwargs)

    monkeypatch.setattr(serving, "choose_config", spy)
    rep = cupygemm.warmup([(4096, 7168)], m, kind=kind, groups=groups, num_sms=132, dry_run=True)
    kid = C.kind_id(kind)
    ms = {v for r in serving.parse_m_ranges(m) for v in range(r[0], r[1] + 1)
          if kid != C.KIND_CONTIGUOUS or v % 128 == 0}
    assert rep.problems == len(ms)
    assert len(calls) == len({C.m_class(kid, v) for v in ms})
    cfgs = {C.choose_config(kid, v, 4096, 7168, groups, 132) for v in ms}
    assert rep.configs == len(cfgs) and set(rep.keys) == set(serving.kernel_keys(cfgs))


@pytest.mark.parametrize("kwargs,match", [
    (dict(m="1:2147483648"), "m: M = 2147483648 is too large: dimensions must be below 2.31"),
    (dict(m="100000000000"), "m: M = 100000000000 is too large"),
    (dict(m=[(1, 10**30)], kind="contiguous", groups=2), f"m: M = {10**30} is too large"),
    (dict(m="1:600000000", kind="masked", groups=4), "m: total_rows = 2400000000 is too large"),
])
def test_warmup_bounds_m_by_what_the_kernels_address(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cupygemm.warmup([(4096, 7168)], num_sms=132, dry_run=True, **kwargs)


def test_explicit_masked_shapes_plan_full_groups():
    """Explicit masked shapes are groups of M rows (expected_m = max_m = M): the plan is the one a call with those
    arrays gets, whose max_m caps the sizes the chooser plans for."""
    probs = serving.problems_from_shapes("masked", [(4, 256, 4096, 7168)])
    assert probs[0].max_m == 256 and probs[0].m == 256
    assert serving.plan(probs, 132) == [C.choose_config(C.KIND_MASKED, 256, 4096, 7168, 4, 132, max_m=256)]
    assert serving.plan(probs, 132)[0].block_m == 256  # full groups: 256-row tiles (uncapped: 128)
    # M ranges are expected_m with max_m unknown: uncapped
    assert serving.problems_for("masked", [(4096, 7168)], [(256, 256)], groups=4)[0].max_m is None


@pytest.mark.parametrize("kwargs,match", [
    (dict(nk=[(4096, 7168)], m="0:10"), "m: expected 1 <= LO <= HI"),
    (dict(nk=[(4096, 7168)], m="5:a"), "m: expected LO:HI"),
    (dict(nk=[(4096, 7168)], kind="masked", groups=4), "m: give the M range for masked"),
    (dict(m="1:10"), "m: give the .N, K. pairs"),
    (dict(preset="llama"), "preset: expected one of"),
    (dict(nk=[(4096, 7168)], groups=0, kind="masked", m="1:2"), "groups: expected a positive int"),
    (dict(), "nothing to plan"),
    (dict(shapes=[(4, 64, 4096, 7168)]), "normal shapes are MxNxK"),
    (dict(nk=[(4096, 7168)], m="1", jobs=0), "jobs: expected a positive int, got 0"),
])
def test_warmup_rejects_bad_requests(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cupygemm.warmup(num_sms=132, dry_run=True, **kwargs)


@pytest.mark.parametrize("num_sms", [-3, 0, 10**30])
def test_warmup_names_its_own_num_sms(num_sms):
    with pytest.raises(ValueError, match=f"^num_sms: expected an SM count in 1..[0-9]+, got {num_sms}$"):
        cupygemm.warmup([(4096, 7168)], "1", num_sms=num_sms, dry_run=True)


@pytest.mark.parametrize("kwargs,dims", [
    (dict(nk=[(4096, 7167)], m="1:64"), dict(n=4096, k=7167)),
    (dict(nk=[(4095, 7168)], m="1:64"), dict(n=4095, k=7168)),
    (dict(shapes=[(64, 4095, 7168)]), dict(n=4095, k=7168)),
    (dict(shapes=[(2, 64, 4096, 7160)], kind="masked"), dict(n=4096, k=7160)),
])
def test_warmup_applies_the_gemms_shape_rules(kwargs, dims):
    """A kernel the GEMMs would refuse to run is not built: the same check (validate.py), naming the request."""
    from cupygemm import validate

    with pytest.raises(ValueError) as gemm:
        validate.check_k_n(**dims)
    with pytest.raises(ValueError) as warm:
        cupygemm.warmup(num_sms=132, dry_run=True, **kwargs)
    assert str(gemm.value) in str(warm.value)
    assert str(warm.value).startswith("nk " if "nk" in kwargs else "shapes ")


@pytest.mark.parametrize("kwargs,match", [
    (dict(shapes=[(0, 4096, 7168)]), "shapes 0x4096x7168: .*positive"),
    (dict(shapes=[(2, 0, 4096, 7168)], kind="masked"), "shapes 2x0x4096x7168: .*positive"),
    (dict(shapes=[(99999999999999999999, 4096, 7168)]), "M = 99999999999999999999 is too large"),
    (dict(shapes=[(2, 2**30, 4096, 7168)], kind="contiguous"), f"M = {2**31} is too large"),
    (dict(shapes=[(4, 2**29, 4096, 7168)], kind="masked"), f"total_rows = {2**31} is too large"),
])
def test_warmup_refuses_shapes_no_gemm_can_have(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cupygemm.warmup(num_sms=132, dry_run=True, **kwargs)


@pytest.mark.parametrize("args", [["--nk", "4096x7167"], ["64x4095x7168"], ["0x4096x7168"],
                                  ["99999999999999999999x4096x7168"]])
def test_warmup_cli_refuses_what_bench_refuses(args):
    res = subprocess.run([sys.executable, "-m", "cupygemm", "warmup", *args, "--num-sms", "132", "--dry-run"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stdout + res.stderr
    assert res.stderr.startswith("cupygemm warmup: ") and res.stdout == ""


def test_warmup_builds_only_what_is_missing(fresh_cache, monkeypatch):
    """Counts are true: a second warm-up finds everything cached and builds nothing (compile faked for speed; the
    real, parallel build is the next test)."""
    built = []

    def fake_compile(cfg):
        built.append(cfg)
        cache.store(cache_key(gemm_source(cfg)), b"cubin " + repr(cfg).encode())

    monkeypatch.setattr(serving, "compile_config", fake_compile)
    first = cupygemm.warmup([(7168, 2048)], "1:512", num_sms=132, jobs=1)
    assert first.built == first.kernels == len(built) >= 2 and first.cached == 0
    cache.clear_memory()
    second = cupygemm.warmup([(7168, 2048)], "1:1024", num_sms=132, jobs=1)
    assert second.cached == first.kernels and second.built == second.kernels - first.kernels
    assert len(built) == second.kernels


def test_warmup_cli_builds_in_parallel_processes(fresh_cache):
    """`cupygemm warmup` with two processes really compiles (NVRTC) the planned kernels into the cache."""
    args = ["--nk", "1024x1024", "--m", "1:64,4096", "--num-sms", "132"]
    env = dict(os.environ, CUPYGEMM_CACHE_DIR=str(fresh_cache))
    res = subprocess.run([sys.executable, "-m", "cupygemm", "warmup", *args, "--jobs", "2"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    plan = cupygemm.warmup([(1024, 1024)], "1:64,4096", num_sms=132, dry_run=True)
    assert plan.kernels == 2 and plan.cached == 2  # built by the subprocess: on disk now
    assert f"65 problems -> {plan.configs} configs -> 2 kernels: 0 already cached, 2 built" in res.stdout
    assert "built 2/2 kernels" in res.stderr
    again = subprocess.run([sys.executable, "-m", "cupygemm", "warmup", *args, "--quiet"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "2 already cached, 0 built" in again.stdout and not again.stderr


def test_warmup_cli_usage_errors():
    for args in (["warmup", "--num-sms", "132"], ["warmup", "--nk", "4096x7168", "--m", "9:3", "--num-sms", "132"]):
        res = subprocess.run([sys.executable, "-m", "cupygemm", *args], cwd=REPO, capture_output=True, text=True,
                             timeout=120)
        assert res.returncode == 2 and res.stderr


def test_warmup_refuses_a_disabled_cache(monkeypatch):
    monkeypatch.setenv("CUPYGEMM_DISABLE_CACHE", "1")
    with pytest.raises(CupygemmError, match="CUPYGEMM_DISABLE_CACHE"):
        cupygemm.warmup([(4096, 7168)], "1", num_sms=132)


def test_warmup_fails_when_it_cannot_write_the_cache(tmp_path):
    """A warm-up exists to fill the disk cache: an unwritable one (here a regular file) fails it (rc 1) before
    anything is built, instead of building into memory and reporting success."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    env = dict(os.environ, CUPYGEMM_CACHE_DIR=str(blocker))
    res = subprocess.run([sys.executable, "-m", "cupygemm", "warmup", "--nk", "1024x1024", "--m", "64", "--num-sms",
                          "132", "--jobs", "1", "--quiet"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stdout + res.stderr
    assert res.stderr.startswith(f"cupygemm warmup: cannot write the kernel cache in {blocker}")
    assert "built" not in res.stdout
    assert blocker.read_text() == ""
    dry = subprocess.run([sys.executable, "-m", "cupygemm", "warmup", "--nk", "1024x1024", "--m", "64", "--num-sms",
                          "132", "--dry-run"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert dry.returncode == 0, dry.stderr  # a dry run writes nothing
    env = dict(os.environ, CUPYGEMM_DISABLE_CACHE="1")
    off = subprocess.run([sys.executable, "-m", "cupygemm", "warmup", "--nk", "1024x1024", "--m", "64", "--num-sms",
                          "132"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert off.returncode == 1 and "CUPYGEMM_DISABLE_CACHE" in off.stderr and "Traceback" not in off.stderr


def test_warmup_fails_when_what_it_built_did_not_reach_the_disk(fresh_cache, monkeypatch):
    """The cache was writable at the start, but the kernels were kept in memory only (as store() does when a write
    fails, e.g. on a full disk): the warm-up says so instead of reporting them built."""
    monkeypatch.setattr(serving, "compile_config", lambda cfg: None)  # built, never written
    with pytest.raises(CupygemmCacheError, match=r"warm-up: \d+ of the \d+ kernels built could not be written"):
        cupygemm.warmup([(7168, 2048)], "1:64", num_sms=132, jobs=1)


# ---- portable cache ---------------------------------------------------------------------------------------------

def _fill(n=3):
    blobs = {hashlib.sha256(bytes([i])).hexdigest(): os.urandom(64) for i in range(n)}
    for k, b in blobs.items():
        cache.store(k, b)
    return blobs


def _rewrite(src: Path, dst: Path, manifest_edit=None, blob_edit=None, extra=None):
    """Copy an archive, altering its manifest / one cubin / adding a member."""
    with tarfile.open(src, "r:gz") as tin, tarfile.open(dst, "w:gz") as tout:
        for m in tin.getmembers():
            data = tin.extractfile(m).read()
            if m.name == portable.MANIFEST and manifest_edit:
                man = json.loads(data)
                manifest_edit(man)
                data = json.dumps(man).encode()
            elif m.name != portable.MANIFEST and blob_edit:
                data, blob_edit = blob_edit(data), None
            info = tarfile.TarInfo(m.name)
            info.size = len(data)
            tout.addfile(info, io.BytesIO(data))
        if extra:
            info = tarfile.TarInfo(extra)
            info.size = 1
            tout.addfile(info, io.BytesIO(b"x"))


def test_export_import_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPYGEMM_CACHE_DIR", str(tmp_path / "a"))
    cache.clear_memory()
    blobs = _fill()
    archive = tmp_path / "kernels.tar.gz"
    assert portable.export_cache(archive, num_sms=132) == 3
    manifest, got = portable.read_archive(archive)
    assert got == blobs and manifest["num_sms"] == 132 and manifest["arch"] == "sm_90a"
    assert manifest["cupygemm"] == cupygemm.__version__ and len(manifest["source_hash"]) == 64
    monkeypatch.setenv("CUPYGEMM_CACHE_DIR", str(tmp_path / "b"))
    cache.clear_memory()
    res = portable.import_cache(archive, num_sms=132)
    assert (res.added, res.present, res.cache_dir) == (3, 0, tmp_path / "b")
    cache.clear_memory()
    assert {k: cache.load(k) for k in blobs} == blobs  # read back from disk
    assert portable.import_cache(archive, num_sms=132).present == 3
    cache.clear_memory()


@pytest.mark.parametrize("field,value", [("nvrtc", [11, 0]), ("cupygemm", "0.0.1"), ("arch", "sm_100a"),
                                         ("source_hash", "0" * 64), ("format", "other/9")])
def test_import_refuses_a_tampered_or_foreign_manifest(tmp_path, monkeypatch, field, value):
    monkeypatch.setenv("CUPYGEMM_CACHE_DIR", str(tmp_path / "a"))
    cache.clear_memory()
    _fill()
    archive, bad = tmp_path / "k.tar.gz", tmp_path / "bad.tar.gz"
    portable.export_cache(archive, num_sms=132)
    _rewrite(archive, bad, manifest_edit=lambda m: m.__setitem__(field, value))
    monkeypatch.setenv("CUPYGEMM_CACHE_DIR", str(tmp_path / "b"))
    cache.clear_memory()
    with pytest.raises(CupygemmCacheError, match=f"refused.*\n  {field}: archive"):
        portable.import_cache(bad, num_sms=132)
    assert not (tmp_path / "b").exists()  # nothing written
    cache.clear_memory()


def test_import_refuses_damage_and_other_sm_counts(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPYGEMM_CACHE_DIR", str(tmp_path / "a"))
    cache.clear_memory()
    _fill()
    archive = tmp_path / "k.tar.gz"
    portable.export_cache(archive, num_sms=132)
    monkeypatch.setenv("CUPYGEMM_CACHE_DIR", str(tmp_path / "b"))
    cache.clear_memory()
    flipped = tmp_path / "flipped.tar.gz"
    _rewrite(archive, flipped, blob_edit=lambda d: bytes([d[0] ^ 1]) + d[1:])
    with pytest.raises(CupygemmCacheError, match="does not match its checksum"):
        portable.import_cache(flipped, num_sms=132)
    sneaky = tmp_path / "sneaky.tar.gz"
    _rewrite(archive, sneaky, extra="../../etc/evil")
    with pytest.raises(CupygemmCacheError, match="not listed in the manifest"):
        portable.import_cache(sneaky, num_sms=132)
    with pytest.raises(CupygemmCacheError, match="num_sms: archive 132, here 114"):
        portable.import_cache(archive, num_sms=114)
    (tmp_path / "junk").write_bytes(b"not a tar")
    with pytest.raises(CupygemmCacheError, match="not a cupygemm cache archive"):
        portable.import_cache(tmp_path / "junk", num_sms=132)
    assert not (tmp_path / "b").exists()
    if not cupygemm.device.gpu_available():
        res = portable.import_cache(archive)  # no GPU, no num_sms: imported, and the note says what was not checked
        assert res.added == 3 and "SM count not checked" in res.note
        with pytest.raises(ValueError, match="num_sms: no GPU here"):
            portable.export_cache(tmp_path / "x.tar.gz")
    cache.clear_memory()


def test_cache_cli_round_trip_and_refusal(tmp_path):
    env = dict(os.environ, CUPYGEMM_CACHE_DIR=str(tmp_path / "a"))
    subprocess.run([sys.executable, "-c", "from cupygemm.jit import cache; cache.store('ab' * 32, b'cubin')"],
                   env=env, check=True, timeout=120)
    archive = tmp_path / "k.tar.gz"
    out = subprocess.run([sys.executable, "-m", "cupygemm", "cache", "export", str(archive), "--num-sms", "132"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "exported 1 kernels" in out.stdout, out.stderr
    env["CUPYGEMM_CACHE_DIR"] = str(tmp_path / "b")
    bad = subprocess.run([sys.executable, "-m", "cupygemm", "cache", "import", str(archive), "--num-sms", "78"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "refused" in bad.stderr and "num_sms" in bad.stderr
    ok = subprocess.run([sys.executable, "-m", "cupygemm", "cache", "import", str(archive), "--num-sms", "132"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "imported 1 kernels" in ok.stdout, ok.stderr
    assert (tmp_path / "b" / "ab" / f"{'ab' * 32}.cubin").is_file()


def test_import_of_a_truncated_archive_is_refused_cleanly(tmp_path):
    """A download cut short: gzip's EOFError becomes the cache's own error (rc 1 from the CLI), and nothing is
    written."""
    env = dict(os.environ, CUPYGEMM_CACHE_DIR=str(tmp_path / "a"))
    subprocess.run([sys.executable, "-c", "from cupygemm.jit import cache; cache.store('ab' * 32, __import__('os')"
                    ".urandom(1 << 16))"], env=env, check=True, timeout=120)
    archive, cut = tmp_path / "k.tar.gz", tmp_path / "cut.tar.gz"
    subprocess.run([sys.executable, "-m", "cupygemm", "cache", "export", str(archive), "--num-sms", "132"], cwd=REPO,
                   env=env, check=True, capture_output=True, timeout=120)
    data = archive.read_bytes()
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(CupygemmCacheError, match="truncated or damaged"):
        portable.read_archive(cut)
    env["CUPYGEMM_CACHE_DIR"] = str(tmp_path / "b")
    res = subprocess.run([sys.executable, "-m", "cupygemm", "cache", "import", str(cut), "--num-sms", "132"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith(f"cupygemm cache import: {cut}: truncated or damaged archive"), res.stderr
    assert not (tmp_path / "b").exists()
