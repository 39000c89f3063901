"""Where the JAX expert-parallel layer's time goes on 1 and 2 GPUs: a CUPTI timeline of kernels, memcpys and
memsets per device for a few calls of the jitted layer (cupygemm.jax.parallel_bench.moe_setup, the bench's
defaults), summarized per call and device: span, busy time, the kernels grouped by family, and the idle gaps with
the records on either side. Usage: python3 benchmarks/probes/jax_ep_timeline.py OUT.json [--calls 3] [--variant
base] (XLA flags as the example's: latency-hiding scheduler on). Reads CUPTI through ctypes (libcupti as
cupygemm.bench.cupti finds it): activity records of kernels, memcpys and memsets with their device and stream."""
import argparse
import json
import os
import re
import sys
import time
import ctypes

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_latency_hiding_scheduler=true"
                           " --xla_gpu_experimental_parallel_collective_overlap_limit=2").strip()

import jax  # noqa: E402

from cupygemm.bench import cupti as cupti_mod  # noqa: E402
from cupygemm.jax import parallel_bench as pb  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--calls", type=int, default=3)
ap.add_argument("--variant", default="base")
ap.add_argument("--tokens", type=int, default=4096)
args = ap.parse_args()

# CUPTI activity kinds and where their records keep (start, end, deviceId, streamId): kernels as
# cupygemm.bench.cupti reads them (CUpti_ActivityKernel4..9), memcpys (also peer ones) and memsets (Memcpy5/6,
# MemcpyPtoP, Memset4: the same head).
KINDS = {10: "kernel", 1: "memcpy", 2: "memset", 22: "memcpy_p2p"}
OFFS = {"kernel": (16, 24, 40, 48), "memcpy": (16, 24, 32, 40), "memset": (16, 24, 32, 40),
        "memcpy_p2p": (16, 24, 32, 40)}
lib = None
for path in cupti_mod._candidate_paths():
    try:
        lib = ctypes.CDLL(path)
        break
    except OSError:
        continue
if lib is None:
    sys.exit("no libcupti")
records, buffers = [], {}


def on_request(buf_pp, size_p, max_p):
    buf = (ctypes.c_uint8 * ((8 << 20) + 8))()
    addr = (ctypes.addressof(buf) + 7) & ~7
    buffers[addr] = buf
    buf_pp[0] = ctypes.cast(addr, ctypes.POINTER(ctypes.c_uint8))
    size_p[0] = 8 << 20
    max_p[0] = 0


def on_complete(ctx, stream_id, buf_p, size, valid):
    addr = ctypes.cast(buf_p, ctypes.c_void_p).value
    rec = ctypes.c_void_p()
    while valid and lib.cuptiActivityGetNextRecord(buf_p, ctypes.c_size_t(valid), ctypes.byref(rec)) == 0:
        base = rec.value
        kind = KINDS.get(ctypes.c_uint32.from_address(base).value)
        if kind is None:
            continue
        o_s, o_e, o_d, o_st = OFFS[kind]
        if kind == "kernel":
            name = (ctypes.c_char_p.from_address(base + 104).value or b"").decode(errors="replace")
            nbytes = 0
        else:
            nbytes = ctypes.c_uint64.from_address(base + 8).value
            name = f"{kind}:{ctypes.c_uint8.from_address(base + 4).value}:{nbytes}"
        records.append({"kind": kind, "name": name, "dev": ctypes.c_uint32.from_address(base + o_d).value,
                        "stream": ctypes.c_uint32.from_address(base + o_st).value,
                        "start": ctypes.c_uint64.from_address(base + o_s).value,
                        "end": ctypes.c_uint64.from_address(base + o_e).value, "bytes": nbytes})
    buffers.pop(addr, None)


_req, _done = cupti_mod._REQUESTED(on_request), cupti_mod._COMPLETED(on_complete)
assert lib.cuptiActivityRegisterCallbacks(_req, _done) == 0


class _Cupti:  # the calls below, on libcupti
    @staticmethod
    def activity_enable(kind):
        if lib.cuptiActivityEnable(kind) != 0:
            print(f"CUPTI activity kind {kind} ({KINDS[kind]}) not enabled")

    @staticmethod
    def activity_disable(kind):
        lib.cuptiActivityDisable(kind)

    @staticmethod
    def activity_flush_all(flag):
        lib.cuptiActivityFlushAll(flag)


