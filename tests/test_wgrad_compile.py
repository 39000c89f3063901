"""The wgrad kernels (cuda_src/fp8_wgrad.cu, k_grouped_prep.cu) built by NVRTC to sm_90a cubins and checked in their
SASS, and their host contract (cupygemm/contract_wgrad.py) checked against the kernel source; no GPU needed."""
from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path

import pytest

from cupygemm import contract_wgrad as cw
from cupygemm.jit.compiler import BASE_OPTIONS, compile_cubin
from cupygemm.jit.source import KernelSource, cuda_src_dir, included_headers
from cupygemm.launch import DESC, PTR, U32
from wgrad_harness import compile_prep, compile_wgrad, prep_source, wgrad_source
from sass_helpers import require_tool, tool_env
from sass_tools.elf import Cubin

DEEPGEMM_WGRAD = [(7168, 2112), (1536, 24576), (512, 32768), (16384, 7168), (7168, 4096), (2048, 7168)]
DEEPGEMM_K_GROUPED = [(7168, 4096), (2048, 7168)]
_SIZES = {DESC: 128, PTR: 8, U32: 4}


def sass_of(cubin: bytes, tmp_path: Path) -> str:
    f = tmp_path / "k.cubin"
    f.write_bytes(cubin)
    return subprocess.run([require_tool("cuobjdump"), "-sass", str(f)], capture_output=True, text=True,
                          env=tool_env(), check=True).stdout


def max_register(sass: str) -> int:
    """Registers the code uses: the highest Rn plus one (the cubin's count is the launch-bound cap with setmaxnreg)."""
    return max(int(r) for r in re.findall(r"\bR(\d+)\b", sass)) + 1


def kparams(cubin: bytes, entry: str) -> list[tuple[int, int, int]]:
    """(ordinal, offset, size) of the kernel's parameters as the cubin records them (EIATTR_KPARAM_INFO)."""
    out = []
    for a in Cubin.from_bytes(cubin).kernel(entry).attributes:
        if a.name == "EIATTR_KPARAM_INFO":
            _, ordinal, offset, flags = struct.unpack("<IHHI", a.payload)
            out.append((ordinal, offset, (flags >> 18) & 0x3FFF))
    return sorted(out)


