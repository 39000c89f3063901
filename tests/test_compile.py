"""NVRTC builds of the real kernel configs to sm_90a cubins, checked in their SASS (no GPU needed)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cupygemm import config as C
from cupygemm import contract
from cupygemm.errors import CupygemmCompileError
from cupygemm.jit.compiler import compile_cubin, nvrtc_version
from cupygemm.jit.source import render
from cupygemm.kernels import compile_gemm, gemm_source
from seed_shapes import CONTIGUOUS, MASKED, NORMAL


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        import nvidia

        for root in nvidia.__path__:
            for cand in Path(root).glob(f"*/bin/{name}"):
                path = str(cand)
    if path is None:
        pytest.fail(f"{name} not found: install the test extra (pip install -e '.[test]')")
    return path


def _sass(cubin: bytes, tmp_path: Path) -> tuple[str, str]:
    f = tmp_path / "k.cubin"
    f.write_bytes(cubin)
    cuobjdump = _tool("cuobjdump")
    env = {"PATH": str(Path(_tool("nvdisasm")).parent) + ":/usr/bin:/bin"}
    sass = subprocess.run([cuobjdump, "-sass", str(f)], capture_output=True, text=True, env=env, check=True).stdout
    res = subprocess.run([cuobjdump, "-res-usage", str(f)], capture_output=True, text=True, env=env, check=True).stdout
    return sass, res


def test_nvrtc_is_present():
    # A missing NVRTC must fail CI, not skip it.
    assert nvrtc_version() >= (12, 3)


def _seed_configs():
    out = []
    for m, n, k in NORMAL:
        out.append(C.choose_config(C.KIND_NORMAL, m, n, k, 1, 132))
    for g, m, n, k in CONTIGUOUS:
        out.append(C.choose_config(C.KIND_CONTIGUOUS, g * m, n, k, g, 132))
    for g, m, n, k in MASKED:
        out.append(C.choose_config(C.KIND_MASKED, m, n, k, g, 132))
    return list(dict.fromkeys(out))


@pytest.mark.parametrize("cfg", _seed_configs(), ids=lambda c: c.describe().split(":")[0] + f" {c.block_m}x{c.block_n}")
def test_seed_config_sass(cfg, tmp_path):
    cubin = compile_gemm(cfg)
    assert cubin[:4] == b"\x7fELF"
    sass, res = _sass(cubin, tmp_path)
    assert "QGMMA" in sass, "FP8 wgmma missing"
    assert "UTMALDG" in sass, "TMA loads missing"
    assert "SYNCS" in sass, "mbarrier ops missing"
    assert "USETMAXREG" in sass or cfg.num_math_wg == 1
    assert not re.search(r"\b(LDL|STL)\b", sass), "local-memory traffic (register spills)"
    m = re.search(r"LOCAL:(\d+)", res)
    assert m and int(m.group(1)) == 0


def test_wgmma_shape_in_sass_matches_config(tmp_path):
    cfg = C.make_config(C.KIND_NORMAL, 4096, 1024, 128, 112, 132)
    sass, _ = _sass(compile_gemm(cfg), tmp_path)
    assert "QGMMA.64x112x32.F32.E4M3.E4M3" in sass


def test_split_n_and_block_m_256_compile(tmp_path):
    for cfg in (C.make_config(C.KIND_NORMAL, 4096, 512, 64, 256, 132),
                C.make_config(C.KIND_NORMAL, 4096, 512, 256, 64, 132)):
        sass, res = _sass(compile_gemm(cfg), tmp_path)
        assert "QGMMA" in sass and not re.search(r"\b(LDL|STL)\b", sass)


@pytest.mark.parametrize("bm,bn,ks,interleave", [(64, 128, 8, False), (64, 128, 4, True), (128, 128, 4, False),
                                         (256, 128, 2, False)])
def test_split_k_compile(bm, bn, ks, interleave, tmp_path):
    """Split-K across CTAs: the partial-sum pass adds no spills; one acquire-release arrival per tile."""
    cfg = C.make_config(C.KIND_NORMAL, 2112, 7168, bm, bn, 132, split_k=ks, interleave_k=interleave,
                        serial_m=bm == 256)
    assert contract.defines(cfg)["CUPYGEMM_SPLIT_K"] == ks
    sass, res = _sass(compile_gemm(cfg), tmp_path)
    assert "QGMMA" in sass and not re.search(r"\b(LDL|STL)\b", sass)
    assert len(re.findall(r"ATOMG\.E\.ADD\.STRONG\.GPU", sass)) == 1
    assert "MEMBAR.ALL.GPU" in sass  # the arrival's release/acquire fence
    # partial sums leave register by register (benchmarks/NOTES.md, "Stream-K tail")
    assert not re.search(r"STG\.E\.128\.STRONG", sass)


@pytest.mark.parametrize("kind,bm,bn,mc", [(C.KIND_MASKED, 128, 160, 1), (C.KIND_MASKED, 128, 128, 0),
                                          (C.KIND_MASKED, 256, 128, 1), (C.KIND_NORMAL, 128, 128, 2),
                                          (C.KIND_NORMAL, 64, 128, 0)])
def test_stream_k_compile(kind, bm, bn, mc, tmp_path):
    """Stream-K tail kernels: the tail pieces run one more, not unrolled, copy of the K loop (4 wgmmas per m64
    sub-tile); nothing spills; the K loop keeps its wgmma descriptors in uniform registers (a few more R2UR moves than
    without the tail, not one or more per wgmma); the pieces' partial sums leave register by register (4-byte .cg
    stores): 16-byte vector stores pinned the accumulators to register quads, which slowed the kernel's whole tiles by
    2-3 % (benchmarks/NOTES.md, "Stream-K tail")."""
    cfg = C.make_config(kind, 4096, 7168, bm, bn, 132, multicast=mc, stream_k=True, serial_m=bm == 256)
    base = C.make_config(kind, 4096, 7168, bm, bn, 132, multicast=mc, serial_m=bm == 256)
    sass, _ = _sass(compile_gemm(cfg), tmp_path)
    base_sass, _ = _sass(compile_gemm(base), tmp_path)
    qgmma, base_qgmma = len(re.findall(r"QGMMA\.", sass)), len(re.findall(r"QGMMA\.", base_sass))
    assert qgmma == base_qgmma + 4
    assert not re.search(r"\b(LDL|STL)\b", sass)
    assert sass.count("R2UR") <= base_sass.count("R2UR") + 12
    assert not re.search(r"STG\.E\.128\.STRONG", sass)
    assert len(re.findall(r"STG\.E\.STRONG\.GPU", sass)) >= bm * bn // (128 * cfg.num_math_wg)  # one per partial sum


@pytest.mark.parametrize("bm,bn,mc,sk", [(256, 128, 1, True), (128, 160, 1, False), (64, 168, 0, False)])
def test_masked_partial_rows_leave_staged(bm, bn, mc, sk, tmp_path):
    """Masked tiles reaching past masked_m store their valid rows from the staged (swizzled) output tile in 16-byte
    pieces (LDS.128 -> STG.E.128), not 4-byte stores straight from the accumulators (benchmarks/NOTES.md, "Masked
    GEMMs"); full tiles keep their TMA stores."""
    cfg = C.make_config(C.KIND_MASKED, 4096, 7168, bm, bn, 132, multicast=mc, stream_k=sk, serial_m=bm == 256,
                        interleave_k=bm == 64)
    sass, _ = _sass(compile_gemm(cfg), tmp_path)
    assert "LDS.128" in sass and re.search(r"STG\.E\.128 ", sass) and "UTMASTG" in sass
    assert not re.search(r"STG\.E ", sass)


def test_compile_error_carries_log_and_config():
    cfg = C.make_config(C.KIND_NORMAL, 4096, 1024, 128, 128, 132)
    src = gemm_source(cfg)
    broken = type(src)(src.name, src.text + "\nthis is not C++;\n", src.headers, src.entry)
    with pytest.raises(CupygemmCompileError) as info:
        compile_cubin(broken, config=cfg)
    assert "error" in info.value.log
    assert info.value.config is cfg


def test_render_inlines_every_header():
    src = render("fp8_gemm.cu", "cupygemm_fp8_gemm", {"X": 1})
    assert src.text.startswith("#define X 1\n")
    assert {"ptx_common.cuh", "ptx_global.cuh", "ptx_mbarrier.cuh", "ptx_tma.cuh", "ptx_wgmma.cuh",
            "ptx_wgmma_fp8.cuh", "named_barriers.cuh", "kernel_traits.cuh", "scheduler.cuh", "producer.cuh",
            "mainloop.cuh", "reduction.cuh", "epilogue.cuh"} <= set(src.headers)


@pytest.mark.parametrize("bm,bn,fields,unroll", [(64, 128, {}, 4), (128, 128, {}, 4), (256, 128, {"serial_m": True}, 4),
                                                (128, 128, {"split_k": 2}, 1), (192, 128, {}, 4),
                                                (192, 128, {"multicast": 1}, 4), (64, 184, {}, 1)])
def test_k_loop_unroll(bm, bn, fields, unroll, tmp_path):
    """Whole tiles unroll the K loop 4x (benchmarks/NOTES.md, "K-loop unrolling"); split-K kernels keep one block per
    iteration, and so do one-warpgroup tiles that select B scales per column at run time (184 wide: unrolled, they
    spilled). Counted in wgmmas: 4 per m64 sub-tile and K block of 128, plus a one-block loop over the first sub-tile
    for tiles whose second sub-tile lies past the last row."""
    cfg = C.make_config(C.KIND_NORMAL, 2048, 7168, bm, bn, 132, **fields)
    sass, _ = _sass(compile_gemm(cfg), tmp_path)
    subtiles_per_wg = 2 if bm == 256 else 1
    partial_loop = 4 if subtiles_per_wg > 1 else 0
    assert len(re.findall(rf"QGMMA\.64x{bn}x32", sass)) == 4 * subtiles_per_wg * unroll + partial_loop
    assert not re.search(r"\b(LDL|STL)\b", sass)


def test_interleave_k_widest_tile_compiles_without_spills(tmp_path):
    """Interleaved-K tiles stop at 176 columns (64x184 spilled under NVRTC 12.9 and 13.5, benchmarks/NOTES.md,
    "Interleaved K"): asking for 184 is refused; 176, which selects B scales per column at run time too, compiles
    without spills."""
    with pytest.raises(ValueError, match="block_n <= 176"):
        C.make_config(C.KIND_NORMAL, 2048, 7168, 64, 184, 132, interleave_k=True)
    for kind in (C.KIND_NORMAL, C.KIND_MASKED):
        cfg = C.make_config(kind, 2048, 7168, 64, 176, 132, interleave_k=True)
        assert cfg.interleave_k
        sass, _ = _sass(compile_gemm(cfg), tmp_path)
        assert not re.search(r"\b(LDL|STL)\b", sass)


def test_interleave_k_loop_unrolled(tmp_path):
    """Interleaved K over two warpgroups: each takes every other K block in a loop of its own, unrolled 4x, with a remainder
    (its trip count depends on the warpgroup), so more than one block's wgmmas appear and nothing spills."""
    cfg = C.make_config(C.KIND_NORMAL, 2048, 7168, 64, 128, 132, interleave_k=True)
    sass, _ = _sass(compile_gemm(cfg), tmp_path)
    assert len(re.findall(r"QGMMA\.64x128x32", sass)) >= 4 * 4
    assert not re.search(r"\b(LDL|STL)\b", sass)


def test_three_warpgroup_kernel_registers(tmp_path):
    """192-row tiles: 512 threads, the producer hands registers down to 24 and the three math warpgroups take 160."""
    cfg = C.make_config(C.KIND_NORMAL, 32768, 512, 192, 128, 132, multicast=1)
    sass, _ = _sass(compile_gemm(cfg), tmp_path)
    assert (cfg.producer_regs, cfg.math_regs) == (24, 160)
    assert f"USETMAXREG.DEALLOC.CTAPOOL {cfg.producer_regs:#x}" in sass
    assert re.search(rf"USETMAXREG.TRY_ALLOC.CTAPOOL \w+, {cfg.math_regs:#x}", sass)
    assert not re.search(r"\b(LDL|STL)\b", sass)


def test_pdl_variant_waits_and_releases(tmp_path):
    """CUPYGEMM_PDL's kernel variant waits for the previous grid (ACQBULK) and releases the next one (PREEXIT);
    the default variant has neither, and its source is the one without the PDL define (so its cache entries and
    code stay what was measured)."""
    cfg = C.choose_config(C.KIND_NORMAL, 64, 2112, 7168, 1, 132)
    ops = {}
    for pdl in (False, True):
        sass, _ = _sass(compile_gemm(cfg, pdl), tmp_path)
        ops[pdl] = re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass, re.M)
    assert "ACQBULK" in ops[True] and "PREEXIT" in ops[True]
    assert "ACQBULK" not in ops[False] and "PREEXIT" not in ops[False]
    assert "CUPYGEMM_PDL" not in gemm_source(cfg, False).text.split("#include")[0]


