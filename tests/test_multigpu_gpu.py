"""Two GPUs in one process and in two: operands on a device that is not the current one, CuPy arrays alternating
between devices, one host thread per GPU, set_num_sms per device, and a 2-process NCCL run of the column- and
row-parallel FP8 linears and the expert-parallel MoE (cupygemm.bench.parallel) against single-device references."""
from __future__ import annotations

import os
import threading

import pytest

pytestmark = pytest.mark.multigpu

cp = pytest.importorskip("cupy")

import cupygemm  # noqa: E402
from gpu_helpers import calc_diff, make_normal, ref_normal  # noqa: E402

M, N, K = 384, 1024, 2048


def _normal_on(device: int, seed: int):
    with cp.cuda.Device(device):
        a, sfa, b, sfb, _, _ = make_normal(M, N, K, seed)
        want, _ = ref_normal(a, sfa, b, sfb)
    return a, sfa, b, sfb, want


def _check(out, want) -> None:
    got = cp.asarray(out).view(cp.uint16).astype(cp.uint32) << 16
    assert calc_diff(got.view(cp.float32), want) < 1e-3


def test_torch_tensors_on_cuda1_with_cuda0_current():
    torch = pytest.importorskip("torch")
    a, sfa, b, sfb, want = _normal_on(1, 0)
    ta, tb = (torch.from_dlpack(x).view(torch.float8_e4m3fn) for x in (a, b))
    tsa, tsb = torch.from_dlpack(sfa), torch.from_dlpack(sfb)
    torch.cuda.set_device(0)
    with cp.cuda.Device(0):
        out = cupygemm.gemm_fp8_fp8_bf16_nt((ta, tsa), (tb, tsb))
        torch.cuda.synchronize(1)
        assert out.device == torch.device("cuda", 1) and torch.cuda.current_device() == 0
        assert cp.cuda.runtime.getDevice() == 0
    with cp.cuda.Device(1):
        _check(cp.from_dlpack(out.view(torch.uint16)), want)
        again = cupygemm.gemm_fp8_fp8_bf16_nt((ta, tsa), (tb, tsb))  # device 1 current: the same result
        assert torch.equal(out.view(torch.int16), again.view(torch.int16))


def test_cupy_arrays_alternating_devices():
    ops = [_normal_on(d, d) for d in (0, 1)]
    firsts = {}
    for i in range(6):  # device 0 stays current; the operands' device picks the kernel, plan and buffers
        d = i % 2
        a, sfa, b, sfb, want = ops[d]
        out = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
        assert out.device.id == d and cp.cuda.runtime.getDevice() == 0
        with cp.cuda.Device(d):
            _check(out, want)
            if d in firsts:
                assert bool((out.view(cp.uint16) == firsts[d].view(cp.uint16)).all())
            firsts.setdefault(d, out)


def test_two_threads_each_driving_one_gpu():
    ops = [_normal_on(d, 10 + d) for d in (0, 1)]
    errors, outs = [], {}

    def drive(d: int) -> None:
        try:
            with cp.cuda.Device(d):
                a, sfa, b, sfb, want = ops[d]
                s = cp.cuda.Stream(non_blocking=True)
                results = [cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), stream=s) for _ in range(50)]
                s.synchronize()
                _check(results[0], want)
                outs[d] = all(bool((r.view(cp.uint16) == results[0].view(cp.uint16)).all()) for r in results)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=drive, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert outs == {0: True, 1: True}


def test_set_num_sms_per_device():
    from cupygemm.kinds import kind_named
    from cupygemm.plan import plan_gemm

    ops = [_normal_on(d, 20 + d) for d in (0, 1)]
    full = cupygemm.get_num_sms(0)
    cupygemm.set_num_sms(full // 2, device=1)
    try:
        assert cupygemm.get_num_sms(0) == full and cupygemm.get_num_sms(1) == full // 2
        for d, (a, sfa, b, sfb, want) in enumerate(ops):  # device 0 current throughout
            out = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))
            with cp.cuda.Device(d):
                _check(out, want)
        # a problem of far more tiles than SMs gets a persistent grid of (about) every SM it may use
        normal = kind_named("normal")
        assert plan_gemm(normal, 4096, 4096, K, 1, 1).grid <= full // 2
        assert plan_gemm(normal, 4096, 4096, K, 1, 0).grid > full // 2
    finally:
        cupygemm.reset_num_sms(1)
    assert plan_gemm(normal, 4096, 4096, K, 1, 1).grid > full // 2


# ---- two processes, NCCL --------------------------------------------------------------------------------------

HIDDEN, INTER, TOKENS, EXPERTS_PER_RANK, TOPK = 1024, 512, 512, 4, 2