def make(kind, bm, bn, stages=None, **kw):
    m, k = (0, 4096) if kind == cw.KIND_WGRAD else (7168, 0)
    n = kw.pop("n", 7168)
    sw = kw.pop("swizzle", cw.staging_swizzle(bn))
    slabs = kw.pop("staged_slabs", 0)
    if stages is None:
        stages = min(8, cw.max_stages(bm, bn, sw, slabs or bn // cw.slab_cols(bn, sw)))
    return cw.WgradConfig(kind, m, n, k, bm, bn, stages, swizzle=sw, staged_slabs=slabs, **kw)


REPRESENTATIVE = {
    "dense-128x128": make(cw.KIND_WGRAD, 128, 128),
    "dense-128x144": make(cw.KIND_WGRAD, 128, 144),
    "dense-128x152": make(cw.KIND_WGRAD, 128, 152, n=2112),  # unswizzled staging: one reduce per warpgroup
    "dense-128x152-32B": make(cw.KIND_WGRAD, 128, 152, swizzle=32, n=2112),
    "dense-128x96-2acc": make(cw.KIND_WGRAD, 128, 96, two_acc_sets=True),
    "dense-128x128-mcA": make(cw.KIND_WGRAD, 128, 128, multicast=1),
    "dense-128x128-mcB": make(cw.KIND_WGRAD, 128, 128, multicast=2),
    "dense-128x128-2slabs": make(cw.KIND_WGRAD, 128, 128, staged_slabs=2),
    "dense-128x112-1slab": make(cw.KIND_WGRAD, 128, 112, staged_slabs=1),
    "dense-64x128-2acc": make(cw.KIND_WGRAD, 64, 128, two_acc_sets=True),
    "dense-64x160": make(cw.KIND_WGRAD, 64, 160),
    "dense-64x48-32B": make(cw.KIND_WGRAD, 64, 48, swizzle=32, n=2112),
    "dense-128x128-store": make(cw.KIND_WGRAD, 128, 128, store=True),
    "dense-128x128-mcB-store": make(cw.KIND_WGRAD, 128, 128, multicast=2, store=True),
    "kgrouped-128x128": make(cw.KIND_K_GROUPED, 128, 128, n=4096),
    "kgrouped-128x144": make(cw.KIND_K_GROUPED, 128, 144, n=4096),
    "kgrouped-128x128-mcA": make(cw.KIND_K_GROUPED, 128, 128, n=4096, multicast=1),
    "kgrouped-128x144-mcB": make(cw.KIND_K_GROUPED, 128, 144, n=4096, multicast=2),
    "kgrouped-128x152-mcB-whole": make(cw.KIND_K_GROUPED, 128, 152, n=4096, multicast=2, b_whole=True),
    "kgrouped-128x152-mcB-whole-dprefetch": make(cw.KIND_K_GROUPED, 128, 152, n=4096, multicast=2, b_whole=True,
                                                 d_prefetch=2),
    "dense-64x128-2acc-dprefetch": make(cw.KIND_WGRAD, 64, 128, two_acc_sets=True, d_prefetch=3),
    "kgrouped-128x96-2acc": make(cw.KIND_K_GROUPED, 128, 96, two_acc_sets=True),
    "kgrouped-64x128-2acc": make(cw.KIND_K_GROUPED, 64, 128, two_acc_sets=True),
    "kgrouped-64x160": make(cw.KIND_K_GROUPED, 64, 160),
}


def chosen_configs() -> list[cw.WgradConfig]:
    out = []
    for k in (4096, 8192):
        out += [cw.choose_wgrad_config(cw.KIND_WGRAD, m, n, k, 1, 132) for m, n in DEEPGEMM_WGRAD]
    for g, k in ((4, 4096), (4, 8192), (8, 4096)):
        out += [cw.choose_wgrad_config(cw.KIND_K_GROUPED, m, n, k, g, 132) for m, n in DEEPGEMM_K_GROUPED]
    return list(dict.fromkeys(out))


def check_kernel_sass(cfg: cw.WgradConfig, sass: str) -> None:
    qgmma = re.findall(r"QGMMA\.64x(\d+)x32\.F32\.E4M3\.E4M3", sass)
    assert qgmma and set(qgmma) == {str(cfg.block_n)}, "FP8 wgmma of the tile's width"
    assert not re.search(r"\b(LDL|STL)\b", sass), "local-memory traffic (register spills)"
    # One TMA reduce-add per slab (rounds unrolled), or one store per slab for the storing kernel.
    reduces, stores = len(re.findall(r"UTMAREDG\.3D\.ADD", sass)), len(re.findall(r"UTMASTG\.3D", sass))
    assert (reduces, stores) == ((0, cfg.num_slabs) if cfg.store else (cfg.num_slabs, 0))
    assert "UTMALDG.3D" in sass and "SYNCS.PHASECHK" in sass
    # D prefetch: one L2 prefetch per slab and math warpgroup (unrolled), none without it.
    assert len(re.findall(r"UTMAPF\.L2\.3D", sass)) == (cfg.num_slabs * cfg.num_math_wg if cfg.d_prefetch else 0)
    if cfg.num_math_wg == 2:
        assert f"USETMAXREG.DEALLOC.CTAPOOL {cfg.producer_regs:#x}" in sass
        assert re.search(rf"USETMAXREG.TRY_ALLOC.CTAPOOL \w+, {cfg.math_regs:#x}", sass)
    assert max_register(sass) <= cfg.math_regs
    if cfg.multicast:
        assert "UTMALDG.3D.MULTICAST" in sass
    # The k-grouped producer acquires a group's two maps (UTMACCTL.IV drops them from the descriptor cache) before
    # loading through them; dense kernels read only their launch's maps.
    assert sass.count("UTMACCTL.IV") == (2 if cfg.kind == cw.KIND_K_GROUPED else 0)


@pytest.mark.parametrize("name", sorted(REPRESENTATIVE))
def test_representative_configs_compile_without_spills(name, tmp_path):
    cfg = REPRESENTATIVE[name]
    cubin = compile_wgrad(cfg)
    assert cubin[:4] == b"\x7fELF"
    check_kernel_sass(cfg, sass_of(cubin, tmp_path))


@pytest.mark.parametrize("cfg", chosen_configs(), ids=lambda c: c.describe())
def test_chosen_configs_compile_without_spills(cfg, tmp_path):
    assert cfg.smem_bytes + cw.STATIC_SMEM <= cw.SMEM_LIMIT
    check_kernel_sass(cfg, sass_of(compile_wgrad(cfg), tmp_path))


def test_dense_k_loop_is_unrolled_and_promotes_with_fmul_and_ffma(tmp_path):
    """Dense tiles run the K loop over compile-time bounds unrolled 4x (4 wgmmas per K block); each sum costs one
    FMUL (the two scales' product, which ptxas computes while the wgmmas run) and one FFMA per K block."""
    cfg = REPRESENTATIVE["dense-128x128"]
    sass = sass_of(compile_wgrad(cfg), tmp_path)
    assert len(re.findall(r"QGMMA\.64x128x32", sass)) == 4 * 4
    assert len(re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+FMUL ", sass, re.M)) == 4 * cfg.block_n // 2
    assert len(re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+FFMA ", sass, re.M)) == 4 * cfg.block_n // 2
    assert len(re.findall(r"LDS\.64", sass)) == 4 * cfg.block_n // 8  # B scales: one float2 per 8 columns


def test_k_grouped_k_loop_runs_in_chunks_from_stage_zero(tmp_path):
    """K-grouped 128-row tiles of up to 4 stages run their K loop as a block before the first stage-0 one, chunks of
    kNumStages blocks (each stage a compile-time constant) and a block after: 4 + 4 x stages + 4 wgmmas. Other
    k-grouped tiles (here 64 rows on 6 stages) keep the loop unrolled twice with a remainder: 3 x 4."""
    aligned = REPRESENTATIVE["kgrouped-128x128"]
    assert aligned.num_stages == 4
    sass = sass_of(compile_wgrad(aligned), tmp_path)
    assert len(re.findall(r"QGMMA\.64x128x32", sass)) == 4 + 4 * aligned.num_stages + 4
    unrolled = REPRESENTATIVE["kgrouped-64x160"]
    assert unrolled.num_stages > 4
    sass = sass_of(compile_wgrad(unrolled), tmp_path)
    assert len(re.findall(r"QGMMA\.64x160x32", sass)) == 3 * 4


def test_prep_kernel_sass(tmp_path):
    """The prep kernel edits shared-memory copies of the maps (the row stride goes in shifted right by 4: ptxas takes
    bytes) and copies them out with the tensormap proxy's release: 4-byte strong GPU-scope stores, one per lane."""
    sass = sass_of(compile_prep(), tmp_path)
    assert not re.search(r"\b(LDL|STL)\b", sass)
    assert len(re.findall(r"SHF\.R\.U64 R\d+, R\d+, 0x4, R", sass)) == 4  # two strides of two maps
    assert len(re.findall(r"ATOMG\.E\.EXCH\.STRONG\.GPU", sass)) == 2  # A's map, B's map


def test_kernels_compile_with_every_installed_nvrtc():
    """The PTX they use (tensormap.replace / cp_fenceproxy / fence.proxy.tensormap, cp.reduce.async.bulk.tensor)
    compiles with each NVRTC found (12.9 and 13.5 here), without spills."""
    from sass_tools.nvrtc import compile_ctypes, find_nvrtc_libs

    libs = find_nvrtc_libs()
    if not libs:
        pytest.skip("no libnvrtc found by sass_tools.nvrtc")
    srcs = [wgrad_source(REPRESENTATIVE["dense-128x128-mcA"]), wgrad_source(REPRESENTATIVE["kgrouped-64x128-2acc"]),
            prep_source()]
    opts = list(BASE_OPTIONS) + [f"-I{cuda_src_dir()}"]
    for lib in libs:
        version, cubins = compile_ctypes(lib.path, [(s.text, opts) for s in srcs])
        for src, cubin in zip(srcs, cubins):
            kernel = Cubin.from_bytes(cubin).kernel(src.entry)
            assert kernel.frame_size in (0, None), (version, src.entry, kernel.frame_size)


def test_gemm_parameters_match_the_cubin():
    """cupygemm_fp8_wgrad's parameters, as NVRTC lays them out, are WGRAD_PARAMS in order (the driver's
    cuFuncGetParamInfo, which the packed launcher reads, reports the same layout)."""
    cubin = compile_wgrad(REPRESENTATIVE["dense-128x128"])
    params = kparams(cubin, cw.WGRAD_ENTRY)
    assert [p[0] for p in params] == list(range(len(cw.WGRAD_PARAMS)))
    assert [p[2] for p in params] == [_SIZES[k] for k in cw.WGRAD_PARAMS]
    assert all(b[1] >= a[1] + a[2] for a, b in zip(params, params[1:]))
    src = (cuda_src_dir() / cw.WGRAD_FILE).read_text()
    sig = re.search(rf"\b{cw.WGRAD_ENTRY}\s*\(([^)]*)\)", src).group(1)
    names = [p.split()[-1].lstrip("*") for p in sig.split(",")]
    assert tuple(names) == cw.WGRAD_PARAM_NAMES


def test_prep_parameters_match_the_cubin():
    params = kparams(compile_prep(), cw.PREP_ENTRY)
    assert [p[2] for p in params] == [_SIZES[k] for k in cw.PREP_PARAMS]
    src = (cuda_src_dir() / cw.PREP_FILE).read_text()
    sig = re.search(rf"\b{cw.PREP_ENTRY}\s*\(([^)]*)\)", src).group(1)
    names = [p.split()[-1].lstrip("*") for p in sig.split(",")]
    assert tuple(names) == cw.PREP_PARAM_NAMES


def _probe(asserts: list[str]) -> None:
    """Compiles static_asserts over the kernel's constants (fails to compile when the host disagrees)."""
    text = '#include "wgrad_traits.cuh"\n#include "k_grouped_workspace.cuh"\n#include "k_grouped_prep.cu"\n' + \
        "\n".join(asserts) + "\n"
    headers = {**included_headers(cw.WGRAD_FILE), **included_headers(cw.PREP_FILE),
               cw.PREP_FILE: (cuda_src_dir() / cw.PREP_FILE).read_text()}
    compile_cubin(KernelSource("probe.cu", text, headers, "none"))


def test_smem_layout_and_workspace_match_the_kernel():
    """smem_bytes and the tx bytes the kernel expects, and the workspace layout and prep grid, as the kernel's own
    constants compute them (static_asserts compiled with the host's numbers)."""
    asserts = []
    for name, cfg in REPRESENTATIVE.items():
        d = cw.defines(cfg)
        t = ("cupygemm::WgradTraits<{WGRAD_KIND}, {SHAPE_M}, {SHAPE_N}, {SHAPE_K}, {BLOCK_M}, {BLOCK_N}, {NUM_STAGES}, "
             "{NUM_MATH_WG}, {MATH_REGS}, {PRODUCER_REGS}, {SWIZZLE_D}, {STAGED_SLABS}, {RASTER_N}, {MULTICAST}, "
             "{TWO_ACC_SETS}, {PINGPONG}, {WGRAD_STORE}, {B_WHOLE}>").format(
                 **({"PINGPONG": 0, "WGRAD_STORE": 0, "B_WHOLE": 0} |
                    {k[len("CUPYGEMM_"):]: v for k, v in d.items()}))
        layout = (f"{t}::SMEM_D + {t}::kNumStages * ({t}::SMEM_A + {t}::SMEM_B + {t}::SMEM_SFA + {t}::SMEM_SFB) + "
                  f"{t}::kNumStages * 16")
        asserts.append(f'static_assert({layout} == {cfg.smem_bytes}, "{name}: smem_bytes");')
    for g in (1, 7, 8, 9, 256, 1000):
        asserts.append(f'static_assert(cupygemm::KGroupedWorkspace::bytes({g}) == {cw.workspace_bytes(g)}, "ws");')
        lay = cw.workspace_layout(g)
        assert lay["active"][0] + lay["active"][1] <= cw.workspace_bytes(g)
    asserts.append(f'static_assert(cupygemm::kPrepThreads == {cw.PREP_THREADS}, "prep threads");')
    asserts.append(f'static_assert(cupygemm::kGroupsPerCta == {cw.PREP_GROUPS_PER_CTA}, "prep groups per CTA");')
    _probe(asserts)


def test_contract_values():
    cfg = REPRESENTATIVE["dense-128x128"]
    assert (cfg.num_math_wg, cfg.threads, cfg.math_regs, cfg.producer_regs) == (2, 384, 232, 40)
    assert cfg.producer_regs * 128 + cfg.math_regs * 256 <= 64 * 1024
    # 64 KB of FP32 staging (the whole 128x128 tile) leaves 4 stages of 33 KB.
    assert cw.staging_bytes(128, 128, 128, 4) == 64 * 1024 and cfg.num_stages == 4
    assert cfg.smem_bytes + cw.STATIC_SMEM <= cw.SMEM_LIMIT
    a, b, sfa, sfb, d = cw.tma_specs(cfg, 1000, ld_d=4100)
    assert a.dims == (4096, 1000, 1) and a.box == (128, 128, 1) and a.swizzle == 128
    assert b.dims == (4096, 7168, 1) and b.box == (128, 128, 1)
    assert sfa.dims == (1000, 32, 1) and sfa.strides[0] == 4 * 1000 and sfa.box == (128, 1, 1)
    assert sfb.dims == (7168, 32, 1) and sfb.box == (128, 1, 1)
    assert d.dims == (7168, 1000, 1) and d.strides[0] == 4 * 4100 and d.box == (32, 64, 1) and d.swizzle == 128
    wide = REPRESENTATIVE["dense-128x152"]  # one unswizzled slab: a 152 x 64 box, 76 KB of staging
    assert wide.swizzle == 0 and wide.num_slabs == 1 and cw.tma_specs(wide, 1000)[4].box == (152, 64, 1)
    assert cw.tma_specs(wide, 1000)[4].swizzle == 0 and cw.staging_bytes(128, 152, 0, 1) == 2 * 64 * 152 * 4
    mc = REPRESENTATIVE["dense-128x128-mcA"]
    assert cw.tma_specs(mc, 1000)[0].box == (128, 64, 1) and cw.defines(mc)["CUPYGEMM_CLUSTER_ATTR"]
    assert cw.tma_specs(REPRESENTATIVE["dense-128x128-mcB"], 1000)[1].box == (128, 64, 1)
    kg = REPRESENTATIVE["kgrouped-128x144"]
    a, b, sfa, sfb, d = cw.tma_specs(kg, 7168, num_groups=4, sfa_rows=130, sfb_rows=131, d_group_stride=7168 * 4200,
                                     ld_d=4200)
    assert a.dims == (128, 7168, 1) and a.strides == (128, 128 * 7168)  # templates: the prep kernel sets K
    assert sfa.dims == (7168, 130, 1) and sfb.dims == (4096, 131, 1)
    assert d.dims == (4096, 7168, 4) and d.strides == (4 * 4200, 4 * 7168 * 4200) and d.box == (16, 64, 1)
    assert cw.prep_grid(1) == 1 and cw.prep_grid(8) == 1 and cw.prep_grid(9) == 2


def test_dense_grid_is_the_fewest_ctas_for_its_rounds():
    """7168x4096 on 128x152 tiles in pairs: 756 pairs are 12 rounds of 66 pairs or of 63; 126 CTAs are launched."""
    cfg = cw.choose_wgrad_config(cw.KIND_WGRAD, 7168, 4096, 4096, 1, 132)
    assert (cfg.block_n, cfg.multicast, cfg.num_sms, cw.grid(cfg)) == (152, 2, 126, 126)
    assert cw.choose_wgrad_config(cw.KIND_K_GROUPED, 2048, 7168, 4096, 4, 132).num_sms == 132  # k-grouped: all


def test_short_dense_tiles_prefetch_d():
    """Dense kernels of at most 4096 tokens prefetch D two K blocks before each tile's end; longer ones, the storing
    kernel (it reads no D) and k-grouped ones do not."""
    for m, n in DEEPGEMM_WGRAD:
        short = cw.choose_wgrad_config(cw.KIND_WGRAD, m, n, 4096, 1, 132)
        assert short.d_prefetch == cw.D_PREFETCH_BLOCKS == 2
        assert cw.defines(short)["CUPYGEMM_WGRAD_D_PREFETCH"] == 2
        assert cw.choose_wgrad_config(cw.KIND_WGRAD, m, n, 4096 + 16, 1, 132).d_prefetch == 0
        assert cw.choose_wgrad_config(cw.KIND_WGRAD, m, n, 4096, 1, 132, store=True).d_prefetch == 0
    assert cw.choose_wgrad_config(cw.KIND_WGRAD, 100, 48, 48, 1, 132).d_prefetch == 2
    for m, n in DEEPGEMM_K_GROUPED:
        cfg = cw.choose_wgrad_config(cw.KIND_K_GROUPED, m, n, 4096, 4, 132)
        assert cfg.d_prefetch == 0 and "CUPYGEMM_WGRAD_D_PREFETCH" not in cw.defines(cfg)


@pytest.mark.parametrize("m,n", DEEPGEMM_K_GROUPED)
def test_wide_tiles_share_b_whole(m, n):
    """128x152 tiles share B over pairs of m blocks, the first CTA loading the whole tile (152 rows are not two
    halves of whole swizzle atoms), so B's TMA box is the tile's. Dense builds of it move 16 registers a thread
    from the producer to the math warpgroups (24/240: at 40/232 one spilled); k-grouped ones keep 40/232."""
    cfg = cw.choose_wgrad_config(cw.KIND_K_GROUPED, m, n, 8192, 4, 132)
    assert (cfg.block_n, cfg.multicast, cfg.b_whole) == (152, 2, True)
    assert cw.defines(cfg)["CUPYGEMM_B_WHOLE"] == 1
    assert (cfg.producer_regs, cfg.math_regs) == (40, 232)
    assert cw.tma_specs(cfg, m, sfa_rows=256, sfb_rows=256)[1].box[1] == 152
    dense = cw.choose_wgrad_config(cw.KIND_WGRAD, m, n, 4096, 1, 132)
    assert (dense.block_n, dense.multicast, dense.b_whole) == (152, 2, True)
    assert (dense.producer_regs, dense.math_regs) == (24, 240)
    assert 24 * 128 + 240 * 256 <= 64 * 1024
    assert cw.tma_specs(dense, m)[1].box[1] == 152
    halves = cw.choose_wgrad_config(cw.KIND_WGRAD, 512, 32768, 4096, 1, 132)  # 128x144: B in halves of 72 rows
    assert (halves.block_n, halves.multicast, halves.b_whole) == (144, 2, False)
    assert "CUPYGEMM_B_WHOLE" not in cw.defines(halves) and cw.tma_specs(halves, 512)[1].box[1] == 72


def test_config_legality():
    with pytest.raises(ValueError, match="block_n"):
        make(cw.KIND_WGRAD, 128, 160)
    with pytest.raises(ValueError, match="block_n"):  # B multicast halves: whole 8-row atoms
        make(cw.KIND_WGRAD, 128, 152, swizzle=32, multicast=2)
    with pytest.raises(ValueError, match="b_whole"):
        make(cw.KIND_WGRAD, 128, 152, b_whole=True)
    with pytest.raises(ValueError, match="block_n"):
        make(cw.KIND_WGRAD, 128, 112, two_acc_sets=True)
    with pytest.raises(ValueError, match="multicast 1 pairs neighbouring n blocks"):  # 29 n blocks
        make(cw.KIND_K_GROUPED, 128, 144, n=4096, multicast=1)
    with pytest.raises(ValueError, match="multicast 2 pairs neighbouring m blocks"):  # 3 m blocks
        cw.WgradConfig(cw.KIND_K_GROUPED, 300, 4096, 0, 128, 128, 4, multicast=2)
    with pytest.raises(ValueError, match="no store"):
        make(cw.KIND_K_GROUPED, 128, 128, store=True)
    with pytest.raises(ValueError, match="d_prefetch"):  # the storing kernel reads no D
        make(cw.KIND_WGRAD, 128, 128, store=True, d_prefetch=2)
    with pytest.raises(ValueError, match="d_prefetch"):
        make(cw.KIND_WGRAD, 128, 128, d_prefetch=-1)
    with pytest.raises(ValueError, match="swizzle"):
        make(cw.KIND_WGRAD, 128, 112, swizzle=128)
    with pytest.raises(ValueError, match="shared memory"):
        make(cw.KIND_WGRAD, 128, 128, stages=5)
    with pytest.raises(ValueError, match="shape_k"):
        cw.WgradConfig(cw.KIND_WGRAD, 0, 4096, 100, 128, 128, 4)


@pytest.mark.parametrize("kind,m,n,k,g", [("wgrad", m, n, k, 1) for m, n in DEEPGEMM_WGRAD for k in (4096, 8192)] +
                         [("k_grouped_wgrad", m, n, k, g) for m, n in DEEPGEMM_K_GROUPED for k, g in
                          ((4096, 4), (8192, 4), (4096, 8))] + [("wgrad", 100, 48, 48, 1), ("wgrad", 64, 16, 16, 1),
                                                                 ("k_grouped_wgrad", 70, 24, 16, 3)])
def test_chooser_returns_legal_configs(kind, m, n, k, g):
    cfg = cw.choose_wgrad_config(kind, m, n, k, g, 132)
    assert cfg.smem_bytes + cw.STATIC_SMEM <= cw.SMEM_LIMIT and cfg.num_stages >= 2
    assert cw.grid(cfg) % cfg.cluster_size == 0
    if kind == "wgrad":
        assert (cfg.shape_m, cfg.shape_n, cfg.shape_k) == (0, n, k)
        # the fewest CTAs that keep the rounds of a full grid (pairs with multicast)
        units = -(-(-(-m // cfg.block_m) * -(-n // cfg.block_n)) // cfg.cluster_size)
        full = 132 // cfg.cluster_size
        assert cfg.num_sms <= 132 and -(-units // (cfg.num_sms // cfg.cluster_size)) == -(-units // full)
        assert -(-units // (cfg.num_sms // cfg.cluster_size - 1 or 1)) > -(-units // full) or cfg.num_sms == cfg.cluster_size
    else:
        assert (cfg.shape_m, cfg.shape_n, cfg.shape_k) == (m, n, 0)
        if cfg.multicast:  # the k-grouped kernel takes whole pairs only
            blocks = -(-n // cfg.block_n) if cfg.multicast == 1 else -(-m // cfg.block_m)
            assert blocks % 2 == 0
