"""cupygemm inside ``jax.jit``: a ``lax.scan`` of decode GEMMs, with and without XLA command buffers.

For each case (64x2112x7168, 128x7168x2048, masked 4 groups x max_m 128, expected_m 64, N 7168, K 2048) the
script times, per scan step (``--steps`` GEMMs per scan, median of ``--repeats`` scans, wall clock around
``block_until_ready``):

* ``cupygemm.jax`` in the scan;
* the kernels' own time: the same GEMMs through the CuPy path, ``--steps`` calls captured in one CUDA graph, CUDA
  events around its launches (per call; includes the graph's launch gaps);
* ``jnp.dot`` in BF16 (masked: a batched dot over all max_m rows);
* JAX's FP8 dot: ``lax.dot_general`` on float8_e4m3fn operands with ``preferred_element_type=float32`` and one
  scale per tensor, cast to BF16 (masked: batched, all rows);
* XLA's own loop: the same scan with a body of one small fusion (the carry plus the step's scalar) and no GEMM, the
  floor of a step that XLA's while loop puts under any custom call;
* where CUPTI is available, one warm scan's kernels per step, for ours and the baselines: the GEMM's time inside the
  scan, the time of the other kernels (XLA's: the step's slice, the loop counter; with ``WHILE`` the condition too)
  and the device's idle time;

each in a fresh process with default XLA flags, in one with
``XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"``, and in one
that adds ``WHILE,CONDITIONAL`` to that list (XLA reads the flags when its backend starts, hence subprocesses).
The masked case runs twice: updating the scan's carry in place (``out=``), and writing a new zeroed output.

Per case it also reports how often XLA runs the FFI handler in the first scan of a fresh executable and in the
next one (with command buffers, a run means recording or updating the graph), the handler's host time per call
(``perf_counter_ns`` around the Python handler, as XLA calls it) split into reading the call frame, asking XLA for
its stream, and our launch, whether XLA calls it from the Python thread that dispatched the scan or from a thread of
its own, and which of the custom call's buffers (operands, then results) change address from one call to the
next: a moved buffer is what makes XLA record the command again.

Every step reads a per-step operand (its A scales; the baselines an output scale): XLA hoists a loop-invariant
call out of the loop, and the scan would time one GEMM.

    cupygemm jax-scan --json jax-scan.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from ..device import require_hopper_or_exit
from .options import help_text
from .timing import capture_graph, open_cupti_timer, stream_event_us

CB_FLAGS = "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"
# The scan's while loop itself in the graph too (conditional nodes): no host round trip per step.
CB_WHILE_FLAGS = ("--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,WHILE,CONDITIONAL "
                  "--xla_gpu_graph_min_graph_size=1")
CASES = [
    {"name": "normal 64x2112x7168", "kind": "normal", "m": 64, "n": 2112, "k": 7168},
    {"name": "normal 128x7168x2048", "kind": "normal", "m": 128, "n": 7168, "k": 2048},
    {"name": "masked 4x128(64)x7168x2048", "kind": "masked", "g": 4, "m": 128, "expected_m": 64, "n": 7168,
     "k": 2048},
    # The same GEMM writing a new zeroed output each step instead of updating the carry in place (out=).
    {"name": "masked 4x128(64)x7168x2048, new output", "kind": "masked", "g": 4, "m": 128, "expected_m": 64,
     "n": 7168, "k": 2048, "new_output": True},
]


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def child(steps: int, repeats: int, with_cupy: bool, unroll: int = 1) -> dict:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np
    from jax import lax

    import cupygemm
    import cupygemm.jax as cj
    from cupygemm import reference as ref

    rng = np.random.default_rng(0)
    f8 = ml_dtypes.float8_e4m3fn
    kernel_timer, _ = open_cupti_timer()
    results = []
    for case in CASES:
        m, n, k = case["m"], case["n"], case["k"]
        g = case.get("g")
        a_shape = (g, m, k) if g else (m, k)
        b_shape = (g, n, k) if g else (n, k)
        x = rng.standard_normal(a_shape).astype(np.float32)
        w = rng.standard_normal(b_shape).astype(np.float32)
        if g:
            qa = [ref.per_token_cast_to_fp8_reference(x[i]) for i in range(g)]
            qb = [ref.per_block_cast_to_fp8_reference(w[i]) for i in range(g)]
            a, sfa = np.stack([q[0] for q in qa]), np.stack([q[1] for q in qa])
            b, sfb = np.stack([q[0] for q in qb]), np.stack([q[1] for q in qb])
            masked_m = (rng.uniform(0.7, 1.3, g) * case["expected_m"]).astype(np.int32).clip(0, m)
        else:
            a, sfa = ref.per_token_cast_to_fp8_reference(x)
            b, sfb = ref.per_block_cast_to_fp8_reference(w)
        ja, jb, jsb = jnp.asarray(a.view(f8)), jnp.asarray(b.view(f8)), jnp.asarray(sfb)
        out_shape = (g, m, n) if g else (m, n)

        if g:
            jmm = jnp.asarray(masked_m)

            def ours(a_, sa_, prev):
                # Rows past masked_m keep the previous step's output (as in decode): no zero fill per step.
                out = None if case.get("new_output") else prev
                return cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(a_, sa_, jb, jsb, jmm, case["expected_m"], out=out)
        else:
            def ours(a_, sa_, _):
                return cj.gemm_fp8_fp8_bf16_nt(a_, sa_, jb, jsb)

        xbf, wbf = jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16)
        dn = (((2,), (2,)), ((0,), (0,))) if g else (((1,), (1,)), ((), ()))

        def bf16_dot(a_, scale, _):
            return lax.dot_general(a_, wbf, dn, preferred_element_type=jnp.bfloat16) * scale.astype(jnp.bfloat16)

        a8 = jnp.asarray((x / np.abs(x).max() * 448).astype(f8))
        b8 = jnp.asarray((w / np.abs(w).max() * 448).astype(f8))
        s8 = np.float32(np.abs(x).max() / 448 * np.abs(w).max() / 448)

        def fp8_dot(a_, scale, _):
            return (lax.dot_general(a_, b8, dn, preferred_element_type=jnp.float32) * scale).astype(jnp.bfloat16)

        def scan_of(fn, a_in, per_step):
            @jax.jit
            def run(a_, xs):
                if unroll > 1:
                    # Unrolled, a step whose result nothing reads would be dead code: keep every step's result.
                    def body(carry, x_):
                        y = fn(a_, x_, carry)
                        return y, y
                else:
                    def body(carry, x_):
                        return fn(a_, x_, carry), None
                return lax.scan(body, jnp.zeros(out_shape, jnp.bfloat16), xs, unroll=unroll)
            return lambda: run(a_in, per_step)

        # Each step reads one per-step operand (its A scales; the baselines' output scale), so that no step is
        # loop-invariant: XLA hoists an invariant call out of the loop (optimization_barrier does not stop it).
        sfa_steps = jnp.asarray(np.broadcast_to(sfa, (steps,) + sfa.shape).copy())
        row = {"case": case["name"], "steps": steps}
        for label, fn, args in (("cupygemm_jax", ours, (ja, sfa_steps)),
                                ("jnp_dot_bf16", bf16_dot, (xbf, jnp.ones(steps, jnp.float32))),
                                ("jax_fp8_dot", fp8_dot, (a8, jnp.full(steps, s8, jnp.float32)))):
            if case.get("new_output") and label != "cupygemm_jax":
                continue  # the baselines are the masked case's
            run = scan_of(fn, *args)
            jax.block_until_ready(run())
            jax.block_until_ready(run())
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                jax.block_until_ready(run())
                times.append((time.perf_counter() - t0) / steps * 1e6)
            row[f"{label}_us"] = _median(times)
            if kernel_timer is not None:
                row[f"{label}_timeline"] = _timeline(kernel_timer, run, steps)

        # XLA's own loop: the same scan with a one-fusion body (the carry plus the step's scalar), no GEMM.
        floor = scan_of(lambda _a, s_, c: c + s_.astype(jnp.bfloat16), None, jnp.ones(steps, jnp.float32))
        jax.block_until_ready(floor())
        row["xla_loop_floor_us"] = _median([_wall_us(jax, floor, steps) for _ in range(repeats)])

        # Host time of the handler itself (per call as XLA makes it), and how often XLA runs it in a scan once
        # the executable has run before (with command buffers: only when it records or updates the graph).
        handler = cj._handlers.get("cuda") or cj._handlers["cpu"]
        run = scan_of(ours, ja, sfa_steps)
        handler.profile = []
        jax.block_until_ready(run())
        row["handler_calls_first_scan"] = len(handler.profile)
        handler.profile, handler.profile_parts, handler.trace = [], [], []
        jax.block_until_ready(run())
        row["handler_calls_per_scan"] = len(handler.profile)
        row["handler_host_us"] = _median(handler.profile) / 1e3 if handler.profile else None
        if handler.profile_parts:  # where the handler's time goes: frame read, XLA's stream, our launch
            read, stream, end = (_median([p[i] for p in handler.profile_parts]) / 1e3 for i in range(3))
            row["handler_parts_us"] = {"frame_read": read, "stream_get": stream - read, "launch": end - stream}
        # XLA's TFRT GPU client runs executables on its own threads, where a ctypes callback needs a Python thread
        # state of its own (the handler keeps one per thread): does it call from the dispatching Python thread?
        row["handler_on_main_thread"] = threading.main_thread().ident in handler.threads
        # Which of the custom call's buffers move from one call to the next (operands, then results): a moved
        # buffer is why XLA records the command again.
        trace = handler.trace
        row["moving_buffers"] = sorted({i for (_, p1), (_, p2) in zip(trace, trace[1:])
                                        for i, (x, y) in enumerate(zip(p1, p2)) if x != y})
        handler.profile = handler.profile_parts = handler.trace = None

        if with_cupy:
            row["kernel_us"] = _cupy_graph_time(case, a, sfa, b, sfb, masked_m if g else None, steps, repeats)
        results.append(row)
    return {"xla_flags": os.environ.get("XLA_FLAGS", ""), "unroll": unroll, "jax": jax.__version__,
            "device": jax.devices()[0].device_kind, "cases": results}


def _wall_us(jax: Any, run: Any, steps: int) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(run())
    return (time.perf_counter() - t0) / steps * 1e6


def _timeline(kernel_timer: Any, run: Any, steps: int) -> dict:
    """One warm scan's kernels as CUPTI records them, split per step (:func:`step_breakdown`)."""
    import jax

    held = []
    return step_breakdown(kernel_timer.records(lambda: held.append(run()), lambda: jax.block_until_ready(held[-1])),
                          steps)


