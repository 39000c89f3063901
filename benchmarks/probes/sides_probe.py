"""Packed (L2-side-aware) GEMMs with the SM side map right and inverted, and plain: do the L2 sides cost the time?

With the map inverted every CTA reads its half of B from the far L2 side; near against far tells whether a packed
kernel's time comes from the sides or from its loads (benchmarks/NOTES.md, "L2-side-aware weights").

Usage (on a Hopper machine): python benchmarks/probes/sides_probe.py OUT.json [MxNxK ...]
"""
from __future__ import annotations

import json
import sys

import cupy as cp
import numpy as np

import cupygemm
from cupygemm import l2, plan
from cupygemm.bench import cases, inputs, providers, timing


def main() -> None:
    out = sys.argv[1]
    dims = [tuple(int(x) for x in t.split("x")) for t in sys.argv[2:]] or [(64, 4096, 7168), (64, 24576, 1536)]
    kernel_timer, _ = timing.open_cupti_timer()
    timer = timing.Timer(timing.FLUSH_BYTES, kernel_timer)
    info = l2.side_info(0)
    rows = []
    for d in dims:
        shape = cases.Shape("normal", d)
        inp = inputs.make_inputs(shape, cases.make_sizes(shape, 0), 0)
        packed = cupygemm.pack_weights(inp.b, inp.sfb)
        row = {"dims": d}
        for name, rhs, invert in (("plain", None, False), ("packed", packed, False), ("packed_far", packed, True)):
            plan._plan.cache_clear()
            cupygemm.gemm._calls.clear()
            orig = l2.SideInfo.side_map
            if invert:
                def inverted(self, _orig=orig):
                    words = np.frombuffer(_orig(self), dtype=np.uint32) ^ np.uint32(0xFFFFFFFF)
                    return words.tobytes()
                l2.SideInfo.side_map = inverted
            try:
                prep = providers.prepare_cupygemm(inp, rhs)
                prep.call()
                row[name] = float(np.median(timer.time(prep.call, 30)))
            finally:
                l2.SideInfo.side_map = orig
        print(json.dumps(row), flush=True)
        rows.append(row)
    json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "sides": info.describe(),
               "rows": rows}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
