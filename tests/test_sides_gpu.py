"""L2-side-aware weights on the GPU: the side measurement, and GEMMs on packed weights against the same GEMMs on
plain weights (bit for bit where the accumulation order is the same) and the float64 reference, repeated launches
(the side tickets reset themselves), CUDA graphs, grouped layouts and torch callers."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

import cupygemm  # noqa: E402
from cupygemm import config as C  # noqa: E402
from cupygemm import l2  # noqa: E402
from cupygemm.plan import plan_gemm  # noqa: E402

from gpu_helpers import (check_against_reference, grouped_weights,  # noqa: E402
                         make_normal, plain_like_packed, poison_bf16, ref_normal)


@pytest.fixture(autouse=True)
def _pack_on_any_hopper(monkeypatch):
    """The side-aware kernels are tested wherever two L2 sides are measured, H200 included, where auto leaves
    weights plain (test_auto_packs_where_it_pays)."""
    monkeypatch.setenv("CUPYGEMM_L2_SIDES", "1")


@pytest.fixture(autouse=True)
def _release_memory():
    """The float64 references of the long-K shapes take GBs; hand them back so that other test processes sharing
    the GPU (pytest -n) do not run out of memory, e.g. inside a torch graph capture, where that is fatal."""
    yield
    cp.get_default_memory_pool().free_all_blocks()


def packed_case(m, n, k, seed=5):
    """A normal GEMM's A (its scales M-major), B packed, and the plain kernel's output on the packed plan's tile."""
    a, sfa, b, sfb, _, _ = make_normal(m, n, k, seed=seed)
    sfa_mn = cupygemm.get_col_major_tma_aligned_tensor(sfa)
    packed = cupygemm.pack_weights(b, sfb)
    with plain_like_packed(C.KIND_NORMAL, m, n, k):
        plain = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa_mn), (b, sfb))
    return a, sfa_mn, packed, plain


@pytest.fixture(scope="module")
def info():
    dev = cp.cuda.runtime.getDevice()
    got = l2.side_info(dev)
    if got is None:
        pytest.fail(f"no L2 side info on this Hopper GPU: {l2.unavailable_reason(dev)}")
    return got


def test_auto_packs_where_it_pays(info, monkeypatch):
    """Under CUPYGEMM_L2_SIDES=auto, pack_weights packs on an H100 and leaves an H200's weights plain (the B it was
    given, not a copy); the GEMM on either gives the plain call's bits."""
    monkeypatch.setenv("CUPYGEMM_L2_SIDES", "auto")
    dev = cp.cuda.runtime.getDevice()
    name = cp.cuda.runtime.getDeviceProperties(dev)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    a, sfa, b, sfb, _, _ = make_normal(64, 2112, 7168, seed=11)
    sfa_mn = cupygemm.get_col_major_tma_aligned_tensor(sfa)
    p = cupygemm.pack_weights(b, sfb)
    assert p.side_aware == ("H100" in name) == (l2.why_plain(dev) is None)
    if not p.side_aware:
        assert p.data is b and name in l2.why_plain(dev)
        got, want = (cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa_mn), w) for w in (p, (b, sfb)))
        assert cp.array_equal(got.view(cp.uint16), want.view(cp.uint16))


def test_side_info_splits_the_sms(info):
    n0, n1 = info.counts
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    assert n0 + n1 == sms and min(n0, n1) >= sms // 4
    assert info.hash_bits & 0x1000 and not info.hash_bits & 0xFFF
    assert info.far_cycles > info.near_cycles