def step_breakdown(records: list[tuple[int, int, str]], steps: int) -> dict:
    """Per step of a scan, from its kernel records ((start ns, end ns, name), any order): the GEMM (the kernel name
    with the most time: ours, or the baseline's dot) and its median time, the time of the other kernels (XLA's: the
    step's slice, the loop counter; with ``WHILE`` the condition too), and the device's idle time (the records' span
    less their busy time)."""
    if not records or steps < 1:
        raise ValueError(f"step_breakdown: expected kernel records and steps >= 1, got {len(records)} and {steps}")
    by_name: dict[str, list[float]] = {}
    for s, e, name in records:
        by_name.setdefault(name, []).append((e - s) / 1e3)
    gemm = max(by_name, key=lambda n: sum(by_name[n]))
    busy = sum(e - s for s, e, _ in records) / 1e3
    span = (max(e for _, e, _ in records) - min(s for s, _, _ in records)) / 1e3
    return {"kernels_per_step": len(records) / steps, "gemm_kernel": gemm[:60], "gemm_us": _median(by_name[gemm]),
            "other_kernels_us_per_step": (busy - sum(by_name[gemm])) / steps, "idle_us_per_step": (span - busy) / steps,
            "other_kernel_names": sorted(n[:60] for n in by_name if n != gemm)}


