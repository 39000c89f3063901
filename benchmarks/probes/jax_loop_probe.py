"""Where a `lax.scan` step's time goes beyond our kernel's: XLA's loop alone, steps per scan, handler runs.

Issue 30's 1.1x-of-kernel target; benchmarks/NOTES.md, "JAX and XLA command buffers".

Per XLA flag set (one child process each: XLA reads its flags when the backend starts), per variant:
- wall time per step (median of timed scans);
- how often XLA runs our FFI handler in a warm scan, and which of its buffers moved since the previous call,
  across runs too (a moved buffer makes XLA record the command again);
- a CUPTI timeline of one warm scan: kernels per step, our kernel's time, the other kernels' time, and the idle gap
  per step (wall of the scan's kernels minus their busy time).

Variants: an XLA-only step (the loop's own floor: one small fusion per step); our dense 64x2112x7168 GEMM (as the
benchmark runs it) over 100 and 400 steps (a per-run cost shrinks per step with more steps, a per-step one does
not); the same with the carry passed in and donated, its result fed back (stable addresses from run to run).

    python benchmarks/probes/jax_loop_probe.py OUT.json
"""
import json
import os
import subprocess
import sys
import time

CB = "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"
CB_WHILE = "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,WHILE,CONDITIONAL --xla_gpu_graph_min_graph_size=1"
MODES = {"default": "", "command_buffers": CB, "command_buffers+while": CB_WHILE}


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def child():
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np
    from cupti import cupti
    from jax import lax

    import cupygemm.jax as cj
    from cupygemm import reference as ref
    from cupygemm.bench.cupti import CuptiPythonTimer

    timer = CuptiPythonTimer(cupti)
    m, n, k = 64, 2112, 7168
    rng = np.random.default_rng(0)
    a, sfa = ref.per_token_cast_to_fp8_reference(rng.standard_normal((m, k)).astype(np.float32))
    b, sfb = ref.per_block_cast_to_fp8_reference(rng.standard_normal((n, k)).astype(np.float32))
    f8 = ml_dtypes.float8_e4m3fn
    ja, jb, jsb = jnp.asarray(a.view(f8)), jnp.asarray(b.view(f8)), jnp.asarray(sfb)

    def ours(sa, _carry):
        return cj.gemm_fp8_fp8_bf16_nt(ja, sa, jb, jsb)

    def floor(s, carry):
        return carry + s.astype(jnp.bfloat16)

    def make(fn, steps, per_step, donate):
        def scan(c0, xs):
            return lax.scan(lambda c, x: (fn(x, c), None), c0, xs)[0]
        run = jax.jit(scan, donate_argnums=(0,) if donate else ())
        state = {"c": jnp.zeros((m, n), jnp.bfloat16)}

        def call():
            out = run(state["c"], per_step)
            if donate:
                state["c"] = out
            return out
        return call

    handler = None
    results = []
    for name, fn, steps, donate in (("xla_only", floor, 100, False), ("ours", ours, 100, False),
                                    ("ours", ours, 400, False), ("ours_donated_carry", ours, 100, True)):
        if fn is floor:
            per_step = jnp.ones((steps,), jnp.float32)
        else:
            per_step = jnp.asarray(np.broadcast_to(sfa, (steps,) + sfa.shape).copy())
        call = make(fn, steps, per_step, donate)
        jax.block_until_ready(call())
        handler = cj._handlers.get("cuda")
        row = {"variant": name, "steps": steps}
        if fn is ours and handler is not None:
            handler.trace = []
            for _ in range(3):
                jax.block_until_ready(call())
            trace = handler.trace
            handler.trace = None
            row["handler_calls_per_scan"] = len(trace) / 3
            row["moving_buffers"] = sorted({i for (_, p1), (_, p2) in zip(trace, trace[1:])
                                            for i, (x, y) in enumerate(zip(p1, p2)) if x != y})
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            jax.block_until_ready(call())
            times.append((time.perf_counter() - t0) / steps * 1e6)
        row["wall_us_per_step"] = _median(times)
        row["wall_us_per_step_min"] = min(times)
        with timer._recording():
            jax.block_until_ready(call())
            recs = sorted(timer._drain())
        if recs:
            busy = sum(e - s for s, e, _ in recs) / 1e3
            span = (recs[-1][1] - recs[0][0]) / 1e3
            mine = [(e - s) / 1e3 for s, e, nm in recs if "cupygemm" in nm or "fp8_gemm" in nm]
            names = {}
            for s, e, nm in recs:
                key = nm[:60]
                names.setdefault(key, []).append((e - s) / 1e3)
            row["timeline"] = {
                "kernels": len(recs), "kernels_per_step": len(recs) / steps,
                "span_us_per_step": span / steps, "busy_us_per_step": busy / steps,
                "idle_us_per_step": (span - busy) / steps,
                "our_kernel_us": _median(mine), "our_kernels": len(mine),
                "by_name": {k_: {"count": len(v), "median_us": _median(v)} for k_, v in names.items()},
                "first_records": [((s - recs[0][0]) / 1e3, (e - s) / 1e3, nm[:50]) for s, e, nm in recs[:12]],
            }
        results.append(row)
    return {"xla_flags": os.environ.get("XLA_FLAGS", ""), "device": jax.devices()[0].device_kind,
            "results": results}


def main():
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child()))
        return 0
    out = {"command": "python benchmarks/probes/jax_loop_probe.py " + " ".join(sys.argv[1:]), "modes": {}}
    for label, flags in MODES.items():
        env = dict(os.environ)
        env.pop("XLA_FLAGS", None)
        if flags:
            env["XLA_FLAGS"] = flags
        res = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True)
        if res.returncode:
            print(label, "failed:", res.stderr[-3000:], file=sys.stderr)
            continue
        out["modes"][label] = json.loads(res.stdout.strip().splitlines()[-1])
        for r in out["modes"][label]["results"]:
            t = r.get("timeline", {})
            print(f"{label:24s} {r['variant']:20s} steps {r['steps']:4d} wall {r['wall_us_per_step']:7.2f} us/step "
                  f"kernel {t.get('our_kernel_us')} busy {t.get('busy_us_per_step', 0):.2f} "
                  f"idle {t.get('idle_us_per_step', 0):.2f} k/step {t.get('kernels_per_step')} "
                  f"handler/scan {r.get('handler_calls_per_scan')} moving {r.get('moving_buffers')}")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
