"""FFMA interleave pass, measured: NVRTC 12.8 builds with the pass off/on vs the default NVRTC, dense seed shapes.

  python benchmarks/probes/interleave_bench.py build DIR   # no GPU needed: NVRTC 12.8 via ctypes (sass_tools.nvrtc)
  python benchmarks/probes/interleave_bench.py run DIR     # on the GPU: time all three builds, check bitwise equality
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import cupygemm
from cupygemm import config as C
from cupygemm.jit.compiler import BASE_OPTIONS
from cupygemm.kernels import gemm_source
from cupygemm.shapes import NORMAL as SHAPES


def flatten(src) -> str:
    """The kernel with its headers inlined (the ctypes NVRTC wrapper takes one source, no headers)."""
    done: set[str] = set()

    def expand(text: str) -> str:
        def sub(m):
            name = m.group(1)
            if name in done:
                return ""
            done.add(name)
            return expand(src.headers[name])

        return re.sub(r'^\s*#\s*include\s+"([^"]+)"', sub, text, flags=re.MULTILINE)

    return expand(src.text)


def build(out: Path) -> None:
    from sass_tools.interleave import interleave_ffma
    from sass_tools.nvrtc import compile_ctypes, find_nvrtc_libs

    libs = [lib for lib in find_nvrtc_libs() if lib.version == (12, 8)]
    if not libs:
        raise SystemExit("NVRTC 12.8 not found: pip install --target .nvrtc128 nvidia-cuda-nvrtc-cu12==12.8.93")
    out.mkdir(parents=True, exist_ok=True)
    cfgs = [C.choose_config(C.KIND_NORMAL, m, n, k, 1, 132) for m, n, k in SHAPES]
    version, cubins = compile_ctypes(libs[0].path, [(flatten(gemm_source(c)), BASE_OPTIONS) for c in cfgs])
    report = []
    for (m, n, k), cubin in zip(SHAPES, cubins):
        res = interleave_ffma(cubin)
        (out / f"{m}x{n}x{k}.off.cubin").write_bytes(cubin)
        (out / f"{m}x{n}x{k}.on.cubin").write_bytes(res.cubin)
        kr = res.kernels[0]
        report.append({"shape": [m, n, k], "runs": kr.runs, "ffmas_in_runs": kr.ffmas_in_runs, "changed": kr.changed})
    (out / "build.json").write_text(json.dumps({"nvrtc": version, "kernels": report}, indent=1))
    print(json.dumps(report))


def run(src: Path) -> None:
    import cupy as cp

    from cupygemm import kernels
    from cupygemm.bench.inputs import make_normal
    from cupygemm.bench.timing import Timer
    from cupygemm.jit.build import LoadedKernel
    from cupygemm.jit.compiler import nvrtc_version

    timer = Timer(512 << 20)
    rows = []
    for m, n, k in SHAPES:
        cfg = C.choose_config(C.KIND_NORMAL, m, n, k, 1, 132)
        a, sfa, b, sfb = make_normal(m, n, k, 0)
        sfa = cupygemm.get_col_major_tma_aligned_tensor(sfa)
        out = cp.empty((m, n), dtype=cupygemm.tensors.BF16)
        call = lambda: cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)  # noqa: E731
        res, bits = {}, {}
        kernels._by_config.pop((0, cfg), None)
        res["default"] = timer.median_us(call, 30)
        bits["default"] = out.view(cp.uint16).copy()
        for mode in ("off", "on"):
            module = cp.cuda.function.Module()
            module.load((src / f"{m}x{n}x{k}.{mode}.cubin").read_bytes())
            lk = LoadedKernel(module, module.get_function("cupygemm_fp8_gemm"), f"nvrtc12.8-{mode}")
            lk.ensure_dynamic_smem(cfg.smem_bytes)
            kernels._by_config[(0, cfg)] = lk
            res[f"12.8-{mode}"] = timer.median_us(call, 30)
            bits[mode] = out.view(cp.uint16).copy()
        kernels._by_config.pop((0, cfg), None)
        same = bool((bits["on"] == bits["off"]).all()) and bool((bits["on"] == bits["default"]).all())
        rows.append({"shape": [m, n, k], **{f"us_{key}": v for key, v in res.items()}, "bitwise_equal": same})
        print(f"{m}x{n}x{k}: default(NVRTC {nvrtc_version()}) {res['default']:.1f} us, 12.8 off "
              f"{res['12.8-off']:.1f} us, 12.8 on {res['12.8-on']:.1f} us, bitwise equal {same}", flush=True)
    out_dir = Path(os.environ.get("OUT", "."))
    (out_dir / "interleave.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    {"build": build, "run": run}[sys.argv[1]](Path(sys.argv[2]))
