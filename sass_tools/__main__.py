"""Command line: ``python -m sass_tools {info,dump,interleave} FILE.cubin``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from typing import Dict, Optional, Sequence

from . import PASS_VERSION, __version__
from .elf import Cubin, Kernel
from .interleave import (DEFAULT_FRACTION, find_ffma_runs, interleave_ffma, kernel_already_interleaved)
from .sass import decode_text

_SPILL_OPS = ("LDL", "STL")
_HIGHLIGHT = ("QGMMA", "HGMMA", "IGMMA", "BGMMA", "FFMA", "FADD", "FMUL", "LDL", "STL", "UTMALDG", "UTMASTG",
              "SYNCS.ARRIVE", "SYNCS.PHASECHK", "BAR", "EXIT")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _kernel_info(cb: Cubin, k: Kernel) -> Dict[str, object]:
    text = cb.read_text(k)
    ins = decode_text(text)
    mix = Counter(i.opcode_name for i in ins)
    words = [(i.lo_raw, i.hi_raw) for i in ins]
    runs = find_ffma_runs(words)
    return {
        "name": k.name,
        "registers": k.registers,
        "shared_bytes": k.shared_bytes,
        "max_threads": list(k.max_threads) if k.max_threads else None,
        "max_reg_count": k.max_reg_count,
        "param_bytes": k.param_size,
        "frame_bytes": k.frame_size,
        "num_barriers": k.num_barriers,
        "num_mbarriers": k.num_mbarriers,
        "reg_reconfig": k.reg_reconfig,
        "instructions": len(ins),
        "text_offset": k.text_offset,
        "text_bytes": k.text_size,
        "spill_instructions": sum(mix[o] for o in _SPILL_OPS),
        "ffma_runs": len(runs),
        "ffmas_in_runs": sum(n for _, n in runs),
        "yielded_ffmas": sum(1 for i in ins if i.is_ffma and i.yield_),
        "already_interleaved": bool(runs) and kernel_already_interleaved(words, runs),
        "mix": dict(sorted(mix.items(), key=lambda kv: (-kv[1], kv[0]))),
    }


def _dash(v: object) -> str:
    return "-" if v is None else str(v)


def cmd_info(args: argparse.Namespace) -> int:
    cb = Cubin.from_bytes(_read(args.file))
    kernels = [k for k in cb.kernels if args.kernel is None or k.name == args.kernel]
    if args.kernel is not None and not kernels:
        raise ValueError(f"no kernel {args.kernel!r} (kernels: {[k.name for k in cb.kernels]})")
    infos = [_kernel_info(cb, k) for k in kernels]
    tk = cb.toolkit_version
    header = {
        "file": args.file,
        "bytes": len(cb.to_bytes()),
        "arch": cb.arch,
        "abi_version": cb.abi_version,
        "toolkit": f"{tk[0]}.{tk[1]}" if tk else None,
        "e_flags": f"0x{cb.e_flags:08x}",
        "kernels": infos,
    }
    if args.json:
        print(json.dumps(header, indent=2))
        return 0
    print(f"{args.file}: {header['bytes']} bytes, {cb.arch}, ELF ABI {cb.abi_version}, toolkit {header['toolkit']}, "
          f"e_flags {header['e_flags']}, {len(cb.kernels)} kernel(s)")
    for info in infos:
        print(f"\nkernel {info['name']}")
        mt = info["max_threads"]
        print(f"  registers      {info['registers']}  (max_reg_count {info['max_reg_count']}, "
              f"setmaxnreg {'yes' if info['reg_reconfig'] else 'no'})")
        print(f"  shared memory  {info['shared_bytes']} bytes (static)")
        print(f"  max threads    {'x'.join(map(str, mt)) if mt else '-'}")
        print(f"  params         {info['param_bytes']} bytes; frame {info['frame_bytes']} bytes; "
              f"barriers {_dash(info['num_barriers'])}; mbarriers {_dash(info['num_mbarriers'])}")
        print(f"  instructions   {info['instructions']} ({info['text_bytes']} bytes at file offset "
              f"0x{info['text_offset']:x})")
        print(f"  spills (LDL/STL) {info['spill_instructions']}")
        print(f"  FFMA runs >= 8 {info['ffma_runs']} ({info['ffmas_in_runs']} FFMAs), yielded FFMAs "
              f"{info['yielded_ffmas']}, already interleaved: {'yes' if info['already_interleaved'] else 'no'}")
        mix: Dict[str, int] = info["mix"]  # type: ignore[assignment]
        hl = ", ".join(f"{n} {mix.get(n, 0)}" for n in _HIGHLIGHT)
        print(f"  key ops        {hl}")
        print("  mix            " + ", ".join(f"{n} {c}" for n, c in mix.items()))
    return 0


def cmd_dump(args: argparse.Namespace) -> int:
    cb = Cubin.from_bytes(_read(args.file))
    kernels = [k for k in cb.kernels if args.kernel is None or k.name == args.kernel]
    if args.kernel is not None and not kernels:
        raise ValueError(f"no kernel {args.kernel!r} (kernels: {[k.name for k in cb.kernels]})")
    out = sys.stdout
    for k in kernels:
        out.write(f"// kernel {k.name}: {k.text_size // 16} instructions, .text at file offset 0x{k.text_offset:x}\n")
        for ins in decode_text(cb.read_text(k)):
            line = f"/*{ins.address:04x}*/  {ins.text():<58s} {ins.control_text()}"
            if args.hex:
                line += f"  0x{ins.lo_raw:016x} 0x{ins.hi_raw:016x}"
            out.write(line.rstrip() + "\n")
        out.write("\n")
    return 0


def _default_output(path: str) -> str:
    root, ext = os.path.splitext(path)
    return (root if ext == ".cubin" else path) + ".interleaved.cubin"


def cmd_interleave(args: argparse.Namespace) -> int:
    data = _read(args.file)
    res = interleave_ffma(data, fraction=args.fraction, force=args.force)
    out = args.output or _default_output(args.file)
    with open(out, "wb") as f:
        f.write(res.cubin)
    if args.json:
        print(json.dumps({
            "input": args.file, "output": out, "pass_version": PASS_VERSION, "fraction": args.fraction,
            "force": args.force, "changed": res.changed,
            "kernels": [{
                "name": r.name, "runs": r.runs, "ffmas_in_runs": r.ffmas_in_runs, "changed": r.changed,
                "already_interleaved": r.already_interleaved, "skipped_reason": r.skipped_reason,
                "yields_before": r.yields_before, "yields_after": r.yields_after,
            } for r in res.kernels],
        }, indent=2))
        return 0
    print(f"interleave pass v{PASS_VERSION} (fraction {args.fraction:g}{', forced' if args.force else ''}): "
          f"{args.file} -> {out}")
    for r in res.kernels:
        print("  " + r.summary())
    print(f"  total changed instructions: {res.changed}")
    return 0


def _fraction(text: str) -> float:
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            v = float(num) / float(den)
        else:
            v = float(text)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"bad fraction {text!r} (use e.g. 0.5625 or 9/16)")
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"fraction {text!r} must be within [0, 1]")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sass_tools",
        description="Inspect and patch NVIDIA sm_90a cubins (CUDA 12 and 13 formats): kernel resources, SASS "
                    "listing with control words, and the FFMA yield/reuse interleave pass.")
    p.add_argument("--version", action="version", version=f"sass_tools {__version__} (pass {PASS_VERSION})")
    sub = p.add_subparsers(dest="command", required=True, metavar="{info,dump,interleave}")

    pi = sub.add_parser("info", help="per-kernel registers, shared memory, instruction count and mix")
    pi.add_argument("file", help="cubin file")
    pi.add_argument("--kernel", help="only this kernel (mangled name)")
    pi.add_argument("--json", action="store_true", help="machine-readable output")
    pi.set_defaults(func=cmd_info)

    pd = sub.add_parser("dump", help="list every instruction with address, opcode, FP32 operands and control word")
    pd.add_argument("file", help="cubin file")
    pd.add_argument("--kernel", help="only this kernel (mangled name)")
    pd.add_argument("--hex", action="store_true", help="also print the lo/hi words")
    pd.set_defaults(func=cmd_dump)

    pl = sub.add_parser("interleave", help="apply the FFMA interleave pass; writes FILE.interleaved.cubin")
    pl.add_argument("file", help="cubin file")
    pl.add_argument("-o", "--output", help="output path (default: FILE.interleaved.cubin)")
    pl.add_argument("--fraction", type=_fraction, default=DEFAULT_FRACTION,
                    help="part of each FFMA run to rewrite, e.g. 9/16 (default) or 1")
    pl.add_argument("--force", action="store_true", help="also patch kernels the compiler already interleaved")
    pl.add_argument("--json", action="store_true", help="machine-readable report")
    pl.set_defaults(func=cmd_interleave)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `python -m sass_tools dump x.cubin | head`
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
