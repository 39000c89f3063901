"""The GEMM kernel's host contract (cupygemm/contract.py) against the kernel source and the configs."""
from __future__ import annotations

import dataclasses
import re

import pytest

from cupygemm import config as C
from cupygemm import contract, tma
from cupygemm.config.constants import STATIC_SMEM
from cupygemm.jit.source import cuda_src_dir
from cupygemm.launch import DESC, PTR, SIDE_MAP, U32


def _entry_params() -> list[tuple[str, str]]:
    """(type, name) of cupygemm_fp8_gemm's parameters, read from the kernel source (side-aware ones last)."""
    src = (cuda_src_dir() / contract.GEMM_FILE).read_text()
    m = re.search(rf"\b{contract.GEMM_ENTRY}\s*\(([^)]*)\)", src)
    assert m, "entry point not found"
    params = []
    text = re.sub(r"^#.*$", "", m.group(1), flags=re.M)  # the #if CUPYGEMM_SIDES lines
    for p in text.split(","):
        words = p.replace("*", " * ").split()
        params.append((" ".join(words[:-1]), words[-1]))
    return params


def test_runtime_parameters_match_the_entry_point():
    params = _entry_params()
    names = contract.GEMM_PARAM_NAMES + contract.SIDE_PARAM_NAMES
    assert len(params) == len(contract.GEMM_PARAMS_SIDES) == len(names)
    assert contract.GEMM_PARAMS_SIDES[:len(contract.GEMM_PARAMS)] == contract.GEMM_PARAMS
    for (ctype, name), kind, want in zip(params, contract.GEMM_PARAMS_SIDES, names):
        expected = {DESC: "TmaDescriptor", PTR: "*", U32: "uint32_t", SIDE_MAP: "SideMap"}[kind]
        assert expected in ctype, (ctype, name, kind)
        assert name.startswith(want), (name, want)  # d_ptr is the d parameter


def test_defines_are_the_kernel_contract_keys():
    """The template constants, in the split-K vocabulary; the grid size is not one of them."""
    cfg = C.choose_config(C.KIND_NORMAL, 64, 200, 3000, 1, 132)  # 64x48 split 3 on one warpgroup
    d = contract.defines(cfg)
    assert list(d) == [
        "CUPYGEMM_SHAPE_N", "CUPYGEMM_SHAPE_K", "CUPYGEMM_BLOCK_M", "CUPYGEMM_BLOCK_N", "CUPYGEMM_WGMMA_N",
        "CUPYGEMM_NUM_STAGES", "CUPYGEMM_NUM_MATH_WG", "CUPYGEMM_MATH_REGS", "CUPYGEMM_PRODUCER_REGS",
        "CUPYGEMM_SWIZZLE_D", "CUPYGEMM_RASTER_N", "CUPYGEMM_KIND", "CUPYGEMM_MULTICAST", "CUPYGEMM_INTERLEAVE_K",
        "CUPYGEMM_SERIAL_M", "CUPYGEMM_SPLIT_K", "CUPYGEMM_STREAM_K", "CUPYGEMM_A_BOX_M", "CUPYGEMM_CLUSTER_ATTR",
        "CUPYGEMM_TWO_ACC_SETS"]  # (one math warpgroup: two accumulator sets, a flag added last where on)
    assert cfg.split_k > 1 and d["CUPYGEMM_SPLIT_K"] == cfg.split_k and d["CUPYGEMM_INTERLEAVE_K"] == 0
    # Split-K clusters add their flag (last, so other kernels keep their sources) and launch 2-CTA clusters.
    two = C.make_config("normal", 2112, 7168, 64, 32, 132, split_k=2, split_cluster=True)
    dt = contract.defines(two)
    assert list(dt)[-1] == "CUPYGEMM_SPLIT_CLUSTER" and dt["CUPYGEMM_SPLIT_CLUSTER"] == 1
    assert dt["CUPYGEMM_CLUSTER_ATTR"] == "__cluster_dims__(2, 1, 1)"
    assert "CUPYGEMM_SPLIT_CLUSTER" not in contract.defines(dataclasses.replace(two, split_cluster=False))
    inter = C.choose_config(C.KIND_NORMAL, 64, 4096, 7168, 1, 132)
    assert inter.interleave_k and contract.defines(inter)["CUPYGEMM_INTERLEAVE_K"] == 1
    assert contract.defines(inter)["CUPYGEMM_SPLIT_K"] == 1
    assert contract.defines(C.make_config(C.KIND_NORMAL, 4096, 7168, 128, 128, 132, multicast=1))[
        "CUPYGEMM_CLUSTER_ATTR"] == "__cluster_dims__(2, 1, 1)"


@pytest.mark.parametrize("bm,interleave,wg", [(64, False, 1), (64, True, 2), (128, False, 2), (192, False, 3),
                                              (256, False, 2)])
def test_cta_shape_and_registers(bm, interleave, wg):
    assert contract.math_warpgroups(bm, interleave) == wg
    assert contract.threads(wg) == 128 * (wg + 1)
    if wg > 1:  # setmaxnreg splits the 64K registers of one CTA per SM
        assert contract.producer_regs(wg) * 128 + contract.math_regs(wg) * 128 * wg <= 64 * 1024
    else:
        assert contract.math_regs(wg) * contract.threads(wg) <= 64 * 1024


