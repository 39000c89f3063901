"""Multi-GPU JAX layers on cupygemm.jax: an expert-parallel MoE layer (``shard_map`` + ``all_to_all`` + the masked
grouped GEMM) and a tensor-parallel MLP (plain ``jit`` over NamedShardings), with their float32 references and
their timings (used by ``examples/jax_expert_parallel_moe.py``).

MoE layer, per device (mesh axis ``"ep"``, ``E_l`` experts a device): quantize the device's tokens (1x128), route
each token to ``topk`` experts (a random router: softmax weights of the top logits), place each (token, choice) in
a fixed-capacity slot ``[device, local expert, slot]`` (slots counted per source device and expert, in token
order; choices past the capacity are dropped, and counted), send the FP8 rows and their scales with
``lax.all_to_all``, run each local expert's SwiGLU FFN as two masked grouped GEMMs over the rows it received
(``[E_l, D * C, ...]``, empty slots zero), send the outputs back and sum them with the routing weights.

TP MLP: ``y = down(silu(x @ Wg.T) * (x @ Wu.T))`` with the up-projection column-parallel (its N sharded: each
device its slice of the intermediate features, no collective) and the down-projection row-parallel (its K sharded:
a partial product per device, summed by one all-reduce), activations replicated; every op is cupygemm's, the
shardings those of :mod:`cupygemm.jax.sharding`'s rules.
"""
from __future__ import annotations

import math
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


def _silu_glu(h: jax.Array) -> jax.Array:
    half = h.shape[-1] // 2
    g, u = h[..., :half].astype(jnp.float32), h[..., half:].astype(jnp.float32)
    return g * jax.nn.sigmoid(g) * u


def route(logits: jax.Array, topk: int, devices: int, experts_per_device: int,
          capacity: int) -> dict[str, jax.Array]:
    """Top-k routing of ``logits`` [D * T, E] (device-major tokens): experts, weights, each choice's slot and
    whether it fits in the capacity."""
    tokens = logits.shape[0] // devices
    weights, experts = lax.top_k(logits, topk)
    weights = jax.nn.softmax(weights, axis=-1)
    onehot = jax.nn.one_hot(experts.reshape(devices, tokens * topk), devices * experts_per_device, dtype=jnp.int32)
    slot = (jnp.cumsum(onehot, axis=1) - 1)  # rank among the source device's choices of that expert
    slot = jnp.take_along_axis(slot, experts.reshape(devices, -1, 1), axis=2).reshape(-1, topk)
    return {"experts": experts.astype(jnp.int32), "weights": weights, "slot": slot.astype(jnp.int32),
            "keep": slot < capacity}


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


def moe_layer(mesh: Mesh, experts_per_device: int, capacity: int, expected_m: int) -> Callable:
    """The jitted EP layer ``(x [D*T, H] bf16, routing, up_q, up_s, down_q, down_s) -> y [D*T, H] f32``,
    tokens, routing and experts sharded over the mesh axis ``"ep"``."""
    d = mesh.shape["ep"]
    el, c = experts_per_device, capacity

    def local(x, experts, weights, slot, keep, up_q, up_s, down_q, down_s):
        t, h = x.shape
        q, s = cj.per_token_cast_to_fp8(x)
        dest = jnp.where(keep, experts * c + slot, d * el * c)  # flat [device, expert, slot]; dropped: past the end
        rows = jnp.broadcast_to(jnp.arange(t)[:, None], experts.shape)
        send_q = jnp.zeros((d * el * c + 1, h), q.dtype).at[dest.reshape(-1)].set(q[rows.reshape(-1)])
        send_s = jnp.zeros((d * el * c + 1, s.shape[1]), s.dtype).at[dest.reshape(-1)].set(s[rows.reshape(-1)])
        send_q, send_s = send_q[:-1].reshape(d, el, c, h), send_s[:-1].reshape(d, el, c, -1)
        recv_q = lax.all_to_all(send_q, "ep", 0, 0, tiled=True)  # [source device, E_l, C, H]
        recv_s = lax.all_to_all(send_s, "ep", 0, 0, tiled=True)
        a = jnp.swapaxes(recv_q, 0, 1).reshape(el, d * c, h)
        sfa = jnp.swapaxes(recv_s, 0, 1).reshape(el, d * c, -1)
        m = jnp.full((el,), d * c, jnp.int32)  # empty slots are zero rows: zero outputs
        hmid = cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(a, sfa, up_q, up_s, m, expected_m)
        act = _silu_glu(hmid)
        aq, asf = cj.per_token_cast_to_fp8(act.reshape(el * d * c, -1))
        out = cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(aq.reshape(el, d * c, -1), asf.reshape(el, d * c, -1),
                                                       down_q, down_s, m, expected_m)
        back = lax.all_to_all(jnp.swapaxes(out.reshape(el, d, c, h), 0, 1), "ep", 0, 0, tiled=True)
        picked = back.reshape(d * el * c, h)[jnp.minimum(dest, d * el * c - 1)].astype(jnp.float32)
        w = jnp.where(keep, weights, 0.0)[..., None]
        return jnp.sum(picked * w, axis=1)

    spec = P("ep")
    f = jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 9, out_specs=spec, check_vma=False)
    return jax.jit(f)


