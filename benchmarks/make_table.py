"""Markdown table of a `cupygemm bench --json` result, with DeepGEMM timed in the same run or compared through cuBLAS.

When the run timed DeepGEMM itself (`--peers cublas,deepgemm` with deep_gemm 03d0be3 importable), the ratio is
time to time in that run. Otherwise DeepGEMM's time comes from a peers file measured on the same
kind of GPU (benchmarks/peers/*.json). Absolute times move between machines, so the comparison goes
through cuBLAS block-scaled timed in our run: ours / DeepGEMM = (ours / cuBLAS ours-run) x (cuBLAS / DeepGEMM
peers-run). Grouped shapes have no cuBLAS peer: they compare directly (same GPU kind), marked "same rows" when
the run drew group sizes with the peer's valid-row total (`cupygemm bench --match-rows PEERS.json`), else by
TFLOPS over valid rows, marked "per FLOP" (random draws differ: 1109 vs DeepGEMM's 1006 rows for masked 1x1024).
Usage (cupygemm installed): python benchmarks/make_table.py RESULTS.json [PEERS.json]
"""
import json
import math
import sys

from cupygemm.bench.cases import peer_valid_rows


def key(kind, shape):
    return (kind[:6], tuple(shape))


def main():
    res = json.load(open(sys.argv[1]))
    peers = json.load(open(sys.argv[2]))["rows"] if len(sys.argv) > 2 else []
    peer_rows = peer_valid_rows(sys.argv[2]) if len(sys.argv) > 2 else {}
    pk, pk_tflops = {}, {}
    for r in peers:
        pk[(key(r["kind"], r["shape"]), r["provider"])] = r["us"]
        pk_tflops[(key(r["kind"], r["shape"]), r["provider"])] = r["tflops"]
    ours = {key(r["kind"], r["shape"]): r for r in res["rows"] if r["provider"] == "cupygemm"}
    cub = {key(r["kind"], r["shape"]): r for r in res["rows"] if r["provider"] == "cublas_block"}
    dg_run = {key(r["kind"], r["shape"]): r for r in res["rows"] if r["provider"] == "deepgemm" and r.get("us")}
    dg_col = " DeepGEMM us (same run) |" if dg_run else ""
    print(f"| kind | shape | cupygemm us | TFLOPS | % of floor | cuBLAS-block us (same run) |{dg_col} vs cuBLAS | "
          "vs DeepGEMM |")
    print("|---|---|---|---|---|---|---|---|" + ("---|" if dg_run else ""))
    ratios_dg, ratios_cb = [], []
    for k, r in ours.items():
        c = cub.get(k)
        dg = pk.get((k, "deepgemm"))
        cb_peer = pk.get((k, "cublas_block"))
        vs_cb = c["us"] / r["us"] if c else None
        if vs_cb:
            ratios_cb.append(vs_cb)
        if dg_run:
            d = dg_run.get(k)
            vs_dg, note = (d["us"] / r["us"], "") if d else (None, "")
        elif dg and c and cb_peer:
            vs_dg = dg / (r["us"] * cb_peer / c["us"])
            note = ""
        elif dg:
            if peer_rows.get((r["kind"], tuple(r["shape"]))) == r["valid_m"]:
                vs_dg, note = dg / r["us"], " (same rows)"
            else:
                vs_dg, note = r["tflops"] / pk_tflops[(k, "deepgemm")], " (per FLOP)"
        else:
            vs_dg, note = None, ""
        if vs_dg:
            ratios_dg.append(vs_dg)
        shape = "x".join(map(str, r["shape"]))
        d_us = f" {dg_run[k]['us']:.1f} |" if k in dg_run else (" - |" if dg_run else "")
        print(f"| {r['kind']} | {shape} | {r['us']:.1f} | {r['tflops']:.0f} | {r['pct_floor']:.0f}% | "
              + (f"{c['us']:.1f} |{d_us} {vs_cb:.2f}x | " if c else f"- |{d_us} - | "), end="")
        print(f"{vs_dg:.2f}x{note} |" if vs_dg else "- |")
    g = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
    how = "timed in the same run" if dg_run else "through cuBLAS and the peer table"
    print(f"\nGeometric mean speedup: {g(ratios_cb):.2f}x over cuBLAS block-scaled ({len(ratios_cb)} shapes), "
          f"{g(ratios_dg):.2f}x over DeepGEMM ({how}; {len(ratios_dg)} shapes; >1 = cupygemm faster).")


if __name__ == "__main__":
    main()