cupti = _Cupti


def family(name: str) -> str:
    n = name.lower()
    if "nccl" in n:
        return "nccl"
    if "cupygemm" in n or "fp8_gemm" in n or "gemm_kernel" in n:
        return "cupygemm_gemm"
    if "cast" in n or "quant" in n:
        return "cupygemm_cast"
    if n.startswith("memcpy") or n.startswith("memset"):
        return n.split(":")[0]
    m = re.match(r"([a-z_]+?)(_fusion|fusion)", n)
    return (m.group(1) + "fusion") if m else n[:40]


def summarize(recs):
    out = {}
    for dev in sorted({r["dev"] for r in recs}):
        rs = sorted((r for r in recs if r["dev"] == dev), key=lambda r: r["start"])
        if not rs:
            continue
        first, last = rs[0]["start"], max(r["end"] for r in rs)
        busy, cur_s, cur_e, gaps = 0, None, None, []
        prev = None
        for r in rs:
            if cur_e is None or r["start"] > cur_e:
                if cur_e is not None:
                    busy += cur_e - cur_s
                    if r["start"] - cur_e > 3000:
                        gaps.append({"gap_us": (r["start"] - cur_e) / 1e3, "at_us": (cur_e - first) / 1e3,
                                     "after": prev["name"][:80], "before": r["name"][:80]})
                cur_s, cur_e = r["start"], r["end"]
            else:
                cur_e = max(cur_e, r["end"])
            prev = r if prev is None or r["end"] >= prev["end"] else prev
        busy += cur_e - cur_s
        fams = {}
        for r in rs:
            f = fams.setdefault(family(r["name"]), [0, 0.0])
            f[0] += 1
            f[1] += (r["end"] - r["start"]) / 1e3
        out[str(dev)] = {"span_us": (last - first) / 1e3, "busy_us": busy / 1e3, "records": len(rs),
                         "families_us": {k: [v[0], round(v[1], 1)] for k, v in sorted(fams.items(), key=lambda x: -x[1][1])},
                         "gaps": gaps,
                         "timeline": [{"t_us": round((r["start"] - first) / 1e3, 1),
                                       "dur_us": round((r["end"] - r["start"]) / 1e3, 1), "stream": r["stream"],
                                       "name": r["name"][:100]} for r in rs]}
    return out


variant = pb.parse_variant(args.variant) if args.variant != "base" else {}
layer = {k: v for k, v in variant.items() if k in ("overlap", "decide", "transport")}
gpus = jax.devices("gpu")
result = {"device": gpus[0].device_kind, "command": " ".join(sys.argv), "xla_flags": os.environ["XLA_FLAGS"],
          "runs": []}
for n in sorted({1, len(gpus)}):
    f, fargs, info = pb.moe_setup(gpus[:n], args.tokens, 7168, 2048, 8, 8, 1.125, **layer)
    for _ in range(5):
        jax.block_until_ready(f(*fargs))
    calls = []
    for _ in range(args.calls):  # one recording per call: every record is that call's
        records.clear()
        for kind in KINDS:
            cupti.activity_enable(kind)
        cupti.activity_flush_all(1)
        records.clear()
        w0 = time.perf_counter()
        jax.block_until_ready(f(*fargs))
        wall = (time.perf_counter() - w0) * 1e3
        cupti.activity_flush_all(1)
        for kind in KINDS:
            cupti.activity_disable(kind)
        calls.append({"wall_ms": wall, "devices": summarize(list(records))})
    result["runs"].append({"devices": n, "slots": info["slots"], "max_count": info["max_count"], "calls": calls})
    for i, c in enumerate(calls):
        print(f"{n} GPU call {i}: wall {c['wall_ms']:.3f} ms")
        for dev, s in c["devices"].items():
            print(f"  dev {dev}: span {s['span_us']:.0f} us busy {s['busy_us']:.0f} us, {s['records']} records, "
                  f"gaps>3us {sum(g['gap_us'] for g in s['gaps']):.0f} us in {len(s['gaps'])}")
            print("   ", {k: v for k, v in list(s["families_us"].items())[:12]})
            for g in sorted(s["gaps"], key=lambda g: -g["gap_us"])[:6]:
                print("    gap", g)
    del f, fargs
with open(args.out, "w") as fh:
    json.dump(result, fh, indent=1)
print("wrote", args.out)
