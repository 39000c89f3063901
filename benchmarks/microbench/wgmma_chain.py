"""Cycles per K block of the math warpgroups' wgmma -> wait -> promote chain: what promotion costs the tensor pipe.

Usage on a Hopper machine: PYTHONPATH=. python benchmarks/microbench/wgmma_chain.py [--out F.json]
Without a GPU it only compiles every variant (NVRTC). One CTA per SM, ITER K blocks; cycles from clock64 around the
loop, the slowest warpgroup of each CTA; the median over the CTAs is reported with the ideal (the tensor pipe's
8192 FP8 FLOP per cycle per SM).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

from cupygemm.jit.compiler import compile_cubin
from cupygemm.jit.source import KernelSource, _read

HERE = os.path.dirname(os.path.abspath(__file__))
HEADERS = ["ptx_common.cuh", "ptx_mbarrier.cuh", "ptx_wgmma.cuh", "ptx_wgmma_fp8.cuh"]
ITER = 2000
# name, warpgroups, serial m64 sub-tiles per warpgroup, wgmma N, promote, TX bytes per block, SKEW, ALT, KB
VARIANTS = [
    ("256x128 serial, mma only", 2, 2, 128, 0, 0, 0, 0, 0),
    ("256x128 serial, promote", 2, 2, 128, 1, 0, 0, 0, 0),
    ("256x128 serial, promote, skew 200", 2, 2, 128, 1, 0, 200, 0, 0),
    ("256x128 serial, promote, skew 400", 2, 2, 128, 1, 0, 400, 0, 0),
    ("256x128 serial, promote, alternate", 2, 2, 128, 1, 0, 0, 1, 0),
    ("128x128, promote", 2, 1, 128, 1, 0, 0, 0, 0),
    ("128x128, promote, alternate", 2, 1, 128, 1, 0, 0, 1, 0),
    ("192x128 3WG, promote", 3, 1, 128, 1, 0, 0, 0, 0),
    ("192x128 3WG, promote, alternate", 3, 1, 128, 1, 0, 0, 1, 0),
    ("256x128 serial, promote, tx48K", 2, 2, 128, 1, 49152, 0, 0, 0),
    ("256x128 serial, promote, alternate, tx48K", 2, 2, 128, 1, 49152, 0, 1, 0),
    ("256x128 serial, promote, tx48K, kblock lead", 2, 2, 128, 1, 49152, 0, 0, 1),
    ("128x128, promote, tx32K", 2, 1, 128, 1, 32768, 0, 0, 0),
    ("128x128, promote, tx32K, kblock lead", 2, 1, 128, 1, 32768, 0, 0, 1),
    ("192x128 3WG, promote, tx40K", 3, 1, 128, 1, 40960, 0, 0, 0),
]


def build(v) -> bytes:
    _, nwg, sl, wn, pr, tx, skew, alt, kb = v
    defs = dict(NWG=nwg, SL=sl, WN=wn, PROMOTE=pr, TX=tx, ITER=ITER, SKEW=skew, ALT=alt, KB=kb)
    text = "".join(f"#define {k} {val}\n" for k, val in defs.items())
    text += open(os.path.join(HERE, "wgmma_chain.cu")).read()
    return compile_cubin(KernelSource(name="wgmma_chain.cu", text=text, headers={h: _read(h) for h in HEADERS},
                                      entry="wgmma_chain"))


def main() -> None:
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    try:
        import cupy as cp
        nsm = cp.cuda.Device().attributes["MultiProcessorCount"]
    except Exception:  # no GPU: compile only
        cp = None
    results = []
    if cp is not None:
        src = cp.zeros(nsm * 3 * 49152 * 2, dtype=cp.uint8)
    for i, v in enumerate(VARIANTS):
        cubin = build(v)
        if cp is None:
            print("compiled", v[0], len(cubin), "bytes")
            continue
        name, nwg, sl, wn, pr, tx, skew, alt, kb = v
        path = os.path.join(tempfile.gettempdir(), f"wgmma_chain_{i}.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        kernel = cp.RawModule(path=path).get_function("wgmma_chain")
        smem = 210 * 1024
        kernel.max_dynamic_shared_size_bytes = smem
        threads = 128 * (nwg + (1 if tx else 0))
        sums = cp.zeros(nsm * threads, dtype=cp.float32)
        cycles = cp.zeros(nsm * 4, dtype=cp.int64)
        for _ in range(3):
            kernel((nsm,), (threads,), (src, sums, cycles), shared_mem=smem)
        cp.cuda.Device().synchronize()
        per_block = sorted((cycles.get().reshape(nsm, 4)[:, :nwg].max(axis=1) / ITER).tolist())
        ideal = nwg * sl * 64 * wn * 128 * 2 / 8192
        med = per_block[len(per_block) // 2]
        r = dict(name=name, warpgroups=nwg, slices=sl, wgmma_n=wn, promote=pr, tx=tx, skew=skew, alternate=alt,
                 kblock_lead=kb, ideal_clk=ideal, clk_per_kblock_median=med, clk_min=per_block[0],
                 clk_max=per_block[-1], tensor_util=ideal / med)
        print(json.dumps(r), flush=True)
        results.append(r)
    if out and cp is not None:
        with open(out, "w") as f:
            json.dump(dict(device=cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                           command=" ".join(sys.argv), results=results), f, indent=1)


if __name__ == "__main__":
    main()
