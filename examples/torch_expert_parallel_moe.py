"""An expert-parallel MoE layer and a tensor-parallel MLP with torch.distributed (NCCL) on cupygemm's FP8 GEMMs.

Run on two GPUs with ``torchrun --nproc-per-node 2 examples/torch_expert_parallel_moe.py`` or
``python examples/torch_expert_parallel_moe.py --spawn``.

DeepSeek-V3's routed experts (hidden 7168, intermediate 2048), 8 experts per GPU, 4096 tokens per GPU. Per rank:

1. the router picks ``--topk`` experts per token; the tokens are cast to FP8 per token (1x128 scales);
2. dispatch: ``all_to_all_single`` sends every (token, expert) pair's FP8 row and its scales (as bytes: NCCL has no
   FP8 type) to the rank holding the expert, after an all_to_all of the counts;
3. the received rows are grouped by local expert and padded to 128 rows for
   ``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous`` (gate and up projection), SiLU, FP8 cast, the down projection;
4. combine: ``all_to_all_single`` back, each token's expert outputs weighted and summed.

The tensor-parallel MLP is column-parallel gate and up (``all_gather`` of the FP8 token shards) and row-parallel
down (``reduce_scatter`` of the partial sums). Both layers live in ``cupygemm/bench/parallel.py`` (the
``cupygemm multigpu`` benchmark times them); this script runs them once and checks each rank's output against a
float32 single-device reference of the same layer.
"""
import cupygemm

cupygemm.device.require_hopper_or_exit()  # one clear line, not CuPy's driver error, where there is no Hopper GPU

import argparse  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from cupygemm.bench import parallel  # noqa: E402


def run(rank: int, world: int, args: argparse.Namespace) -> None:
    gpu = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(gpu)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", gpu))
    try:
        torch.manual_seed(rank)
        hidden, inter, tokens = args.hidden, args.intermediate, args.tokens
        num_experts = args.experts_per_gpu * world
        x = torch.randn((tokens, hidden), device="cuda").bfloat16()

        idx, weights = parallel.route(x, num_experts, args.topk)
        experts = parallel.make_experts(rank * args.experts_per_gpu, args.experts_per_gpu, hidden, inter, x.device)
        y = parallel.ep_moe(x, idx, weights, experts)
        moe_diff = parallel.calc_diff(y, parallel.moe_reference(x, idx, weights, num_experts, hidden, inter))

        w1, w2 = parallel.expert_bf16(0, hidden, inter, x.device, seed=1)  # the MLP's full weights
        mlp = parallel.tp_mlp(x, parallel.tp_shard(w1, w2, rank, world))
        every = torch.empty((world * tokens, hidden), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(every, x)
        want = parallel.mlp_reference(parallel.dequant_tokens(*cupygemm.per_token_cast_to_fp8(every)),
                                      parallel.dequant_blocks(*cupygemm.per_block_cast_to_fp8(w1)),
                                      parallel.dequant_blocks(*cupygemm.per_block_cast_to_fp8(w2)))
        mlp_diff = parallel.calc_diff(mlp, want[rank * tokens:(rank + 1) * tokens])
        print(f"rank {rank}: expert-parallel MoE ({args.experts_per_gpu} experts here, top-{args.topk}) "
              f"calc_diff {moe_diff:.2e}; tensor-parallel MLP calc_diff {mlp_diff:.2e}", flush=True)
        if max(moe_diff, mlp_diff) > 1e-3:
            raise SystemExit(f"rank {rank}: the layers differ from the reference")
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    run(rank, world, args)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spawn", action="store_true", help="start one process per GPU here instead of under torchrun")
    p.add_argument("--gpus", type=int, default=2, help="with --spawn: processes, one per GPU (default 2)")
    p.add_argument("--tokens", type=int, default=4096, help="tokens per GPU (default 4096)")
    p.add_argument("--hidden", type=int, default=parallel.HIDDEN)
    p.add_argument("--intermediate", type=int, default=parallel.INTERMEDIATE)
    p.add_argument("--experts-per-gpu", type=int, default=8)
    p.add_argument("--topk", type=int, default=8, help="experts per token (default 8, as DeepSeek-V3)")
    args = p.parse_args()
    if args.spawn:
        if torch.cuda.device_count() < args.gpus:
            raise SystemExit(f"--spawn: {args.gpus} GPUs needed, {torch.cuda.device_count()} visible")
        port = parallel.free_port()
        torch.multiprocessing.spawn(_spawned, args=(args.gpus, port, args), nprocs=args.gpus)
    else:  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)


if __name__ == "__main__":
    main()
