"""FP8 layers over torch.distributed built on cupygemm's GEMMs: column- and row-parallel linears, a
tensor-parallel MLP (sequence-parallel: tokens sharded between the layers), and an expert-parallel MoE layer, with
float references to check them against. Used by ``cupygemm multigpu``, ``examples/torch_expert_parallel_moe.py``
and the multi-GPU tests; imports torch only when called.

Every layer keeps activations sharded by tokens between layers and moves FP8 bytes and their FP32 scales over NCCL
(as uint8: NCCL reduces no FP8) rather than BF16, so a dispatch carries about half the bytes:

* column-parallel: all_gather of the token shards' FP8 rows and scales, then each rank's slice of the output
  features (``gemm_fp8_fp8_bf16_nt``);
* row-parallel: each rank's slice of the input features gives partial sums of every output, which
  reduce_scatter adds up and hands each rank its tokens' rows of;
* expert-parallel MoE: per-token cast, all_to_all of each (token, expert) pair's FP8 row and scales to the rank
  holding the expert, each expert's rows padded to 128 for the contiguous grouped GEMM (gate and up projection,
  SiLU, down projection), all_to_all back and the weighted sum per token.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

import cupygemm

#: DeepSeek-V3's routed expert: hidden 7168, intermediate 2048.
HIDDEN, INTERMEDIATE = 7168, 2048
ALIGN = cupygemm.get_m_alignment_for_contiguous_layout()


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for the processes' rendezvous (MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torch() -> Any:
    import torch

    return torch


@dataclass
class Experts:
    """FP8 weights of ``count`` experts (global ids ``first`` ...): gate and up stacked ``w1`` [E, 2I, H], down
    ``w2`` [E, H, I], each with its 128x128 block scales."""

    first: int
    w1: Any
    s1: Any
    w2: Any
    s2: Any

    @property
    def count(self) -> int:
        return self.w1.shape[0]


def expert_bf16(e: int, hidden: int, inter: int, device: Any, seed: int = 0) -> tuple[Any, Any]:
    """Expert ``e``'s BF16 weights (w1 [2I, H], w2 [H, I]), the same on every rank (seeded by ``e``)."""
    torch = _torch()
    g = torch.Generator(device=device).manual_seed(seed * 100_003 + e)
    w1 = torch.randn((2 * inter, hidden), generator=g, device=device) / hidden ** 0.5
    w2 = torch.randn((hidden, inter), generator=g, device=device) / inter ** 0.5
    return w1.bfloat16(), w2.bfloat16()


def make_experts(first: int, count: int, hidden: int, inter: int, device: Any, seed: int = 0) -> Experts:
    """Experts ``first`` .. ``first + count - 1``, cast to FP8 (128x128 blocks)."""
    torch = _torch()
    w1s, s1s, w2s, s2s = [], [], [], []
    for e in range(first, first + count):
        w1, w2 = expert_bf16(e, hidden, inter, device, seed)
        q1, s1 = cupygemm.per_block_cast_to_fp8(w1)
        q2, s2 = cupygemm.per_block_cast_to_fp8(w2)
        w1s.append(q1), s1s.append(s1), w2s.append(q2), s2s.append(s2)
    return Experts(first, torch.stack(w1s), torch.stack(s1s), torch.stack(w2s), torch.stack(s2s))


def route(x: Any, num_experts: int, topk: int, seed: int = 0) -> tuple[Any, Any]:
    """(expert ids [T, topk] int64, weights [T, topk] float32 summing to 1) from a seeded random router."""
    torch = _torch()
    g = torch.Generator(device=x.device).manual_seed(seed + 7)
    gate = torch.randn((num_experts, x.shape[1]), generator=g, device=x.device) / x.shape[1] ** 0.5
    scores = (x.float() @ gate.T).softmax(dim=-1)
    w, idx = scores.topk(topk, dim=-1)
    return idx, w / w.sum(dim=-1, keepdim=True)


def _all_to_all(out: Any, inp: Any, out_sizes: list[int], in_sizes: list[int], group: Any) -> Any:
    torch = _torch()
    dist = torch.distributed
    if inp.dtype == torch.float8_e4m3fn:  # NCCL moves bytes; it has no FP8 type
        inp, out_bytes = inp.view(torch.uint8), out.view(torch.uint8)
        dist.all_to_all_single(out_bytes, inp, out_sizes, in_sizes, group=group)
        return out
    dist.all_to_all_single(out, inp, out_sizes, in_sizes, group=group)
    return out