def _rank(rank: int, world: int, port: int, results) -> None:
    import torch
    import torch.distributed as dist

    from cupygemm.bench import parallel

    torch.cuda.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    try:
        torch.manual_seed(rank)
        x = torch.randn((TOKENS, HIDDEN), device="cuda").bfloat16()
        gathered = torch.empty((world * TOKENS, HIDDEN), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(gathered, x)
        xq = parallel.dequant_tokens(*cupygemm.per_token_cast_to_fp8(gathered))
        w1, w2 = parallel.expert_bf16(0, HIDDEN, INTER, x.device)
        shard = parallel.tp_shard(w1, w2, rank, world)
        # column-parallel alone: this rank's slice of every token's output features
        col = parallel.column_parallel(*cupygemm.per_token_cast_to_fp8(x), shard.w1, shard.s1)
        col_want = xq @ parallel.dequant_blocks(shard.w1, shard.s1).T
        # row-parallel alone: every token's partial sums over this rank's input features, reduce_scattered
        part = INTER // world
        h = torch.randn((world * TOKENS, INTER), device="cuda", generator=torch.Generator("cuda").manual_seed(5))
        hq, hs = cupygemm.per_token_cast_to_fp8(h[:, rank * part:(rank + 1) * part].bfloat16().contiguous())
        row = parallel.row_parallel(hq, hs, shard.w2, shard.s2)
        w2q = parallel.dequant_blocks(*cupygemm.per_block_cast_to_fp8(w2))
        hq_full = parallel.dequant_tokens(*cupygemm.per_token_cast_to_fp8(h.bfloat16()))
        row_want = (hq_full @ w2q.T)[rank * TOKENS:(rank + 1) * TOKENS]
        mlp = parallel.tp_mlp(x, shard)
        mlp_want = parallel.mlp_reference(xq, parallel.dequant_blocks(*cupygemm.per_block_cast_to_fp8(w1)),
                                          w2q)[rank * TOKENS:(rank + 1) * TOKENS]
        idx, w = parallel.route(x, EXPERTS_PER_RANK * world, TOPK)
        experts = parallel.make_experts(rank * EXPERTS_PER_RANK, EXPERTS_PER_RANK, HIDDEN, INTER, x.device)
        moe = parallel.ep_moe(x, idx, w, experts)
        moe_want = parallel.moe_reference(x, idx, w, EXPERTS_PER_RANK * world, HIDDEN, INTER)
        diffs = {name: float(parallel.calc_diff(got, want)) for name, got, want in
                 (("column", col, col_want), ("row", row, row_want), ("mlp", mlp, mlp_want), ("moe", moe, moe_want))}
        diffs.update(_dtensor_diffs(rank, world, x.device))
        results.put((rank, diffs))
    finally:
        dist.destroy_process_group()


def _dtensor_diffs(rank: int, world: int, device) -> dict[str, float]:
    """The dense GEMM on DTensor operands (cupygemm.torch.sharding's rules), column- and row-parallel, gathered and
    compared with the GEMM of the whole operands on this GPU."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    from cupygemm.bench import parallel

    mesh = init_device_mesh("cuda", (world,))
    g = torch.Generator(device="cuda").manual_seed(7)  # the same operands on every rank
    xq, xs = cupygemm.per_token_cast_to_fp8(torch.randn(256, HIDDEN, device=device, generator=g).bfloat16())
    wq, ws = cupygemm.per_block_cast_to_fp8(torch.randn(INTER, HIDDEN, device=device, generator=g).bfloat16())
    whole = cupygemm.gemm_fp8_fp8_bf16_nt((xq, xs), (wq, ws))

    def part(t, dim):  # this rank's shard of t along dim
        size = t.shape[dim] // world
        return DTensor.from_local(t.narrow(dim, rank * size, size).contiguous(), mesh, [Shard(dim)], run_check=False)

    def everywhere(t):
        return DTensor.from_local(t, mesh, [Replicate()], run_check=False)

    col = cupygemm.gemm_fp8_fp8_bf16_nt((everywhere(xq), everywhere(xs)), (part(wq, 0), part(ws, 0)))
    row = cupygemm.gemm_fp8_fp8_bf16_nt((part(xq, 1), part(xs, 1)), (part(wq, 1), part(ws, 1)))
    assert tuple(col.placements) == (Shard(1),) and tuple(row.placements) == (Partial(),)
    return {"dtensor_column": float(parallel.calc_diff(col.full_tensor(), whole)),
            "dtensor_row": float(parallel.calc_diff(row.full_tensor(), whole))}


def test_nccl_column_row_parallel_and_expert_parallel_against_one_device():
    pytest.importorskip("torch")
    import torch.multiprocessing as mp

    from cupygemm.bench import parallel

    results = mp.get_context("spawn").Queue()
    mp.start_processes(_rank, args=(2, parallel.free_port(), results), nprocs=2, start_method="spawn")
    got = dict(results.get(timeout=120) for _ in range(2))
    for rank, diffs in got.items():
        # column and row: one FP8 GEMM against the same quantized operands in float32; mlp and moe add the FP8
        # cast of the activations between their two GEMMs
        assert diffs["column"] < 1e-4 and diffs["row"] < 1e-4, (rank, diffs)
        assert diffs["mlp"] < 1e-3 and diffs["moe"] < 1e-3, (rank, diffs)
        # DTensor: the column split is the same products (only BF16 rounding of other tiles' orders may differ);
        # the row split sums two BF16-rounded partial products
        assert diffs["dtensor_column"] < 1e-6 and diffs["dtensor_row"] < 1e-4, (rank, diffs)
