"""Check that a CUDA source change is SASS-neutral: compile every config the chooser proposes for the seed shapes
(and a few serving decode M values) from two trees of cuda_src/, and compare the kernels' instruction streams.

    python scripts/sass_diff.py                      # base = main at 1b28717, new = this checkout's cuda_src/
    python scripts/sass_diff.py --base REV --jobs 2
    python scripts/sass_diff.py --hashes             # print the new tree's stream hashes of the chosen configs
    python scripts/sass_diff.py --pin                # print tests/test_sass_pinned.py's PINNED_HASHES entry
    python scripts/sass_diff.py --pin --nvrtc LIBPATH  # ... for another NVRTC (repeatable)
    python scripts/sass_diff.py --extras --nvrtc /path/to/nvidia/cu13/lib/libnvrtc.so.13   # another NVRTC
    python scripts/sass_diff.py --wgrad --base REV   # the weight-gradient kernel (fp8_wgrad.cu) instead

NVRTC builds sm_90a cubins on the CPU; no GPU is needed. The instruction stream is the kernel's .text section
(sass_tools.elf): branch targets are relative and the kernel calls nothing, so identical code gives identical bytes,
while symbol names, section offsets and the source text do not enter. Where two streams differ, both are
disassembled (nvdisasm) without addresses and the opcode lines diffed. Exit status 1 on any difference.

By default the NVRTC is CuPy's (the one the package and tests/test_sass_pinned.py use here). ``--nvrtc LIBPATH``
(repeatable) compiles both trees with that libnvrtc instead, through ctypes in child processes
(sass_tools.nvrtc.compile_ctypes; the headers found with -I<tree>), and checks each library in turn. NVRTC versions
differ in what they make of one source, and a change that is SASS-neutral under one may not be under another: check
with the GPU image's NVRTC 13.0 (where the kernel's performance is measured) as well as the CPU one, e.g.
``pip install --target DIR nvidia-cuda-nvrtc==13.0.*`` and ``--nvrtc DIR/nvidia/cu13/lib/libnvrtc.so.13``
(sass_tools.nvrtc.find_nvrtc_libs lists the libraries it finds). These cubins share the default builds' cache,
keyed by source digest and library.

``--wgrad`` checks the weight-gradient kernel the same way: the chooser's picks for DeepGEMM 03d0be3's test_core
wgrad and k-grouped shapes, and the options it does not pick (ping-pong, two accumulator sets, the storing form, A
multicast, a 64-row k-grouped tile).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import difflib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from cupygemm import config as C  # noqa: E402
from cupygemm import contract  # noqa: E402
from cupygemm import contract_wgrad as cw  # noqa: E402
from cupygemm.shapes import CONTIGUOUS, K_TAIL_SHAPE, MASKED, NORMAL, NORMAL_NK  # noqa: E402
from cupygemm.jit.compiler import BASE_OPTIONS, compile_cubin, nvrtc_version  # noqa: E402
from cupygemm.jit.source import KernelSource  # noqa: E402
from cupygemm.errors import CupygemmCompileError  # noqa: E402
from sass_tools.elf import Cubin  # noqa: E402
from sass_tools.nvrtc import compile_ctypes  # noqa: E402

ENTRY = "cupygemm_fp8_gemm"
WGRAD_ENTRY = "cupygemm_fp8_wgrad"
DEFAULT_BASE = "1b28717"
NUM_SMS = 132
# Serving decode batches besides the seed shapes' M (64, 128, 4096): they reach split-K across CTAs, interleave_k
# and the one-wave tiles.
DECODE_M = (1, 16, 32, 256, 512, 1024, 2048)
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


# ---------------------------------------------------------------------------------------------------- configs
def tree_defines(cfg, tree: str) -> dict[str, object]:
    """The CUPYGEMM_* constants of ``cfg`` in a tree's spelling: "new" (interleave_k, split_k count, as
    cupygemm.contract writes them) or "old", for sources before the split-K rename (02afdcf and earlier: split_k
    was the interleave flag, k_slices the count, and double_acc existed)."""
    out = contract.defines(cfg)
    if tree == "old":
        out = {k: v for k, v in out.items() if k not in ("CUPYGEMM_SPLIT_K", "CUPYGEMM_INTERLEAVE_K")}
        out.update(CUPYGEMM_DOUBLE_ACC=0, CUPYGEMM_SPLIT_K=int(cfg.interleave_k), CUPYGEMM_K_SLICES=cfg.split_k)
    return out


def is_wgrad(cfg) -> bool:
    return isinstance(cfg, cw.WgradConfig)


def kernel_of(cfg) -> tuple[str, str]:
    """(source file, entry point) of cfg's kernel."""
    return ("fp8_wgrad.cu", WGRAD_ENTRY) if is_wgrad(cfg) else ("fp8_gemm.cu", ENTRY)