def expert_ffn(q: Any, s: Any, local_e: Any, experts: Experts) -> Any:
    """The experts' FFN on FP8 rows ``q`` [R, H] (scales ``s``) whose local expert is ``local_e`` [R]: rows grouped
    by expert and padded to 128 for the contiguous grouped GEMMs; BF16 [R, H] in the rows' order."""
    torch = _torch()
    r, h = q.shape
    if r == 0:
        return torch.empty((0, h), dtype=torch.bfloat16, device=q.device)
    counts = torch.bincount(local_e, minlength=experts.count)
    padded = (counts + ALIGN - 1) // ALIGN * ALIGN
    starts = torch.cumsum(padded, 0) - padded
    order = torch.argsort(local_e, stable=True)
    sorted_e = local_e[order]
    rank_in_expert = torch.arange(r, device=q.device) - (torch.cumsum(counts, 0) - counts)[sorted_e]
    rows = starts[sorted_e] + rank_in_expert  # where each sorted row goes in the padded layout
    m = int(padded.sum())  # one host sync: the GEMMs' M
    a = torch.zeros((m, h), dtype=q.dtype, device=q.device)
    sa = torch.ones((m, s.shape[1]), dtype=torch.float32, device=q.device)
    m_indices = torch.full((m,), -1, dtype=torch.int32, device=q.device)
    a[rows], sa[rows], m_indices[rows] = q[order], s[order], sorted_e.int()
    hidden = cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (experts.w1, experts.s1), None, m_indices)
    inter = hidden.shape[1] // 2
    act = (torch.nn.functional.silu(hidden[:, :inter].float()) * hidden[:, inter:].float()).bfloat16()
    out = cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(cupygemm.per_token_cast_to_fp8(act),
                                                             (experts.w2, experts.s2), None, m_indices)
    result = torch.empty((r, h), dtype=torch.bfloat16, device=q.device)
    result[order] = out[rows]
    return result


