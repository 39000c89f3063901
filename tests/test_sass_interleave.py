"""The FFMA interleave pass: gating, exact bit changes, disassembly equivalence, golden NVRTC 12.8 behaviour."""

from __future__ import annotations

import math
import os
import sys

import pytest
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_helpers as H  # noqa: E402

import sass_tools  # noqa: E402
from sass_tools.elf import Cubin  # noqa: E402
from sass_tools.interleave import (NATIVE_MIN_YIELDS, find_ffma_runs, interleave_ffma,  # noqa: E402
                                   is_interleaved, kernel_already_interleaved)
from sass_tools.sass import decode, is_ffma  # noqa: E402

ALLOWED_HI_BITS = (1 << 45) | (0xF << 58)
RUN = 64  # FFMAs in the promotion loop of qgmma_promote (64 accumulators)


def _gemm_builds():
    return [b for b in H.builds_cuda12() + (H.builds_cuda13(required=False) or []) if b.source == "gemm"]


def _by_lb(builds, lb):
    return [b for b in builds if b.launch_threads == lb]


def _report(res, name):
    return next(k for k in res.kernels if k.name == name)


def _run_words(cubin: bytes, kernel: str = "qgmma_promote"):
    cb = Cubin.from_bytes(cubin)
    words = cb.instructions(kernel)
    runs = find_ffma_runs(words)
    assert len(runs) == 1 and runs[0][1] == RUN, runs
    s, n = runs[0]
    return [decode(*w) for w in words[s : s + n]]


def _pattern(run) -> str:
    return "".join("Y" if i.yield_ else ("r" if i.reuse else ".") for i in run)


def _assert_only_intended_bits(orig: bytes, patched: bytes):
    """Only hi bits 45 and 58-61 of FFMA words may differ; everything else byte-identical."""
    assert len(orig) == len(patched)
    a, b = Cubin.from_bytes(orig), Cubin.from_bytes(patched)
    text_ranges = []
    n_changed = 0
    for k in a.kernels:
        text_ranges.append((k.text_offset, k.text_offset + k.text_size))
        for (lo0, hi0), (lo1, hi1) in zip(a.instructions(k), b.instructions(k.name)):
            if (lo0, hi0) == (lo1, hi1):
                continue
            n_changed += 1
            assert is_ffma(lo0) and lo0 == lo1
            assert (hi0 ^ hi1) & ~ALLOWED_HI_BITS == 0, (k.name, hex(hi0), hex(hi1))
            after = decode(lo1, hi1)
            assert after.yield_ and after.reuse == 0  # yield set explicitly, all reuse cleared
            assert after.stall == decode(lo0, hi0).stall
    for i, (x, y) in enumerate(zip(orig, patched)):
        if x != y:
            assert any(s <= i < e for s, e in text_ranges), f"byte {i} outside .text changed"
    return n_changed


def test_pass_version():
    assert isinstance(sass_tools.PASS_VERSION, str) and sass_tools.PASS_VERSION


def test_gating_native_interleave_at_384():
    """NVRTC >= 12.9 with __launch_bounds__(384, 1): already interleaved -> is_interleaved True, nothing changes."""
    for b in _by_lb(_gemm_builds(), 384):
        assert b.version >= (12, 9), b.tag
        run = _run_words(b.cubin)
        yields = sum(i.yield_ for i in run)
        assert yields >= 16 and all(i.stall == 1 for i in run if i.yield_), (b.tag, _pattern(run))
        assert not any(i.yield_ and i.reuse for i in run)
        assert is_interleaved(b.cubin), b.tag
        res = interleave_ffma(b.cubin)
        assert res.cubin == b.cubin and res.changed == 0
        r = _report(res, "qgmma_promote")
        assert r.already_interleaved and r.skipped_reason and r.changed == 0
        assert (r.runs, r.ffmas_in_runs, r.yields_before) == (1, RUN, yields)