def test_tma_maps_of_a_masked_multicast_problem():
    """Masked A and D carry the group dimension, A loads 64-row boxes; B multicast is normal-only, A multicast here:
    with it the A box is not halved for masked tiles (they load 64-row boxes anyway)."""
    g, m, n, k = 4, 256, 4096, 7168
    cfg = C.make_config(C.KIND_MASKED, n, k, 256, 128, 132, multicast=1, serial_m=True)
    a_str, b_str, d_str = (m * k, k, 1), (n * k, k, 1), (m * n * 2, n * 2, 2)
    c = contract.launch_contract(cfg, m, n, k, g, a_str, b_str, d_str, b_evict_first=True)
    a, a_tail, b, sfa, d = c.tmaps
    assert (a.dtype, a.dims, a.strides, a.box, a.swizzle) == (tma.UINT8, (k, m, g), (k, m * k), (128, 64, 1), 128)
    assert a_tail == a  # 256 rows per group: no box reaches past them
    assert (b.dims, b.box) == ((k, n, g), (128, 128, 1))
    assert (sfa.dtype, sfa.dims, sfa.box) == (tma.FLOAT32, (m, 56, g), (256, 1, 1))
    assert sfa.strides == (4 * c.sfa_m_pad, 4 * c.sfa_m_pad * 56) and c.sfa_m_pad == 256
    assert (d.dtype, d.dims, d.box, d.swizzle) == (tma.BFLOAT16, (n, m, g), (64, 128, 1), 128)  # 128 rows per WG
    assert c.scalars == (m, g, n, 1)
    assert c.threads == cfg.threads == 384 and c.smem_bytes == cfg.smem_bytes
    assert c.scratch_floats == 0 or cfg.stream_k


def test_tma_maps_share_the_multicast_operand():
    n, k, m = 4096, 7168, 4096
    strides = ((k, 1), (k, 1), (2 * n, 2))
    a_half = contract.tma_specs(C.make_config(C.KIND_NORMAL, n, k, 128, 128, 132, multicast=1), m, n, k, 1, *strides)
    b_half = contract.tma_specs(C.make_config(C.KIND_NORMAL, n, k, 128, 128, 132, multicast=2), m, n, k, 1, *strides)
    assert a_half[0].box[1] == 64 and a_half[2].box[1] == 128
    assert b_half[0].box[1] == 128 and b_half[2].box[1] == 64
    inter = contract.tma_specs(C.make_config(C.KIND_NORMAL, n, k, 64, 128, 132, interleave_k=True), m, n, k, 1,
                               *strides)
    assert inter[4].box[1] == 64  # both warpgroups hold all 64 rows; one stores them


@pytest.mark.parametrize("kind, block_m, multicast, m, tail_rows", [
    (C.KIND_NORMAL, 128, 0, 80, 80),      # one row block, shorter than the box
    (C.KIND_NORMAL, 64, 0, 16, 16),
    (C.KIND_NORMAL, 128, 0, 200, 72),     # the second row block's box
    (C.KIND_NORMAL, 128, 1, 4160, 64),    # A multicast: 64-row boxes, 4160 = 65 of them
    (C.KIND_NORMAL, 128, 1, 4100, 4),
    (C.KIND_NORMAL, 128, 0, 4096, 128),   # whole boxes: the tail map is the first one
    (C.KIND_MASKED, 128, 0, 100, 36),     # masked: 64-row boxes over each group's max_m rows
])
def test_a_tail_map_ends_at_the_last_row(kind, block_m, multicast, m, tail_rows):
    """The second A map's box covers exactly the rows of A's last box, so no A load reaches past M (the kernel's
    producer takes it for the box that would; cuda_src/producer.cuh)."""
    n, k, g = 4096, 7168, 2 if kind == C.KIND_MASKED else 1
    cfg = C.make_config(kind, n, k, block_m, 128, 132, multicast=multicast)
    a_str = (m * k, k, 1) if kind == C.KIND_MASKED else (k, 1)
    d_str = (m * n * 2, n * 2, 2) if kind == C.KIND_MASKED else (n * 2, 2)
    a, a_tail, *_ = contract.tma_specs(cfg, m, n, k, g, a_str, a_str, d_str)
    assert a_tail.box[1] == tail_rows and (a_tail.dims, a_tail.strides, a_tail.swizzle) == (a.dims, a.strides, 128)
    box = contract.a_box_rows(kind, block_m, multicast)
    assert a.box[1] == box and (m - tail_rows) % box == 0 and 0 < tail_rows <= box
    assert (a_tail == a) == (m % box == 0)


def test_grid_is_whole_co_resident_clusters():
    cfg = C.make_config(C.KIND_NORMAL, 4096, 7168, 128, 128, 132, multicast=1)
    assert contract.grid(cfg, 66) == 132 and contract.grid(cfg, 62) == 124
    plain = C.make_config(C.KIND_NORMAL, 4096, 7168, 128, 128, 132)
    assert contract.grid(plain, 0) == 132


def test_smem_layout_is_what_configs_carry():
    for cfg in (C.choose_config(C.KIND_NORMAL, 64, 4096, 7168, 1, 132),
                C.choose_config(C.KIND_MASKED, 256, 4096, 7168, 4, 132),
                C.choose_config(C.KIND_CONTIGUOUS, 8192, 4096, 7168, 8, 132)):
        assert cfg.smem_bytes == contract.smem_bytes(cfg.block_m, cfg.block_n, cfg.num_stages, cfg.interleave_k)
        assert cfg.smem_bytes + STATIC_SMEM <= C.SM90_MAX_SMEM_PER_BLOCK
