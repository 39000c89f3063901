"""Multi-GPU JAX layers on cupygemm.jax: an expert-parallel MoE layer (``shard_map`` + ``all_to_all`` + the masked
grouped GEMM) and a tensor-parallel MLP (plain ``jit`` over NamedShardings), with their float32 references and
their timings (used by ``examples/jax_expert_parallel_moe.py``).

MoE layer (:func:`ep_moe`), per device of the mesh axis (``D`` devices, ``E_l`` experts and ``T`` tokens a device):

1. Dispatch, each token to each device at most once: the device's tokens are quantized (1x128); a token goes to
   device ``j`` when any of its top-k experts lives there. Its payload row (the FP8 row's bytes, its scales, its
   top-k expert ids and weights, all as int32 words) is placed in block ``j`` of a ``[D, T, W]`` buffer, in token
   order, and one ``lax.all_to_all`` exchanges the blocks. A block has a slot for every token of its source, so
   nothing overflows and nothing is dropped (no capacity factor); unused slots are zero rows naming expert -1.
2. Experts: the receiving device lays its (received token, local expert) pairs out as the masked grouped GEMM's
   ``[E_l, M, H]`` (expert ``e``'s pairs in its first ``masked_m[e]`` rows, source then token order; ``masked_m``
   the exact counts, ``expected_m`` their average ``T * topk / E_l``) and runs the expert FFN on it (an argument:
   :func:`cupygemm_ffn`, gate/up GEMM, SiLU(gate)*up, cast, down GEMM; tests pass a ``jnp`` one).
3. Combine: each received token's outputs over this device's experts, weighted by its routing weights, are summed
   in float32 into one row, sent back in BF16 by a second all_to_all into the slots it came from; the source sums
   its ``D`` partial rows in float32. BF16 on the wire: the expert outputs are BF16 GEMM results already, and the
   partial sum's one more BF16 rounding (2^-9 relative) is far below the FP8 operands' error, at half the bytes of
   float32.

Slots per expert: exactness needs ``M = D * T`` (one expert may receive every token), and every XLA op around the
GEMMs (the gather into the layout, the GEMM outputs' zero-fill, SiLU, the cast) runs over all ``M`` rows whatever the
counts, while the GEMMs stop at ``masked_m``. With ``slots < D * T`` the layer therefore traces the expert step for
both ``M = slots`` and ``M = D * T`` and ``lax.cond`` runs the first when every count fits and the second otherwise:
always exact, the padded work that of ``slots`` in the common case. On GPU XLA's conditional (outside a command
buffer) copies its predicate to the host and waits for it: one synchronization a call, once the dispatch has
arrived. ``D = 1`` is the same code: its all_to_alls move nothing off the device.

Chunks (``chunks = C > 1``): the device's tokens are split into ``C`` chunks, and steps 1 to 3 run per chunk, each
chunk's own all_to_alls and GEMMs (``M`` per chunk: ``D * T / C`` exact). Nothing of chunk i+1's dispatch depends on
chunk i's GEMMs, nor chunk i's combine on chunk i+1's, so XLA's latency-hiding scheduler can run those all_to_alls
(async on GPU, on their own stream) under the GEMMs: only the first dispatch and the last combine stay exposed. The
layout choice then moves before the dispatch: a ``[C, E]`` histogram of the routing, summed over the devices by one
small all-reduce, is every receiver's ``masked_m`` of every chunk, so one ``lax.cond`` picks ``slots`` (all chunks,
all devices fit) or the exact layout for the whole call, holding the chunks' collectives in its branches (every
device takes the same one); its one host round trip comes first, before the GPU has work queued, instead of once a
chunk between its dispatch and its GEMMs. ``C = 1`` is the unchunked layer above, per-device cond included.

Overlap (``overlap="local"`` or ``"split"``, issue 47): a device's own tokens need no communication for its own
experts. The layer runs them as expert steps of their own (rows: the own tokens in place, no gather; partial rows
float32, never on the wire) and only the other devices' tokens go through the dispatch (the own block empty) into a
remote step (exact ``(D - 1) * T`` rows an expert; each step's small layout the same fraction of ``slots`` as of
``D * T``). Order: dispatch start, the own tokens' step (with ``"split"``: their first half), the remote step, the
combine start, the second half. ``lax.optimization_barrier`` ties the remote step to the first local part and the
second half to the remote step: nothing else orders them, and XLA's scheduler could otherwise put the local GEMMs
after the remote ones. What hides the collectives is XLA's latency-hiding scheduler moving each async start above
and its done below the independent local GEMMs; the compiled HLO (:func:`schedule_summary`) shows where they land.
A collective's kernels need SMs while a persistent GEMM holds them all (benchmarks/NOTES.md, "Multi-GPU"): leave
some (``set_num_sms``, ``sms=`` in :func:`parse_variant`; NCCL_MAX_NCHANNELS) or move the bytes with the copy
engines (XLA's ``--xla_gpu_use_memcpy_local_p2p``). ``transport="ppermute"``: ``D - 1`` collective-permutes each way
(shift j: to device ``me + j``) instead of one all_to_all, no own block at all; for D = 2 one of them. General for
any D; the overlap only pays where the local part is large (few devices, or routing that favours local experts).

Layout choice (``decide``): ``"after"`` puts a ``lax.cond`` on each expert step's counts (one host round trip each
on GPU, outside command buffers); ``"before"`` makes one choice for all steps of all devices from an all-gathered
``[D, parts, E]`` routing histogram before the dispatch, the cond at the start holding the collectives (every
device takes the same branch); ``"never"`` runs the exact layout without a cond (more padded rows around the GEMMs).
Unchunked and not overlapped, ``"before"`` is the chunked path's one decision with one chunk.

Bytes: the fixed-shape all_to_all moves a whole block to every device, used or not, so each device sends
``(D - 1) * T`` payload rows of ``H + 4 * ceil(H / 128) + 8 * topk`` bytes and gets ``(D - 1) * T`` BF16 rows of
``2 * H`` bytes back: in bytes an all-gather of the FP8 tokens, which is what top-8 of 16 experts on 2 devices
needs anyway (almost every token has an expert on both). ``lax.ragged_all_to_all`` would send each block's used
rows only (the counts are known before the exchange); it pays off with more devices or more local routing, and is
not used here because the fixed-shape all_to_all runs on every backend (XLA's CPU one included, where the tests
run this layer).

TP MLP: ``y = down(silu(x @ Wg.T) * (x @ Wu.T))`` with the up-projection column-parallel (its N sharded: each
device its slice of the intermediate features, no collective) and the down-projection row-parallel (its K sharded:
a partial product per device, summed by one all-reduce), activations replicated; every op is cupygemm's, the
shardings those of :mod:`cupygemm.jax.sharding`'s rules.
"""
from __future__ import annotations