def defines_of(cfg, tree: Path) -> dict[str, object]:
    """The CUPYGEMM_* constants of ``cfg`` as ``tree`` reads them."""
    return cw.defines(cfg) if is_wgrad(cfg) else tree_defines(cfg, spelling(tree))


def source_of(cfg, tree: Path) -> KernelSource:
    return render_from(tree, defines_of(cfg, tree), *kernel_of(cfg))


def features(cfg) -> dict[str, object]:
    if is_wgrad(cfg):
        return {"kind": cfg.kind, "block_m": cfg.block_m, "multicast": cfg.multicast, "swizzle": cfg.swizzle,
                "two_acc_sets": cfg.two_acc_sets, "pingpong": cfg.pingpong, "store": cfg.store,
                "stages": cfg.num_stages}
    return {"kind": C.KIND_NAMES[cfg.kind], "block_m": cfg.block_m, "math_wg": cfg.num_math_wg,
            "multicast": cfg.multicast, "interleave_k": cfg.interleave_k, "serial_m": cfg.serial_m,
            "split_k>1": cfg.split_k > 1, "stream_k": cfg.stream_k,
            "straddle": cfg.block_n % 128 != 0 and 128 % cfg.block_n != 0,
            "a_box<block_m": cfg.a_box_rows < cfg.block_m, "wgmma_n<block_n": cfg.wgmma_n < cfg.block_n}


def chosen_configs() -> list[tuple[str, object]]:
    """(problem, config) for every distinct kernel the chooser proposes for the seed shapes and decode M values."""
    problems = [(f"normal {m}x{n}x{k}", (C.KIND_NORMAL, m, n, k, 1)) for m, n, k in NORMAL + (K_TAIL_SHAPE,)]
    problems += [(f"normal {m}x{n}x{k}", (C.KIND_NORMAL, m, n, k, 1)) for m in DECODE_M for n, k in NORMAL_NK]
    problems += [(f"contig {g}x{m}x{n}x{k}", (C.KIND_CONTIGUOUS, g * m, n, k, g)) for g, m, n, k in CONTIGUOUS]
    problems += [(f"masked {g}x{m}x{n}x{k}", (C.KIND_MASKED, m, n, k, g)) for g, m, n, k in MASKED]
    seen: dict[tuple, tuple[str, object]] = {}
    for name, (kind, m, n, k, g) in problems:
        cfg = C.choose_config(kind, m, n, k, g, NUM_SMS)
        key = tuple(sorted(tree_defines(cfg, "new").items()))
        seen.setdefault(key, (name, cfg))
    return list(seen.values())


