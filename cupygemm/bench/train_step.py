"""``cupygemm train-step``: forward + backward of one linear layer ``y = x @ W^T`` at DeepSeek-V3's six dense (N, K)
pairs and ``--tokens`` T (4096), all casts included, against the same step in BF16 and through ``torch._scaled_mm``.

A step takes x [T, K] and dy [T, N] (BF16) and W [N, K] (``--weights``: an FP32 master weight by default, whose
gradient accumulates in ``W.grad`` over micro-batches) and makes y, dx and W's gradient. Steps, each timed in the
same run:

* ``bf16``: ``torch.mm`` for the forward, dgrad and wgrad (autograd of ``x @ W.bfloat16().T``: W's BF16 copy, and
  dW converted and added into ``W.grad``);
* ``cupygemm``: :func:`cupygemm.torch.fp8_linear` (autograd): the fused transpose casts of x, W and dy, then the
  forward, dgrad (NT kernel on W's FP8 transpose) and wgrad (1x128 x 1x128, FP32) GEMMs;
* ``scaled_mm``: the same casts (cupygemm's, so that the GEMMs are what differs), with cuBLASLt's block-scaled FP8
  through ``torch._scaled_mm`` for the forward and dgrad (1x128 x 128x128) and, where the installed torch/CUDA
  takes it, the wgrad (1x128 x 1x128; else ``torch.mm`` in BF16, said in the row's ``scaled_mm_wgrad``);
* with ``--jax``: ``jax_bf16`` (``jnp.dot`` under ``jax.vjp``) and ``jax_cupygemm`` (:func:`cupygemm.jax.fp8_linear`
  under ``jax.vjp``), each one jitted function.

Where the time goes: cupygemm's parts timed alone in the same run: ``cast_x`` (x and x^T, one pass), ``cast_w`` (W and
W^T), ``cast_dy`` (dy and dy^T), ``fwd``, ``dgrad``, ``wgrad`` (GEMMs).

Timing: ``us`` is each step's GPU time, the sum of the durations of every kernel it launches (CUPTI, as ``cupygemm
bench``; CUDA events around the step where CUPTI is missing), after an untimed 1 GiB memset that flushes L2; the
median of ``--iters``. The parts: CUDA events around each eager call. ``eager_us``: wall time per step over
``--iters`` steps back to back (no flush): where it exceeds ``us``, the host is the bound (torch's autograd and each
call's Python; JAX's dispatch). JAX runs with XLA's command buffers on (``XLA_FLAGS`` as the README says, set here
unless the environment sets it), so that the custom calls replay inside CUDA graphs. Checks: dx and dW of every
step against the float64 product of the unquantized inputs (DeepGEMM's calc_diff): cupygemm's within 2e-3 (the
exit status), the peers' reported (``scaled_mm_check``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable

from ..shapes import NORMAL_NK
from .options import help_text

#: calc_diff allowed for an FP8 step's dx and dW against the unquantized float64 product (issue 48).
CALC_DIFF_LIMIT = 2e-3
STEPS = ("bf16", "cupygemm", "scaled_mm")
PARTS = ("cast_x", "cast_w", "cast_dy", "fwd", "dgrad", "wgrad")


def _calc_diff(torch: Any, got: Any, want: Any) -> float:
    x, y = got.double(), want
    den = float((x * x + y * y).sum())
    return 0.0 if den == 0 else 1.0 - 2.0 * float((x * y).sum()) / den


def _scaled_mm(torch: Any, a: Any, sa: Any, bt: Any, sb: Any, out_dtype: Any) -> Any:
    r = torch._scaled_mm(a, bt, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    return r[0] if isinstance(r, tuple) else r


def _m_major(s: Any) -> Any:
    """Scales [rows, kb] with strides (1, rows): cuBLASLt's 1x128 layout."""
    return s.t().contiguous().t()