def test_packed_pairs_sit_on_their_sides(info):
    """A second, independent vote on the chunks pack_weights placed: half 0's slots on side 0, half 1's on 1."""
    _, _, b, sfb, _, _ = make_normal(64, 4096, 7168, seed=3)
    p = cupygemm.pack_weights(b, sfb)
    assert p.side_aware and p.hash_bits == info.hash_bits
    lay = p.layout
    base = p.data.data.ptr
    assert base % 8192 == 0 and base % (1 << 21) == p.base_low
    words = p.data[lay.group_bytes:lay.group_bytes + 4 * lay.page_words(p.base_low, 1)].view(cp.uint32).get()
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")
    pairs = np.random.default_rng(0).choice(lay.k_blocks * lay.pairs, size=64, replace=False).astype(np.uint64)
    slot0 = base + pairs * np.uint64(8192)
    half1_slot = 1 ^ l2.chunk_side(slot0, base, bits, p.hash_bits)  # the kernel's rule (l2_sides.cuh, PageSides)
    addrs = slot0 + half1_slot.astype(np.uint64) * np.uint64(4096)
    sides = l2._vote(addrs, info, 7, cp.cuda.Device().attributes["MultiProcessorCount"])
    assert (sides == 1).mean() >= 0.9, sides


def test_copied_packed_weights_compute_the_same():
    """The slots follow from what the weights keep (base_low, hash bits, page bits), not from where the buffer is:
    a copy at another address (another offset in its page) gives the same result."""
    m, n, k = 64, 2112, 7168
    a, sfa, b, sfb, _, _ = make_normal(m, n, k, seed=5)
    sfa_mn = cupygemm.get_col_major_tma_aligned_tensor(sfa)
    p = cupygemm.pack_weights(b, sfb)
    first = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa_mn), p)
    holder = cp.empty(p.data.size + 3 * 8192, dtype=cp.uint8)
    off = (-holder.data.ptr % 8192) + 8192 * (1 if (holder.data.ptr + (-holder.data.ptr % 8192)) % (1 << 21)
                                               == p.base_low else 0)
    moved = holder[off:off + p.data.size]
    moved[...] = p.data
    assert moved.data.ptr % (1 << 21) != p.base_low
    copy = cupygemm.PackedWeights(moved, p.scales, p.shape, True, p.base_low, p.hash_bits, page_words=p.page_words)
    again = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa_mn), copy)
    assert cp.array_equal(first.view(cp.uint16), again.view(cp.uint16))


DENSE = [(64, 2112, 7168), (128, 7168, 2048), (64, 7168, 16384), (128, 4096, 7168), (64, 24576, 1536),
         (100, 1000, 384), (256, 200, 4096), (4096, 4096, 1024)]


@pytest.mark.parametrize("m,n,k", DENSE)
def test_dense_packed_matches_plain(info, m, n, k):
    a, sfa, b, sfb, _, _ = make_normal(m, n, k, seed=m + n)
    sfa_mn = cupygemm.get_col_major_tma_aligned_tensor(sfa)
    with plain_like_packed(C.KIND_NORMAL, m, n, k):
        plain = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa_mn), (b, sfb))
    packed = cupygemm.pack_weights(b, sfb)
    assert packed.side_aware
    want, mag = ref_normal(a, sfa, b, sfb)
    for _ in range(3):  # the side tickets reset themselves for the next launch
        out = poison_bf16((m, n))
        cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa_mn), packed, out)
        r = check_against_reference(out, want, mag)
        assert r["finite"] and r["beyond_one_ulp"] == 0, r
        assert cp.array_equal(out.view(cp.uint16), plain.view(cp.uint16))


def test_packed_split_k_clusters_match(info):
    """Packed weights on split-K tiles (64x2112x7168: 64x32 split 2 on interleaved K) met as clusters and met in
    global memory: bit for bit the plain kernel's output, launch after launch."""
    m, n, k = 64, 2112, 7168
    a, sfa_mn, packed, plain = packed_case(m, n, k)
    assert plan_gemm(C.KIND_NORMAL, m, n, k, 1, cp.cuda.runtime.getDevice(), sides=True).cfg.split_cluster
    for split_cluster in (True, False):
        C.override_config("normal", n, k, split_cluster=split_cluster)
        try:
            for _ in range(2):
                out = poison_bf16((m, n))
                cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa_mn), packed, out)
                assert cp.array_equal(out.view(cp.uint16), plain.view(cp.uint16)), split_cluster
        finally:
            C.override_config("normal", n, k)


