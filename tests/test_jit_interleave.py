"""The JIT's SASS post-processing: CUPYGEMM_FFMA_INTERLEAVE=on patches only FFMA control bits; auto follows NVRTC."""
from __future__ import annotations


from cupygemm import config as C
from cupygemm.jit import cache
from cupygemm.jit.compiler import nvrtc_version
from cupygemm.kernels import compile_gemm
from sass_tools.elf import Cubin
from sass_tools.sass import is_ffma

# One math warpgroup (256 threads): NVRTC >= 12.9 does not interleave kernels under 384 threads itself.
CFG = C.make_config(C.KIND_NORMAL, 2048, 1024, 64, 128, 132)


def build(monkeypatch, tmp_path, mode):
    monkeypatch.setenv("CUPYGEMM_CACHE_DIR", str(tmp_path / mode))
    monkeypatch.setenv("CUPYGEMM_FFMA_INTERLEAVE", mode)
    cache.clear_memory()
    try:
        return compile_gemm(CFG)
    finally:
        cache.clear_memory()


def test_on_changes_only_ffma_yield_and_reuse_bits(monkeypatch, tmp_path):
    off = build(monkeypatch, tmp_path, "off")
    on = build(monkeypatch, tmp_path, "on")
    assert len(on) == len(off) and on != off
    a, b = Cubin.from_bytes(off), Cubin.from_bytes(on)
    changed = 0
    for ka, kb in zip(a.kernels, b.kernels):
        for (lo0, hi0), (lo1, hi1) in zip(a.instructions(ka), b.instructions(kb)):
            if (lo0, hi0) == (lo1, hi1):
                continue
            changed += 1
            assert lo0 == lo1 and is_ffma(lo0)
            assert (hi0 ^ hi1) & ~((1 << 45) | (0xF << 58)) == 0
    assert changed >= 8


def test_auto_matches_the_compiler_version(monkeypatch, tmp_path):
    auto = build(monkeypatch, tmp_path, "auto")
    off = build(monkeypatch, tmp_path, "off")
    if nvrtc_version() > (12, 8):
        assert auto == off  # NVRTC >= 12.9 interleaves itself: the pass stays out
    else:
        assert auto != off