import math
import re
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import cupygemm.jax as cj

_BLOCK = 128

#: The experts' FFN as :func:`ep_moe` calls it: ``ffn(a, sfa, masked_m, params) -> out``, ``a`` float8_e4m3fn
#: ``[E_l, M, H]``, ``sfa`` float32 ``[E_l, M, ceil(H/128)]``, ``masked_m`` int32 ``[E_l]`` (expert ``e``'s tokens
#: are its first ``masked_m[e]`` rows), ``params`` this device's expert weights; ``out`` ``[E_l, M, H]`` (BF16 or
#: float32), of which rows past ``masked_m`` are never read. An FFN may carry ``for_expected_m(m) -> ExpertFFN``: the
#: same FFN for an expert step whose average count is ``m`` (a config hint; the overlapped layer's steps differ).
ExpertFFN = Callable[[jax.Array, jax.Array, jax.Array, Any], jax.Array]


def _silu_glu(h: jax.Array) -> jax.Array:
    half = h.shape[-1] // 2
    g, u = h[..., :half].astype(jnp.float32), h[..., half:].astype(jnp.float32)
    return g * jax.nn.sigmoid(g) * u


def route(logits: jax.Array, topk: int) -> dict[str, jax.Array]:
    """Top-k routing of ``logits`` [tokens, E]: each token's experts (int32) and weights (softmax of the top
    logits)."""
    weights, experts = lax.top_k(logits, topk)
    return {"experts": experts.astype(jnp.int32), "weights": jax.nn.softmax(weights, axis=-1)}


def moe_params(devices: int, experts_per_device: int, hidden: int, inter: int, seed: int = 0) -> dict[str, Any]:
    """Quantized expert weights [E, 2 * inter, hidden] (gate and up) and [E, hidden, inter], and their float32
    values (the reference's)."""
    e = devices * experts_per_device
    k1, k2 = jax.random.split(jax.random.key(seed))
    w_up = jax.random.normal(k1, (e, 2 * inter, hidden), jnp.float32) / math.sqrt(hidden)
    w_down = jax.random.normal(k2, (e, hidden, inter), jnp.float32) / math.sqrt(inter)
    up_q, up_s = jax.vmap(cj.per_block_cast_to_fp8)(w_up)
    down_q, down_s = jax.vmap(cj.per_block_cast_to_fp8)(w_down)
    return {"up": (up_q, up_s), "down": (down_q, down_s), "w_up": w_up, "w_down": w_down}


def cupygemm_ffn(expected_m: int) -> ExpertFFN:
    """The experts' SwiGLU FFN on cupygemm.jax's masked grouped GEMMs, ``params = (up_q, up_s, down_q, down_s)``
    (gate and up fused [E_l, 2I, H], down [E_l, H, I], 128x128-block scales): the gate/up GEMM, SiLU(gate) * up in
    float32 rounded to BF16 (the cast's input; half the bytes of float32 over all ``M`` rows, and the 1x128 FP8 cast
    after it rounds far coarser), the cast, the down GEMM. ``expected_m``: the GEMMs' config hint (the average
    count)."""

    def ffn(a: jax.Array, sfa: jax.Array, masked_m: jax.Array, params: Any) -> jax.Array:
        up_q, up_s, down_q, down_s = params
        g, m, _ = a.shape
        h = cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(a, sfa, up_q, up_s, masked_m, expected_m)
        aq, asf = cj.per_token_cast_to_fp8(_silu_glu(h).astype(jnp.bfloat16).reshape(g * m, -1))
        return cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(aq.reshape(g, m, -1), asf.reshape(g, m, -1), down_q, down_s,
                                                        masked_m, expected_m)

    ffn.for_expected_m = cupygemm_ffn  # an expert step of another average count (the overlapped layer's parts)
    return ffn


