"""``cupygemm multigpu``: the FP8 layers of :mod:`cupygemm.bench.parallel` over NCCL, one process per GPU
(torch.multiprocessing), against one GPU.

* expert-parallel MoE (DeepSeek-V3 experts, ``--experts-per-gpu`` per GPU, top-``--topk``) and the tensor-parallel
  MLP (column-parallel gate/up, row-parallel down), ms per forward, the slowest rank's: on one GPU at the same
  tokens per GPU (weak scaling: the per-GPU GEMM work is the same, the difference is the communication) and at the
  same total tokens (strong scaling: one GPU does all of it);
* overlap: on each GPU the expert GEMMs alone (gate/up then down, contiguous layout, the tokens of a balanced
  routing), the same while NCCL all_reduces run beside them (NCCL's own stream, started from a side stream), and
  again with ``set_num_sms`` leaving ``--spare-sms`` SMs to NCCL, then with the all_reduces on a communicator of
  their own whose kernels take at most ``--spare-sms`` CTAs (``ncclConfig_t`` maxCTAs, through
  ``ProcessGroupNCCL.Options``): the recipe for a GEMM beside background traffic; with the all_reduce times alone.

Needs torch with CUDA and at least two Hopper GPUs; says so in one line otherwise. ``--out FILE`` writes the
numbers with the device and the command as JSON.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any, Callable

from ..device import require_hopper_or_exit
from .options import help_text

PROGRAM = "cupygemm multigpu"


def _timed(fn: Callable[[], Any], iters: int, group: Any = None, align: bool = True) -> float:
    """ms per call of ``fn`` on the current stream (median of ``iters`` event pairs after two warm-up calls), the
    slowest rank's. ``align``: start after a barrier (not while collectives are queued: it would wait for them)."""
    import torch
    import torch.distributed as dist

    for _ in range(2):
        fn()
    if align:
        torch.cuda.synchronize()
        dist.barrier(group=group)
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    t = torch.tensor([statistics.median(times)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t)


def _layers(world: int, rank: int, tokens: int, experts: int, args: argparse.Namespace) -> dict[str, float]:
    """ms per forward of the EP MoE (``experts`` per GPU) and the TP MLP on ``tokens`` tokens per GPU."""
    import torch

    from . import parallel

    x = torch.randn((tokens, parallel.HIDDEN), device="cuda", generator=torch.Generator("cuda").manual_seed(rank))
    x = x.bfloat16()
    idx, w = parallel.route(x, experts * world, args.topk)
    local = parallel.make_experts(rank * experts, experts, parallel.HIDDEN, parallel.INTERMEDIATE, x.device)
    ep = _timed(lambda: parallel.ep_moe(x, idx, w, local), args.iters)
    w1, w2 = parallel.expert_bf16(0, parallel.HIDDEN, parallel.INTERMEDIATE, x.device)
    shard = parallel.tp_shard(w1, w2, rank, world)
    tp = _timed(lambda: parallel.tp_mlp(x, shard), args.iters)
    return {"tokens_per_gpu": tokens, "experts_per_gpu": experts, "ep_moe_ms": ep, "tp_mlp_ms": tp}


def _overlap(world: int, rank: int, args: argparse.Namespace) -> dict[str, float]:
    """The expert GEMMs of one rank alone, beside NCCL all_reduces, and beside them with SMs left to NCCL."""
    import torch
    import torch.distributed as dist

    import cupygemm

    from . import parallel

    e = args.experts_per_gpu
    rows = -(-args.tokens * args.topk // e // 128) * 128  # each expert's rows of a balanced routing, padded
    experts = parallel.make_experts(rank * e, e, parallel.HIDDEN, parallel.INTERMEDIATE, torch.device("cuda"))
    x = torch.randn((rows * e, parallel.HIDDEN), device="cuda").bfloat16()
    a = cupygemm.per_token_cast_to_fp8(x)
    act = cupygemm.per_token_cast_to_fp8(torch.randn((rows * e, parallel.INTERMEDIATE), device="cuda").bfloat16())
    m_indices = torch.arange(e, device="cuda", dtype=torch.int32).repeat_interleave(rows)

    def gemms() -> None:
        cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(a, (experts.w1, experts.s1), None, m_indices)
        cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(act, (experts.w2, experts.s2), None, m_indices)

    buf = torch.ones(args.allreduce_mib << 18, device="cuda")  # float32: MiB * 2^18 elements
    alone = _timed(gemms, args.iters)
    nccl = _timed(lambda: dist.all_reduce(buf), args.iters)
    side = torch.cuda.Stream()

    def beside(group: Any = None) -> float:
        # enough all_reduces to outlast the timed GEMMs, queued first on a stream of their own
        count = int((alone * (args.iters + 2)) / max(nccl, 1e-3)) + 2
        gemms()
        torch.cuda.synchronize()
        dist.barrier()
        with torch.cuda.stream(side):
            for _ in range(count):
                dist.all_reduce(buf, group=group)
        t = _timed(gemms, args.iters, align=False)
        torch.cuda.synchronize()
        return t

    with_nccl = beside()
    full = cupygemm.get_num_sms()
    cupygemm.set_num_sms(full - args.spare_sms)
    try:
        fewer = beside()
        fewer_alone = _timed(gemms, args.iters)
        # The recipe: the background collective on a communicator of its own held to the spare SMs' worth of CTAs
        # (ncclConfig_t maxCTAs), the GEMMs on the rest; the layers' communicator keeps NCCL's defaults.
        limited, why = _limited_group(dist, args.spare_sms)
        if limited is not None:
            nccl_limited = _timed(lambda: dist.all_reduce(buf, group=limited), args.iters)
            fewer_limited = beside(limited)
    finally:
        cupygemm.reset_num_sms()
    out = {"rows_per_expert": rows, "gemm_alone_ms": alone, "allreduce_alone_ms": nccl,
           "allreduce_mib": args.allreduce_mib, "gemm_with_nccl_ms": with_nccl,
           "num_sms_reduced": full - args.spare_sms, "gemm_reduced_sms_alone_ms": fewer_alone,
           "gemm_reduced_sms_with_nccl_ms": fewer}
    if limited is not None:
        out |= {"nccl_max_ctas": args.spare_sms, "allreduce_limited_alone_ms": nccl_limited,
                "gemm_reduced_sms_with_limited_nccl_ms": fewer_limited}
    else:
        out["limited_nccl"] = why
    return out


def _limited_group(dist: Any, ctas: int) -> tuple[Any, str | None]:
    """A new NCCL communicator of every rank whose kernels use at most ``ctas`` CTAs (None and why, where this
    torch cannot say so)."""
    options = dist.ProcessGroupNCCL.Options()
    config = getattr(options, "config", None)
    if config is None or not hasattr(config, "max_ctas"):
        return None, "this torch's ProcessGroupNCCL.Options has no config.max_ctas"
    config.max_ctas = config.min_ctas = ctas
    return dist.new_group(backend="nccl", pg_options=options), None


def _worker(rank: int, world: int, port: int, gpus: int, args: argparse.Namespace, results: Any) -> None:
    import os

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    try:
        out: dict[str, Any] = {"world": world}
        # same tokens per GPU (weak); on one GPU also all GPUs' tokens and experts (strong)
        out["weak"] = _layers(world, rank, args.tokens, args.experts_per_gpu, args)
        if world == 1:
            out["strong"] = _layers(1, rank, args.tokens * gpus, args.experts_per_gpu * gpus, args)
        else:
            out["overlap"] = _overlap(world, rank, args)
        if rank == 0:
            results.put(out)
    except BaseException as e:
        if rank == 0:
            results.put({"error": f"{type(e).__name__}: {e}"})
        raise
    finally:
        dist.destroy_process_group()


def _spawn(world: int, gpus: int, args: argparse.Namespace) -> dict[str, Any]:
    import torch.multiprocessing as mp

    from .parallel import free_port

    port = free_port()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    mp.start_processes(_worker, args=(world, port, gpus, args, results), nprocs=world, start_method="spawn")
    out = results.get(timeout=60)
    if "error" in out:
        raise RuntimeError(out["error"])
    return out


def run(args: argparse.Namespace) -> int:
    info = require_hopper_or_exit(PROGRAM)
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print(f"{PROGRAM}: needs PyTorch with CUDA (pip install torch)", file=sys.stderr)
        return 2
    if not dist.is_available() or not dist.is_nccl_available():
        print(f"{PROGRAM}: this PyTorch has no NCCL (torch.distributed); install a CUDA build of torch",
              file=sys.stderr)
        return 2
    visible = torch.cuda.device_count()
    if args.gpus < 2 or visible < args.gpus:
        print(f"{PROGRAM}: needs {max(args.gpus, 2)} GPUs, {visible} visible", file=sys.stderr)
        return 2
    one, many = _spawn(1, args.gpus, args), _spawn(args.gpus, args.gpus, args)
    weak = {k: one["weak"][k] / many["weak"][k] for k in ("ep_moe_ms", "tp_mlp_ms")}
    strong = {k: one["strong"][k] / many["weak"][k] for k in ("ep_moe_ms", "tp_mlp_ms")}
    print(f"{info.name} x {args.gpus}, {args.tokens} tokens per GPU, {args.experts_per_gpu} experts per GPU, "
          f"top-{args.topk}; ms per forward (slowest rank)")
    print("| layer | 1 GPU, same tokens/GPU | 1 GPU, same total | "
          f"{args.gpus} GPUs | weak eff. | strong speed-up |\n|---|---|---|---|---|---|")
    for key, name in (("ep_moe_ms", "EP MoE"), ("tp_mlp_ms", "TP MLP")):
        print(f"| {name} | {one['weak'][key]:.3f} | {one['strong'][key]:.3f} | {many['weak'][key]:.3f} | "
              f"{weak[key]:.2f} | {strong[key]:.2f} |")
    o = many["overlap"]
    print(f"expert GEMMs per GPU ({args.experts_per_gpu} x {o['rows_per_expert']} rows): alone "
          f"{o['gemm_alone_ms']:.3f} ms, beside NCCL all_reduce ({args.allreduce_mib} MiB, "
          f"{o['allreduce_alone_ms']:.3f} ms alone) {o['gemm_with_nccl_ms']:.3f} ms; with set_num_sms("
          f"{o['num_sms_reduced']}): alone {o['gemm_reduced_sms_alone_ms']:.3f} ms, beside NCCL "
          f"{o['gemm_reduced_sms_with_nccl_ms']:.3f} ms" + (
              f", beside NCCL on a communicator of at most {o['nccl_max_ctas']} CTAs (its all_reduce "
              f"{o['allreduce_limited_alone_ms']:.3f} ms alone) {o['gemm_reduced_sms_with_limited_nccl_ms']:.3f} ms "
              f"({o['gemm_reduced_sms_with_limited_nccl_ms'] / o['gemm_alone_ms']:.3f}x the GEMMs alone)"
              if "nccl_max_ctas" in o else f"; {o['limited_nccl']}"))
    if args.out:
        from .overhead import environment

        with open(args.out, "w") as f:
            json.dump({"device": info.name, "gpus": args.gpus,
                       "command": " ".join([PROGRAM] + sys.argv[2:]), "environment": environment(),
                       "tokens_per_gpu": args.tokens, "experts_per_gpu": args.experts_per_gpu, "topk": args.topk,
                       "iters": args.iters, "one_gpu": one, "multi_gpu": many, "weak_efficiency": weak,
                       "strong_speedup": strong}, f, indent=1)
    return 0


def add_parser(sub: Any) -> None:
    sp = sub.add_parser("multigpu", help="expert-parallel MoE and tensor-parallel MLP over NCCL, GEMM/NCCL "
                        "overlap: N GPUs against one", description=help_text(__doc__),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("--gpus", type=int, default=2, help="processes, one per GPU (default 2)")
    sp.add_argument("--tokens", type=int, default=4096, help="tokens per GPU (default 4096)")
    sp.add_argument("--experts-per-gpu", type=int, default=8, help="routed experts per GPU (default 8)")
    sp.add_argument("--topk", type=int, default=8, help="experts per token (default 8, as DeepSeek-V3)")
    sp.add_argument("--iters", type=int, default=10, help="timed forwards; the median is reported (default 10)")
    sp.add_argument("--allreduce-mib", type=int, default=64, help="all_reduce size beside the GEMMs (default 64)")
    sp.add_argument("--spare-sms", type=int, default=4,
                    help="SMs left to NCCL in the last timings, and the CTAs of the limited communicator (default 4)")
    sp.add_argument("--out", metavar="FILE", help="write the numbers, the device and the command as JSON")
    sp.set_defaults(func=run)
