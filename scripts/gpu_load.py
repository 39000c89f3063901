"""Keep the GPU busy from another process for a bounded time: GEMMs in a loop on a few streams, then exit.

For ``scripts/device_check.sh tests-under-load``: stream-ordering bugs in tests (work on one stream reading what
another stream has not finished) hid while the GPU was otherwise idle and showed when another process kept it busy
(issue 50: 200 of 200 PDL chains compared wrong beside another process's load, 0 of 200 alone).

    python3 scripts/gpu_load.py --seconds 600                    # cupygemm FP8 GEMMs, 4096x7168x7168, two streams
    python3 scripts/gpu_load.py --seconds 60 --kind cupy         # CuPy float16 matmuls (cuBLAS) instead

Prints ``running ...`` once the loop starts (after the first GEMM compiled and ran) and a summary line when it ends:
at ``--seconds``, or on SIGTERM/SIGINT. The work queued per stream between host synchronizations is bounded
(``--batch``), so stopping takes at most one batch.
"""
from __future__ import annotations

import argparse
import signal
import sys
import time


def _inputs(kind: str, m: int, n: int, k: int, streams: list):
    """(call(out), out per stream): the GEMM a stream runs in the loop, and each stream's output buffer."""
    import cupy as cp

    rng = cp.random.default_rng(0)
    if kind == "cupy":
        a = rng.standard_normal((m, k), dtype=cp.float32).astype(cp.float16)
        bt = rng.standard_normal((k, n), dtype=cp.float32).astype(cp.float16)
        outs = [cp.empty((m, n), cp.float16) for _ in streams]
        return (lambda out: cp.matmul(a, bt, out=out)), outs
    import cupygemm

    x = rng.standard_normal((m, k), dtype=cp.float32)
    w = rng.standard_normal((n, k), dtype=cp.float32)
    a, sfa = cupygemm.per_token_cast_to_fp8(x)
    sfa = cupygemm.get_col_major_tma_aligned_tensor(sfa)  # the kernels' layout: no copy per call
    b, sfb = cupygemm.per_block_cast_to_fp8(w)
    outs = [cp.empty((m, n), cupygemm.tensors.BF16) for _ in streams]
    return (lambda out: cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)), outs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, required=True, help="run this long, then exit")
    p.add_argument("--kind", choices=("cupygemm", "cupy"), default="cupygemm",
                   help="cupygemm FP8 GEMMs (default) or CuPy float16 matmuls")
    p.add_argument("--shape", default="4096x7168x7168", help="MxNxK of each GEMM (default 4096x7168x7168)")
    p.add_argument("--streams", type=int, default=2, help="non-blocking streams taking turns (default 2)")
    p.add_argument("--batch", type=int, default=4, help="GEMMs queued per stream between its syncs (default 4)")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.streams < 1 or args.batch < 1:
        p.error("--seconds, --streams and --batch must be positive")
    m, n, k = (int(v) for v in args.shape.lower().split("x"))

    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.append(signum))

    import cupy as cp

    start = time.monotonic()
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(args.streams)]
    with streams[0]:
        call, outs = _inputs(args.kind, m, n, k, streams)
        call(outs[0])  # compile (or load) the kernel before the loop
    cp.cuda.Device().synchronize()
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    print(f"running {args.kind} {m}x{n}x{k} on {args.streams} streams, {args.batch} per batch, for "
          f"{args.seconds:g} s on {name} (ready after {time.monotonic() - start:.1f} s)", flush=True)

    begin = time.monotonic()
    deadline = start + args.seconds
    gemms = 0
    while not stop and time.monotonic() < deadline:
        for s, out in zip(streams, outs):  # refill each stream while the others still have work queued
            s.synchronize()
            with s:
                for _ in range(args.batch):
                    call(out)
            gemms += args.batch
    for s in streams:
        s.synchronize()
    took = time.monotonic() - begin
    why = f"signal {stop[0]}" if stop else "time up"
    print(f"stopped ({why}): {gemms} GEMMs in {took:.1f} s, {2 * m * n * k * gemms / max(took, 1e-9) / 1e12:.0f} "
          f"TFLOPS on average", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