def moe_reference(x: jax.Array, routing: dict[str, jax.Array], params: dict[str, Any]) -> np.ndarray:
    """The layer in float32 on one device: every kept choice's expert FFN on the unquantized weights."""
    x = jnp.asarray(x, jnp.float32)
    hi = lax.Precision.HIGHEST
    y = jnp.zeros_like(x)
    w = jnp.where(routing["keep"], routing["weights"], 0.0)
    for e in range(params["w_up"].shape[0]):
        coef = jnp.sum(jnp.where(routing["experts"] == e, w, 0.0), axis=1)
        h = _silu_glu(jnp.dot(x, params["w_up"][e].T, precision=hi))
        y = y + coef[:, None] * jnp.dot(h, params["w_down"][e].T, precision=hi)
    return np.asarray(y)


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
              capacity_factor: float = 1.5, seed: int = 0) -> tuple[Callable, tuple, dict]:
    """The EP layer over ``devices`` with its sharded inputs; ``info`` holds the routing, parameters and drops."""
    d = len(devices)
    mesh = Mesh(np.array(devices), ("ep",))
    e = d * experts_per_device
    cap = tokens_per_device * topk / e * capacity_factor
    capacity = max(_BLOCK, int(math.ceil(cap / _BLOCK)) * _BLOCK)
    kx, kr = jax.random.split(jax.random.key(seed + 7))
    x = jax.random.normal(kx, (d * tokens_per_device, hidden), jnp.float32).astype(jnp.bfloat16)
    logits = jax.random.normal(kr, (d * tokens_per_device, e), jnp.float32)
    routing = route(logits, topk, d, experts_per_device, capacity)
    params = moe_params(d, experts_per_device, hidden, inter, seed)
    shard = NamedSharding(mesh, P("ep"))
    args = tuple(jax.device_put(v, shard) for v in (x, routing["experts"], routing["weights"], routing["slot"],
                                                    routing["keep"], *params["up"], *params["down"]))
    f = moe_layer(mesh, experts_per_device, capacity, expected_m=max(1, int(cap)))
    dropped = int(np.sum(~np.asarray(routing["keep"])))
    return f, args, {"x": x, "routing": routing, "params": params, "capacity": capacity, "dropped": dropped}


def mlp_setup(devices: list, tokens: int, hidden: int, ffn: int, seed: int = 1) -> tuple[Callable, tuple, dict]:
    mesh = Mesh(np.array(devices), ("tp",))
    params = mlp_params(hidden, ffn, seed)
    f, weights = tp_mlp(mesh, params)
    x = jax.random.normal(jax.random.key(seed + 11), (tokens, hidden), jnp.float32).astype(jnp.bfloat16)
    return f, (jax.device_put(x, NamedSharding(mesh, P())), *weights), {"x": x, "params": params}


def time_ms(f: Callable, args: tuple, repeats: int = 20, warmup: int = 3) -> float:
    """Median wall time of ``f(*args)`` in ms (each call waited for)."""
    for _ in range(warmup):
        jax.block_until_ready(f(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def bench(devices: list, tokens_per_device: int = 4096, hidden: int = 7168, inter: int = 2048,
          experts_per_device: int = 8, topk: int = 8, ffn: int = 18432, repeats: int = 20) -> dict[str, Any]:
    """Times the EP layer and the TP MLP on 1 and ``len(devices)`` devices: weak scaling (the same tokens a
    device) and strong scaling (the same total tokens, ``tokens_per_device`` x the largest count). Returns a dict
    (rows of ``layer, scaling, devices, tokens, ms``)."""
    counts = sorted({1, len(devices)})
    most = counts[-1]
    rows = []
    for scaling in ("weak", "strong"):
        for n in counts:
            per = tokens_per_device if scaling == "weak" else tokens_per_device * most // n
            f, args, info = moe_setup(devices[:n], per, hidden, inter, experts_per_device, topk)
            rows.append({"layer": "ep_moe", "scaling": scaling, "devices": n, "tokens": per * n,
                         "dropped": info["dropped"], "ms": time_ms(f, args, repeats)})
            f, args, _ = mlp_setup(devices[:n], per * n if scaling == "weak" else tokens_per_device * most, hidden,
                                   ffn)
            rows.append({"layer": "tp_mlp", "scaling": scaling, "devices": n, "tokens": args[0].shape[0],
                         "ms": time_ms(f, args, repeats)})
    return {"device": getattr(devices[0], "device_kind", str(devices[0])), "devices": [str(d) for d in devices],
            "command": " ".join(sys.argv), "timing": "ms per call of the jitted layer (each call waited for), median of the repeats",
            "tokens_per_device": tokens_per_device, "hidden": hidden, "inter": inter,
            "experts_per_device": experts_per_device, "topk": topk, "ffn": ffn, "rows": rows}