def torch_steps(torch: Any, x: Any, w: Any, dy: Any) -> tuple[dict[str, Callable[[], tuple]], Callable[[], None], str]:
    """The steps (each returns (y, dx, W's gradient: ``w.grad`` after the step)), a reset (``w.grad = None``) and how
    ``scaled_mm`` computes its wgrad.

    ``w`` is the weight as training keeps it: an FP32 master weight (the default of ``--weights``), whose gradient
    accumulates in ``w.grad`` over micro-batches, or BF16. BF16 step: ``x @ w.bfloat16().T`` under autograd (the
    weight's BF16 copy, dW in BF16, converted and added into the FP32 ``w.grad``: autograd's own way); cupygemm's:
    :func:`cupygemm.torch.fp8_linear` (dW added into ``w.grad`` by the wgrad kernel); the peer's: the same casts,
    ``_scaled_mm`` and its dW added into ``w.grad``."""
    import cupygemm
    import cupygemm.torch as ct

    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
    master = w.dtype == torch.float32

    def backward(y: Any) -> tuple:
        xg.grad = None
        torch.autograd.backward(y, dy, inputs=[xg, wg])
        return y, xg.grad, wg.grad

    def bf16():
        return backward(xg @ (wg.bfloat16() if master else wg).t())

    def ours():
        return backward(ct.fp8_linear(xg, wg))

    def reset():
        wg.grad = None

    def peer_parts():
        xqt, xst, xq, xs = cupygemm.per_token_cast_to_fp8_transposed(x, rowwise=True)
        wq, ws, wqt, wst = cupygemm.per_block_cast_to_fp8(w, with_transpose=True)
        y = _scaled_mm(torch, xq, _m_major(xs), wq.t(), ws.t(), torch.bfloat16)
        dyqt, dyst, dyq, dys = cupygemm.per_token_cast_to_fp8_transposed(dy, rowwise=True)
        dx = _scaled_mm(torch, dyq, _m_major(dys), wqt.t(), wst.t(), torch.bfloat16)
        return y, dx, (dyqt, dyst, xqt, xst)

    # cuBLASLt's 1x128 x 1x128 recipe (if this torch has it): A = dy^T [N, T], B = x^T as [T, K] column-major, each
    # scaled per row and 128 of T; the scale layout it takes is tried in the forms it may want, and kept only if it
    # computes dW (checked against the BF16 product).
    def wgrad_with(layout):
        def wgrad(ops):
            dyqt, dyst, xqt, xst = ops
            return _scaled_mm(torch, dyqt, _m_major(dyst), xqt.t(), layout(xst), torch.float32)
        return wgrad

    want = (dy.t().double() @ x.double())
    mode, wgrad_scaled = "torch.mm (BF16): _scaled_mm has no 1x128 x 1x128 recipe here", None
    for label, layout in (("scale_b [K, T/128] K-major", _m_major), ("scale_b [T/128, K]", lambda s: s.t())):
        try:
            _, _, ops = peer_parts()
            got = wgrad_with(layout)(ops)
            torch.cuda.synchronize()
        except (RuntimeError, ValueError) as e:
            mode = f"torch.mm (BF16): _scaled_mm refused 1x128 x 1x128 ({str(e).splitlines()[0][:160]})"
            continue
        if _calc_diff(torch, got, want) <= CALC_DIFF_LIMIT:
            mode, wgrad_scaled = f"_scaled_mm 1x128 x 1x128, {label}", wgrad_with(layout)
            break
        mode = f"torch.mm (BF16): _scaled_mm 1x128 x 1x128 ran but computed something else ({label})"

    def scaled():
        y, dx, ops = peer_parts()
        dw = wgrad_scaled(ops) if wgrad_scaled is not None else dy.t() @ x
        if wg.grad is None:
            wg.grad = dw.to(w.dtype)
        else:
            wg.grad.add_(dw)
        return y, dx, wg.grad

    return {"bf16": bf16, "cupygemm": ours, "scaled_mm": scaled}, reset, mode