def test_uneven_sides_split_the_halves_by_work(info, monkeypatch):
    """On a GPU whose sides hold different SM counts (H100s measured 62 + 70), each half of N still gets the clusters
    its tiles need (contract.side_clusters0), and the result stays the plain kernel's bit for bit."""
    import dataclasses

    from cupygemm import contract, plan

    m, n, k = 64, 4096, 1024
    a, sfa_mn, packed, plain = packed_case(m, n, k)
    dev = cp.cuda.runtime.getDevice()
    sides = list(info.sm_side)
    moved = [sm for sm, s in enumerate(sides) if s == 1][:4]
    for sm in moved:  # four SMs of side 1 counted on side 0
        sides[sm] = 0
    uneven = dataclasses.replace(info, sm_side=tuple(sides))
    monkeypatch.setitem(l2._info, dev, uneven)
    plan.clear()
    try:
        p = plan_gemm(C.KIND_NORMAL, m, n, k, 1, dev, sides=True)
        units0, units1 = contract.side_units(p.cfg)
        clusters = p.grid // (2 if p.cfg.multicast else 1)
        assert -(-units0 // p.side_clusters0) == -(-units1 // (clusters - p.side_clusters0)) == 1
        for _ in range(2):
            out = poison_bf16((m, n))
            cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa_mn), packed, out)
            assert cp.array_equal(out.view(cp.uint16), plain.view(cp.uint16))
    finally:
        plan.clear()  # no plan built on the uneven map outlives the test (monkeypatch restores the map after)


def test_packed_in_a_cuda_graph(info):
    m, n, k = 64, 2112, 7168
    a, sfa_mn, packed, want = packed_case(m, n, k)
    out = poison_bf16((m, n))
    cp.cuda.Device().synchronize()  # made on the default stream; the stream is non-blocking
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa_mn), packed, out, stream=stream)  # plan and scratch before capture
        stream.begin_capture()
        for _ in range(4):
            cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa_mn), packed, out, stream=stream)
        graph = stream.end_capture()
        for _ in range(3):
            out.view(cp.uint16).fill(0xFFFF)
            graph.launch(stream)
        stream.synchronize()
    assert cp.array_equal(out.view(cp.uint16), want.view(cp.uint16))


def test_contiguous_and_masked_packed_match_plain(info):
    rng = np.random.default_rng(1)
    g, n, k = 4, 4096, 7168
    b, sfb = grouped_weights(g, n, k, cp.random.default_rng(2))
    packed = cupygemm.pack_weights(b, sfb)
    assert packed.side_aware and packed.num_groups == g
    # masked: groups of random valid rows
    max_m = 256
    a, sfa, _, _, _, _ = make_normal(g * max_m, 128, k, seed=7)
    a3, sfa3 = a.reshape(g, max_m, k), sfa.reshape(g, max_m, -1)
    masked_m = cp.asarray(rng.integers(0, max_m + 1, size=g).astype(np.int32))
    plain = poison_bf16((g, max_m, n))
    with plain_like_packed(C.KIND_MASKED, max_m, n, k, g, expected_m=128):
        cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a3, sfa3), (b, sfb), plain, masked_m, 128)
    out = poison_bf16((g, max_m, n))
    cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((a3, sfa3), packed, out, masked_m, 128)
    for gi, rows in enumerate(masked_m.get()):
        got, want = out[gi, :rows], plain[gi, :rows]
        assert cp.array_equal(got.view(cp.uint16), want.view(cp.uint16))
        assert cp.all(out[gi, rows:].view(cp.uint16) == 0xFFFF)  # rows past masked_m are not written
    # contiguous: 128-row blocks of groups 2, 0, 3, 3
    m = 512
    a, sfa, _, _, _, _ = make_normal(m, 128, k, seed=8)
    m_indices = cp.asarray(np.repeat([2, 0, 3, 3], 128).astype(np.int32))
    with plain_like_packed(C.KIND_CONTIGUOUS, m, n, k, g):
        plain = cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sfa), (b, sfb), None, m_indices)
    got = cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sfa), packed, None, m_indices)
    assert cp.array_equal(got.view(cp.uint16), plain.view(cp.uint16))


