"""Why XLA records the masked GEMM's custom call again on every scan step: handler runs, moving buffers, step time.

Per variant of the per-step A scales: the handler runs per warm scan, the buffers that move between calls, and the
time per step (benchmarks/NOTES.md, "JAX and XLA command buffers").
Run once per XLA flag set (XLA reads its flags when the backend starts).

Usage: XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1" \
    python benchmarks/probes/jax_masked_probe.py [--steps 50]
"""
import argparse
import json
import os
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import cupygemm.jax as cj  # noqa: E402
from cupygemm import reference as ref  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--hlo", action="store_true", help="print the optimized HLO's lines around the custom calls")
    args = p.parse_args()
    g, m, n, k, em = 4, 128, 7168, 2048, 64
    rng = np.random.default_rng(0)
    f8 = ml_dtypes.float8_e4m3fn
    qa = [ref.per_token_cast_to_fp8_reference(rng.standard_normal((m, k)).astype(np.float32)) for _ in range(g)]
    qb = [ref.per_block_cast_to_fp8_reference(rng.standard_normal((n, k)).astype(np.float32)) for _ in range(g)]
    a = jnp.asarray(np.stack([q[0] for q in qa]).view(f8))
    sfa = np.stack([q[1] for q in qa])
    b, sfb = jnp.asarray(np.stack([q[0] for q in qb]).view(f8)), jnp.asarray(np.stack([q[1] for q in qb]))
    mm = jnp.asarray((rng.uniform(0.7, 1.3, g) * em).astype(np.int32).clip(0, m))
    sfa_steps = jnp.asarray(np.broadcast_to(sfa, (args.steps,) + sfa.shape).copy())
    scales = jnp.ones(args.steps, jnp.float32)

    variants = {
        # A's scales sliced per step straight from the stacked array (the benchmark's case)
        "slice": lambda sa, s, prev: cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(a, sa, b, sfb, mm, em, out=prev),
        # the slice times a per-step scalar: a fusion writes the scales to a temporary first
        "slice*scalar": lambda sa, s, prev: cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(a, sa * s, b, sfb, mm, em,
                                                                                      out=prev),
        # the dense GEMM on group 0's rows, same slices: its scales did not move in the benchmark
        "dense": lambda sa, s, prev: cj.gemm_fp8_fp8_bf16_nt(a[0], sa[0], b[0], sfb[0])[None].repeat(g, 0),
    }
    handler = cj._handlers.get("cuda")
    out = {"xla_flags": os.environ.get("XLA_FLAGS", ""), "variants": {}}
    for name, fn in variants.items():
        @jax.jit
        def run(xs, ss):
            def body(carry, x):
                return fn(x[0], x[1], carry), None
            return lax.scan(body, jnp.zeros((g, m, n), jnp.bfloat16), (xs, ss))[0]

        jax.block_until_ready(run(sfa_steps, scales))
        handler = handler or cj._handlers["cuda"]
        handler.trace = []
        jax.block_until_ready(run(sfa_steps, scales))
        trace, handler.trace = handler.trace, None
        moving = sorted({i for (_, p1), (_, p2) in zip(trace, trace[1:]) for i, (x, y) in enumerate(zip(p1, p2))
                         if x != y})
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            jax.block_until_ready(run(sfa_steps, scales))
            times.append((time.perf_counter() - t0) / args.steps * 1e6)
        out["variants"][name] = {"handler_calls_per_warm_scan": len(trace), "moving_buffers": moving,
                                 "us_per_step": sorted(times)[len(times) // 2]}
        print(name, out["variants"][name], flush=True)
        if args.hlo:
            print_operand_producers(run.lower(sfa_steps, scales).compile().as_text())
    print(json.dumps(out))


def print_operand_producers(text: str) -> None:
    """The custom call's line and, two levels deep, the lines defining its operands."""
    import re

    defs = {}
    for line in text.splitlines():
        mt = re.match(r"\s*(?:ROOT\s+)?(%?[\w.\-]+)\s*=", line)
        if mt:
            defs[mt.group(1).lstrip("%")] = line.strip()
    for line in text.splitlines():
        if 'custom_call_target="cupygemm' in line:
            print("CALL:", line.strip()[:400])
            args = re.search(r"custom-call\(([^)]*)\)", line).group(1)
            for name in re.findall(r"[\]}]\s+%?([\w.\-]+)", args)[:2]:
                d = defs.get(name, "?")
                print("  ARG", name, ":", d[:300])
                for n2 in re.findall(r"[\]}]\s+%?([\w.\-]+)", d.split("=", 1)[-1]):
                    print("    <-", n2, ":", defs.get(n2, "?")[:300])
            break


if __name__ == "__main__":
    main()
