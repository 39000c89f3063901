"""The torch operators on DTensor operands (cupygemm.torch.sharding): on a mesh of two ranks of torch's fake process
group (one process, one GPU: this rank's shards are real, the other rank's collectives do nothing), each split gives
the output placement its rule says, and the output's local tensor is bit for bit the operator on the local shards.
Two real GPUs: tests/test_multigpu_gpu.py."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

import cupygemm  # noqa: E402

F8 = torch.float8_e4m3fn


@pytest.fixture(scope="module")
def mesh():
    if not torch.cuda.is_available() or not torch.distributed.is_available():
        pytest.skip("torch without CUDA or distributed support")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import cupygemm.torch

    cupygemm.torch.sharding.ensure_registered()  # these tests call the operators directly
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield init_device_mesh("cuda", (2,))
    finally:
        dist.destroy_process_group()


def _dt(mesh, local, placement, shape=None):
    """A DTensor of this rank's ``local`` shard; ``shape``: the global shape where the shards are uneven (else the
    local one times the mesh along a sharded dimension)."""
    from torch.distributed.tensor import DTensor

    stride = None if shape is None else torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local, mesh, [placement], run_check=False, shape=shape, stride=stride)


def _pl(name, dim=None):
    from torch.distributed.tensor import Partial, Replicate, Shard

    return {"R": Replicate(), "P": Partial()}.get(name) or Shard(dim)


def _operands(m, n, k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    w = torch.randn(n, k, device="cuda", generator=g).bfloat16()
    a, sfa = cupygemm.per_token_cast_to_fp8(x)
    b, sfb = cupygemm.per_block_cast_to_fp8(w)
    return a, sfa, b, sfb


def _same(x, y) -> bool:
    return torch.equal(x.view(torch.uint8) if x.dtype == F8 else x, y.view(torch.uint8) if y.dtype == F8 else y)


@pytest.mark.parametrize("split", ["m", "n", "k"])
def test_dense_gemm_splits(mesh, split):
    """Rows (M-sharded activations), columns (column-parallel weights: B's rows and their 128x128 scales) and K
    (row-parallel: every operand along K, partial sums out)."""
    m, n, k = 256, 512, 1024
    a, sfa, b, sfb = _operands(m, n, k)
    if split == "m":
        local = (a[:m // 2], sfa[:m // 2], b, sfb)
        places, want = [_pl("S", 0), _pl("S", 0), _pl("R"), _pl("R")], _pl("S", 0)
    elif split == "n":
        local = (a, sfa, b[:n // 2], sfb[:n // 256])
        places, want = [_pl("R"), _pl("R"), _pl("S", 0), _pl("S", 0)], _pl("S", 1)
    else:
        local = tuple(t[:, :t.shape[1] // 2].contiguous() for t in (a, sfa, b, sfb))
        places, want = [_pl("S", 1)] * 4, _pl("P")
    y = cupygemm.torch.ops.gemm_fp8_fp8_bf16_nt.default(*(_dt(mesh, t, p) for t, p in zip(local, places)))
    assert tuple(y.placements) == (want,) and tuple(y.shape) == (m, n)
    assert _same(y.to_local(), cupygemm.gemm_fp8_fp8_bf16_nt((local[0], local[1]), (local[2], local[3])))


def test_public_entry_point_on_dtensors(mesh):
    a, sfa, b, sfb = _operands(256, 512, 1024, 1)
    la, lsa = a[:128], sfa[:128]
    y = cupygemm.gemm_fp8_fp8_bf16_nt((_dt(mesh, la, _pl("S", 0)), _dt(mesh, lsa, _pl("S", 0))),
                                      (_dt(mesh, b, _pl("R")), _dt(mesh, sfb, _pl("R"))))
    assert tuple(y.placements) == (_pl("S", 0),)
    assert _same(y.to_local(), cupygemm.gemm_fp8_fp8_bf16_nt((la, lsa), (b, sfb)))


def test_unaligned_columns_are_not_split_across_scale_blocks(mesh):
    """N = 384 in two halves of 192 rows would split a 128-row block of SFB: the rule offers no column split, so
    the output is not column-sharded (DTensor redistributes to a split that is whole instead)."""
    a, sfa, b, sfb = _operands(256, 384, 1024, 2)
    y = cupygemm.torch.ops.gemm_fp8_fp8_bf16_nt.default(
        _dt(mesh, a, _pl("R")), _dt(mesh, sfa, _pl("R")), _dt(mesh, b[:192], _pl("S", 0)),
        _dt(mesh, sfb[:2], _pl("S", 0), shape=tuple(sfb.shape)))  # 3 block rows: 2 here, 1 on the other rank
    assert tuple(y.placements) != (_pl("S", 1),) and tuple(y.shape) == (256, 384)


def test_weight_gradient_over_token_shards_is_a_partial_sum(mesh):
    """wgrad's K is the tokens: a token-sharded dW = dY^T X is each rank's partial sum (data parallelism)."""
    g = torch.Generator(device="cuda").manual_seed(3)
    dy_t = torch.randn(512, 1024, device="cuda", generator=g).bfloat16()  # [N, tokens]
    x_t = torch.randn(256, 1024, device="cuda", generator=g).bfloat16()  # [K, tokens]
    a, sfa = cupygemm.per_token_cast_to_fp8(dy_t[:, :512].contiguous())
    b, sfb = cupygemm.per_token_cast_to_fp8(x_t[:, :512].contiguous())
    dw = cupygemm.torch.ops.wgrad_gemm_fp8_fp8_fp32_nt_store.default(
        *(_dt(mesh, t, _pl("S", 1)) for t in (a, sfa, b, sfb)))
    assert tuple(dw.placements) == (_pl("P"),) and tuple(dw.shape) == (512, 256)
    assert _same(dw.to_local(), cupygemm.wgrad_gemm_fp8_fp8_fp32_nt_store((a, sfa), (b, sfb)))


def test_masked_grouped_gemm_splits_along_groups(mesh):
    """Expert parallelism: each rank its groups (their A rows, weights, scales and masked_m)."""
    g, m, n, k = 4, 128, 512, 1024
    gen = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(g * m, k, device="cuda", generator=gen).bfloat16()
    a, sfa = cupygemm.per_token_cast_to_fp8(x)
    a, sfa = a.view(g, m, k), sfa.view(g, m, -1)
    w = torch.randn(g, n, k, device="cuda", generator=gen).bfloat16()
    bs = [cupygemm.per_block_cast_to_fp8(w[i]) for i in range(g)]
    b, sfb = torch.stack([q for q, _ in bs]), torch.stack([s for _, s in bs])
    masked_m = torch.tensor([100, 7, 128, 0], dtype=torch.int32, device="cuda")
    local = (a[:2], sfa[:2], b[:2], sfb[:2], masked_m[:2])
    y = cupygemm.torch.ops.m_grouped_gemm_fp8_fp8_bf16_nt_masked.default(
        *(_dt(mesh, t, _pl("S", 0)) for t in local), 64)
    assert tuple(y.placements) == (_pl("S", 0),) and tuple(y.shape) == (g, m, n)
    want = cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((local[0], local[1]), (local[2], local[3]), None,
                                                          local[4], 64)
    for i, rows in enumerate((100, 7)):  # rows past masked_m are not written
        assert _same(y.to_local()[i, :rows], want[i, :rows])


@pytest.mark.parametrize("entry", ["per_token_cast_to_fp8", "per_block_cast_to_fp8",
                                   "per_token_cast_to_fp8_transposed", "per_token_cast_to_fp8_transposed_rowwise",
                                   "per_block_cast_to_fp8_with_transpose"])
@pytest.mark.parametrize("dim", [0, 1])
def test_casts_split_along_rows_or_columns(mesh, entry, dim):
    x = torch.randn(512, 1024, device="cuda", generator=torch.Generator(device="cuda").manual_seed(5)).bfloat16()
    local = x[:256] if dim == 0 else x[:, :512].contiguous()
    op = getattr(cupygemm.torch.ops, entry).default
    outs = op(_dt(mesh, local, _pl("S", dim)))
    want = op(local)
    transposed = {"per_token_cast_to_fp8_transposed": (True, True),
                  "per_token_cast_to_fp8_transposed_rowwise": (True, True, False, False),
                  "per_block_cast_to_fp8_with_transpose": (False, False, True, True)}.get(entry, (False, False))
    for got, w, t in zip(outs, want, transposed):
        assert tuple(got.placements) == (_pl("S", 1 - dim if t else dim),)
        assert _same(got.to_local(), w)


def test_rules_registered_at_import_or_at_the_first_public_call():
    """A fresh process: the rules are registered at import where DTensor is loaded by then (the layers'
    torch.compiler.disable loads it), else the first public call on a DTensor registers them."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import sys, torch, cupygemm, cupygemm.torch
        assert cupygemm.torch.sharding._registered == ("torch.distributed.tensor" in sys.modules)
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard
        from torch.testing._internal.distributed.fake_pg import FakeStore
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
        mesh = init_device_mesh("cuda", (2,))
        x = DTensor.from_local(torch.randn(128, 256, device="cuda").bfloat16(), mesh, [Shard(0)], run_check=False)
        q, s = cupygemm.per_token_cast_to_fp8(x)
        assert cupygemm.torch.sharding._registered and tuple(q.placements) == (Shard(0),), q.placements
        dist.destroy_process_group()
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