def wgrad_configs() -> list[tuple[str, object]]:
    """(problem, config) for every distinct weight-gradient kernel the chooser picks for DeepGEMM 03d0be3's test_core
    shapes, and the options it does not pick."""
    mn = [(7168, 2112), (1536, 24576), (512, 32768), (16384, 7168), (7168, 4096), (2048, 7168)]
    problems = [(f"wgrad {m}x{n}x{k}", (cw.KIND_WGRAD, m, n, k, 1)) for m, n in mn for k in (4096, 8192)]
    problems += [(f"k-grouped {g}x{m}x{n}x{k}", (cw.KIND_K_GROUPED, m, n, k, g)) for g, k in ((4, 4096), (4, 8192),
                                                                                              (8, 4096))
                 for m, n in ((7168, 4096), (2048, 7168))]
    seen: dict[tuple, tuple[str, object]] = {}
    for name, (kind, m, n, k, g) in problems:
        cfg = cw.choose_wgrad_config(kind, m, n, k, g, NUM_SMS)
        seen.setdefault(tuple(sorted(cw.defines(cfg).items())), (name, cfg))
    dense = cw.choose_wgrad_config(cw.KIND_WGRAD, 7168, 4096, 4096, 1, NUM_SMS)
    grouped = cw.choose_wgrad_config(cw.KIND_K_GROUPED, 7168, 4096, 4096, 4, NUM_SMS)
    options = [("option ping-pong", dict(block_n=144, swizzle=64, pingpong=True)),
               ("option store", dict(store=True)),
               ("option two acc sets", dict(block_n=96, swizzle=128, two_acc_sets=True)),
               ("option A multicast", dict(block_n=128, swizzle=128, multicast=1))]
    out = list(seen.values())
    for name, fields in options:
        cfg = dataclasses.replace(dense, **fields)
        out.append((name, dataclasses.replace(cfg, num_stages=min(8, cw.max_stages(
            cfg.block_m, cfg.block_n, cfg.swizzle, cfg.num_slabs)))))
    out.append(("option k-grouped ping-pong", dataclasses.replace(grouped, pingpong=True)))
    narrow = dataclasses.replace(grouped, block_m=64, block_n=160, swizzle=128, multicast=0)
    out.append(("option k-grouped 64x160", dataclasses.replace(narrow, num_stages=min(8, cw.max_stages(
        64, 160, 128, narrow.num_slabs)))))
    return out


def _make(kind: int, n: int, k: int, bm: int, bn: int, **fields):
    return C.make_config(kind, n, k, bm, bn, NUM_SMS, **fields)


def extra_configs() -> list[tuple[str, object]]:
    """Kernel features the chooser does not propose for the seed shapes, built explicitly (--extras): split wgmmas,
    B scales picked per column at run time, interleave_k on masked GEMMs, 64/128-row contiguous tiles, 256-row
    tiles without serial sub-tiles, stream-K without multicast."""
    specs = [
        ("extra split wgmma", (C.KIND_NORMAL, 2048, 7168, 256, 128), dict(wgmma_n=64)),
        ("extra run-time scale select", (C.KIND_NORMAL, 2048, 7168, 64, 184), {}),
        ("extra masked interleave_k", (C.KIND_MASKED, 4096, 7168, 64, 128), dict(interleave_k=True)),
        ("extra contiguous 128-row", (C.KIND_CONTIGUOUS, 4096, 7168, 128, 128), {}),
        ("extra contiguous 64-row", (C.KIND_CONTIGUOUS, 4096, 7168, 64, 128), {}),
        ("extra masked stream-K", (C.KIND_MASKED, 4096, 7168, 128, 128), dict(stream_k=True)),
        ("extra split-K 4 + interleave_k", (C.KIND_NORMAL, 2112, 7168, 64, 128), dict(interleave_k=True, split_k=4)),
        ("extra split-K 2 on 256 rows", (C.KIND_NORMAL, 2112, 7168, 256, 128), dict(split_k=2, serial_m=True)),
    ]
    out = []
    for name, args, fields in specs:
        try:
            out.append((name, _make(*args, **fields)))
        except (TypeError, ValueError) as e:  # the host no longer builds it: say so, check the rest
            print(f"skipping {name}: {e}", file=sys.stderr)
    return out


# ---------------------------------------------------------------------------------------------------- builds
def base_tree(rev: str, dest: Path) -> Path:
    """cuda_src/ of git revision ``rev`` under ``dest``."""
    out = dest / f"cuda_src-{rev}"
    if not (out / "fp8_gemm.cu").is_file():
        out.mkdir(parents=True, exist_ok=True)
        data = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "cuda_src"], check=True,
                              capture_output=True).stdout
        with tempfile.TemporaryFile() as f:
            f.write(data)
            f.seek(0)
            with tarfile.open(fileobj=f) as tar:
                for m in tar.getmembers():
                    if m.isfile():
                        (out / Path(m.name).name).write_bytes(tar.extractfile(m).read())
    return out