def _cupy_graph_time(case: dict, a, sfa, b, sfb, masked_m, steps: int, repeats: int) -> float:
    """Per-call time of ``steps`` CuPy-path GEMMs replayed from one CUDA graph (CUDA events)."""
    import cupy as cp

    import cupygemm

    A, SA, B, SB = cp.asarray(a), cp.asarray(sfa), cp.asarray(b), cp.asarray(sfb)
    out = cp.empty(((case["g"],) if masked_m is not None else ()) + (case["m"], case["n"]), cp.uint16)
    mm = cp.asarray(masked_m) if masked_m is not None else None

    def call():
        if mm is not None:
            cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((A, SA), (B, SB), out, mm, case["expected_m"])
        else:
            cupygemm.gemm_fp8_fp8_bf16_nt((A, SA), (B, SB), out)

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        call()  # loads the kernel and allocates scratch before the capture
    stream.synchronize()
    graph = capture_graph(stream, call, steps)
    times = [stream_event_us(stream, lambda: graph.launch(stream), steps) for _ in range(repeats)]
    return _median(times)


def _cell(us: float | None) -> str:
    return "-" if us is None else f"{us:.1f}"


def add_parser(sub: Any) -> None:
    sp = sub.add_parser("jax-scan", help="cupygemm.jax inside jax.jit: a lax.scan of decode GEMMs, with and "
                        "without XLA command buffers, against jnp.dot and JAX's FP8 dot",
                        description=help_text(__doc__),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    _options(sp)
    sp.set_defaults(func=run)


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", help="write the results here")
    p.add_argument("--steps", type=int, default=100, help="GEMMs per scan (default 100)")
    p.add_argument("--repeats", type=int, default=20, help="timed scans; the median is reported (default 20)")


def main(argv: list[str] | None = None) -> int:
    """The child processes' entry (``python -m cupygemm.bench.jax_scan --child``): one XLA flag set each."""
    p = argparse.ArgumentParser(description=help_text(__doc__.split("\n")[0]))
    _options(p)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--with-cupy", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--unroll", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.steps, args.repeats, args.with_cupy, args.unroll)))
        return 0
    return run(args)


