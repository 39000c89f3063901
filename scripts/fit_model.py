"""Fit the cost model's constants (cupygemm/config/cost.py) to config sweeps from scripts/tune.py.

For a set of constants, the score is how far the model's pick is from the fastest measured config of each
shape (geometric mean and worst case of measured(pick) / best). A coordinate search over a small grid of each
constant keeps the best set. Usage: python scripts/fit_model.py SWEEP.json [SWEEP.json ...]
"""
from __future__ import annotations

import json
import math
import sys

from cupygemm import config as C
from cupygemm.config import cost

KINDS = {"normal": C.KIND_NORMAL, "contiguous": C.KIND_CONTIGUOUS, "masked": C.KIND_MASKED}


def load(paths):
    """{(kind, shape): {(bm, bn, mc, split, serial): us}} from sweep rows (later files win)."""
    table: dict = {}
    for path in paths:
        for r in json.load(open(path)):
            if "bm" not in r:
                continue
            key = (r["bm"], r["bn"], r["mc"], bool(r.get("split")), bool(r.get("serial")))
            table.setdefault((r["kind"], tuple(r["shape"])), {})[key] = r["us"]
    return table


def model_args(kind, shape):
    if kind == "normal":
        m, n, k = shape
        return C.KIND_NORMAL, m, n, k, 1
    g, m, n, k = shape
    if kind == "contiguous":
        return C.KIND_CONTIGUOUS, g * m, n, k, g  # the sweep's padded total is close to g * m
    return C.KIND_MASKED, m, n, k, g


def score(table, verbose=False):
    C.clear_memo()
    ratios, missing = [], 0
    for (kind, shape), measured in sorted(table.items()):
        kid, m, n, k, g = model_args(kind, shape)
        cfg = C.choose_config(kid, m, n, k, g, 132)
        key = (cfg.block_m, cfg.block_n, cfg.multicast, cfg.interleave_k, cfg.serial_m)
        best = min(measured.values())
        if key not in measured:
            missing += 1
            ratios.append(1.5)
            continue
        ratios.append(measured[key] / best)
        if verbose:
            print(f"{kind:10s} {'x'.join(map(str, shape)):18s} pick {key} {measured[key]:8.1f} us, best "
                  f"{min(measured, key=measured.get)} {best:8.1f} us ({ratios[-1]:.3f})")
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    return geo, max(ratios), missing


GRID = {
    "eff64": [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6],
    "eff128": [0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7],
    "eff256": [0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8],
    "LOAD_BYTES_PER_SM": [30e9, 40e9, 50e9, 60e9, 70e9, 85e9, 100e9, 120e9],
    "TILE_OVERHEAD_S": [0.2e-6, 0.5e-6, 1.0e-6, 1.5e-6, 2.0e-6],
    "STRADDLE_PENALTY": [0.0, 0.1, 0.2, 0.3],
    "STRADDLE_SPECIALIZED_PENALTY": [0.0, 0.03, 0.05, 0.1, 0.15],
    "MULTICAST_PENALTY": [1.0, 1.01, 1.02, 1.03, 1.05],
    "INTERLEAVE_K_FACTOR": [0.85, 0.9, 0.93, 0.96, 1.0],
}


def set_param(name, value):
    if name.startswith("eff"):
        cost.MMA_EFFICIENCY[int(name[3:])] = value
    else:
        setattr(cost, name, value)


def get_param(name):
    if name.startswith("eff"):
        return cost.MMA_EFFICIENCY[int(name[3:])]
    return getattr(cost, name)


def main():
    table = load(sys.argv[1:])
    print(f"{len(table)} shapes; current constants: geomean, worst, missing = {score(table)}")
    best = score(table)
    for _ in range(4):  # coordinate search, a few sweeps
        improved = False
        for name, values in GRID.items():
            keep = get_param(name)
            for v in values:
                set_param(name, v)
                sc = score(table)
                if (sc[2], round(sc[0], 4), sc[1]) < (best[2], round(best[0], 4), best[1]):
                    best, keep, improved = sc, v, True
            set_param(name, keep)
        if not improved:
            break
    print("fitted:", {name: get_param(name) for name in GRID}, "-> geomean, worst, missing =", best)
    score(table, verbose=True)


if __name__ == "__main__":
    main()