def render_from(tree: Path, defines: dict[str, object], source: str = "fp8_gemm.cu",
                entry: str = ENTRY) -> KernelSource:
    """``source`` of ``tree`` with ``defines`` prepended and its headers inlined (as cupygemm.jit.source does)."""
    headers: dict[str, str] = {}
    todo = _INCLUDE.findall((tree / source).read_text())
    while todo:
        inc = todo.pop()
        if inc not in headers:
            headers[inc] = (tree / inc).read_text()
            todo.extend(_INCLUDE.findall(headers[inc]))
    text = "".join(f"#define {k} {v}\n" for k, v in defines.items()) + (tree / source).read_text()
    return KernelSource(source, text, dict(sorted(headers.items())), entry)


def cache_dir() -> Path:
    d = Path(os.environ.get("CUPYGEMM_SASS_DIFF_CACHE", Path(tempfile.gettempdir()) / "cupygemm-sass-diff"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def build(src: KernelSource) -> bytes:
    """The raw NVRTC cubin (no SASS pass), cached by source digest and NVRTC version."""
    path = cache_dir() / f"{src.digest[:32]}-{'.'.join(map(str, nvrtc_version()))}.cubin"
    if path.is_file():
        return path.read_bytes()
    cubin = compile_cubin(src)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(cubin)
    tmp.replace(path)
    return cubin


def _lib_tag(lib: str) -> str:
    """Cache-key part for a libnvrtc: its version (from the builtins library beside it) and a digest of its path."""
    from sass_tools.nvrtc import _version_from_builtins

    ver = _version_from_builtins(lib)
    path_digest = hashlib.sha256(os.path.realpath(lib).encode()).hexdigest()[:12]
    return f"{'.'.join(map(str, ver)) if ver else 'unknown'}-{path_digest}"


def build_with(lib: str, builds: list[tuple[KernelSource, Path]], jobs: int) -> list[bytes]:
    """Raw cubins of (source, its cuda_src/ tree) built with the libnvrtc at ``lib`` (ctypes, child processes, up
    to ``jobs`` at once), cached by source digest and library. The source is fp8_gemm.cu with its defines; the
    headers come from the tree through -I (compile_ctypes passes no in-memory headers)."""
    tag = _lib_tag(lib)
    paths = [cache_dir() / f"{src.digest[:32]}-nvrtc{tag}.cubin" for src, _ in builds]
    todo = [i for i, p in enumerate(paths) if not p.is_file()]
    size = min(16, -(-len(todo) // max(1, jobs))) if todo else 1  # at most 16 kernels per child (its time limit)
    chunks = [todo[i:i + size] for i in range(0, len(todo), size)]

    def run(chunk: list[int]) -> None:
        job = [(builds[i][0].text, list(BASE_OPTIONS) + [f"-I{builds[i][1]}"]) for i in chunk]
        _, cubins = compile_ctypes(lib, job)
        for i, cubin in zip(chunk, cubins):
            tmp = paths[i].with_suffix(f".{os.getpid()}.{i}.tmp")
            tmp.write_bytes(cubin)
            tmp.replace(paths[i])

    with concurrent.futures.ThreadPoolExecutor(max(1, min(jobs, len(chunks)))) as pool:
        list(pool.map(run, chunks))  # each chunk is one child process
    return [p.read_bytes() for p in paths]


def instruction_stream(cubin: bytes, entry: str = ENTRY) -> tuple[bytes, int]:
    """(the kernel's .text bytes, its register count)."""
    cb = Cubin.from_bytes(cubin)
    k = cb.kernel(entry)
    return cb.read_text(k), k.registers


def stream_hash(cubin: bytes, entry: str = ENTRY) -> str:
    return hashlib.sha256(instruction_stream(cubin, entry)[0]).hexdigest()[:16]


def print_pins(libs: list[str], jobs: int) -> int:
    """Print tests/test_sass_pinned.py's PINNED_HASHES entries for this tree: CuPy's NVRTC (the test's own hash), or
    each libnvrtc in ``libs`` (the same .text hash of the same rendered source)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import test_sass_pinned as pinned

    names = list(pinned.PINNED_CONFIGS)
    if not libs:
        print(f"    {nvrtc_version()}: {{")
        for name in names:
            print(f"        {name!r}: {pinned.instruction_hash(name)!r},")
        print("    },")
        return 0
    tree = ROOT / "cuda_src"
    for lib in libs:
        cubins = build_with(lib, [(render_from(tree, pinned.pinned_defines(n)), tree) for n in names], jobs)
        from sass_tools.nvrtc import _version_from_builtins

        print(f"    {_version_from_builtins(lib)}: {{  # {lib}")
        for name, cubin in zip(names, cubins):
            print(f"        {name!r}: {stream_hash(cubin)!r},")
        print("    },")
    return 0


def _nvdisasm() -> str | None:
    path = shutil.which("nvdisasm")
    if path is None:
        try:
            import nvidia

            for root in nvidia.__path__:
                for cand in Path(root).glob("*/bin/nvdisasm"):
                    return str(cand)
        except ImportError:
            return None
    return path


def listing(cubin: bytes) -> list[str]:
    """Instruction lines without addresses, labels, comments or the kernel's name."""
    tool = _nvdisasm()
    if tool is None:
        return []
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-hex", "-c", f.name], capture_output=True, text=True).stdout
    lines = []
    for line in out.splitlines():
        line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)
        line = re.sub(r"/\*\s*0x[0-9a-f]+\s*\*/", "", line).strip()
        if line and not line.startswith((".", "//")) and not line.endswith(":"):
            lines.append(re.sub(r"`\([^)]*\)", "`(L)", line).replace(ENTRY, "K").replace(WGRAD_ENTRY, "K"))
    return lines


def compare(args: tuple) -> dict:
    name, cfg, old_tree, new_tree = args
    new = build(source_of(cfg, new_tree))
    try:
        old = build(source_of(cfg, old_tree))
    except CupygemmCompileError:  # a kernel feature the base does not have (or allow for this config)
        text, regs = instruction_stream(new, kernel_of(cfg)[1])
        return {"name": name, "cfg": cfg, "instructions": len(text) // 16, "old_instructions": 0, "regs": (0, regs),
                "same": False, "hash": hashlib.sha256(text).hexdigest()[:16], "diff_lines": 0, "new_only": True}
    return compare_cubins(name, cfg, old, new)


def compare_cubins(name: str, cfg, old: bytes, new: bytes) -> dict:
    entry = kernel_of(cfg)[1]
    (old_text, old_regs), (new_text, new_regs) = instruction_stream(old, entry), instruction_stream(new, entry)
    row = {"name": name, "cfg": cfg, "instructions": len(new_text) // 16, "old_instructions": len(old_text) // 16,
           "regs": (old_regs, new_regs), "same": old_text == new_text and old_regs == new_regs,
           "hash": hashlib.sha256(new_text).hexdigest()[:16], "diff_lines": 0}
    if not row["same"]:
        a, b = listing(old), listing(new)
        row["diff_lines"] = sum(1 for d in difflib.unified_diff(a, b, lineterm="", n=0)
                                if d[:1] in "+-" and d[:3] not in ("+++", "---"))
        row["diff"] = "\n".join(list(difflib.unified_diff(a, b, "old", "new", lineterm="", n=1))[:60])
    return row


def spelling(tree: Path) -> str:
    """Which constants a cuda_src/ tree reads: "new" where the kernel knows CUPYGEMM_INTERLEAVE_K, else "old"."""
    return "new" if "CUPYGEMM_INTERLEAVE_K" in "".join(p.read_text() for p in tree.glob("*.c*")) else "old"


def short(cfg) -> str:
    if is_wgrad(cfg):
        return cfg.describe().split(": ", 1)[-1].replace(" slabs of ", "x").replace(" floats", "")[:44]
    tags = [C.KIND_NAMES[cfg.kind][:6], f"{cfg.block_m}x{cfg.block_n}/n{cfg.wgmma_n}", f"st{cfg.num_stages}",
            f"wg{cfg.num_math_wg}"]
    tags += [t for t, on in ((f"mc{cfg.multicast}", cfg.multicast), ("ilv", cfg.interleave_k),
                             ("serm", cfg.serial_m), (f"sk{cfg.split_k}", cfg.split_k > 1),
                             ("clu", cfg.split_cluster), ("2acc", cfg.two_acc_sets), ("strk", cfg.stream_k)) if on]
    return " ".join(tags)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default=DEFAULT_BASE,
                    help="git revision of the reference cuda_src/ (default %(default)s)")
    ap.add_argument("--new", default=str(ROOT / "cuda_src"), help="cuda_src/ directory to check (default: this tree)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--only", default="", help="regex over the config's short description")
    ap.add_argument("--extras", action="store_true",
                    help="also check kernel features the chooser does not propose for these shapes (extra_configs)")
    ap.add_argument("--wgrad", action="store_true",
                    help="the weight-gradient kernel (fp8_wgrad.cu): its picks for DeepGEMM's shapes and its options")
    ap.add_argument("--hashes", action="store_true", help="print the new tree's instruction-stream hashes only")
    ap.add_argument("--pin", action="store_true",
                    help="print the PINNED_HASHES entry of tests/test_sass_pinned.py for this tree and CuPy's NVRTC "
                         "(or each --nvrtc library)")
    ap.add_argument("--show-diff", action="store_true", help="print the opcode diff of differing configs")
    ap.add_argument("--nvrtc", action="append", default=[], metavar="LIBPATH",
                    help="compile with this libnvrtc.so (ctypes, child processes) instead of CuPy's NVRTC; "
                         "repeat to check several versions in turn")
    args = ap.parse_args()

    if args.pin:
        return print_pins(args.nvrtc, args.jobs)
    configs = wgrad_configs() if args.wgrad else chosen_configs() + (extra_configs() if args.extras else [])
    configs = [(n, c) for n, c in configs if re.search(args.only, short(c))]
    new_tree = Path(args.new).resolve()
    new_srcs = [source_of(cfg, new_tree) for _, cfg in configs]
    if args.hashes:
        for lib in args.nvrtc or [None]:
            if lib is not None:
                print(f"NVRTC {_lib_tag(lib).split('-')[0]} ({lib}):")
            cubins = build_with(lib, [(s, new_tree) for s in new_srcs], args.jobs) if lib else map(build, new_srcs)
            for (name, cfg), cubin in zip(configs, cubins):
                print(f"{stream_hash(cubin, kernel_of(cfg)[1])}  {short(cfg):42s} {name}")
        return 0
    old_tree = base_tree(args.base, cache_dir())
    if not args.nvrtc:
        jobs = [(n, c, old_tree, new_tree) for n, c in configs]
        with concurrent.futures.ProcessPoolExecutor(max(1, args.jobs)) as pool:
            rows = list(pool.map(compare, jobs))
        return report(rows, args, ".".join(map(str, nvrtc_version())))
    old_srcs = [source_of(cfg, old_tree) for _, cfg in configs]
    status = 0
    for lib in args.nvrtc:
        cubins = build_with(lib, [(s, old_tree) for s in old_srcs] + [(s, new_tree) for s in new_srcs], args.jobs)
        old, new = cubins[:len(configs)], cubins[len(configs):]
        rows = [compare_cubins(n, c, o, w) for (n, c), o, w in zip(configs, old, new)]
        status |= report(rows, args, f"{_lib_tag(lib).split('-')[0]}, {lib}")
    return status


def report(rows: list[dict], args, nvrtc: str) -> int:
    """Prints the table of ``rows`` and the summary line; 0 if every config is identical, else 1."""
    print(f"{'config':44s} {'problem':30s} {'instr':>6s} {'regs':>8s}  result")
    for r in rows:
        regs = f"{r['regs'][0]}/{r['regs'][1]}" if r["regs"][0] != r["regs"][1] else str(r["regs"][1])
        res = "identical" if r["same"] else "NEW (the base does not compile it)" if r.get("new_only") else \
            f"DIFFERS ({r['old_instructions']} -> {r['instructions']} instr, {r['diff_lines']} diff lines)"
        print(f"{short(r['cfg']):44s} {r['name']:30s} {r['instructions']:6d} {regs:>8s}  {res}")
        if not r["same"] and args.show_diff:
            print(r.get("diff", ""))
    cover: dict[str, set] = {}
    for r in rows:
        for k, v in features(r["cfg"]).items():
            cover.setdefault(k, set()).add(v)
    print("\nfeature values covered: " + "; ".join(f"{k} {sorted(v, key=str)}" for k, v in cover.items()))
    same = sum(r["same"] for r in rows)
    print(f"{len(rows)} configs, {same} identical, {len(rows) - same} differ (base {args.base}, NVRTC {nvrtc})")
    return 0 if same == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
