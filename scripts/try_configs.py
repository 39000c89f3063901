"""Time chosen config variants of a few shapes with the bench's inputs and timer (CUPTI kernel time).

For predict-change-measure experiments: each line of the spec file is a bench shape, its kind, and a list of
override_config variants ({} = the model's pick); rows go to OUT.json. Group sizes follow the bench
(--match-rows PEERS.json as in ``cupygemm bench``).

Usage (on a Hopper machine): python scripts/try_configs.py SPEC.json OUT.json [--match-rows PEERS.json] [--seed S] [--warm]
SPEC.json: [{"kind": "contiguous", "dims": [4, 8192, 4096, 7168], "variants": [{}, {"block_m": 128, ...}]}, ...]
An entry may fix its grouped rows with "group_rows": [...] (one per group) instead of the bench's draw, and a
masked entry its max_m with "max_m". A variant with "packed": true runs on weights packed by cupygemm.pack_weights
(the side-aware kernel of the variant's config).
OUT.json: {"device", "timing", "command", "spec", "rows": [{kind, dims, valid_m, variant, config, us, error}]}
Each variant's output is checked on sampled rows against the reference first (error "check FAIL").
"""
from __future__ import annotations

import argparse
import json
import sys

import cupy as cp
import numpy as np

from cupygemm import config as C
from cupygemm.bench import cases, checks, inputs, providers, timing
from cupygemm.bench.run import compile_configs


def sizes_of(entry: dict, shape: cases.Shape, drawn: cases.Sizes) -> cases.Sizes:
    """The entry's rows: its "group_rows" when given (grouped kinds), else the bench's draw; a masked entry's
    "max_m" replaces the bench's max_m (e.g. max_m = expected_m for groups whose rows are all valid)."""
    if "max_m" in entry:
        if shape.kind != "masked":
            raise SystemExit(f"{shape.label}: max_m is for masked entries")
        drawn = cases.Sizes(tuple(min(r, int(entry["max_m"])) for r in drawn.group_rows), int(entry["max_m"]))
    if "group_rows" not in entry:
        return drawn
    rows = tuple(int(r) for r in entry["group_rows"])
    if shape.kind == "normal" or len(rows) != shape.groups:
        raise SystemExit(f"{shape.label}: group_rows needs a grouped kind and one size per group, got {rows}")
    if shape.kind == "masked" and not all(0 <= r <= drawn.a_rows for r in rows):
        raise SystemExit(f"{shape.label}: masked group_rows must lie in [0, {drawn.a_rows}] (max_m), got {rows}")
    if shape.kind == "contiguous" and not all(r >= 1 for r in rows):
        raise SystemExit(f"{shape.label}: contiguous group_rows must be positive, got {rows}")
    if shape.kind == "contiguous":
        return cases.Sizes(rows, sum(cases.round_up(r, C.M_ALIGNMENT) for r in rows))
    return cases.Sizes(rows, drawn.a_rows)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("spec")
    p.add_argument("out")
    p.add_argument("--match-rows", default=None)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warm", action="store_true",
                   help="no L2 flush before each call (a loop on the same weights; the bench flushes 1 GiB)")
    p.add_argument("--seed", type=int, default=0, help="the bench's seed for group sizes (without --match-rows)")
    args = p.parse_args()
    spec = json.load(open(args.spec))
    shapes = [cases.Shape(e["kind"], tuple(e["dims"])) for e in spec]
    drawn = cases.shape_sizes(shapes, args.seed, args.match_rows)
    sizes = [sizes_of(e, s, drawn[s]) for e, s in zip(spec, shapes)]

    def fields(v):
        return {f: x for f, x in v.items() if f != "packed"}

    def configs(shape, size, variants):
        out = []
        for v in variants:
            C.override_config(shape.kind, shape.n, shape.k, **fields(v))
            try:
                out.append(cases.shape_config(shape, size, 132, sides=bool(v.get("packed"))))
            except ValueError as ex:
                print(f"skip {shape.label} {v}: {ex}")
                out.append(None)
            finally:
                C.override_config(shape.kind, shape.n, shape.k)
        return out

    all_cfgs = [c for e, s, z in zip(spec, shapes, sizes) for c in configs(s, z, e["variants"]) if c is not None]
    secs = compile_configs(all_cfgs, 16, progress=False)
    print(f"compiled {len(set(all_cfgs))} kernels in {secs:.0f}s", flush=True)
    kernel_timer, why = timing.open_cupti_timer()
    timer = timing.Timer(16 if args.warm else timing.FLUSH_BYTES, kernel_timer)
    print("timing:", "cupti" if kernel_timer else f"events ({why})", flush=True)
    rows = []
    for e, shape, size in zip(spec, shapes, sizes):
        inp = inputs.make_inputs(shape, size, 0)
        plain = providers.prepare_cupygemm(inp)
        packed = None
        sel_rows, sel_groups = cases.check_rows(shape, size, checks.CHECK_ROWS, 0)
        ref = checks.reference_rows(inp, sel_rows, sel_groups)
        for v, cfg in zip(e["variants"], configs(shape, size, e["variants"])):
            if cfg is None:
                continue
            C.override_config(shape.kind, shape.n, shape.k, **fields(v))
            try:
                prep = plain
                if v.get("packed"):
                    if packed is None:
                        import cupygemm

                        packed = providers.prepare_cupygemm(inp, cupygemm.pack_weights(inp.b, inp.sfb))
                    prep = packed
                prep.output().fill(0)
                prep.call()
                check = checks.compare(checks.output_rows(prep.output(), sel_rows), *ref)["check"]
                us = float(np.median(timer.time(prep.call, args.iters)))
                err = None if check == "ok" else "check FAIL"
            except Exception as ex:  # keep going: report the failure
                us, err = None, f"{type(ex).__name__}: {ex}"
            finally:
                C.override_config(shape.kind, shape.n, shape.k)
            rows.append({"kind": shape.kind, "dims": list(shape.dims), "valid_m": size.valid_m,
                         "group_rows": list(size.group_rows),
                         "variant": v, "config": cfg.describe(), "us": us, "error": err})
            print(f"{shape.kind} {shape.label} {json.dumps(v)}: {us if us is None else round(us, 2)} us  "
                  f"[{cfg.describe().split(': ', 1)[1]}]{'  ' + err if err else ''}", flush=True)
        del inp, plain, packed
        cp.get_default_memory_pool().free_all_blocks()
        with open(args.out, "w") as f:
            json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "timing":
                       ("cupti" if kernel_timer else "events") + (", L2 warm" if args.warm else ", after a 1 GiB flush"),
                       "command": " ".join(sys.argv), "spec": spec,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
