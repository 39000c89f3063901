"""Dump the chosen config of a large grid of problems to JSON, to check that a change to the chooser is neutral.

    PYTHONPATH=$PWD python scripts/dump_configs.py out.json            # write the dump
    PYTHONPATH=$PWD python scripts/dump_configs.py --check old.json    # compare against a dump, list differences

Covers all three kinds, the seed shapes (cupygemm.shapes), M = 1..4096 at the memo-class boundaries for the
DeepSeek-V3 (N, K) pairs, grouped problems over several group counts, 132 and 114 SMs (H100 SXM and PCIe), and
problems under overrides.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from cupygemm import config as C
from cupygemm.shapes import CONTIGUOUS, K_TAIL_SHAPE, MASKED, NORMAL, NORMAL_NK

DEEPSEEK_NK = list(NORMAL_NK)
EXTRA_NK = [(7168, 576), (576, 7168), (1536, 7168), (256, 7168), (7168, 4096), (4096, 4096), (8192, 8192),
            (1000, 1000), (200, 3000)]
# Every memo class of normal M up to 4096 (M = 64 j), and values inside classes.
M_VALUES = sorted({*range(1, 17), *range(64, 4097, 64), 24, 48, 63, 65, 100, 127, 129, 200, 257, 1000, 4000})
SMS = (132, 114)
GROUPED_NK = [(4096, 7168), (7168, 2048), (2048, 7168), (7168, 4096), (3072, 1536)]
GROUPS = (1, 2, 4, 8, 16, 32)
CONTIG_ROWS_PER_GROUP = (128, 256, 512, 1024, 2048, 4096, 8192)
MASKED_EXPECTED_M = (1, 8, 32, 64, 100, 128, 192, 256, 512, 1024)

# Overrides: (kind, n, k, fields, M values).
OVERRIDES = [
    ("normal", 4096, 7168, dict(block_m=128, block_n=128), (64, 4096)),
    ("normal", 4096, 7168, dict(block_m=256, block_n=128, serial_m=True, multicast=2), (4096,)),
    ("normal", 4096, 7168, dict(block_n=96), (64, 512, 4096)),
    ("normal", 4096, 7168, dict(block_m=64), (64, 512, 4096)),
    ("normal", 4096, 7168, dict(num_stages=4), (64, 4096)),
    ("normal", 4096, 7168, dict(num_sms=100), (64, 4096)),
    ("normal", 4096, 7168, dict(raster_n=4), (4096,)),
    ("normal", 4096, 7168, dict(multicast=0), (128, 4096)),
    ("normal", 4096, 7168, dict(wgmma_n=64, block_m=128, block_n=128), (4096,)),
    ("normal", 2112, 7168, dict(split_k=2), (64, 128)),
    ("normal", 2112, 7168, dict(split_k=1), (64, 128)),
    ("normal", 2112, 7168, dict(block_m=64, block_n=64, split_k=4), (64,)),
    ("normal", 7168, 16384, dict(interleave_k=True, block_m=64, block_n=128), (64,)),
    ("normal", 7168, 16384, dict(interleave_k=False), (64,)),
    ("normal", 7168, 16384, dict(interleave_k=True), (64,)),
    ("normal", 4096, 7168, dict(stream_k=True), (4096, 2048)),
    ("normal", 4096, 7168, dict(stream_k=False), (4096, 2048)),
    ("normal", 4096, 7168, dict(block_m=128, block_n=128, stream_k=True), (4096,)),
    ("normal", 4096, 7168, dict(block_m=192, block_n=128), (4096,)),
    ("masked", 4096, 7168, dict(stream_k=False), (256, 1024)),
    ("masked", 4096, 7168, dict(block_m=128, block_n=128), (256,)),
    ("masked", 4096, 7168, dict(interleave_k=True, block_m=64, block_n=128, num_stages=6), (32,)),
    ("masked", 4096, 7168, dict(interleave_k=True, block_m=64, block_n=128, num_stages=8), (32,)),
    ("normal", 4096, 7168, dict(interleave_k=True, block_m=128, block_n=128), (64,)),
    ("normal", 4096, 7168, dict(split_k=3), (64,)),
    ("contiguous", 4096, 7168, dict(block_m=128, block_n=128), (8192,)),
    ("contiguous", 4096, 7168, dict(block_m=256, block_n=128, serial_m=True), (8192,)),
]


def normalize(cfg) -> dict:
    """A config as a dict in the split-K vocabulary, with the derived launch values."""
    d = dataclasses.asdict(cfg)
    for name in ("threads", "math_regs", "producer_regs", "a_box_rows"):
        d[name] = getattr(cfg, name)
    return dict(sorted(d.items()))


def choose(kind: int, m: int, n: int, k: int, g: int, sms: int) -> dict:
    try:
        return normalize(C.choose_config(kind, m, n, k, g, sms))
    except ValueError as e:
        return {"error": str(e).split(":")[0]}


def dump() -> dict[str, dict]:
    out: dict[str, dict] = {}

    def put(kind: int, m: int, n: int, k: int, g: int, sms: int, tag: str = "") -> None:
        out[f"{C.KIND_NAMES[kind]} m={m} n={n} k={k} g={g} sms={sms}{tag}"] = choose(kind, m, n, k, g, sms)

    for sms in SMS:
        for m, n, k in NORMAL + (K_TAIL_SHAPE,):
            put(C.KIND_NORMAL, m, n, k, 1, sms)
        for g, m, n, k in CONTIGUOUS:
            put(C.KIND_CONTIGUOUS, g * m, n, k, g, sms)
        for g, m, n, k in MASKED:
            put(C.KIND_MASKED, m, n, k, g, sms)
        for n, k in DEEPSEEK_NK + EXTRA_NK:
            for m in M_VALUES:
                put(C.KIND_NORMAL, m, n, k, 1, sms)
        for n, k in GROUPED_NK:
            for g in GROUPS:
                for rows in CONTIG_ROWS_PER_GROUP:
                    put(C.KIND_CONTIGUOUS, g * rows, n, k, g, sms)
                for em in MASKED_EXPECTED_M:
                    put(C.KIND_MASKED, em, n, k, g, sms)
    for kind, n, k, fields, ms in OVERRIDES:
        kid = C.kind_id(kind)
        tag = " override " + ",".join(f"{a}={b}" for a, b in sorted(fields.items()))
        try:
            C.override_config(kind, n, k, **fields)
        except ValueError as e:
            out[f"{kind} n={n} k={k}{tag}"] = {"error": str(e).split(":")[0]}
            continue
        try:
            for sms in SMS:
                for m in ms:
                    put(kid, m, n, k, 4 if kind != "normal" else 1, sms, tag)
        finally:
            C.override_config(kind, n, k)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--check", action="store_true", help="compare against PATH instead of writing it")
    args = ap.parse_args()
    now = dump()
    if not args.check:
        with open(args.path, "w") as f:
            json.dump(now, f, indent=0, sort_keys=True)
        print(f"{len(now)} problems -> {args.path}")
        return 0
    with open(args.path) as f:
        then = json.load(f)
    diff = [key for key in sorted(set(now) | set(then)) if now.get(key) != then.get(key)]
    for key in diff[:50]:
        print(f"{key}:\n  old {then.get(key)}\n  new {now.get(key)}")
    print(f"{len(now)} problems, {len(then)} in {args.path}: {len(diff)} differ")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
