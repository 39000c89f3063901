"""What else in a process invalidates a ``torch.cuda.graph`` capture (global mode, torch's default)?

Each case runs in its own process: a torch capture of two small kernels around ``during()``, repeated ``--trials``
times, stopping at the first invalidated capture (after one, torch's state is not worth trusting). One line per
case: ``<case>: valid in N of N`` or ``<case>: INVALIDATED at trial t (<error>)``.

    python3 scripts/capture_probe.py [--trials 10] [case ...]      # default: every case

Cases (issue 50, the torch capture test failing only inside a shared xdist worker; NOTES 34c measured the first four
kinds of call on the capturing thread):

- ``nothing``: the control.
- ``cupy-malloc``: a CuPy pool allocation that needs cudaMalloc, on the capturing thread (34c: invalidates).
- ``cupy-malloc-thread``: the same from another Python thread, started before the capture and allocating inside it
  (global mode checks every thread).
- ``cupy-free-gc``: a CuPy array in a garbage cycle collected during the capture (a pool free: 34c: valid).
- ``cupy-graph-gc``: a CuPy CUDA graph (captured and launched before) collected during the capture
  (cudaGraphExecDestroy, cudaGraphDestroy).
- ``torch-graph-gc``: an earlier torch CUDAGraph collected during the capture (its exec and private pool go).
- ``jax-h2d``: JAX host-to-device copies started just before the capture (XLA allocates their staging and device
  buffers on its own threads; with XLA_PYTHON_CLIENT_PREALLOCATE=false the device allocator grows by cuMemAlloc),
  the capture held open 0.2 s.
- ``jax-compute``: a compiled JAX computation with a new, larger output, dispatched just before, likewise.
"""
from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import threading
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

MIB = 1 << 20


def _cycle(obj):
    """``obj`` kept alive only by a reference cycle: freed by the next collection, not by reference counting."""
    holder = {"obj": obj}
    holder["self"] = holder
    return holder


# Each case returns (before, during): before() runs just before the capture begins, during() inside it.

def _nothing(trial):
    return None, None


def _cupy_malloc(trial):
    import cupy as cp

    return None, lambda: cp.empty((64 + trial) * MIB, cp.uint8)  # a size the pool has not seen: cudaMalloc


def _cupy_malloc_thread(trial):
    import cupy as cp

    def allocate():
        time.sleep(0.05)  # inside the capture by then
        cp.empty((64 + trial) * MIB, cp.uint8)
    t = threading.Thread(target=allocate)

    def during():
        time.sleep(0.2)
        t.join()
    return t.start, during


def _cupy_free_gc(trial):
    import cupy as cp

    holder = _cycle(cp.empty(8 * MIB, cp.uint8))
    del holder
    return None, gc.collect


def _cupy_graph_gc(trial):
    import cupy as cp

    s = cp.cuda.Stream(non_blocking=True)
    with s:
        x = cp.ones(MIB, cp.float32)
        x *= 2  # the kernel loads outside the capture
        s.begin_capture()
        x *= 2
        graph = s.end_capture()
        graph.launch(s)
    s.synchronize()
    holder = _cycle((graph, x, s))
    del holder, graph, x, s
    return None, gc.collect


def _torch_graph_gc(trial):
    import torch

    x = torch.ones(MIB, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x * 3
    g.replay()
    torch.cuda.synchronize()
    holder = _cycle((g, y))
    del holder, g, y
    return None, gc.collect


def _jax_h2d(trial):
    import jax.numpy as jnp
    import numpy as np

    host = [np.full((64 + 16 * trial) * MIB // 4, i, np.float32) for i in range(4)]
    started = []
    # jnp.asarray returns before XLA's threads have allocated and filled the device buffers
    return (lambda: started.extend(jnp.asarray(h) for h in host)), (lambda: time.sleep(0.2))


def _jax_compute(trial):
    import jax
    import jax.numpy as jnp

    v = jnp.ones(MIB, jnp.float32)
    compiled = jax.jit(jnp.tile, static_argnums=1).lower(v, 64 + 16 * trial).compile()  # a new, larger output
    jax.block_until_ready(v)
    started = []
    return (lambda: started.append(compiled(v))), (lambda: time.sleep(0.2))


CASES = {
    "nothing": _nothing,
    "cupy-malloc": _cupy_malloc,
    "cupy-malloc-thread": _cupy_malloc_thread,
    "cupy-free-gc": _cupy_free_gc,
    "cupy-graph-gc": _cupy_graph_gc,
    "torch-graph-gc": _torch_graph_gc,
    "jax-h2d": _jax_h2d,
    "jax-compute": _jax_compute,
}


def _child(case: str, trials: int) -> str:
    import torch

    x = torch.ones(MIB, device="cuda")
    for trial in range(trials):
        before, during = CASES[case](trial)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        try:
            if before:
                before()
            with torch.cuda.graph(g):
                y = x * 2
                if during:
                    during()
                y = y + 1
        except Exception as e:  # noqa: BLE001 - any error of the capture is the finding
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return f"{case}: INVALIDATED at trial {trial + 1} of {trials} ({type(e).__name__}: {first[:200]})"
        g.replay()
        torch.cuda.synchronize()
        if not bool((y == 3).all()):
            return f"{case}: WRONG replay result at trial {trial + 1}"
        del g, y
    return f"{case}: valid in {trials} of {trials}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="*", help=f"cases to run (default: all of {', '.join(CASES)})")
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(_child(args.child, args.trials), flush=True)
        return 0
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        p.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    for case in args.cases or list(CASES):
        try:
            r = subprocess.run([sys.executable, __file__, "--child", case, "--trials", str(args.trials)],
                               capture_output=True, text=True, timeout=300)
            lines = r.stdout.strip().splitlines()
            line = lines[-1] if lines and r.returncode == 0 else \
                f"{case}: child failed (rc {r.returncode}): {(r.stdout + r.stderr).strip()[-400:]}"
        except subprocess.TimeoutExpired:
            line = f"{case}: child timed out"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
