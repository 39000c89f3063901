"""The JIT cache: keys, corruption, concurrency, unwritable directories."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from cupygemm import config as C
from cupygemm.jit import build, cache
from cupygemm.jit.source import KernelSource
from cupygemm.kernels import compile_gemm, gemm_source

CFG = C.make_config(C.KIND_NORMAL, 256, 256, 64, 64, 132)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPYGEMM_CACHE_DIR", str(tmp_path / "cache"))
    cache.clear_memory()
    yield tmp_path / "cache"
    cache.clear_memory()


def test_key_covers_source_headers_options_and_toolchain(monkeypatch):
    src = gemm_source(CFG)
    k0 = build.cache_key(src)
    assert build.cache_key(src) == k0
    assert build.cache_key(KernelSource(src.name, src.text + " ", src.headers, src.entry)) != k0
    headers = dict(src.headers)
    headers["ptx_tma.cuh"] += "\n// changed"
    assert build.cache_key(KernelSource(src.name, src.text, headers, src.entry)) != k0
    assert build.cache_key(src, options=("-lineinfo",)) != k0
    monkeypatch.setattr(build, "nvrtc_version", lambda: (11, 8))
    assert build.cache_key(src) != k0
    monkeypatch.undo()
    assert build.cache_key(gemm_source(C.make_config(C.KIND_NORMAL, 256, 256, 64, 72, 132))) != k0


def test_key_covers_interleave_decision_and_pass_version(monkeypatch):
    import sass_tools

    src = gemm_source(CFG)
    monkeypatch.setenv("CUPYGEMM_FFMA_INTERLEAVE", "off")
    off = build.cache_key(src)
    monkeypatch.setenv("CUPYGEMM_FFMA_INTERLEAVE", "on")
    on = build.cache_key(src)
    assert on != off
    monkeypatch.setattr(sass_tools, "PASS_VERSION", sass_tools.PASS_VERSION + "-next")
    assert build.cache_key(src) != on
    monkeypatch.setenv("CUPYGEMM_FFMA_INTERLEAVE", "sometimes")
    with pytest.raises(ValueError, match="CUPYGEMM_FFMA_INTERLEAVE"):
        build.cache_key(src)


def test_entry_written_then_read_from_disk(fresh_cache):
    cubin = compile_gemm(CFG)
    entries = list(fresh_cache.glob("*/*.cubin"))
    assert len(entries) == 1
    cache.clear_memory()
    key = build.cache_key(gemm_source(CFG))
    assert cache.load(key) == cubin
    assert not list(fresh_cache.glob("*/*.tmp"))


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_corrupt_entry_is_detected_and_rebuilt(fresh_cache, damage):
    cubin = compile_gemm(CFG)
    (path,) = fresh_cache.glob("*/*.cubin")
    blob = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(blob[: len(blob) // 2])
    elif damage == "flip":
        path.write_bytes(blob[:-100] + bytes([blob[-100] ^ 1]) + blob[-99:])
    elif damage == "garbage":
        path.write_bytes(b"not a cubin")
    else:
        path.write_bytes(b"")
    cache.clear_memory()
    key = build.cache_key(gemm_source(CFG))
    assert cache.load(key) is None
    assert compile_gemm(CFG) == cubin
    assert path.read_bytes() == blob


def test_unwritable_cache_dir_falls_back_to_memory_with_one_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("CUPYGEMM_CACHE_DIR", str(blocker / "cache"))
    cache.clear_memory()
    cache._warned_dirs.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        a = compile_gemm(CFG)
        b = compile_gemm(C.make_config(C.KIND_NORMAL, 256, 256, 64, 80, 132))
    msgs = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
    assert len(msgs) == 1 and "memory only" in msgs[0]
    assert a[:4] == b[:4] == b"\x7fELF"
    assert compile_gemm(CFG) == a  # served from memory
    cache.clear_memory()


@pytest.mark.parametrize("err", [PermissionError(13, "Permission denied"), OSError(28, "No space left on device"),
                                 OSError(30, "Read-only file system")])
def test_read_only_or_full_cache_dir(fresh_cache, monkeypatch, err):
    def fail(*a, **k):
        raise err

    monkeypatch.setattr(cache.tempfile, "mkstemp", fail)
    cache._warned_dirs.clear()
    with pytest.warns(RuntimeWarning, match="memory only"):
        cubin = compile_gemm(CFG)
    assert cubin[:4] == b"\x7fELF" and not list(fresh_cache.glob("*/*"))


def test_disable_cache_env(fresh_cache, monkeypatch):
    monkeypatch.setenv("CUPYGEMM_DISABLE_CACHE", "1")
    compile_gemm(CFG)
    assert not fresh_cache.exists() or not list(fresh_cache.glob("*/*.cubin"))


def test_eight_processes_cold_compile_the_same_kernels(tmp_path):
    """Concurrent cold compiles leave exactly one valid entry per kernel and identical cubins."""
    script = textwrap.dedent(
        """
        import hashlib, sys
        from cupygemm import config as C
        from cupygemm.kernels import compile_gemm
        out = []
        for bn in (64, 72, 80):
            cfg = C.make_config(C.KIND_NORMAL, 512, 512, 64, bn, 132)
            out.append(hashlib.sha256(compile_gemm(cfg)).hexdigest())
        print(",".join(out))
        """
    )
    env = dict(os.environ, CUPYGEMM_CACHE_DIR=str(tmp_path / "c"))
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True,
                              cwd=str(Path(__file__).resolve().parents[1])) for _ in range(8)]
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outs)) == 1, outs
    entries = list((tmp_path / "c").glob("*/*.cubin"))
    assert len(entries) == 3
    assert not list((tmp_path / "c").glob("*/*.tmp")) and not list((tmp_path / "c").glob("*/.*"))
    cache.clear_memory()
    os.environ["CUPYGEMM_CACHE_DIR"], saved = str(tmp_path / "c"), os.environ["CUPYGEMM_CACHE_DIR"]
    try:
        for e in entries:
            assert cache.load(e.stem) is not None
    finally:
        os.environ["CUPYGEMM_CACHE_DIR"] = saved


def test_threads_build_each_kernel_once(fresh_cache, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    calls = []
    real = build.compile_cubin

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(build, "compile_cubin", counting)
    cfg = C.make_config(C.KIND_NORMAL, 512, 512, 64, 96, 132)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: compile_gemm(cfg), range(16)))
    assert len(set(results)) == 1
    assert len(calls) == 1


def test_driver_older_than_nvrtc_is_reported(monkeypatch):
    import sys
    import types

    from cupygemm.errors import CupygemmToolchainError

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(driverGetVersion=lambda: 12040)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(build, "nvrtc_version", lambda: (13, 0))
    build.check_driver_for_nvrtc.cache_clear()
    try:
        with pytest.raises(CupygemmToolchainError, match="NVRTC 13.0 builds CUDA 13 cubins.*CUDA 12.4"):
            build.check_driver_for_nvrtc(0)
        monkeypatch.setattr(build, "nvrtc_version", lambda: (12, 9))
        build.check_driver_for_nvrtc.cache_clear()
        build.check_driver_for_nvrtc(0)  # fine
    finally:
        build.check_driver_for_nvrtc.cache_clear()
