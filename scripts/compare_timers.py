"""Do the two CUPTI paths time alike? Runs `cupygemm bench` once per timer on the same shapes and inputs (one process
each: two CUPTI clients must not share a process) and compares the medians shape by shape.

    python scripts/compare_timers.py --out $OUT/timers [--shapes ...] [--iters 30]

Timers: cupti-ctypes (libcupti through ctypes, reading activity structs at fixed offsets), cupti-python (NVIDIA's package),
events (CUDA events around each call, for scale: it adds launch gaps). Writes timers.json and prints, per shape, the
three medians and cupti-python / cupti-ctypes; exits 1 when any shape's ratio is outside 1 +- --tolerance (default 2 %,
about a rerun's spread on the small shapes) or a run failed.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

TIMERS = ("cupti-ctypes", "cupti-python", "events")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for the bench JSONs and timers.json")
    ap.add_argument("--kinds", default="normal", help="bench --kinds (default: normal, the 18 normal seed shapes)")
    ap.add_argument("--shapes", nargs="*", default=None, help="bench --shapes instead of the seed shapes")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--tolerance", type=float, default=0.02)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    medians: dict[str, dict[str, float]] = {}
    meta: dict[str, str] = {}
    for timer in TIMERS:
        path = out / f"bench-{timer}.json"
        cmd = [sys.executable, "-m", "cupygemm", "bench", "--peers", "none", "--timing", timer, "--iters",
               str(args.iters), "--kinds", args.kinds, "--json", str(path)]
        if args.shapes:
            cmd += ["--shapes", *args.shapes]
        print("+", " ".join(cmd), flush=True)
        res = subprocess.run(cmd)
        if res.returncode != 0 or not path.exists():
            print(f"{timer}: bench failed (rc {res.returncode})", file=sys.stderr)
            return 1
        report = json.loads(path.read_text())
        meta[timer] = str(report.get("timing", "?"))  # the run's meta sits at the top level
        medians[timer] = {r["label"]: r["us"] for r in report["rows"] if r["provider"] == "cupygemm" and r["us"]}
    if not meta["cupti-python"].startswith("cupti"):
        print(f"cupti-python did not time with CUPTI: {meta['cupti-python']}", file=sys.stderr)
        return 1
    rows, bad = [], 0
    print(f"{'shape':<24} {'cupti us':>10} {'cupti-python':>13} {'events':>10} {'py/ctypes':>10}")
    for label, us in medians["cupti-ctypes"].items():
        py, ev = medians["cupti-python"].get(label), medians["events"].get(label)
        ratio = py / us if py else None
        ok = ratio is not None and abs(ratio - 1) <= args.tolerance
        bad += not ok
        rows.append({"shape": label, "cupti_us": us, "cupti_python_us": py, "events_us": ev, "ratio": ratio, "ok": ok})
        print(f"{label:<24} {us:>10.2f} {py or float('nan'):>13.2f} {ev or float('nan'):>10.2f} "
              f"{ratio or float('nan'):>10.4f}{'' if ok else '  <-'}")
    (out / "timers.json").write_text(json.dumps({"timing": meta, "rows": rows}, indent=1))
    print(f"{len(rows) - bad}/{len(rows)} shapes within {args.tolerance:.0%}; {out / 'timers.json'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
