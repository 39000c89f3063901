"""What the seed shapes could take at best, measured like the bench: how much any kernel could still gain per shape.

Usage on a Hopper machine with torch (and DeepGEMM on PYTHONPATH):
    PYTHONPATH=. python benchmarks/microbench/ceilings.py [--rounds 2] [--iters 20] [--out F.json]

For every seed shape, in one process, each call after the bench's untimed 1 GiB memset, CUPTI kernel time:
- ``stream``: one kernel that reads the bytes a GEMM must read (A's valid rows, every group's B) and writes the
  bytes it must write (D's valid rows), with every SM busy and 64 B per thread in flight: the memory half of a
  practical floor. It pays what a GEMM pays after the flush (launch, DRAM behind the memset's dirty lines) and
  nothing a GEMM needs beyond moving the bytes;
- ``cublas_tensor``: cuBLASLt FP8 with one scale per tensor (no promotion at all), normal shapes;
- cupygemm, DeepGEMM and cuBLAS block-scaled, as in the bench.
A compute row (8192^3) gives the best FP8 rate any of them sustains here; the practical floor of a shape is then
max(stream, FLOPs / that rate), and DeepGEMM's time over it is the most any kernel could gain on DeepGEMM there.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

from cupygemm.bench import cases, environment, inputs, metrics, providers, run, timing

STREAM_SOURCE = r"""
// UNROLL independent 16-byte loads per thread and trip: bytes in flight for DRAM bandwidth.
template <int UNROLL>
__device__ void stream_bytes(const uint4* __restrict__ a, long long na, const uint4* __restrict__ b, long long nb,
                             uint4* __restrict__ d, long long nd, unsigned int* __restrict__ sink) {
    const long long step = (long long)gridDim.x * blockDim.x;
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int acc = 0;
    for (int part = 0; part < 2; ++part) {
        const uint4* src = part ? b : a;
        const long long n = part ? nb : na;
        for (long long i = t; i < n; i += UNROLL * step) {
            uint4 v[UNROLL];
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                v[u] = i + u * step < n ? __ldcs(src + i + u * step) : make_uint4(0, 0, 0, 0);
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        }
    }
    for (long long i = t; i < nd; i += step) d[i] = make_uint4(acc, acc, acc, acc);
    if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the reads live
}

#define STREAM_ENTRY(U) \
    extern "C" __global__ void __launch_bounds__(512) stream_bytes_u##U(                                  \
            const uint4* a, long long na, const uint4* b, long long nb, uint4* d, long long nd,           \
            unsigned int* sink) { stream_bytes<U>(a, na, b, nb, d, nd, sink); }
STREAM_ENTRY(4)
STREAM_ENTRY(8)

