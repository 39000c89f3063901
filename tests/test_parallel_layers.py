"""The torch.distributed layers of cupygemm.bench.parallel on CPU: two gloo processes run the expert-parallel MoE
(dispatch, padding per expert, combine) and the tensor-parallel MLP (all_gather, reduce_scatter) with the FP8
casts and GEMMs replaced by the NumPy references, and must match the single-process float references. Catches
routing, padding and collective mistakes without a GPU; the GPU versions are in tests/test_multigpu_gpu.py."""
from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import cupygemm  # noqa: E402
from cupygemm import reference  # noqa: E402
from cupygemm.bench import parallel  # noqa: E402

HIDDEN, INTER, EXPERTS_PER_RANK, TOKENS, TOPK = 256, 256, 3, 40, 2


def _fp8(bits: np.ndarray):
    return torch.from_numpy(bits).view(torch.float8_e4m3fn)


def _token_cast(x):
    q, s = reference.per_token_cast_to_fp8_reference(x.float().numpy())
    return _fp8(q), torch.from_numpy(s)


def _block_cast(x):
    q, s = reference.per_block_cast_to_fp8_reference(x.float().numpy())
    return _fp8(q), torch.from_numpy(s)


def _gemm(lhs, rhs, out=None):
    a = parallel.dequant_tokens(*lhs)
    return (a @ parallel.dequant_blocks(*rhs).T).bfloat16()


def _contiguous(lhs, rhs, out, m_indices):
    a = parallel.dequant_tokens(*lhs)
    result = torch.zeros((a.shape[0], rhs[0].shape[1]), dtype=torch.bfloat16)
    for g in range(rhs[0].shape[0]):
        rows = (m_indices == g).nonzero(as_tuple=True)[0]
        # each group's rows are contiguous and start on a 128-row block, as the kernel needs
        assert rows.numel() == 0 or (rows[0] % 128 == 0 and rows[-1] - rows[0] + 1 == rows.numel())
        result[rows] = (a[rows] @ parallel.dequant_blocks(rhs[0][g], rhs[1][g]).T).bfloat16()
    return result


def _host_kernels(monkeypatch) -> None:
    monkeypatch.setattr(cupygemm, "per_token_cast_to_fp8", _token_cast)
    monkeypatch.setattr(cupygemm, "per_block_cast_to_fp8", _block_cast)
    monkeypatch.setattr(cupygemm, "gemm_fp8_fp8_bf16_nt", _gemm)
    monkeypatch.setattr(cupygemm, "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous", _contiguous)


def _worker(rank: int, world: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mp_ = pytest.MonkeyPatch()
        _host_kernels(mp_)
        torch.manual_seed(100 + rank)
        x = torch.randn((TOKENS, HIDDEN)).bfloat16()
        idx, w = parallel.route(x, EXPERTS_PER_RANK * world, TOPK)
        experts = parallel.make_experts(rank * EXPERTS_PER_RANK, EXPERTS_PER_RANK, HIDDEN, INTER, "cpu")
        y = parallel.ep_moe(x, idx, w, experts)
        want = parallel.moe_reference(x, idx, w, EXPERTS_PER_RANK * world, HIDDEN, INTER)
        w1, w2 = parallel.expert_bf16(0, HIDDEN, INTER, "cpu")
        tp = parallel.tp_mlp(x, parallel.tp_shard(w1, w2, rank, world))
        gathered = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(gathered, x)
        xq = parallel.dequant_tokens(*_token_cast(torch.cat(gathered)))
        tp_want = parallel.mlp_reference(xq, parallel.dequant_blocks(*_block_cast(w1)),
                                         parallel.dequant_blocks(*_block_cast(w2)))[rank * TOKENS:(rank + 1) * TOKENS]
        results.put((rank, reference.calc_diff(y.float().numpy(), want.numpy()),
                     reference.calc_diff(tp.float().numpy(), tp_want.numpy()), int(idx.numel())))
    finally:
        dist.destroy_process_group()


def test_expert_and_tensor_parallel_layers_on_two_gloo_ranks():
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    mp.start_processes(_worker, args=(2, parallel.free_port(), results), nprocs=2, start_method="spawn")
    got = sorted(results.get(timeout=60) for _ in range(2))
    for rank, moe_diff, tp_diff, pairs in got:
        assert pairs == TOKENS * TOPK
        # the references quantize x and the weights as the layers do; what is left is the FP8 cast of the
        # activations between the two GEMMs and BF16 rounding (a token routed wrong is off by far more)
        assert moe_diff < 1e-3, (rank, moe_diff)
        assert tp_diff < 1e-3, (rank, tp_diff)