def run(args: argparse.Namespace) -> int:
    require_hopper_or_exit("cupygemm jax-scan")  # here: each child would otherwise print CuPy's traceback
    runs = {}
    # (A fully unrolled scan was tried too: XLA merges identical steps of the baselines, and stacking the results
    # to keep every step alive moves their addresses on every run, so it re-records all steps: benchmarks/NOTES.md, "JAX
    # and XLA command buffers".)
    modes = (("default", None, 1), ("command_buffers", CB_FLAGS, 1), ("command_buffers+while", CB_WHILE_FLAGS, 1))
    for label, flags, unroll in modes:
        env = dict(os.environ)
        env.pop("XLA_FLAGS", None)
        if flags:
            env["XLA_FLAGS"] = flags
        cmd = [sys.executable, "-m", "cupygemm.bench.jax_scan", "--child", "--steps", str(args.steps), "--repeats",
               str(args.repeats), "--unroll", str(unroll)] + (["--with-cupy"] if label == "default" else [])
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            print(f"{label}: failed\n{res.stderr[-3000:]}", file=sys.stderr)
            if label == "default":
                return res.returncode
            continue
        runs[label] = json.loads(res.stdout.strip().splitlines()[-1])

    head = ("| case | XLA flags | cupygemm.jax us/step | our kernel in the scan | other kernels per step | idle per step | "
            "XLA-only step | kernel us (CuPy graph) | jnp.dot BF16 us/step | its idle per step | JAX FP8 dot us/step | "
            "handler host us/call |")
    print(head)
    print("|---" * 12 + "|")
    kernel = {c["case"]: c.get("kernel_us") for c in runs["default"]["cases"]}
    for label, run in runs.items():
        for c in run["cases"]:
            handler = c["handler_host_us"] if label == "default" else None
            t, tb = c.get("cupygemm_jax_timeline", {}), c.get("jnp_dot_bf16_timeline", {})
            cells = [c["case"], label, f"{c['cupygemm_jax_us']:.1f}", _cell(t.get("gemm_us")),
                     _cell(t.get("other_kernels_us_per_step")), _cell(t.get("idle_us_per_step")),
                     _cell(c.get("xla_loop_floor_us")),
                     f"{kernel[c['case']]:.1f}" if kernel.get(c["case"]) else "-",
                     _cell(c.get("jnp_dot_bf16_us")), _cell(tb.get("idle_us_per_step")), _cell(c.get("jax_fp8_dot_us")),
                     f"{handler:.1f}" if handler else f"- ({c['handler_calls_per_scan']} calls/scan)"]
            print("| " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command_buffer_flags": CB_FLAGS, "command_buffer_while_flags": CB_WHILE_FLAGS,
                       "command": " ".join(["cupygemm jax-scan"] + sys.argv[2:]), "runs": runs}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