extern "C" __global__ void empty_grid() {}
"""

COMPUTE_SHAPE = cases.Shape("normal", (8192, 8192, 8192))


class StreamReference:
    """Moves a shape's bytes once: the memory half of the practical floor."""

    def __init__(self, module, num_sms: int, unroll: int):
        import cupy

        self.name = f"stream_u{unroll}"
        self.kernel = module.get_function(f"stream_bytes_u{unroll}")
        self.grid = num_sms * 4
        self.sink = cupy.zeros(1, dtype=cupy.uint32)

    def supports(self, shape: cases.Shape) -> bool:
        return True

    def prepare(self, inp: inputs.Inputs) -> providers.Prepared:
        import cupy

        _, nbytes = metrics.work(inp.shape, inp.sizes)
        k, n = inp.shape.k, inp.shape.n
        valid_m = inp.sizes.valid_m
        a_bytes, d_bytes = valid_m * k, 2 * valid_m * n
        b_bytes = nbytes - a_bytes - d_bytes
        a = inp.a.reshape(-1).view(cupy.uint8)
        b = inp.b.reshape(-1).view(cupy.uint8)
        assert a_bytes <= a.nbytes and b_bytes == b.nbytes, (a_bytes, a.nbytes, b_bytes, b.nbytes)
        d = cupy.empty(d_bytes + 16, dtype=cupy.uint8)
        args = (a, cupy.int64(a_bytes // 16), b, cupy.int64(b_bytes // 16), d, cupy.int64(d_bytes // 16), self.sink)

        def call():
            self.kernel((self.grid,), (512,), args)

        return providers.Prepared(call, lambda: None)


class EmptyGridReference:
    """An empty kernel over the GEMM's grid (one CTA per SM) after the flush: launch and teardown alone."""

    name = "empty"

    def __init__(self, module, num_sms: int):
        self.kernel = module.get_function("empty_grid")
        self.grid = num_sms

    def supports(self, shape: cases.Shape) -> bool:
        return True

    def prepare(self, inp: inputs.Inputs) -> providers.Prepared:
        def call():
            self.kernel((self.grid,), (384,), ())

        return providers.Prepared(call, lambda: None)


class CublasTensorReference:
    """cuBLASLt FP8 with one scale per tensor through torch._scaled_mm: a GEMM that does no promotion."""

    name = "cublas_tensor"

    def __init__(self, torch):
        self.torch = torch

    def supports(self, shape: cases.Shape) -> bool:
        return shape.kind == "normal"

    def prepare(self, inp: inputs.Inputs) -> providers.Prepared:
        torch = self.torch
        a = providers.torch_fp8(torch, inp.a)
        bt = providers.torch_fp8(torch, inp.b).t()
        one = torch.ones((), dtype=torch.float32, device=a.device)

        def call():
            torch._scaled_mm(a, bt, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        return providers.Prepared(call, lambda: None)


def time_shape(shape, sizes, runners, timer, iters, rounds, seed):
    inp = inputs.make_inputs(shape, sizes, seed)
    flops, nbytes = metrics.work(shape, sizes)
    out = {"kind": shape.kind, "shape": list(shape.dims), "flops": flops, "bytes": nbytes, "us": {}, "rounds": {}}
    for r in range(rounds):
        for name, prepare in runners:
            if name not in out["rounds"]:
                out["rounds"][name] = []
            prep, stats, error = run.run_provider(name, prepare, inp, timer, iters)
            out["rounds"][name].append(stats["us"] if stats else None)
            if error:
                out.setdefault("errors", {})[name] = error
    for name, meds in out["rounds"].items():
        ok = [m for m in meds if m is not None]
        out["us"][name] = statistics.median(ok) if ok else None
    streams = [v for k, v in out["us"].items() if k.startswith("stream_u") and v]
    out["us"]["stream"] = min(streams) if streams else None
    del inp
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    return out


def analyse(rows, copy_bw):
    """Adds the practical floor and DeepGEMM's headroom to every row; returns the summary."""
    comp = next(r for r in rows if r["kind"] == COMPUTE_SHAPE.kind and tuple(r["shape"]) == COMPUTE_SHAPE.dims)
    rates = {p: comp["flops"] / (us * 1e-6) for p, us in comp["us"].items()
             if us and not p.startswith("stream") and p != "empty"}
    best = max(rates.values())
    summary = {"compute_shape": list(COMPUTE_SHAPE.dims), "compute_tflops": {p: v / 1e12 for p, v in rates.items()},
               "best_tflops": best / 1e12, "copy_gbs": copy_bw / 1e9}
    heads = []
    for r in rows:
        if r is comp:
            continue
        us = r["us"]
        r["datasheet_floor_us"] = metrics.floor_us(r["flops"], r["bytes"], copy_bw)
        r["compute_floor_us"] = r["flops"] / best * 1e6
        r["practical_floor_us"] = max(us.get("stream") or 0.0, r["compute_floor_us"])
        dg, ours = us.get("deepgemm"), us.get("cupygemm")
        if dg:
            r["deepgemm_headroom"] = dg / r["practical_floor_us"]
            heads.append(r["deepgemm_headroom"])
        if ours:
            r["cupygemm_pct_practical"] = 100 * r["practical_floor_us"] / ours
    if heads:
        summary["deepgemm_headroom_geomean"] = math.exp(sum(map(math.log, heads)) / len(heads))
        summary["shapes_with_headroom_below_1_25"] = sum(h < 1.25 for h in heads)
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--match-rows", default=None)
    ap.add_argument("--kinds", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import cupy

    from cupygemm.device import get_num_sms, require_hopper

    info = require_hopper()
    peers, notes = providers.load_peers(list(providers.PEERS))
    for n in notes:
        print(n, file=sys.stderr)
    module = cupy.RawModule(code=STREAM_SOURCE)  # the stream kernels and the empty one, compiled once
    refs = [StreamReference(module, get_num_sms(), 4), StreamReference(module, get_num_sms(), 8),
            EmptyGridReference(module, get_num_sms())]
    torch = next((p.torch for p in peers.values()), None)
    if torch is not None:
        refs.append(CublasTensorReference(torch))
    kernel_timer, why = timing.open_cupti_timer()
    if kernel_timer is None:
        raise SystemExit(f"CUPTI is needed: {why}")
    timer = timing.Timer(kernel_timer=kernel_timer)
    shapes = cases.select_shapes(cases.parse_kinds(args.kinds), None) + [COMPUTE_SHAPE]
    sizes = cases.shape_sizes(shapes, args.seed, args.match_rows)
    run.precompile(shapes, sizes, get_num_sms(), info.max_smem_per_block, os.cpu_count() or 1)
    copy_bw = timing.measure_copy_bandwidth()
    rows = []
    with run.stream_context(peers):
        for s in shapes:
            runners = [("cupygemm", providers.prepare_cupygemm)]
            runners += [(p.name, p.prepare) for p in list(peers.values()) + refs if p.supports(s)]
            row = time_shape(s, sizes[s], runners, timer, args.iters, args.rounds, args.seed)
            rows.append(row)
            print(row["kind"], "x".join(map(str, row["shape"])),
                  " ".join(f"{k}={v:.1f}" for k, v in row["us"].items() if v), flush=True)
    summary = analyse(rows, copy_bw)
    print(json.dumps(summary, indent=1))
    cols = ("empty", "stream", "cublas_tensor", "cupygemm", "deepgemm", "cublas_block")
    print("| kind | shape | floor | practical floor | " + " | ".join(cols) + " | DeepGEMM headroom |")
    for r in rows:
        if "practical_floor_us" not in r:
            continue
        cells = [f"{r['us'][c]:.1f}" if r["us"].get(c) else "-" for c in cols]
        print(f"| {r['kind']} | {'x'.join(map(str, r['shape']))} | {r['datasheet_floor_us']:.1f} | "
              f"{r['practical_floor_us']:.1f} | " + " | ".join(cells) + f" | {r.get('deepgemm_headroom', 0):.2f}x |")
    if args.out:
        meta = {"device": info.name, "command": " ".join(["python"] + sys.argv), "git_revision": environment.git_revision(),
                "cupy": cupy.__version__, "method": timing.timing_method(True, timing.FLUSH_BYTES)}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "summary": summary, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
