"""A/B of the fused transpose casts (cuda_src/cast_transpose.cu): the kernel of a base revision against this tree's
and this tree's compile-time candidates, in one process, at cast-bench's shapes (benchmarks/NOTES.md, "Training
casts").

Two steps, since the device machine has no git history:

    python3 benchmarks/probes/casts_ab.py export REV .exp/casts_base     # here (.exp/ is git-ignored: carry it)
    python3 benchmarks/probes/casts_ab.py run OUT.json .exp/casts_base   # on the H100, about a minute

``export`` writes the files cast_transpose.cu includes at REV, and ``manifest.json`` (REV's commit, this checkout's
HEAD and whether it had uncommitted changes). ``run`` renders REV's kernel the way cupygemm renders the tree's
(the CUPYGEMM_* constants prefixed; a base without CUPYGEMM_CT_STAGES is launched as one 128-thread CTA per tile
with no dynamic shared memory, its contract), and each candidate of ``CANDIDATES`` with the tree's host contract
(``cupygemm.quantization.fused_cast_*``) and its overrides. For every shape and cast it first runs each kernel once
on outputs filled with a sentinel and requires every output byte to equal the base's, then times them: ``--passes``
passes, each over all shapes with the kernels in a rotated order, each kernel ``--iters`` calls timed with CUDA
events after an untimed 1 GiB memset that flushes L2 (cupygemm.bench.timing.Timer, as ``cupygemm cast-bench``),
and a device-to-device copy of the same bytes (``copy_ratio`` = copy_us / us, as cast-bench). Reported: the median
of all calls of all passes, and each pass's median.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cupygemm import quantization as quant  # noqa: E402
from cupygemm.bench.casts import activation_widths, cast_bytes  # noqa: E402
from cupygemm.jit.source import KernelSource, render  # noqa: E402
from cupygemm.shapes import NORMAL_NK  # noqa: E402
from cupygemm.util import ceil_div  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
TOKENS = 4096
METHOD = {quant.TRANSPOSED: "transposed", quant.TRANSPOSED_ROWWISE: "transposed_rowwise",
          quant.BLOCK_WITH_TRANSPOSE: "per_block_with_transpose"}
PER_TOKEN = (quant.TRANSPOSED, quant.TRANSPOSED_ROWWISE)
# The tree's kernels: name -> (entries, fused_cast_defines overrides, grid). "tree" is the default. grid: None for
# the host's, else (CTAs per SM, waves): min(tiles, SMs x CTAs per SM x waves) CTAs, where waves > 1 hands the tiles
# to more CTAs than fit at once (the later ones start as the first ones exit).
CANDIDATES = {
    "tree": (tuple(METHOD), {}, None),
    "s2": (PER_TOKEN, {"stages": 2}, None),
    "s1_pf256": (PER_TOKEN, {"stages": 1, "l2_prefetch": 256}, None),
    "s2_pf256": (PER_TOKEN, {"stages": 2, "l2_prefetch": 256}, None),
    "s3": (PER_TOKEN, {"stages": 3}, None),
    "s1_3cta": (PER_TOKEN, {"stages": 1}, (3, 1)),
    "s1_2waves": (PER_TOKEN, {"stages": 1}, (4, 2)),
    "block_s1": ((quant.BLOCK_WITH_TRANSPOSE,), {"stages": 1}, None),
}
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


# ---- export (where git is) -----------------------------------------------------------------------------------------

def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def export(rev: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    todo, seen = ["cast_transpose.cu"], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        text = _git("show", f"{rev}:cuda_src/{name}")
        (out / name).write_text(text)
        todo.extend(_INCLUDE.findall(text))
    manifest = {"base": _git("rev-parse", rev).strip(), "base_name": rev, "files": sorted(seen),
                "tree": _git("rev-parse", "HEAD").strip(), "tree_dirty": bool(_git("status", "--porcelain").strip())}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"{out}: {len(seen)} files of {manifest['base']} (tree {manifest['tree'][:12]}"
          f"{', uncommitted changes' if manifest['tree_dirty'] else ''})")


# ---- kernels ----------------------------------------------------------------------------------------------------

class Kernel:
    """One kernel of one cast and input dtype, with its launch shape."""

    def __init__(self, name: str, entry: str, dtype: np.dtype, src: KernelSource, smem: int, grid):
        self.name, self.entry, self.dtype, self.src, self.smem, self.grid = name, entry, dtype, src, smem, grid
        self.block = quant.fused_cast_threads(dtype)
        self.loaded = None

    def load(self, device: int) -> None:
        from cupygemm.jit.loader import load

        self.loaded = load(device, self.src, quant._FUSED_KINDS, post_process=False, dynamic_smem=self.smem)

    def launch(self, m: int, n: int, ptrs: dict, stream: int):
        args = quant.fused_cast_args(self.entry, ptrs["x"], ptrs["q_t"], ptrs["s_t"], ptrs.get("q", 0),
                                     ptrs.get("s", 0), m, n, n)
        params = self.loaded.launcher.pack(args)
        grid = self.grid(m, n)
        return lambda: self.loaded.launcher.launch(params, grid, self.block, self.smem, stream)


def base_kernel(entry: str, dtype: np.dtype, base_dir: Path, num_sms: int) -> Kernel:
    files = {p.name: p.read_text() for p in base_dir.iterdir() if p.suffix in (".cu", ".cuh")}
    text = files["cast_transpose.cu"]
    if "CUPYGEMM_CT_STAGES" in text:  # a base with the tree's contract
        defines = quant.fused_cast_defines(dtype, entry)
        smem = quant.fused_cast_smem(dtype, entry)
        grid = lambda m, n: quant.fused_cast_grid(entry, dtype, m, n, num_sms)  # noqa: E731
    else:  # one CTA per tile, no dynamic shared memory
        defines = {"CUPYGEMM_QUANT_IN_KIND": quant._IN_KINDS[dtype], "CUPYGEMM_CT_MODE": quant._FUSED[entry]}
        smem = 0
        grid = lambda m, n: ceil_div(m, 128) * ceil_div(n, 128)  # noqa: E731
    headers = {k: v for k, v in sorted(files.items()) if k != "cast_transpose.cu"}
    prefix = "".join(f"#define {k} {v}\n" for k, v in defines.items())
    return Kernel("base", entry, dtype, KernelSource("cast_transpose.cu", prefix + text, headers, entry), smem, grid)


def tree_kernel(name: str, entry: str, dtype: np.dtype, overrides: dict, shape: tuple[int, int] | None,
                num_sms: int) -> Kernel:
    stages = overrides.get("stages")
    defines = quant.fused_cast_defines(dtype, entry, **overrides)
    smem = quant.fused_cast_smem(dtype, entry, stages)

    def grid(m: int, n: int) -> int:
        if shape is None:
            return quant.fused_cast_grid(entry, dtype, m, n, num_sms, stages)
        return min(ceil_div(m, 128) * ceil_div(n, 128), num_sms * shape[0] * shape[1])

    return Kernel(name, entry, dtype, render("cast_transpose.cu", entry, defines), smem, grid)


# ---- run --------------------------------------------------------------------------------------------------------

def cases() -> list[tuple[str, tuple[int, int], np.dtype]]:
    """(entry, shape, dtype): cast-bench's activations for the per-token casts, its weights for the per-block one,
    and one float32 activation for each cast."""
    out = [(e, (TOKENS, w), BF16) for w in activation_widths() for e in PER_TOKEN]
    out += [(quant.BLOCK_WITH_TRANSPOSE, (n, k), BF16) for n, k in NORMAL_NK]
    out += [(e, (TOKENS, 7168), F32) for e in METHOD]
    return out


def _input(shape, dtype, seed):
    import cupy as cp

    from cupygemm.bench.inputs import randn_bf16

    rng = cp.random.default_rng(seed)
    return randn_bf16(shape, rng) if dtype == BF16 else rng.standard_normal(shape, dtype=cp.float32)


def _outputs(entry: str, m: int, n: int):
    import cupy as cp

    bufs = {}
    for o in quant.fused_cast_outputs(entry, m, n):
        b = cp.empty(o.buffer, cp.uint8 if o.dtype.itemsize == 1 else cp.float32)
        b.view(cp.uint8).fill(0x5A)  # a byte a kernel leaves unwritten shows in the comparison
        bufs[o.name] = b
    return bufs


def run(out_json: Path, base_dir: Path, iters: int, passes: int, only: list[str] | None = None) -> int:
    import cupy as cp

    from cupygemm.bench.overhead import environment
    from cupygemm.bench.timing import Timer, measure_copy_bandwidth
    from cupygemm.device import require_hopper
    from cupygemm.jit.build import build_cubin

    t0 = time.time()
    candidates = {k: v for k, v in CANDIDATES.items() if only is None or k == "tree" or k in only}
    info = require_hopper()
    dev = cp.cuda.Device().id
    manifest = json.loads((base_dir / "manifest.json").read_text())
    all_cases = cases()
    kernels: dict[tuple[str, str, np.dtype], Kernel] = {}
    for entry, _, dtype in all_cases:
        if (entry, "base", dtype) in kernels:
            continue
        kernels[entry, "base", dtype] = base_kernel(entry, dtype, base_dir, info.num_sms)
        for name, (entries, overrides, grid) in candidates.items():
            if entry in entries and (dtype == BF16 or name == "tree"):
                kernels[entry, name, dtype] = tree_kernel(name, entry, dtype, overrides, grid, info.num_sms)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # NVRTC, into the disk cache
        list(pool.map(lambda k: build_cubin(k.src, post_process=False), kernels.values()))
    for k in kernels.values():
        k.load(dev)
    print(f"{len(kernels)} kernels built and loaded in {time.time() - t0:.0f} s", file=sys.stderr)

    copy_gbs = measure_copy_bandwidth() / 1e9
    timer = Timer()
    stream = cp.cuda.get_current_stream().ptr
    rows, ok = [], True
    prepared = []  # (row, {kernel name: call}, copy call, keep-alive)
    for i, (entry, (m, n), dtype) in enumerate(all_cases):
        x = _input((m, n), dtype, seed=i)
        names = [name for (e, name, d) in kernels if e == entry and d == dtype]
        calls, results = {}, {}
        for name in names:
            bufs = _outputs(entry, m, n)
            ptrs = {"x": x.data.ptr, **{k: v.data.ptr for k, v in bufs.items()}}
            calls[name] = kernels[entry, name, dtype].launch(m, n, ptrs, stream)
            calls[name]()
            results[name] = bufs
        cp.cuda.get_current_stream().synchronize()
        equal = {name: all(bool((results[name][o].view(cp.uint8) == results["base"][o].view(cp.uint8)).all())
                           for o in results["base"]) for name in names if name != "base"}
        ok = ok and all(equal.values())
        nbytes = cast_bytes(METHOD[entry], m, n, dtype.itemsize)
        half = nbytes // 2
        src, dst = cp.empty(half, cp.uint8), cp.empty(half, cp.uint8)
        src.data.memset_async(1, half)
        copy = lambda src=src, dst=dst, half=half: dst.data.copy_from_device_async(src.data, half)  # noqa: E731
        row = {"method": METHOD[entry], "entry": entry, "shape": [m, n], "dtype": str(dtype), "bytes": nbytes,
               "bitwise_equal_to_base": equal, "launch": {name: {"grid": kernels[entry, name, dtype].grid(m, n),
                                                                 "block": kernels[entry, name, dtype].block,
                                                                 "smem": kernels[entry, name, dtype].smem}
                                                          for name in names},
               "samples_us": {name: [] for name in names + ["copy"]}, "pass_median_us": {name: [] for name in
                                                                                        names + ["copy"]}}
        rows.append(row)
        prepared.append((row, calls, copy, (x, results, src, dst)))
        bad = [name for name, e in equal.items() if not e]
        print(f"{METHOD[entry]:>25} {m}x{n:<6} {dtype}: " + ("all equal to base" if not bad else f"DIFFER: {bad}"),
              file=sys.stderr)

    for p in range(passes):
        for row, calls, copy, _ in prepared:
            order = list(calls) + ["copy"]
            order = order[p % len(order):] + order[:p % len(order)]
            for name in order:
                call = copy if name == "copy" else calls[name]
                call()
                us = timer.time_events(call, iters)
                row["samples_us"][name] += us
                row["pass_median_us"][name].append(float(np.median(us)))
        print(f"pass {p + 1}/{passes} done at {time.time() - t0:.0f} s", file=sys.stderr)

    names_all = ["base"] + list(candidates)
    lines = [f"{info.name}, 1 GiB copy {copy_gbs:.0f} GB/s; each kernel: copy_ratio (copy of the same bytes / kernel) "
             f"and (median us of {passes} x {iters} calls)", "",
             "| cast | shape | dtype | copy us | " + " | ".join(names_all) + " | base us / tree us |",
             "|---|---|---|---|" + "---|" * len(names_all) + "---|"]
    for row in rows:
        med = {k: float(np.median(v)) for k, v in row["samples_us"].items()}
        row["us"] = med
        row["copy_ratio"] = {k: med["copy"] / v for k, v in med.items() if k != "copy"}
        cells = [f"{row['copy_ratio'][k]:.3f} ({med[k]:.1f})" if k in med else "" for k in names_all]
        lines.append(f"| {row['method']} | {row['shape'][0]}x{row['shape'][1]} | {row['dtype']} | {med['copy']:.1f} | "
                     + " | ".join(cells) + f" | {med['base'] / med['tree']:.3f}x |")
    summary = {}
    for method in METHOD.values():
        sel = [r for r in rows if r["method"] == method and r["dtype"] == str(BF16)]
        summary[method] = {k: float(np.exp(np.mean([np.log(r["copy_ratio"][k]) for r in sel])))
                           for k in names_all if all(k in r["copy_ratio"] for r in sel)}
        summary[method]["min"] = {k: min(r["copy_ratio"][k] for r in sel) for k in summary[method]}
    lines += ["", "geometric mean copy_ratio (bf16): " + "; ".join(
        f"{m}: " + ", ".join(f"{k} {v:.3f}" for k, v in s.items() if k != "min") for m, s in summary.items())]
    print("\n".join(lines))
    for row in rows:
        del row["samples_us"]
    out_json.write_text(json.dumps({
        "command": " ".join([Path(sys.executable).name] + sys.argv), "device": info.name, "manifest": manifest,
        "environment": environment(), "copy_gbs": copy_gbs, "iters": iters, "passes": passes,
        "candidates": {k: {"entries": [METHOD[e] for e in v[0]], "overrides": v[1], "ctas_per_sm_waves": v[2]}
                       for k, v in candidates.items()},
        "timing": "CUDA events around each call after an untimed 1 GiB memset (L2 flush); us = median of all calls "
                  "of all passes; passes rotate the kernels' order",
        "all_bitwise_equal": ok, "summary": summary, "rows": rows, "seconds": time.time() - t0}, indent=1))
    print(f"{out_json} written in {time.time() - t0:.0f} s; all bitwise equal: {ok}", file=sys.stderr)
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="REV's kernel sources into DIR (needs git)")
    e.add_argument("rev")
    e.add_argument("dir", type=Path)
    r = sub.add_parser("run", help="build, check and time (needs an H100)")
    r.add_argument("out", type=Path)
    r.add_argument("dir", type=Path, help="what export wrote")
    r.add_argument("--iters", type=int, default=20)
    r.add_argument("--passes", type=int, default=3)
    r.add_argument("--candidates", default=None,
                   help=f"comma-separated names of CANDIDATES to time beside base and tree (default: all of "
                        f"{', '.join(CANDIDATES)})")
    a = ap.parse_args()
    if a.cmd == "export":
        export(a.rev, a.dir)
        return 0
    only = None if a.candidates is None else a.candidates.split(",")
    unknown = sorted(set(only or ()) - set(CANDIDATES))
    if unknown:
        ap.error(f"--candidates: unknown {unknown} (known: {', '.join(CANDIDATES)})")
    return run(a.out, a.dir, a.iters, a.passes, only)


if __name__ == "__main__":
    sys.exit(main())