def _words(x: jax.Array) -> jax.Array:
    """The rows of ``x`` [n, c] (1- or 4-byte items) as int32 words: one payload for the all_to_all, and 4-byte
    elements for XLA's row gathers."""
    n, c = x.shape
    per = 4 // np.dtype(x.dtype).itemsize
    return lax.bitcast_convert_type(x.reshape(n, c // per, per) if per > 1 else x, jnp.int32)


def _unwords(w: jax.Array, dtype: Any) -> jax.Array:
    """``_words`` undone: int32 words [n, c] as ``dtype`` [n, c * 4 / itemsize]."""
    return lax.bitcast_convert_type(w, dtype).reshape(w.shape[0], -1)


def dispatch_slots(experts: jax.Array, devices: int, experts_per_device: int,
                   skip: jax.Array | int | None = None) -> tuple[jax.Array, ...]:
    """Where a device's tokens go, from their experts [T, topk] (device ``j`` holds experts ``j * E_l`` ...):
    ``needs`` bool [T, D] (an expert of token t is on device j), ``slot`` int32 [T, D] (its row in block j: its rank
    among the tokens that need j; meaningless where not needed) and ``src`` int32 [D, T] (the token in block j's row
    p, ``T`` for an unused row). ``skip``: a device no token is sent to (its block all unused rows; the overlapped
    layer's own device, whose experts run on the tokens in place)."""
    t = experts.shape[0]
    dest = experts // experts_per_device
    needs = jnp.any(dest[:, :, None] == jnp.arange(devices, dtype=dest.dtype), axis=1)
    if skip is not None:
        needs = needs & (jnp.arange(devices) != skip)
    slot = jnp.cumsum(needs.astype(jnp.int32), axis=0) - 1
    flat = jnp.where(needs, jnp.arange(devices, dtype=jnp.int32) * t + slot, devices * t)
    tokens = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[:, None], (t, devices))
    src = jnp.full((devices * t,), t, jnp.int32).at[flat.reshape(-1)].set(tokens.reshape(-1), mode="drop")
    return needs, slot, src.reshape(devices, t)


def expert_slots(experts: jax.Array, first: jax.Array, experts_per_device: int) -> tuple[jax.Array, ...]:
    """The masked layout's bookkeeping for received rows' experts [R, topk] (global ids, -1 for an unused row) on
    the device holding experts ``first ...``: ``local`` int32 [R, topk] (the pair's local expert, ``E_l`` where the
    expert is elsewhere), ``rank`` int32 [R, topk] (the pair's row among its expert's, in row order) and
    ``counts`` int32 [E_l] (``masked_m``)."""
    el = experts_per_device
    local = experts - first
    local = jnp.where((local >= 0) & (local < el), local, el)
    onehot = (local.reshape(-1, 1) == jnp.arange(el, dtype=local.dtype)).astype(jnp.int32)
    rank = jnp.sum(jnp.cumsum(onehot, axis=0) * onehot, axis=1) - 1
    return local, rank.reshape(local.shape), jnp.sum(onehot, axis=0)


def _expert_step(m: int, ffn: ExpertFFN, experts_per_device: int, combine_dtype: Any) -> Callable:
    """The expert step with ``m`` slots per expert: ``(rq, rs, local, rank, rw, counts, params) -> partial rows``
    [R, H] (each received row's weighted sum over this device's experts; zero for rows with none here)."""
    el = experts_per_device

    def step(rq: jax.Array, rs: jax.Array, local: jax.Array, rank: jax.Array, rw: jax.Array, counts: jax.Array,
             params: Any) -> jax.Array:
        r, k = local.shape
        here = local < el
        flat = jnp.where(here, local * m + rank, el * m)  # the pair's row of the layout; elsewhere: past its end
        rows = jnp.broadcast_to(jnp.arange(r, dtype=jnp.int32)[:, None], (r, k))
        row_of = jnp.full((el * m,), r, jnp.int32).at[flat.reshape(-1)].set(rows.reshape(-1), mode="drop")
        a = _unwords(jnp.take(rq, row_of, axis=0, mode="fill", fill_value=0), jnp.float8_e4m3fn)
        sfa = jnp.take(rs, row_of, axis=0, mode="fill", fill_value=0)
        out = ffn(a.reshape(el, m, -1), sfa.reshape(el, m, -1), counts, params)
        out = out.reshape(el * m, out.shape[-1])
        # One gather per choice, summed as it goes: XLA fuses them into one pass that writes only the [R, H] sum.
        acc = jnp.zeros((r, out.shape[-1]), jnp.float32)
        for c in range(k):
            got = jnp.take(out, jnp.minimum(flat[:, c], el * m - 1), axis=0).astype(jnp.float32)
            acc = acc + jnp.where(here[:, c, None], rw[:, c, None] * got, 0.0)  # where: pad rows may hold anything
        return acc.astype(combine_dtype)

    return step


def chunk_bounds(tokens: int, chunks: int) -> list[tuple[int, int]]:
    """The token ranges of ``chunks`` chunks of ``tokens`` (sizes differing by at most one, none empty)."""
    if not 1 <= chunks <= tokens:
        raise ValueError(f"chunks: expected 1 to {tokens} (the tokens a device), got {chunks}")
    edges = [tokens * c // chunks for c in range(chunks + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _dispatch(x: jax.Array, experts: jax.Array, weights: jax.Array, axis: str, el: int) -> tuple:
    """Step 1 for tokens ``x`` [T, H]: the cast, the payload, the all_to_all; returns the received rows' operands of
    the expert step ``(rq, rs, local, rank, rw, counts)`` and what the combine needs at the source ``(needs,
    slot)``."""
    t, h = x.shape
    k = experts.shape[1]
    d = lax.axis_size(axis)
    q, s = cj.per_token_cast_to_fp8(x)
    hw, kb = h // 4, s.shape[1]
    needs, slot, src = dispatch_slots(experts, d, el)
    payload = jnp.concatenate([_words(q), _words(s), experts.astype(jnp.int32),
                               _words(weights.astype(jnp.float32))], axis=1)
    unused = jnp.zeros((1, payload.shape[1]), jnp.int32).at[0, hw + kb:hw + kb + k].set(-1)
    payload = jnp.concatenate([payload, unused])  # row T: what an unused slot receives
    recv = lax.all_to_all(payload[src], axis, 0, 0, tiled=True).reshape(d * t, -1)  # [source, slot] rows
    rq, rs = recv[:, :hw], _unwords(recv[:, hw:hw + kb], jnp.float32)
    rex, rw = recv[:, hw + kb:hw + kb + k], _unwords(recv[:, hw + kb + k:], jnp.float32)
    local, rank, counts = expert_slots(rex, lax.axis_index(axis) * el, el)
    return (rq, rs, local, rank, rw, counts), (needs, slot)


def _combine(partial: jax.Array, needs: jax.Array, slot: jax.Array, axis: str) -> jax.Array:
    """Step 3: the partial rows [D * T, H] back to their sources, summed there in float32 into y [T, H]."""
    d = lax.axis_size(axis)
    t, h = slot.shape[0], partial.shape[1]
    back = lax.all_to_all(partial.reshape(d, t, h), axis, 0, 0, tiled=True).reshape(d * t, h)
    y = jnp.zeros((t, h), jnp.float32)
    for j in range(d):
        got = jnp.take(back, j * t + jnp.maximum(slot[:, j], 0), axis=0).astype(jnp.float32)
        y = y + jnp.where(needs[:, j, None], got, 0.0)
    return y


#: ``overlap`` of :func:`ep_moe`: ``"none"`` (dispatch, experts, combine in a row), ``"local"`` (the device's own
#: tokens run on its experts while the other tokens are in flight), ``"split"`` (those in two halves: the first
#: under the dispatch, the second under the combine).
OVERLAPS = ("none", "local", "split")
#: ``decide`` of :func:`ep_moe`: when the layout (``slots`` or exact) is chosen. ``"after"``: each expert step on
#: its own counts, by a ``lax.cond`` once they are known (per device; one host round trip per cond on GPU);
#: ``"before"``: once for all steps and devices, from an all-gathered routing histogram before any dispatch (one
#: cond, at the start, holding the collectives); ``"never"``: the exact layout, no cond.
DECIDES = ("after", "before", "never")
#: ``transport`` of the overlapped layer: one ``all_to_all`` each way (the own block sent empty), or ``D - 1``
#: ``ppermute`` shifts each way (no own block at all; for D = 2 one collective-permute).
TRANSPORTS = ("all_to_all", "ppermute")


def _ffn_for(ffn: ExpertFFN, average: float) -> ExpertFFN:
    """``ffn`` for an expert step whose average count is ``average``: ``ffn.for_expected_m(m)`` where the FFN has
    one (:func:`cupygemm_ffn`: the GEMMs' config hint), else ``ffn`` itself."""
    make = getattr(ffn, "for_expected_m", None)
    return ffn if make is None else make(max(1, round(average)))


def part_slots(slots: int | None, rows: int, total: int) -> int:
    """Rows per expert of an expert step over ``rows`` candidate rows (``rows``: its exact layout) when the whole
    layer's small layout is ``slots`` rows for ``total``: the same fraction, rounded up, at most ``rows``."""
    return rows if slots is None else min(rows, -(-slots * rows // total))


def _step(operands: tuple, params: Any, ffn: ExpertFFN, el: int, out_dtype: Any, exact: int, small: int,
          average: float, choice: str) -> jax.Array:
    """One expert step on ``operands = (rq, rs, local, rank, rw, counts)``: the exact layout (``exact`` rows an
    expert), the small one (``small``), or (``choice == "cond"``) a ``lax.cond`` on its counts between them."""
    f = _ffn_for(ffn, average)
    if small >= exact or choice == "exact":
        return _expert_step(exact, f, el, out_dtype)(*operands, params)
    if choice == "small":
        return _expert_step(small, f, el, out_dtype)(*operands, params)
    return lax.cond(jnp.max(operands[-1]) <= small, _expert_step(small, f, el, out_dtype),
                    _expert_step(exact, f, el, out_dtype), *operands, params)


def _ep_overlap(x: jax.Array, experts: jax.Array, weights: jax.Array, params: Any, *, ffn: ExpertFFN, el: int,
                axis: str, slots: int | None, combine_dtype: Any, split: bool, decide: str,
                transport: str) -> jax.Array:
    """:func:`ep_moe` with ``overlap="local"`` or ``"split"`` (see the module docstring, "Overlap")."""
    t, h = x.shape
    k = experts.shape[1]
    d = lax.axis_size(axis)
    me = lax.axis_index(axis)
    e = d * el
    q, s = cj.per_token_cast_to_fp8(x)
    qw, w32 = _words(q), weights.astype(jnp.float32)
    hw, kb = qw.shape[1], s.shape[1]
    parts = chunk_bounds(t, 2) if split and t >= 2 else [(0, t)]
    share = k / e  # a token's chance of choosing a given expert: the average count is rows x share
    local_small = [part_slots(slots, b - a, d * t) for a, b in parts]
    r_exact = (d - 1) * t  # every other device's every token: one expert's most in the remote step
    r_small = part_slots(slots, r_exact, d * t)

    def local_operands(a: int, b: int) -> tuple:
        local, rank, counts = expert_slots(experts[a:b], me * el, el)
        return qw[a:b], s[a:b], local, rank, w32[a:b], counts

    def layer(choice: str) -> jax.Array:
        def local_part(i: int, operands: tuple) -> jax.Array:  # float32: these rows never go on the wire
            a, b = parts[i]
            return _step(operands, params, ffn, el, jnp.float32, b - a, local_small[i], (b - a) * share, choice)

        if d == 1:
            return jnp.concatenate([local_part(i, local_operands(a, b)) for i, (a, b) in enumerate(parts)])
        # Dispatch to the other devices only: this device's own block goes out empty (all_to_all) or not at all.
        needs, slot, src = dispatch_slots(experts, d, el, skip=me)
        payload = jnp.concatenate([qw, _words(s), experts.astype(jnp.int32), _words(w32)], axis=1)
        unused = jnp.zeros((1, payload.shape[1]), jnp.int32).at[0, hw + kb:hw + kb + k].set(-1)
        payload = jnp.concatenate([payload, unused])
        if transport == "all_to_all":
            recv = lax.all_to_all(payload[src], axis, 0, 0, tiled=True).reshape(d * t, -1)
        else:  # shift j: to device me + j, from device me - j
            recv = jnp.concatenate([
                lax.ppermute(jnp.take(payload, jnp.take(src, (me + j) % d, axis=0), axis=0), axis,
                             [(i, (i + j) % d) for i in range(d)]) for j in range(1, d)])
        first = local_part(0, local_operands(*parts[0]))
        # The barrier holds the remote step until the first local part is done: without it nothing orders the
        # two, and the scheduler may put the local GEMMs after the remote ones (nothing left under the dispatch).
        recv, first = lax.optimization_barrier((recv, first))
        rq, rs = recv[:, :hw], _unwords(recv[:, hw:hw + kb], jnp.float32)
        rex, rw = recv[:, hw + kb:hw + kb + k], _unwords(recv[:, hw + kb + k:], jnp.float32)
        local, rank, counts = expert_slots(rex, me * el, el)
        remote = (rq, rs, local, rank, rw, counts)
        partial = _step(remote, params, ffn, el, combine_dtype, r_exact, r_small, r_exact * share, choice)
        if transport == "all_to_all":
            y = _combine(partial, needs, slot, axis)
        else:  # shift j back: the rows device me - j sent come back to it; this device gets those of me + j
            y = jnp.zeros((t, h), jnp.float32)
            for j in range(1, d):
                back = lax.ppermute(partial[(j - 1) * t:j * t], axis, [(i, (i - j) % d) for i in range(d)])
                to = (me + j) % d
                got = jnp.take(back, jnp.maximum(jnp.take(slot, to, axis=1), 0), axis=0).astype(jnp.float32)
                y = y + jnp.where(jnp.take(needs, to, axis=1)[:, None], got, 0.0)
        ys = [first]
        if len(parts) > 1:
            # The second half waits for the remote step (the barrier), so that it runs while the combine is in
            # flight; the combine itself reads the remote partial rows from before the barrier.
            _, later = lax.optimization_barrier((partial, local_operands(*parts[1])))
            ys.append(local_part(1, later))
        return jnp.concatenate(ys) + y

    if decide != "before":
        return layer("exact" if decide == "never" else "cond")
    # One choice for all steps of all devices: each device's routing histogram per local part, all-gathered
    # ([D, P, E], tiny), gives every step's counts on every device before anything is sent.
    hist = jnp.stack([jnp.sum(experts[a:b].reshape(-1, 1) == jnp.arange(e, dtype=experts.dtype), axis=0)
                      for a, b in parts]).astype(jnp.int32)
    every = lax.all_gather(hist, axis) if d > 1 else hist[None]
    owner = jnp.arange(e) // el
    own = every[owner, :, jnp.arange(e)]  # [E, P]: expert e's count from its own device's tokens, per part
    fits = jnp.all(own <= jnp.asarray(local_small, jnp.int32))
    if d > 1:
        fits = fits & (jnp.max(jnp.sum(every, axis=(0, 1)) - jnp.sum(own, axis=1)) <= r_small)
    return lax.cond(fits, lambda: layer("small"), lambda: layer("exact"))


def ep_moe(x: jax.Array, experts: jax.Array, weights: jax.Array, params: Any, *, ffn: ExpertFFN,
           experts_per_device: int, axis: str = "ep", slots: int | None = None,
           combine_dtype: Any = jnp.bfloat16, chunks: int = 1, overlap: str = "none", decide: str | None = None,
           transport: str = "all_to_all") -> jax.Array:
    """One device's part of the expert-parallel MoE layer, inside ``shard_map`` over ``axis`` (see the module
    docstring): ``x`` [T, H] (BF16 or float32), its routing ``experts`` int32 [T, topk] (global ids; device ``j``
    holds experts ``j * E_l`` to ``(j + 1) * E_l - 1``) and ``weights`` [T, topk], ``params`` this device's expert
    weights as ``ffn`` takes them. Returns y [T, H] float32. ``slots``: the small layout's rows per expert, of one
    chunk (None or ``>= D`` x the largest chunk: only the exact one); ``combine_dtype``: the partial rows on the
    wire; ``chunks``: the tokens split into that many chunks, each dispatched, run and combined on its own (see the
    module docstring); ``overlap`` (:data:`OVERLAPS`), ``decide`` (:data:`DECIDES`; None: ``"after"`` unchunked,
    ``"before"`` chunked, its only choice) and ``transport`` (:data:`TRANSPORTS`, overlapped layers only): see
    the module docstring, "Overlap". ValueError for an unknown or unsupported combination."""
    t, h = x.shape
    el = experts_per_device
    d = lax.axis_size(axis)
    if h % 4:
        raise ValueError(f"x: expected a hidden size that is a multiple of 4 (FP8 rows sent as int32 words), got {h}")
    decide = ("after" if chunks == 1 else "before") if decide is None else decide
    for name, value, allowed in (("overlap", overlap, OVERLAPS), ("decide", decide, DECIDES),
                                 ("transport", transport, TRANSPORTS)):
        if value not in allowed:
            raise ValueError(f"{name}: expected one of {allowed}, got {value!r}")
    if overlap != "none":
        if chunks != 1:
            raise ValueError(f"overlap={overlap!r} runs unchunked: expected chunks=1, got {chunks}")
        return _ep_overlap(x, experts, weights, params, ffn=ffn, el=el, axis=axis, slots=slots,
                           combine_dtype=combine_dtype, split=overlap == "split", decide=decide,
                           transport=transport)
    if transport != "all_to_all":
        raise ValueError(f"transport={transport!r} needs an overlapped layer (overlap='local' or 'split')")
    bounds = chunk_bounds(t, chunks)
    small_ok = slots is not None and slots < d * max(b - a for a, b in bounds)
    if decide == "after":
        if chunks != 1:
            raise ValueError(f"decide='after' runs unchunked: with {chunks} chunks the choice comes before")
        operands, back = _dispatch(x, experts, weights, axis, el)
        exact = _expert_step(d * t, ffn, el, combine_dtype)
        if small_ok:  # each device for itself, once its rows have arrived
            small = _expert_step(slots, ffn, el, combine_dtype)
            partial = lax.cond(jnp.max(operands[-1]) <= slots, small, exact, *operands, params)
        else:
            partial = exact(*operands, params)
        return _combine(partial, *back, axis)

    def pipeline(m: int | None) -> Callable:
        """The C chunks in a row, each with ``m`` slots an expert (None: the exact ``D * T_c``). Chunk i's
        dispatch reads only its tokens and its combine only its own FFN's output: no edge between one chunk's
        collectives and another chunk's FFN, which leaves XLA's scheduler free to run chunk i+1's dispatch and
        chunk i-1's combine (async all_to_alls) while chunk i's GEMMs run."""

        def run(x, experts, weights, params):
            ys = []
            for a, b in bounds:
                operands, back = _dispatch(x[a:b], experts[a:b], weights[a:b], axis, el)
                step = _expert_step(d * (b - a) if m is None else m, ffn, el, combine_dtype)
                ys.append(_combine(step(*operands, params), *back, axis))
            return jnp.concatenate(ys)

        return run

    if decide == "never" or not small_ok:
        return pipeline(None)(x, experts, weights, params)
    # One decision for every chunk and every device, before any dispatch: expert e's count in chunk i is the
    # number of chunk-i tokens of all sources that chose it, so a [C, E] histogram of the routing summed over the
    # devices (one tiny all-reduce) gives every receiver's masked_m up front. The layout is then the same on every
    # device, which lets the cond hold the collectives (both branches' all_to_alls run on all devices or none),
    # and the one host round trip of the conditional comes at the start of the call, not between a chunk's
    # dispatch and its GEMMs (C times).
    e = d * el
    hist = jnp.stack([jnp.sum(experts[a:b].reshape(-1, 1) == jnp.arange(e, dtype=experts.dtype), axis=0)
                      for a, b in bounds])
    fits = jnp.max(lax.psum(hist.astype(jnp.int32), axis)) <= slots
    return lax.cond(fits, pipeline(slots), pipeline(None), x, experts, weights, params)


def moe_layer(mesh: Mesh, experts_per_device: int, ffn: ExpertFFN, slots: int | None = None,
              combine_dtype: Any = jnp.bfloat16, chunks: int = 1, overlap: str = "none", decide: str | None = None,
              transport: str = "all_to_all") -> Callable:
    """The jitted EP layer ``(x [D*T, H], experts [D*T, topk], weights [D*T, topk], params) -> y [D*T, H] f32``
    over the mesh axis ``"ep"``: tokens, routing and the experts' weights (each leaf of ``params``: experts first)
    sharded along it, :func:`ep_moe` on each device (the keywords are its own)."""

    def local(x, experts, weights, params):
        return ep_moe(x, experts, weights, params, ffn=ffn, experts_per_device=experts_per_device, axis="ep",
                      slots=slots, combine_dtype=combine_dtype, chunks=chunks, overlap=overlap, decide=decide,
                      transport=transport)

    spec = P("ep")
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 4, out_specs=spec, check_vma=False))


def moe_reference(x: jax.Array, routing: dict[str, jax.Array], params: dict[str, Any]) -> np.ndarray:
    """The layer in float32 on one device: every choice's expert FFN on the unquantized weights."""
    x = jnp.asarray(x, jnp.float32)
    hi = lax.Precision.HIGHEST
    y = jnp.zeros_like(x)
    for e in range(params["w_up"].shape[0]):
        coef = jnp.sum(jnp.where(routing["experts"] == e, routing["weights"], 0.0), axis=1)
        h = _silu_glu(jnp.dot(x, params["w_up"][e].T, precision=hi))
        y = y + coef[:, None] * jnp.dot(h, params["w_down"][e].T, precision=hi)
    return np.asarray(y)


def ep_bytes(devices: int, tokens_per_device: int, hidden: int, topk: int) -> dict[str, int]:
    """Bytes each device sends to the others per call: the dispatch's payload rows (FP8 row, 1x128 scales, top-k
    ids and weights) and the combine's BF16 rows, ``T`` rows to each other device (the fixed-shape all_to_all)."""
    row = hidden + 4 * -(-hidden // _BLOCK) + 8 * topk
    off = (devices - 1) * tokens_per_device
    return {"dispatch_bytes": off * row, "combine_bytes": off * 2 * hidden}


def mlp_params(hidden: int, ffn: int, seed: int = 1) -> dict[str, Any]:
    k1, k2 = jax.random.split(jax.random.key(seed))
    w_up = jax.random.normal(k1, (2 * ffn, hidden), jnp.float32) / math.sqrt(hidden)
    w_down = jax.random.normal(k2, (hidden, ffn), jnp.float32) / math.sqrt(ffn)
    return {"w_up": w_up, "w_down": w_down, "up": cj.per_block_cast_to_fp8(w_up),
            "down": cj.per_block_cast_to_fp8(w_down)}


def tp_mlp(mesh: Mesh, params: dict[str, Any]) -> tuple[Callable, tuple]:
    """The jitted TP MLP and its sharded weights ``(up_q, up_s, down_q, down_s)``: the up-projection's rows
    (gate rows then up rows, interleaved per device so that each device holds matching gate and up features)
    sharded, the down-projection's columns sharded."""
    d = mesh.shape["tp"]
    up_q, up_s = params["up"]
    ffn = up_q.shape[0] // 2
    if ffn % (d * _BLOCK):
        raise ValueError(f"ffn: expected a multiple of 128 x {d} devices, got {ffn}")

    def per_device(q):  # [gate; up] -> [gate_0; up_0; gate_1; up_1; ...]
        g, u = q[:ffn].reshape(d, ffn // d, -1), q[ffn:].reshape(d, ffn // d, -1)
        return jnp.concatenate([g, u], axis=1).reshape(2 * ffn, -1)

    up = (per_device(up_q), per_device(up_s.repeat(_BLOCK, 0)[:2 * ffn])[::_BLOCK])

    def mlp(x, up_q, up_s, down_q, down_s):
        q, s = cj.per_token_cast_to_fp8(x)
        h = cj.gemm_fp8_fp8_bf16_nt(q, s, up_q, up_s)  # N-sharded: [T, 2F] columns per device
        hd = h.reshape(h.shape[0], d, 2, ffn // d)
        h = jax.lax.with_sharding_constraint(hd, NamedSharding(mesh, P(None, "tp")))
        act = (jax.nn.silu(h[:, :, 0].astype(jnp.float32)) * h[:, :, 1].astype(jnp.float32)).reshape(h.shape[0], ffn)
        act = jax.lax.with_sharding_constraint(act, NamedSharding(mesh, P(None, "tp")))
        aq, asf = cj.per_token_cast_to_fp8(act)  # K-sharded cast
        return cj.gemm_fp8_fp8_bf16_nt(aq, asf, down_q, down_s)  # row-parallel: psum inside

    rows, cols, rep = (NamedSharding(mesh, P("tp")), NamedSharding(mesh, P(None, "tp")), NamedSharding(mesh, P()))
    weights = (jax.device_put(up[0], rows), jax.device_put(up[1], rows),
               jax.device_put(params["down"][0], cols), jax.device_put(params["down"][1], cols))
    return jax.jit(mlp, in_shardings=(rep, rows, rows, cols, cols), out_shardings=rep), weights


def mlp_reference(x: jax.Array, params: dict[str, Any]) -> np.ndarray:
    hi = lax.Precision.HIGHEST
    h = jnp.dot(jnp.asarray(x, jnp.float32), params["w_up"].T, precision=hi)
    return np.asarray(jnp.dot(_silu_glu(h), params["w_down"].T, precision=hi))


def moe_setup(devices: list, tokens_per_device: int, hidden: int, inter: int, experts_per_device: int, topk: int,
              slot_factor: float = 1.125, seed: int = 0, chunks: int = 1,
              **layer: Any) -> tuple[Callable, tuple, dict]:
    """The EP layer over ``devices`` on cupygemm's FFN in ``chunks`` chunks, with its sharded inputs ``(x, experts,
    weights, params)``. ``info``: the inputs and parameters for the reference, ``slots`` (the small layout's rows
    per expert of a chunk: ``slot_factor`` x the largest chunk's average count, in 128s, at most ``D * T_c``),
    ``counts`` per expert and ``chunk_counts`` per chunk and expert, ``max_count`` (the largest count of a chunk:
    the small layout runs when it is ``<= slots``), ``expected_m`` (a chunk's average), ``dropped`` (always 0) and
    the bytes each device sends (:func:`ep_bytes`). ``layer``: :func:`moe_layer`'s ``overlap``, ``decide``,
    ``transport``."""
    d = len(devices)
    mesh = Mesh(np.array(devices), ("ep",))
    e = d * experts_per_device
    kx, kr = jax.random.split(jax.random.key(seed + 7))
    x = jax.random.normal(kx, (d * tokens_per_device, hidden), jnp.float32).astype(jnp.bfloat16)
    routing = route(jax.random.normal(kr, (d * tokens_per_device, e), jnp.float32), topk)
    params = moe_params(d, experts_per_device, hidden, inter, seed)
    bounds = chunk_bounds(tokens_per_device, chunks)
    largest = max(b - a for a, b in bounds)
    average = largest * topk / experts_per_device  # a chunk's: the GEMMs run per chunk
    slots = min(d * largest, _BLOCK * math.ceil(slot_factor * average / _BLOCK))
    expected_m = max(1, round(average))
    shard = NamedSharding(mesh, P("ep"))
    args = (jax.device_put(x, shard), jax.device_put(routing["experts"], shard),
            jax.device_put(routing["weights"], shard),
            tuple(jax.device_put(v, shard) for v in (*params["up"], *params["down"])))
    f = moe_layer(mesh, experts_per_device, cupygemm_ffn(expected_m), slots, chunks=chunks, **layer)
    ex = np.asarray(routing["experts"]).reshape(d, tokens_per_device, topk)
    chunk_counts = np.stack([np.bincount(ex[:, a:b].ravel(), minlength=e) for a, b in bounds])  # distinct experts
    return f, args, {"x": x, "routing": routing, "params": params, "slots": slots, "counts": chunk_counts.sum(0),
                     "chunk_counts": chunk_counts, "chunks": chunks, "bounds": bounds,
                     "max_count": int(chunk_counts.max()), "expected_m": expected_m, "dropped": 0,
                     **ep_bytes(d, tokens_per_device, hidden, topk)}


def experts_ms(device: Any, info: dict, tokens_per_device: int, devices: int, experts_per_device: int,
               repeats: int = 20) -> float:
    """The expert FFN alone (:func:`cupygemm_ffn`) on ``device`` with the first device's layouts in the layer
    (per chunk its experts' counts as ``masked_m`` and the slots the layer's expert step runs with; the chunks' FFNs
    in one jitted call): the GEMM side of the layer's time, the rest being dispatch, layout, combine and the
    collectives that the chunks do not hide."""
    el = experts_per_device
    sizes = [b - a for a, b in info["bounds"]]
    # the layer's rule: with one chunk each device for itself, with more one layout for all chunks and devices
    fits = (info["chunk_counts"][:, :el] if len(sizes) == 1 else info["chunk_counts"]).max() <= info["slots"]
    ms = [info["slots"] if fits else devices * n for n in sizes]
    hidden = info["x"].shape[1]
    with jax.default_device(device):
        ops = []
        for m, counts in zip(ms, info["chunk_counts"]):
            x = jax.random.normal(jax.random.key(3), (el * m, hidden), jnp.float32).astype(jnp.bfloat16)
            a, sfa = cj.per_token_cast_to_fp8(x)
            ops.append((a.reshape(el, m, -1), sfa.reshape(el, m, -1), jnp.asarray(counts[:el], jnp.int32)))
        params = tuple(jax.device_put(v[:el], device) for v in (*info["params"]["up"], *info["params"]["down"]))
    ffn = cupygemm_ffn(info["expected_m"])
    return time_ms(jax.jit(lambda ops, params: [ffn(*o, params) for o in ops]), (ops, params), repeats)


def mlp_setup(devices: list, tokens: int, hidden: int, ffn: int, seed: int = 1) -> tuple[Callable, tuple, dict]:
    mesh = Mesh(np.array(devices), ("tp",))
    params = mlp_params(hidden, ffn, seed)
    f, weights = tp_mlp(mesh, params)
    x = jax.random.normal(jax.random.key(seed + 11), (tokens, hidden), jnp.float32).astype(jnp.bfloat16)
    return f, (jax.device_put(x, NamedSharding(mesh, P())), *weights), {"x": x, "params": params}


def time_ms(f: Callable, args: tuple, repeats: int = 20, warmup: int = 3) -> float:
    """Median wall time of ``f(*args)`` in ms (each call waited for)."""
    return float(np.median(_call_times(f, args, repeats, warmup)))


def bench(devices: list, tokens_per_device: int = 4096, hidden: int = 7168, inter: int = 2048,
          experts_per_device: int = 8, topk: int = 8, ffn: int = 18432, repeats: int = 20,
          slot_factor: float = 1.125, chunks: int = 1) -> dict[str, Any]:
    """Times the EP layer and the TP MLP on 1 and ``len(devices)`` devices: weak scaling (the same tokens a
    device) and strong scaling (the same total tokens, ``tokens_per_device`` x the largest count). Returns a dict
    (rows of ``layer, scaling, devices, tokens, ms``; the EP rows add the dispatch, the slots per expert and the
    largest count, the bytes each device sends, and ``experts_ms``: the first device's expert FFN alone,
    ``rest_ms`` the layer less that)."""
    counts = sorted({1, len(devices)})
    most = counts[-1]
    rows = []
    for scaling in ("weak", "strong"):
        for n in counts:
            per = tokens_per_device if scaling == "weak" else tokens_per_device * most // n
            f, args, info = moe_setup(devices[:n], per, hidden, inter, experts_per_device, topk, slot_factor,
                                      chunks=chunks)
            ms = time_ms(f, args, repeats)
            del f, args  # the layer's buffers, before the experts alone are timed
            alone = experts_ms(devices[0], info, per, n, experts_per_device, repeats)
            rows.append({"layer": "ep_moe", "scaling": scaling, "devices": n, "tokens": per * n,
                         "dropped": info["dropped"], "ms": ms, "dispatch": "dedup-per-device", "chunks": chunks,
                         "slots": info["slots"], "max_count": info["max_count"],
                         "dispatch_bytes": info["dispatch_bytes"], "combine_bytes": info["combine_bytes"],
                         "experts_ms": alone, "rest_ms": ms - alone})
            f, args, _ = mlp_setup(devices[:n], per * n if scaling == "weak" else tokens_per_device * most, hidden,
                                   ffn)
            rows.append({"layer": "tp_mlp", "scaling": scaling, "devices": n, "tokens": args[0].shape[0],
                         "ms": time_ms(f, args, repeats)})
    return {"device": getattr(devices[0], "device_kind", str(devices[0])), "devices": [str(d) for d in devices],
            "command": " ".join(sys.argv), "timing": "ms per call of the jitted layer (each call waited for), median of the repeats",
            "tokens_per_device": tokens_per_device, "hidden": hidden, "inter": inter,
            "experts_per_device": experts_per_device, "topk": topk, "ffn": ffn, "slot_factor": slot_factor,
            "chunks": chunks,
            "rows": rows}


def parse_variant(spec: str) -> dict[str, Any]:
    """A variant of the EP layer for :func:`variant_bench`, written as ``+``-joined words: an overlap
    (:data:`OVERLAPS`), a decide (:data:`DECIDES`), ``a2a`` or ``pp`` (the transport), ``sms=N`` (the GEMMs
    planned for N SMs on every device, :func:`cupygemm.set_num_sms`: SMs left to the collectives' kernels),
    ``chunks=C``. ``base`` (or ``none``) alone is the default layer. ValueError for an unknown word."""
    kw: dict[str, Any] = {"overlap": "none", "decide": None, "transport": "all_to_all", "sms": None, "chunks": 1}
    for word in spec.split("+"):
        if word in OVERLAPS:
            kw["overlap"] = word
        elif word in DECIDES:
            kw["decide"] = word
        elif word in ("a2a", "pp"):
            kw["transport"] = "all_to_all" if word == "a2a" else "ppermute"
        elif word.startswith(("sms=", "chunks=")) and word.split("=", 1)[1].isdigit():
            kw[word.split("=", 1)[0]] = int(word.split("=", 1)[1])
        elif word != "base":
            raise ValueError(f"variant {spec!r}: unknown word {word!r} (expected one of {OVERLAPS + DECIDES}, a2a, pp, "
                             f"sms=N, chunks=C or base)")
    return kw


#: Opcodes :func:`schedule_summary` keeps: the collectives (sync and async halves), conditionals, barriers, custom
#: calls (cupygemm's GEMMs and casts).
_EVENTS = ("all-to-all", "all-to-all-start", "all-to-all-done", "collective-permute", "collective-permute-start",
           "collective-permute-done", "all-gather", "all-gather-start", "all-gather-done", "all-reduce",
           "all-reduce-start", "all-reduce-done", "async-start", "async-done", "conditional", "opt-barrier",
           "custom-call", "send", "recv", "send-done", "recv-done")


def schedule_summary(hlo_text: str) -> dict[str, list[str]]:
    """The order of the collectives, conditionals, barriers and custom calls in each computation of a compiled
    (scheduled) HLO module's text, e.g. from ``jit(f).lower(*args).compile().as_text()``: a scheduled module lists
    each computation's instructions in their execution order, so this shows what XLA put between an async
    collective's start and done. Entries ``opcode name shape`` (custom calls: their result's shape) and ``(N other
    ops)`` (the count of other instructions between two entries); computations without any entry are left out."""
    out: dict[str, list[str]] = {}
    comp, between = None, 0
    for line in hlo_text.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head and not line.startswith(" "):
            comp, between = head.group(1), 0
            continue
        m = re.match(r"^\s+(?:ROOT )?%?([\w.\-]+) = (.*?) ([a-z][a-z0-9\-]*)\(", line)
        if comp is None or m is None:
            continue
        name, shape, op = m.groups()
        if op not in _EVENTS:
            between += op not in ("parameter", "constant", "get-tuple-element", "bitcast", "tuple")
            continue
        events = out.setdefault(comp, [])
        if between and events:
            events.append(f"({between} other ops)")  # fusions, copies: work that also runs between the events
        between = 0
        events.append(f"{op} {name}" + (f" {shape.split('{')[0]}" if op == "custom-call" else ""))
    return out


def variant_bench(devices: list, variants: list[str], tokens_per_device: int = 4096, hidden: int = 7168,
                  inter: int = 2048, experts_per_device: int = 8, topk: int = 8, repeats: int = 20, rounds: int = 3,
                  slot_factor: float = 1.125, counts: list[int] | None = None, dump: str | None = None,
                  ffn_factory: Callable[[int], ExpertFFN] = cupygemm_ffn, reference: bool = True,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Times EP layer variants (:func:`parse_variant`; the first one the baseline) on the same inputs, on each
    device count in ``counts`` (default 1 and ``len(devices)``): every variant compiled first, then ``rounds``
    rounds of ``repeats`` calls each, the variants in turn within a round (drift hits all alike); ``ms`` is the
    median of all of a variant's calls. Each variant's output is compared with the baseline's and (``reference``)
    with :func:`moe_reference` (``calc_diff``). ``dump``: a folder for each compiled module's text
    (``<variant>_d<n>.hlo.txt``); every row carries :func:`schedule_summary` of it either way. ``ffn_factory``:
    the expert FFN of an average count (tests pass a ``jnp`` one). Returns a dict with ``rows`` (one per variant and
    device count) and ``summary`` (per variant: ms on each count, weak scaling against its own and the baseline's
    one-device time)."""
    import os

    from cupygemm import reference as ref
    from cupygemm.device import reset_num_sms, set_num_sms

    counts = sorted(set(counts or {1, len(devices)}))
    el = experts_per_device
    parsed = {v: parse_variant(v) for v in variants}
    rows: list[dict[str, Any]] = []
    for n in counts:
        mesh = Mesh(np.array(devices[:n]), ("ep",))
        e = n * el
        kx, kr = jax.random.split(jax.random.key(7))
        x = jax.random.normal(kx, (n * tokens_per_device, hidden), jnp.float32).astype(jnp.bfloat16)
        routing = route(jax.random.normal(kr, (n * tokens_per_device, e), jnp.float32), topk)
        params = moe_params(n, el, hidden, inter)
        shard = NamedSharding(mesh, P("ep"))
        args = (jax.device_put(x, shard), jax.device_put(routing["experts"], shard),
                jax.device_put(routing["weights"], shard),
                tuple(jax.device_put(v, shard) for v in (*params["up"], *params["down"])))
        built = {}
        for v, kw in parsed.items():
            tc = tokens_per_device // kw["chunks"]
            average = tc * topk / el
            slots = min(n * tc, _BLOCK * math.ceil(slot_factor * average / _BLOCK))
            gpus = [int(dev.id if getattr(dev, "local_hardware_id", None) is None else dev.local_hardware_id)
                    for dev in devices[:n]] if kw["sms"] is not None else []
            for g in gpus:
                set_num_sms(kw["sms"], g)
            try:  # the GEMMs are planned when the layer is traced: lower and compile now, under this SM count
                f = moe_layer(mesh, el, ffn_factory(max(1, round(average))), slots, chunks=kw["chunks"],
                              overlap=kw["overlap"], decide=kw["decide"], transport=kw["transport"])
                compiled = f.lower(*args).compile()
            finally:
                for g in gpus:
                    reset_num_sms(g)
            text = compiled.as_text()
            if dump:
                os.makedirs(dump, exist_ok=True)
                with open(os.path.join(dump, f"{v.replace('=', '')}_d{n}.hlo.txt"), "w") as fh:
                    fh.write(text)
            built[v] = (compiled, slots, schedule_summary(text))
        want = None
        if reference:
            want = moe_reference(x, routing, params)
        base_y = None
        times: dict[str, list[float]] = {v: [] for v in variants}
        checks = {}
        for v in variants:
            y = np.asarray(jax.block_until_ready(built[v][0](*args)))
            base_y = y if base_y is None else base_y
            checks[v] = {"calc_diff_base": ref.calc_diff(y, base_y),
                         "calc_diff_ref": None if want is None else ref.calc_diff(y, want),
                         "finite": bool(np.isfinite(y).all())}
        for _ in range(rounds):
            for v in variants:
                times[v].extend(_call_times(built[v][0], args, repeats))
        for v in variants:
            row = {"variant": v, **parsed[v], "devices": n, "tokens": n * tokens_per_device, "slots": built[v][1],
                   "ms": float(np.median(times[v])), "ms_rounds": [float(np.median(times[v][i:i + repeats]))
                                                                  for i in range(0, len(times[v]), repeats)],
                   **checks[v], "schedule": built[v][2]}
            rows.append(row)
            log(f"{v:>24} on {n} device(s): {row['ms']:.3f} ms (rounds {', '.join(f'{t:.3f}' for t in row['ms_rounds'])}"
                f"), calc_diff vs base {row['calc_diff_base']:.1e}, vs float32 {row['calc_diff_ref']}")
        del built, args
    summary = {}
    base1 = next((r["ms"] for r in rows if r["variant"] == variants[0] and r["devices"] == counts[0]), None)
    for v in variants:
        ms = {r["devices"]: r["ms"] for r in rows if r["variant"] == v}
        most = max(ms)
        summary[v] = {"ms": ms, "weak_scaling": ms[counts[0]] / ms[most] if most != counts[0] else 1.0,
                      "weak_scaling_vs_base_1": base1 / ms[most] if base1 else None}
    return {"device": getattr(devices[0], "device_kind", str(devices[0])), "devices": [str(d) for d in devices],
            "command": " ".join(sys.argv), "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
            "timing": f"ms per call of the compiled layer (each call waited for): median of {rounds} rounds x "
                      f"{repeats} calls, the variants in turn within a round",
            "tokens_per_device": tokens_per_device, "hidden": hidden, "inter": inter,
            "experts_per_device": experts_per_device, "topk": topk, "slot_factor": slot_factor,
            "variants": variants, "rows": rows, "summary": summary}


def _call_times(f: Callable, args: tuple, repeats: int, warmup: int = 2) -> list[float]:
    """Wall times of ``repeats`` calls of ``f(*args)`` in ms, each waited for, after ``warmup`` calls."""
    for _ in range(warmup):
        jax.block_until_ready(f(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return times