def test_torch_packed_matches_plain(info):
    torch = pytest.importorskip("torch")
    m, n, k = 128, 2112, 7168
    a, sfa, b, sfb, _, _ = make_normal(m, n, k, seed=9)
    ta = torch.from_dlpack(a).view(torch.float8_e4m3fn)
    tb = torch.from_dlpack(b).view(torch.float8_e4m3fn)
    tsfa, tsfb = torch.from_dlpack(sfa), torch.from_dlpack(sfb)
    with plain_like_packed(C.KIND_NORMAL, m, n, k):
        plain = cupygemm.gemm_fp8_fp8_bf16_nt((ta, tsfa), (tb, tsfb))
    packed = cupygemm.pack_weights(tb, tsfb)
    assert packed.side_aware and isinstance(packed.data, torch.Tensor)
    got = cupygemm.gemm_fp8_fp8_bf16_nt((ta, tsfa), packed)
    torch.cuda.synchronize()
    assert torch.equal(got.view(torch.int16), plain.view(torch.int16))


def test_torch_packed_operators_compile_and_opcheck(info):
    """Packed weights through the ``cupygemm::*_packed`` operators: torch.compile(fullgraph=True) traces the call as
    one operator, and opcheck passes (schema, fake tensor, aliasing); results equal the eager call."""
    torch = pytest.importorskip("torch")
    m, n, k = 64, 2112, 7168
    a, sfa, b, sfb, _, _ = make_normal(m, n, k, seed=11)
    ta = torch.from_dlpack(a).view(torch.float8_e4m3fn)
    tsfa, tsfb = torch.from_dlpack(sfa), torch.from_dlpack(sfb)
    packed = cupygemm.pack_weights(torch.from_dlpack(b).view(torch.float8_e4m3fn), tsfb)
    eager = cupygemm.gemm_fp8_fp8_bf16_nt((ta, tsfa), packed)
    compiled = torch.compile(lambda x, s: cupygemm.gemm_fp8_fp8_bf16_nt((x, s), packed), fullgraph=True)
    assert torch.equal(compiled(ta, tsfa).view(torch.int16), eager.view(torch.int16))
    # uint8 bits: opcheck's schema test compares inputs with ops torch lacks for float8_e4m3fn
    ua = torch.from_dlpack(a)
    tail = (list(packed.shape), packed.base_low, packed.hash_bits, list(packed.page_words))
    torch.library.opcheck(torch.ops.cupygemm.gemm_fp8_fp8_bf16_nt_packed.default,
                          (ua, tsfa, packed.data, packed.scales, *tail))
    out = torch.empty(m, n, dtype=torch.bfloat16, device=ta.device)
    torch.library.opcheck(torch.ops.cupygemm.gemm_fp8_fp8_bf16_nt_packed_out.default,
                          (ua, tsfa, packed.data, packed.scales, *tail, out))
    torch.ops.cupygemm.gemm_fp8_fp8_bf16_nt_packed_out.default(ta, tsfa, packed.data, packed.scales, *tail, out)
    assert torch.equal(out.view(torch.int16), eager.view(torch.int16))
    # masked, on grouped packed weights
    g, max_m, gn, gk = 2, 64, 256, 512
    gb, gsfb = grouped_weights(g, gn, gk, cp.random.default_rng(4))
    gpacked = cupygemm.pack_weights(torch.from_dlpack(gb), torch.from_dlpack(gsfb))
    a3, sfa3, _, _, _, _ = make_normal(g * max_m, 128, gk, seed=12)
    ua3, tsfa3 = torch.from_dlpack(a3).view(g, max_m, gk), torch.from_dlpack(sfa3).view(g, max_m, -1)
    mm = torch.tensor([64, 17], dtype=torch.int32, device=ta.device)
    torch.library.opcheck(torch.ops.cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked_packed.default,
                          (ua3, tsfa3, gpacked.data, gpacked.scales, mm, 32, list(gpacked.shape), gpacked.base_low,
                           gpacked.hash_bits, list(gpacked.page_words)))