def torch_parts(torch: Any, x: Any, w: Any, dy: Any) -> dict[str, Callable[[], Any]]:
    """cupygemm's pieces of a step, each alone, on buffers made once."""
    import cupygemm

    t, k = x.shape
    n = w.shape[0]
    xqt, xst, xq, xs = cupygemm.per_token_cast_to_fp8_transposed(x, rowwise=True)
    wq, ws, wqt, wst = cupygemm.per_block_cast_to_fp8(w, with_transpose=True)
    dyqt, dyst, dyq, dys = cupygemm.per_token_cast_to_fp8_transposed(dy, rowwise=True)
    y, dx = x.new_empty((t, n)), x.new_empty((t, k))
    dw = torch.zeros((n, k), dtype=torch.float32, device=x.device)
    return {
        "cast_x": lambda: cupygemm.per_token_cast_to_fp8_transposed(x, rowwise=True),
        "cast_w": lambda: cupygemm.per_block_cast_to_fp8(w, with_transpose=True),
        "cast_dy": lambda: cupygemm.per_token_cast_to_fp8_transposed(dy, rowwise=True),
        "fwd": lambda: cupygemm.gemm_fp8_fp8_bf16_nt((xq, xs), (wq, ws), y),
        "dgrad": lambda: cupygemm.gemm_fp8_fp8_bf16_nt((dyq, dys), (wqt, wst), dx),
        "wgrad": lambda: cupygemm.wgrad_gemm_fp8_fp8_fp32_nt((dyqt, dyst), (xqt, xst), dw),
    }


def jax_steps(x: Any, w: Any, dy: Any) -> dict[str, Callable[[], Any]]:
    """The JAX steps: one jitted function each, (x, W, dy) -> (y, dx, dW)."""
    import jax
    import jax.numpy as jnp

    import cupygemm.jax as cj

    def step(f):
        def run(x, w, dy):
            y, vjp = jax.vjp(f, x, w)
            return (y,) + vjp(dy)
        return jax.jit(run)

    bf16, ours = step(lambda x, w: jnp.dot(x, w.astype(jnp.bfloat16).T)), step(cj.fp8_linear)
    return {"jax_bf16": lambda: bf16(x, w, dy), "jax_cupygemm": lambda: ours(x, w, dy)}


def _time_jax(call: Callable[[], Any], iters: int) -> float:
    import jax

    jax.block_until_ready(call())
    start = time.perf_counter()
    outs = [call() for _ in range(iters)]
    jax.block_until_ready(outs)
    return (time.perf_counter() - start) / iters * 1e6


def _gpu_us(timer: Any, kernel_timer: Any, call: Callable[[], Any], iters: int) -> float:
    """The median GPU time of a step: the sum of its kernels' durations from CUPTI (whatever the host costs between
    them; the kernels of every stream, XLA's too), each step after an untimed L2 flush; CUDA events around the step
    where CUPTI is missing (then the host's gaps count too)."""
    import cupy

    from .metrics import summarize_times

    if kernel_timer is None:
        return summarize_times(timer.time_events(call, iters))["us"]
    call()
    cupy.cuda.runtime.deviceSynchronize()
    times = kernel_timer.time(call, iters, before=timer.flush, sync=cupy.cuda.runtime.deviceSynchronize)
    return summarize_times(times)["us"]