def ep_moe(x: Any, idx: Any, weights: Any, experts: Experts, group: Any = None) -> Any:
    """Expert-parallel MoE on this rank's tokens ``x`` [T, H] BF16 routed to global experts ``idx`` [T, k] with
    ``weights``; rank r holds experts r * E .. (r + 1) * E - 1 (``experts``). BF16 [T, H]."""
    torch = _torch()
    dist = torch.distributed
    world = dist.get_world_size(group)
    t, h = x.shape
    k = idx.shape[1]
    q, s = cupygemm.per_token_cast_to_fp8(x)
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)  # pairs by expert, so by destination rank
    token = order // k
    expert = flat[order]
    send = torch.bincount(expert // experts.count, minlength=world)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    send_sizes, recv_sizes = send.tolist(), recv.tolist()  # the receive buffers' sizes
    n = sum(recv_sizes)
    rq = _all_to_all(torch.empty((n, h), dtype=q.dtype, device=x.device), q[token], recv_sizes, send_sizes, group)
    rs = _all_to_all(torch.empty((n, s.shape[1]), dtype=s.dtype, device=x.device), s[token], recv_sizes,
                     send_sizes, group)
    re = _all_to_all(torch.empty(n, dtype=torch.int64, device=x.device), expert % experts.count, recv_sizes,
                     send_sizes, group)
    y = expert_ffn(rq, rs, re, experts)
    back = _all_to_all(torch.empty((t * k, h), dtype=torch.bfloat16, device=x.device), y, send_sizes, recv_sizes,
                       group)
    out = torch.zeros((t, h), dtype=torch.float32, device=x.device)
    out.index_add_(0, token, back.float() * weights.reshape(-1)[order, None])
    return out.bfloat16()


def column_parallel(q: Any, s: Any, w: Any, sw: Any, group: Any = None) -> Any:
    """This rank's tokens' FP8 rows ``q`` [T, K] (scales ``s``) gathered from every rank, times this rank's output
    features ``w`` [N / world, K] (block scales ``sw``): BF16 [world * T, N / world]."""
    torch = _torch()
    dist = torch.distributed
    world = dist.get_world_size(group)
    gq = torch.empty((world * q.shape[0], q.shape[1]), dtype=torch.uint8, device=q.device)
    gs = torch.empty((world * s.shape[0], s.shape[1]), dtype=s.dtype, device=s.device)
    dist.all_gather_into_tensor(gq, q.view(torch.uint8), group=group)
    dist.all_gather_into_tensor(gs, s, group=group)
    return cupygemm.gemm_fp8_fp8_bf16_nt((gq.view(torch.float8_e4m3fn), gs), (w, sw))


def row_parallel(q: Any, s: Any, w: Any, sw: Any, group: Any = None) -> Any:
    """Every token's FP8 rows of this rank's input features ``q`` [world * T, K / world] times ``w`` [N, K / world]:
    partial sums, added up over the ranks by reduce_scatter; BF16 [T, N], this rank's tokens."""
    torch = _torch()
    dist = torch.distributed
    world = dist.get_world_size(group)
    partial = cupygemm.gemm_fp8_fp8_bf16_nt((q, s), (w, sw))
    out = torch.empty((partial.shape[0] // world, partial.shape[1]), dtype=partial.dtype, device=partial.device)
    dist.reduce_scatter_tensor(out, partial, group=group)
    return out


@dataclass
class TpShard:
    """This rank's FP8 slices of an MLP: ``w1`` [2 I / world, H] (its gate rows, then its up rows), ``w2``
    [H, I / world]."""

    w1: Any
    s1: Any
    w2: Any
    s2: Any


def tp_shard(w1: Any, w2: Any, rank: int, world: int) -> TpShard:
    """Rank ``rank``'s slices of BF16 ``w1`` [2I, H] (gate rows, then up rows) and ``w2`` [H, I], cast to FP8;
    I / world must be a multiple of 128 (each slice keeps whole scale blocks)."""
    torch = _torch()
    inter = w2.shape[1]
    part = inter // world
    if part % 128 or inter % world:
        raise ValueError(f"w2: the intermediate size {inter} split over {world} ranks must give multiples of 128")
    lo, hi = rank * part, (rank + 1) * part
    w1_r = torch.cat([w1[lo:hi], w1[inter + lo:inter + hi]]).contiguous()
    q1, s1 = cupygemm.per_block_cast_to_fp8(w1_r)
    q2, s2 = cupygemm.per_block_cast_to_fp8(w2[:, lo:hi].contiguous())
    return TpShard(q1, s1, q2, s2)


def tp_mlp(x: Any, shard: TpShard, group: Any = None) -> Any:
    """Tensor-parallel MLP on this rank's tokens ``x`` [T, H] BF16: column-parallel gate and up, SiLU, row-parallel
    down; BF16 [T, H], this rank's tokens."""
    torch = _torch()
    h = column_parallel(*cupygemm.per_token_cast_to_fp8(x), shard.w1, shard.s1, group)
    part = h.shape[1] // 2
    act = (torch.nn.functional.silu(h[:, :part].float()) * h[:, part:].float()).bfloat16()
    return row_parallel(*cupygemm.per_token_cast_to_fp8(act), shard.w2, shard.s2, group)


def dequant_tokens(q: Any, s: Any) -> Any:
    """FP8 rows ``q`` [T, K] times their 1x128 scales ``s``: float32."""
    return q.float() * s.repeat_interleave(128, dim=1)[:, :q.shape[1]]


def dequant_blocks(q: Any, s: Any) -> Any:
    """FP8 ``q`` [N, K] times its 128x128 block scales ``s``: float32."""
    return q.float() * s.repeat_interleave(128, dim=0)[:q.shape[0]].repeat_interleave(128, dim=1)[:, :q.shape[1]]


def calc_diff(x: Any, y: Any) -> float:
    """DeepGEMM's error metric, ``1 - 2 sum(x y) / sum(x^2 + y^2)``, on torch tensors in float64."""
    x, y = x.double(), y.double()
    den = float((x * x + y * y).sum())
    return 0.0 if den == 0 else 1.0 - 2.0 * float((x * y).sum()) / den


def mlp_reference(x: Any, w1: Any, w2: Any) -> Any:
    """``silu(x W1g^T) * (x W1u^T) W2^T`` in float32 from float weights (``w1`` gate rows, then up rows)."""
    torch = _torch()
    h = x.float() @ w1.float().T
    inter = w1.shape[0] // 2
    return (torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]) @ w2.float().T


def moe_reference(x: Any, idx: Any, weights: Any, num_experts: int, hidden: int, inter: int,
                  seed: int = 0) -> Any:
    """The MoE layer on one device in float32: every token's experts (their FP8 weights, dequantized) applied to
    its dequantized FP8 row, weighted and summed."""
    torch = _torch()
    xq = dequant_tokens(*cupygemm.per_token_cast_to_fp8(x))
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(num_experts):
        tok, slot = (idx == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        w1, w2 = expert_bf16(e, hidden, inter, x.device, seed)
        w1 = dequant_blocks(*cupygemm.per_block_cast_to_fp8(w1))
        w2 = dequant_blocks(*cupygemm.per_block_cast_to_fp8(w2))
        out.index_add_(0, tok, mlp_reference(xq[tok], w1, w2) * weights[tok, slot, None])
    return out
