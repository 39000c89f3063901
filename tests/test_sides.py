"""L2-side-aware weights on the CPU: the packed layout's sizes, the side-aware config and contract, the side
measurement's arithmetic (on made-up chain times) and the NVRTC builds of the side-aware, probe and packing kernels."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cupygemm import config as C
from cupygemm import contract, l2, packing
from cupygemm.jit.build import build_cubin
from cupygemm.jit.source import render
from cupygemm.kernels import compile_gemm
from cupygemm.packing import PackedLayout
from cupygemm.util import ceil_div
from sass_tools.elf import Cubin


def test_packed_layout_sizes():
    lay = PackedLayout(2112, 7168)
    assert (lay.chunks, lay.pairs, lay.k_blocks) == (66, 33, 56)
    assert lay.group_bytes == 56 * 33 * 8192
    odd = PackedLayout(1000, 384)  # a partial last chunk; an odd chunk count leaves half 1 one chunk short
    assert (odd.chunks, odd.pairs, odd.k_blocks) == (32, 16, 3)
    # Page bits: one per 2 MiB page the groups touch from the buffer's offset in its first page, 16-byte rounded.
    big = PackedLayout(7168, 16384)  # 112 MiB per group
    assert big.page_words(0, 1) == 2 and big.page_words((1 << 21) - 8192, 1) == 2
    assert big.page_words(0, 100) == ceil_div(ceil_div(100 * big.group_bytes, 1 << 21), 32)
    assert big.buffer_bytes(0, 1) == big.group_bytes + 16
    assert big.page_words(0, 146) <= packing.MAX_PAGE_WORDS < big.page_words(0, 147)


def test_side_aware_config_keeps_the_tile_without_stream_k():
    cfg = C.make_config(C.KIND_NORMAL, 7168, 2048, 64, 112, 128, multicast=2)
    side = C.side_aware_config(cfg, 132)
    assert side.sides and side.multicast == 2 and side.num_sms == 132
    assert (side.block_m, side.block_n, side.num_stages) == (cfg.block_m, cfg.block_n, cfg.num_stages)
    assert side.smem_bytes == cfg.smem_bytes + contract.SIDE_SMEM_BYTES
    assert contract.side_box_rows(side) == 8 and contract.side_box_rows(dataclasses.replace(side, multicast=0)) == 16
    assert contract.side_box_rows(C.side_aware_config(C.make_config(C.KIND_NORMAL, 7168, 2048, 64, 40, 128),
                                                      132)) == 8
    masked = C.make_config(C.KIND_MASKED, 4096, 7168, 128, 160, 132, stream_k=True)
    assert not C.side_aware_config(masked, 132).stream_k
    with pytest.raises(ValueError, match="stream-K"):
        C.make_config(C.KIND_NORMAL, 4096, 7168, 128, 128, 132, stream_k=True, sides=True)
    # A config at the shared-memory limit loses a stage rather than fail.
    full = C.make_config(C.KIND_NORMAL, 24576, 1536, 128, 96, 128)
    assert C.side_aware_config(full, 132).smem_bytes <= C.SM90_MAX_SMEM_PER_BLOCK


def test_packed_b_map_covers_the_groups_in_rows():
    cfg = C.side_aware_config(C.make_config(C.KIND_MASKED, 4096, 7168, 128, 128, 132), 132)
    specs = contract.tma_specs(cfg, 256, 4096, 7168, 4, (256 * 7168 * 4, 7168, 1), (4096 * 7168, 7168, 1),
                               (256 * 4096 * 2, 8192, 2))
    rows = 4 * PackedLayout(4096, 7168).group_bytes // 128
    assert specs[2].dims == (128, rows, 1) and specs[2].box == (128, 32, 1) and specs[2].swizzle == 0
    assert contract.defines(cfg)["CUPYGEMM_SIDE_BOX_ROWS"] == 32


def test_side_contract():
    cfg = C.side_aware_config(C.make_config(C.KIND_NORMAL, 2112, 7168, 64, 48, 132, split_k=3), 132)
    assert contract.defines(cfg)["CUPYGEMM_SIDES"] == 1
    assert "CUPYGEMM_SIDES" not in contract.defines(C.make_config(C.KIND_NORMAL, 2112, 7168, 64, 48, 132))
    floats, counters = contract.scratch_sizes(cfg, 64)
    plain = contract.scratch_sizes(C.make_config(C.KIND_NORMAL, 2112, 7168, 64, 48, 132, split_k=3), 64)
    assert floats == plain[0] and counters == plain[1] + contract.SIDE_TICKET_COUNTERS
    no_split = C.side_aware_config(C.make_config(C.KIND_NORMAL, 4096, 1536, 64, 64, 132), 132)
    assert contract.scratch_sizes(no_split, 64) == (0, contract.SIDE_TICKET_COUNTERS)
    for grid, sms0 in ((132, 64), (132, 0), (132, 132), (2, 1)):
        c0 = contract.side_clusters0(no_split, grid, sms0, 132, 1)
        assert 1 <= c0 <= grid - 1


def _side_rounds(cfg, grid, c0, unit_tiles):
    t0, t1 = (u * unit_tiles for u in contract.side_units(cfg))
    clusters = grid // (2 if cfg.multicast else 1)
    return max(-(-t0 // c0), -(-t1 // (clusters - c0)))


@pytest.mark.parametrize("sms0", [62, 64, 66, 68, 70])
def test_side_clusters_cover_both_halves_in_one_round(sms0):
    # 64x4096x7168 packed: 128 tiles of 64x32, 64 per half, on 132 CTAs. The split follows the work first: with 70 +
    # 62 SMs per side, splitting by SM count gave half 1 62 CTAs for 64 tiles and doubled the kernel's time.
    cfg = C.side_aware_config(C.choose_config(C.KIND_NORMAL, 64, 4096, 7168, 1, 132, sides=True), 132)
    assert contract.side_units(cfg) == (64, 64)
    tiles = contract.side_unit_tiles(cfg, 64, 1)
    c0 = contract.side_clusters0(cfg, 132, sms0, 132, tiles)
    assert _side_rounds(cfg, 132, c0, tiles) == 1
    assert c0 == min(max(sms0, 64), 68)  # the side's own SMs, as far as the halves' tiles allow


def test_side_clusters_split_by_work_across_rounds():
    # Split-K and several m blocks: the halves' tiles, not their units, decide; odd unit counts split unevenly.
    cfg = C.side_aware_config(C.make_config(C.KIND_NORMAL, 2112, 7168, 64, 32, 132, split_k=2), 132)
    u0, u1 = contract.side_units(cfg)
    assert u0 + u1 == 66
    for m in (64, 256, 1024):
        tiles = contract.side_unit_tiles(cfg, m, 1)
        assert tiles == -(-m // 64) * 2
        for sms0 in (60, 66, 72):
            c0 = contract.side_clusters0(cfg, 132, sms0, 132, tiles)
            best = min(_side_rounds(cfg, 132, c, tiles) for c in range(1, 132))
            assert _side_rounds(cfg, 132, c0, tiles) == best


def test_two_groups_and_parity():
    near, far = l2._two_groups(np.array([320.0] * 64 + [515.0] * 68))
    assert (near, far) == (320.0, 515.0)
    with pytest.raises(l2._Unavailable):
        l2._two_groups(np.array([320.0] * 131 + [600.0]))  # one outlier is not a side
    with pytest.raises(l2._Unavailable):
        l2._two_groups(np.array([320.0] * 66 + [322.0] * 66))  # too close to tell
    x = np.array([0, 1, 3, 0xB3000, 0x1000, 0x3000], dtype=np.uint64)
    assert list(l2._parity(x)) == [0, 1, 0, 1, 1, 0]


def test_page_sides_time_one_chunk_per_page_inside_the_buffer(monkeypatch):
    info = l2.SideInfo(0, (0, 1) * 66, 0xB3000, 320.0, 515.0)
    timed = []

    def vote(addrs, info_, votes, num_sms):
        timed.append(np.array(addrs))
        return (np.arange(len(addrs)) % 2).astype(np.int64)  # page i's first chunk in the buffer: side i % 2

    monkeypatch.setattr(l2, "_vote", vote)
    page = 0x7F0000000000
    base = page + 0x6000  # the buffer starts 24 KiB (8 KiB-aligned, as packing allocates) into its first page
    bits = l2.page_sides(base, 3 << 21, info, 132)  # reaches into a fourth page
    assert len(timed) == 1 and list(timed[0]) == [base, page + (1 << 21), page + (2 << 21), page + (3 << 21)]
    assert len(bits) == 4
    # A timed chunk comes out on its measured side; the others of its page follow the hash bits.
    refs = timed[0]
    assert list(l2.chunk_side(refs, base, bits, info.hash_bits)) == [0, 1, 0, 1]
    addrs = base + np.arange(0, 3 << 21, 8192, dtype=np.uint64)
    sides = l2.chunk_side(addrs, base, bits, info.hash_bits)
    in_page0 = addrs < page + (1 << 21)
    want = l2._parity((addrs[in_page0] ^ np.uint64(base)) & np.uint64(0xB3000))
    assert np.array_equal(sides[in_page0], want)
    # Slot 1 of a pair is on the other side of slot 0 (bit 12 is a hash bit).
    assert np.all(l2.chunk_side(addrs + np.uint64(4096), base, bits, info.hash_bits) == 1 - sides)


def _info():
    return l2.SideInfo(device=0, sm_side=(0, 1, 1, 0), hash_bits=0xB3000, near_cycles=100.0, far_cycles=160.0)


@pytest.mark.parametrize("mode, name, packs", [
    (None, "NVIDIA H100 80GB HBM3", True), ("auto", "NVIDIA H100 80GB HBM3", True),
    (None, "NVIDIA H200", False), ("1", "NVIDIA H200", True), ("on", "NVIDIA H200", True),
])
def test_packing_pays_only_where_measured_faster(monkeypatch, mode, name, packs):
    """auto packs on the GPUs where side-aware kernels measured faster (H100), not on the H200, where they measured
    1.22x slower; CUPYGEMM_L2_SIDES=1 packs wherever sides are measured."""
    if mode is None:
        monkeypatch.delenv("CUPYGEMM_L2_SIDES", raising=False)
    else:
        monkeypatch.setenv("CUPYGEMM_L2_SIDES", mode)
    why = l2.packing_off_reason(name, _info())
    assert (why is None) == packs
    if not packs:
        assert name in why and "CUPYGEMM_L2_SIDES=1" in why
    assert "no L2 side info (CUPYGEMM_L2_SIDES=0)" == l2.packing_off_reason(name, None, "CUPYGEMM_L2_SIDES=0")


def test_l2_sides_mode_is_checked(monkeypatch):
    monkeypatch.setenv("CUPYGEMM_L2_SIDES", "sometimes")
    with pytest.raises(ValueError, match="CUPYGEMM_L2_SIDES: expected one of auto, 1, 0"):
        l2.packing_off_reason("NVIDIA H200", _info())
    monkeypatch.setenv("CUPYGEMM_L2_SIDES", "0")
    assert l2.side_info(0) is None and l2.unavailable_reason(0) == "CUPYGEMM_L2_SIDES=0"


def test_packed_weights_need_their_page_words():
    """Kernels on few pages take the page bits as parameters, so packed weights without them (or with too many, or
    out of range) are refused: the GEMM would read the wrong slots."""
    lay = PackedLayout(2112, 7168)
    assert lay.page_bits_in_params and packing.PackedLayout(7168, 16384).page_bits_in_params
    assert not packing.PackedLayout(32768, 16384).page_bits_in_params  # 512 MiB: 256+ pages
    ok = packing.PackedWeights(object(), object(), (2112, 7168), True, 8192, 0xB3000, 0, (5,))
    assert ok.launch_sides == (8192, 0xB3000, 5, 0, 0, 0)
    for words in ((), (5, 0), (-1,), (1 << 32,)):
        with pytest.raises(ValueError, match="page_words"):
            packing.PackedWeights(object(), object(), (2112, 7168), True, 8192, 0xB3000, 0, words)
    big = packing.PackedWeights(object(), object(), (4, 7168, 16384), True, 0, 0xB3000, 0, (1, 2, 3, 4))
    assert big.launch_sides[2:] == (1, 2, 3, 4)
    assert packing.PackedWeights(object(), object(), (2112, 7168), False).launch_sides == (0,) * 6


@pytest.mark.parametrize("kind, n, k, in_params", [
    (C.KIND_NORMAL, 2112, 7168, True), (C.KIND_NORMAL, 32768, 16384, False), (C.KIND_MASKED, 4096, 7168, False)])
def test_page_bits_come_from_parameters_or_the_buffer(kind, n, k, in_params):
    """A side-aware normal kernel whose B spans at most 128 pages has no bulk copy of the page bits (they come as
    parameters, PackedLayout.page_bits_in_params); grouped kernels and larger B copy them from the buffer."""
    import sass_helpers as H

    H.require_tool("nvdisasm")
    cfg = C.side_aware_config(C.make_config(kind, n, k, 64 if kind == C.KIND_NORMAL else 128, 64 if
                                            kind == C.KIND_NORMAL else 128, 132), 132)
    ops = [line.mnemonic for lines in H.nvdisasm_cubin(compile_gemm(cfg, pdl=False)).values() for line in lines]
    assert ("UBLKCP.S.G" in ops) != in_params
    assert (kind == C.KIND_NORMAL and PackedLayout(n, k).page_bits_in_params) == in_params


def test_side_map_bits():
    info = l2.SideInfo(0, (0, 1, -1, 1) + (0,) * 60 + (1,), 0xB3000, 1.0, 2.0)
    words = np.frombuffer(info.side_map(), dtype=np.uint32)
    assert len(words) == 8 and words[0] == 0b1010 and words[2] == 1
    assert info.counts == (61, 3)


@pytest.mark.parametrize("kind,n,k,bm,bn,kw", [
    (C.KIND_NORMAL, 2112, 7168, 64, 48, dict(split_k=3)),
    (C.KIND_NORMAL, 7168, 16384, 64, 64, dict(interleave_k=True)),
    (C.KIND_CONTIGUOUS, 4096, 7168, 128, 128, dict(multicast=1)),
    (C.KIND_MASKED, 4096, 7168, 128, 128, {}),
])
def test_side_aware_kernels_compile(kind, n, k, bm, bn, kw):
    cfg = C.side_aware_config(C.make_config(kind, n, k, bm, bn, 132, **kw), 132)
    cubin = compile_gemm(cfg, pdl=False)
    assert cubin[:4] == b"\x7fELF"
    assert compile_gemm(cfg, pdl=True) != cubin


def test_probe_and_pack_kernels_compile():
    for file, entry, defines in (("l2_probe.cu", "cupygemm_l2_latency", {}),
                                 ("pack_b.cu", "cupygemm_pack_b", {"CUPYGEMM_PACK_N": 1000, "CUPYGEMM_PACK_K": 384})):
        _, cubin = build_cubin(render(file, entry, defines))
        assert cubin[:4] == b"\x7fELF"
        assert [k.name for k in Cubin.from_bytes(cubin).kernels] == [entry]  # one kernel per file


def test_info_lists_sm_ranges():
    from cupygemm.cli import _ranges

    assert _ranges([0, 1, 2, 5, 6, 9]) == "0-2,5-6,9"
    assert _ranges([]) == ""


def test_packing_host_jax_arrays_is_refused():
    jnp = pytest.importorskip("jax.numpy")
    import cupygemm

    with pytest.raises(TypeError, match="GPU"):
        cupygemm.pack_weights(jnp.zeros((128, 128), jnp.float8_e4m3fn), jnp.ones((1, 1), jnp.float32))