def _eager_us(torch: Any, call: Callable[[], Any], iters: int) -> float:
    """Microseconds per eager step, back to back with no flush: the host's cost where it exceeds the GPU's."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e6


def measure_pair(torch: Any, n: int, k: int, tokens: int, iters: int, timer: Any, with_jax: bool,
                 log: Callable[[str], None], weights: str = "float32", kernel_timer: Any = None) -> dict[str, Any]:
    """One (N, K) pair's row: step times, part times, checks."""
    from .metrics import summarize_times

    gen = torch.Generator(device="cuda").manual_seed(n * 7 + k)
    x = torch.randn((tokens, k), device="cuda", generator=gen).bfloat16()
    w = (torch.randn((n, k), device="cuda", generator=gen) / k ** 0.5).bfloat16().to(getattr(torch, weights))
    dy = torch.randn((tokens, n), device="cuda", generator=gen).bfloat16()
    want_dx = dy.double() @ w.double()  # W holds BF16 values in either dtype: the BF16 step computes the same
    want_dw = dy.double().t() @ x.double()
    steps, reset, wgrad_mode = torch_steps(torch, x, w, dy)
    row: dict[str, Any] = {"n": n, "k": k, "tokens": tokens, "weights": str(w.dtype).replace("torch.", ""),
                           "us": {}, "calc_diff": {}, "scaled_mm_wgrad": wgrad_mode}
    row["eager_us"] = {}
    for name, call in steps.items():
        reset()  # the check reads one step's gradient; the timed steps then accumulate, as micro-batches do
        _, dx, dw = call()
        row["calc_diff"][name] = {"dx": _calc_diff(torch, dx, want_dx), "dw": _calc_diff(torch, dw, want_dw)}
        row["us"][name] = _gpu_us(timer, kernel_timer, call, iters)
        row["eager_us"][name] = _eager_us(torch, call, iters)
    parts = torch_parts(torch, x, w, dy)
    row["parts_us"] = {}
    for name, call in parts.items():
        call()
        row["parts_us"][name] = summarize_times(timer.time_events(call, iters))["us"]
    if with_jax:
        import jax.numpy as jnp

        jx, jdy = (jnp.asarray(t.float().cpu().numpy()).astype(jnp.bfloat16) for t in (x, dy))
        jw = jnp.asarray(w.float().cpu().numpy()).astype(jnp.dtype(weights))
        for name, call in jax_steps(jx, jw, jdy).items():
            _, dx, dw = call()
            row["calc_diff"][name] = {"dx": _calc_diff(torch, torch.from_dlpack(dx).float(), want_dx),
                                      "dw": _calc_diff(torch, torch.from_dlpack(dw).float(), want_dw)}
            row["us"][name] = _gpu_us(timer, kernel_timer, call, iters)
            row["eager_us"][name] = _time_jax(call, iters)
    us = row["us"]
    row["speedup_vs_bf16"] = us["bf16"] / us["cupygemm"]
    row["speedup_vs_scaled_mm"] = us["scaled_mm"] / us["cupygemm"]
    if with_jax:
        row["jax_speedup_vs_bf16"] = us["jax_bf16"] / us["jax_cupygemm"]
    ours = [s for s in row["calc_diff"] if "cupygemm" in s]
    row["check"] = all(max(row["calc_diff"][s].values()) <= CALC_DIFF_LIMIT for s in ours)
    # The peer is timed as it is; where its results are off (cuBLASLt's block-scaled GEMM with a reduction that is
    # not a multiple of 128, e.g. dgrad over N = 2112), its row says so and the comparison is with a wrong result.
    row["scaled_mm_check"] = max(row["calc_diff"]["scaled_mm"].values()) <= CALC_DIFF_LIMIT
    log(f"{n}x{k}: " + ", ".join(f"{s} {v:.0f} us" for s, v in us.items()) +
        f"; x{row['speedup_vs_bf16']:.2f} vs BF16, x{row['speedup_vs_scaled_mm']:.2f} vs _scaled_mm; parts " +
        ", ".join(f"{p} {v:.0f}" for p, v in row["parts_us"].items()) + ("" if row["check"] else "  CHECK FAILED")
        + ("" if row["scaled_mm_check"] else "  (_scaled_mm's result is off)"))
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    from .metrics import geomean

    out = {"speedup_vs_bf16_geomean": geomean(r["speedup_vs_bf16"] for r in rows),
           "speedup_vs_bf16_min": min(r["speedup_vs_bf16"] for r in rows),
           "speedup_vs_scaled_mm_geomean": geomean(r["speedup_vs_scaled_mm"] for r in rows),
           "speedup_vs_scaled_mm_min": min(r["speedup_vs_scaled_mm"] for r in rows)}
    if all("jax_speedup_vs_bf16" in r for r in rows):
        out["jax_speedup_vs_bf16_geomean"] = geomean(r["jax_speedup_vs_bf16"] for r in rows)
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    steps = list(rows[0]["us"])
    eager = [s for s in ("bf16", "cupygemm") if "eager_us" in rows[0]]
    head = "| N x K | " + " | ".join(f"{s} us" for s in steps) + " | vs BF16 | vs _scaled_mm | " + \
        " | ".join(PARTS) + "".join(f" | {s} eager us" for s in eager) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r['n']} x {r['k']} | " + " | ".join(f"{r['us'][s]:.0f}" for s in steps) +
                     f" | {r['speedup_vs_bf16']:.2f}x | {r['speedup_vs_scaled_mm']:.2f}x | " +
                     " | ".join(f"{r['parts_us'][p]:.0f}" for p in PARTS) +
                     "".join(f" | {r['eager_us'][s]:.0f}" for s in eager) + " |")
    s = summary(rows)
    lines += ["", f"geomean: {s['speedup_vs_bf16_geomean']:.2f}x BF16 (min {s['speedup_vs_bf16_min']:.2f}x), "
                  f"{s['speedup_vs_scaled_mm_geomean']:.2f}x _scaled_mm (min {s['speedup_vs_scaled_mm_min']:.2f}x)"
              + (f"; JAX {s['jax_speedup_vs_bf16_geomean']:.2f}x jnp.dot BF16" if "jax_speedup_vs_bf16_geomean" in s
                 else "")]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from ..device import require_hopper_or_exit

    require_hopper_or_exit("cupygemm train-step")
    try:
        import torch
    except ImportError:
        print("cupygemm train-step: needs torch with CUDA (it times the step in torch: pip install torch)",
              file=sys.stderr)
        return 1
    from .overhead import environment
    from .timing import Timer, open_cupti_timer

    if args.jax:  # JAX shares the GPU with torch here: no 75 % preallocation; custom calls inside CUDA graphs
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        if "XLA_FLAGS" not in os.environ:
            from ..jax.flags import enable_command_buffers

            enable_command_buffers()
    pairs = tuple(tuple(p) for p in args.nk) if args.nk else NORMAL_NK
    timer = Timer()
    kernel_timer, why = open_cupti_timer()
    if kernel_timer is None:
        print(f"cupygemm train-step: no CUPTI ({why}): CUDA events around each step instead", file=sys.stderr)
    rows = [measure_pair(torch, n, k, args.tokens, args.iters, timer, args.jax,
                         log=lambda s: print(s, file=sys.stderr), weights=args.weights, kernel_timer=kernel_timer)
            for n, k in pairs]
    print(markdown(rows))
    ok = all(r["check"] for r in rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(["cupygemm train-step"] + sys.argv[2:]), "tokens": args.tokens,
                       "iters": args.iters, "timing": __doc__.split("Timing: ", 1)[1].split("\n\n")[0],
                       "gpu_timer": "cupti" if kernel_timer is not None else f"events ({why})",
                       "environment": environment(), "summary": summary(rows), "all_checks_pass": ok, "rows": rows},
                      f, indent=1)
    return 0 if ok else 1


def add_parser(sub: Any) -> None:
    from .casts import _nk_arg

    sp = sub.add_parser("train-step", help="forward + backward of one FP8 linear layer (casts included) against BF16 "
                        "and torch._scaled_mm, with where the time goes", description=help_text(__doc__),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("--tokens", type=int, default=4096, help="T, the tokens of x and dy (default 4096)")
    sp.add_argument("--nk", type=_nk_arg, default=None, metavar="NxK[,NxK...]",
                    help="the (N, K) pairs (default: DeepSeek-V3's six dense projections)")
    sp.add_argument("--iters", type=int, default=30, help="timed steps per row (default 30)")
    sp.add_argument("--weights", choices=("float32", "bfloat16"), default="float32",
                    help="the weight as training keeps it (default float32: a master weight whose gradient "
                         "accumulates in w.grad)")
    sp.add_argument("--jax", action="store_true",
                    help="also time the JAX steps (jnp.dot BF16, cupygemm.jax.fp8_linear)")
    sp.add_argument("--json", metavar="FILE", help="write the rows, the summary and the environment as JSON")
    sp.set_defaults(func=run)