def test_b_prefetch_is_issued_before_the_wait(tmp_path):
    """Weights before the wait (cuda_src/b_prefetch.cuh): the prefetch variant fetches packed B into L2 as byte runs
    before griddepcontrol.wait (ACQBULK); the PDL kernel without it fetches nothing."""
    cfg = C.side_aware_config(C.choose_config(C.KIND_NORMAL, 64, 2112, 7168, 1, 132), 132, 232448)
    fetch = "UBLKPF"
    for b_prefetch in (0, 8 << 20):
        sass, _ = _sass(compile_gemm(cfg, True, b_prefetch), tmp_path)
        ops = re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass, re.M)
        assert not re.search(r"\b(LDL|STL)\b", sass)
        if not b_prefetch:
            assert not any(op.startswith(("UBLKPF", "UTMAPF")) for op in ops)
            continue
        first_fetch = next(i for i, op in enumerate(ops) if op.startswith(fetch))
        assert first_fetch < ops.index("ACQBULK")



def test_side_ticket_drawn_before_the_wait_where_the_host_says_so(tmp_path):
    """A side-aware PDL kernel draws its ticket (an atomic add) before griddepcontrol.wait (ACQBULK) when its
    tickets are its stream's own set (``side_tickets_before_wait``), after it otherwise: both draws are in the code,
    and nothing spills."""
    cfg = C.side_aware_config(C.choose_config(C.KIND_NORMAL, 64, 2112, 7168, 1, 132), 132, 232448)
    sass, _ = _sass(compile_gemm(cfg, True), tmp_path)
    ops = re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass, re.M)
    wait = ops.index("ACQBULK")
    draws = [i for i, op in enumerate(ops) if op.startswith("ATOMG") and ".ADD" in op]
    assert any(i < wait for i in draws) and any(i > wait for i in draws), (wait, draws)
    assert not re.search(r"\b(LDL|STL)\b", sass)


def test_b_prefetch_only_for_packed_weights_under_pdl_at_decode_rows(monkeypatch):
    """Plain B may be the previous kernel's output, so only packed weights prefetch; and only where it measured
    faster (M = 64)."""
    from cupygemm import plan

    monkeypatch.delenv("CUPYGEMM_B_PREFETCH_KIB", raising=False)
    assert plan.b_prefetch(True, True, 64) == 8 << 20
    assert plan.b_prefetch(True, False, 64) == plan.b_prefetch(False, True, 64) == plan.b_prefetch(True, True, 128) == 0
    monkeypatch.setenv("CUPYGEMM_B_PREFETCH_KIB", "0")
    assert plan.b_prefetch(True, True, 64) == 0