def test_pass_changes_128_kernel():
    for b in _by_lb(_gemm_builds(), 128):
        run = _run_words(b.cubin)
        assert sum(i.yield_ for i in run) == 0, b.tag  # no native interleave below 384 threads
        assert not is_interleaved(b.cubin)
        res = interleave_ffma(b.cubin)
        r = _report(res, "qgmma_promote")
        assert not r.already_interleaved and r.skipped_reason is None
        assert (r.runs, r.ffmas_in_runs) == (1, RUN)
        n = math.floor(RUN * 9 / 16)
        assert r.changed == n // 2 == r.yields_after  # Y r Y r ... over the first 36 FFMAs
        assert len(r.changed_offsets) == r.changed
        for name in ("tma_pipeline", "scalar_forms"):
            o = _report(res, name)
            assert o.runs == 0 and o.changed == 0 and o.skipped_reason
        assert _assert_only_intended_bits(b.cubin, res.cubin) == r.changed == res.changed
        after = _run_words(res.cubin)
        assert _pattern(after)[:n] == "Yr" * (n // 2)
        assert _pattern(after)[n:] == _pattern(run)[n:]  # the tail of the run is untouched
        # now recognised as interleaved; a second pass changes nothing
        assert is_interleaved(res.cubin)
        res2 = interleave_ffma(res.cubin)
        assert res2.cubin == res.cubin and _report(res2, "qgmma_promote").already_interleaved


def test_patched_disassembles_identically():
    """nvdisasm listings of original and patched cubins are identical once .reuse is stripped."""
    for b in _by_lb(_gemm_builds(), 128):
        res = interleave_ffma(b.cubin, fraction=1.0)
        d0, d1 = H.nvdisasm_cubin(b.cubin), H.nvdisasm_cubin(res.cubin)
        assert sorted(d0) == sorted(d1)
        n_reuse_dropped = 0
        for k in d0:
            assert len(d0[k]) == len(d1[k])
            for x, y in zip(d0[k], d1[k]):
                assert H.strip_reuse(x.text) == H.strip_reuse(y.text), (b.tag, k, hex(x.address))
                n_reuse_dropped += x.text.count(".reuse") - y.text.count(".reuse")
        assert n_reuse_dropped == _report(res, "qgmma_promote").changed
        H.cuobjdump(["-sass"], res.cubin)  # the patched cubin is still a valid cubin for cuobjdump


def test_fraction_parameter():
    b = _by_lb(_gemm_builds(), 128)[0]
    for frac, expect in ((1.0, RUN // 2), (0.5, 16), (0.25, 8), (9 / 16, 18), (0.0, 0)):
        res = interleave_ffma(b.cubin, fraction=frac)
        assert _report(res, "qgmma_promote").changed == expect, frac
        if expect == 0:
            assert res.cubin == b.cubin
    # the last FFMA of the run carries no reuse flag (nothing follows), so it is left alone
    assert _pattern(_run_words(interleave_ffma(b.cubin, fraction=1.0).cubin)) == "Yr" * 31 + "Y."
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            interleave_ffma(b.cubin, fraction=bad)
    with pytest.raises(ValueError):
        interleave_ffma(b"not a cubin")
    with pytest.raises(ValueError):
        is_interleaved(b"\x7fELF")


def test_explicit_set_and_clear():
    """An FFMA that already yields (with a stray reuse flag) stays yielded: set/clear, never XOR."""
    b = _by_lb(_gemm_builds(), 128)[0]
    cb = Cubin.from_bytes(b.cubin)
    words = cb.instructions("qgmma_promote")
    s, n = find_ffma_runs(words)[0]
    lo, hi = words[s]
    assert (hi >> 59) & 1 and (hi >> 45) & 1  # b-reuse, no yield
    cb.set_instruction("qgmma_promote", s, lo, hi & ~(1 << 45) | (1 << 60))  # yield + b/c reuse
    res = interleave_ffma(cb.to_bytes(), fraction=1.0)
    lo1, hi1 = Cubin.from_bytes(res.cubin).instructions("qgmma_promote")[s]
    assert lo1 == lo and not (hi1 >> 45) & 1 and (hi1 >> 58) & 0xF == 0
    assert hi1 == hi & ~(1 << 45) & ~(0xF << 58)


def test_force_on_native_cubin():
    for b in _by_lb(_gemm_builds(), 384):
        res = interleave_ffma(b.cubin, force=True)
        r = _report(res, "qgmma_promote")
        assert r.already_interleaved and r.skipped_reason is None
        _assert_only_intended_bits(b.cubin, res.cubin)


def test_no_ffma_runs_cubin():
    v = H.build_variants()
    assert is_interleaved(v.cubin)  # vacuously: no kernel has a long FFMA run
    res = interleave_ffma(v.cubin)
    assert res.cubin == v.cubin and res.kernels[0].runs == 0 and res.kernels[0].skipped_reason


def test_detection_threshold():
    b = _by_lb(_gemm_builds(), 128)[0]
    cb = Cubin.from_bytes(b.cubin)
    words = cb.instructions("qgmma_promote")
    runs = find_ffma_runs(words)
    assert not kernel_already_interleaved(words, runs)
    s, _ = runs[0]
    for j in range(NATIVE_MIN_YIELDS):  # yielded stall-1 FFMAs inside the run = compiler pattern
        lo, hi = words[s + 2 * j]
        ins = decode(lo, hi)
        ins.yield_, ins.reuse, ins.stall = True, 0, 1
        words[s + 2 * j] = ins.encode()
    assert kernel_already_interleaved(words, runs)


DATA = Path(__file__).resolve().parent / "data"


def test_golden_nvrtc_12_8():
    """NVRTC 12.8 emits no yields in the promotion run even at 384 threads; the pass adds them.

    Uses a live NVRTC 12.8 when one is installed (nvidia-cuda-nvrtc-cu12==12.8.93 via CUPYGEMM_NVRTC_DIRS), else
    the cubins it built from the same test source (tests/data/nvrtc128_lb*.cubin, make_nvrtc128_fixtures.py).
    """
    b128 = H.builds_cuda128() or [
        H.Build(f"fixture-nvrtc12.8-lb{lb}", (12, 8), lb, (DATA / f"nvrtc128_lb{lb}.cubin").read_bytes(), "gemm")
        for lb in (128, 384)
    ]
    native = {b.launch_threads: b for b in H.builds_cuda12() if b.version >= (12, 9)}
    for b in b128:
        run = _run_words(b.cubin)
        assert sum(i.yield_ for i in run) == 0, b.tag
        assert not is_interleaved(b.cubin)
        assert _report(interleave_ffma(b.cubin), "qgmma_promote").yields_after == 18
        full = interleave_ffma(b.cubin, fraction=1.0)
        assert _report(full, "qgmma_promote").yields_after == 32
        _assert_only_intended_bits(b.cubin, full.cubin)
        if b.launch_threads == 384 and 384 in native:
            # 12.8 vs >= 12.9 at 384 threads: same code, only FFMA hi words differ by the yield/reuse masks
            c8, c9 = Cubin.from_bytes(b.cubin), Cubin.from_bytes(native[384].cubin)
            for k in c8.kernels:
                w8, w9 = c8.instructions(k), c9.instructions(k.name)
                assert len(w8) == len(w9)
                for (lo8, hi8), (lo9, hi9) in zip(w8, w9):
                    assert lo8 == lo9
                    if hi8 != hi9:
                        assert is_ffma(lo8) and (hi8 ^ hi9) in (0x0800200000000000, 0x0000200000000000)
            # both end with 32 yields in the run; the compiler starts the pattern one FFMA later (r Y r Y ...)
            assert _pattern(_run_words(native[384].cubin)).startswith("rY")
            assert _pattern(_run_words(full.cubin)).startswith("Yr")
