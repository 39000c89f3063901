"""``cupygemm cast-bench``: bandwidth of the FP8 casts at DeepSeek-V3's training sizes, against a device-to-device
copy of the same bytes.

Tensors (BF16 by default, ``--tokens`` = 4096 tokens T): the activations x [T, K] and output gradients dy [T, N] of
the six dense (N, K) pairs (one row per distinct width: x and dy of the same width are the same work), and the
weights W [N, K]. Methods:

* activations: ``per_token`` (the 1x128 cast of x, the forward's), ``transposed`` (q_t, s_t of x^T, the wgrad
  operand, in one pass), ``transposed_rowwise`` (both in one pass), and ``unfused``: CuPy's ``x.T.copy()`` then the
  1x128 cast of that copy (what ``transposed`` replaces);
* weights: ``per_block`` (the 128x128 cast) and ``per_block_with_transpose`` (W's and W^T's in one pass).

Per row: ``us``, the median of ``--iters`` calls timed with CUDA events, each after an untimed 1 GiB memset that
flushes L2 (as ``cupygemm bench``); ``bytes``, x read once plus every result written, scales included (the
``unfused`` row counts ``transposed``'s bytes: its GB/s is the effective rate of the result); ``gbs``; ``copy_us``,
a ``cudaMemcpyAsync`` device-to-device of bytes / 2 (so that its read + write is the same byte count), timed the
same way in the same run; ``copy_ratio`` = ``copy_us / us`` (1.0: as fast as a copy of its bytes) and
``peak_ratio`` = ``gbs`` over a 1 GiB copy's rate (``copy_gbs``). ``check``: the fused results are bit for bit the
unfused casts' of ``x.T.copy()`` (and of ``x``, ``W``, ``W.T.copy()``).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

from ..shapes import NORMAL_NK
from ..util import ceil_div
from .options import help_text

ACT_METHODS = ("per_token", "transposed", "transposed_rowwise", "unfused")
WEIGHT_METHODS = ("per_block", "per_block_with_transpose")
_DTYPES = {"bfloat16": 2, "float16": 2, "float32": 4}


def activation_widths(pairs: tuple[tuple[int, int], ...] = NORMAL_NK) -> list[int]:
    """The distinct widths of x [T, K] and dy [T, N] over the (N, K) pairs."""
    return sorted({k for _, k in pairs} | {n for n, _ in pairs})


def cast_bytes(method: str, rows: int, cols: int, itemsize: int) -> int:
    """Bytes a cast of an [rows, cols] input moves: the input once, every output (FP8 values, FP32 scales)."""
    data, rb, cb = rows * cols, ceil_div(rows, 128), ceil_div(cols, 128)
    read = data * itemsize
    if method == "per_token":
        return read + data + 4 * rows * cb
    if method in ("transposed", "unfused"):
        return read + data + 4 * cols * rb
    if method == "transposed_rowwise":
        return read + 2 * data + 4 * (cols * rb + rows * cb)
    if method == "per_block":
        return read + data + 4 * rb * cb
    if method == "per_block_with_transpose":
        return read + 2 * data + 8 * rb * cb
    raise ValueError(f"unknown method {method!r}")


def _input(shape: tuple[int, int], dtype: str, seed: int) -> Any:
    import cupy as cp

    from ..tensors import BF16
    from .inputs import randn_bf16

    rng = cp.random.default_rng(seed)
    if dtype == "bfloat16":
        return randn_bf16(shape, rng)
    return rng.standard_normal(shape, dtype=cp.float32).astype(dtype)


def _transposed_copy(x: Any) -> Any:
    """``x.T.copy()`` (BF16 through its bits: CuPy has no bfloat16 kernels)."""
    import cupy as cp

    bits = {2: cp.uint16, 4: cp.uint32}[x.dtype.itemsize]
    return x.view(bits).T.copy().view(x.dtype)


def _same(got: tuple, want: tuple) -> bool:
    import cupy as cp

    return all(g.shape == w.shape and bool((g.view(cp.uint8) == w.view(cp.uint8)).all()) for g, w in zip(got, want))


def _calls(kind: str, x: Any) -> dict[str, Callable[[], Any]]:
    import cupygemm

    if kind == "act":
        return {
            "per_token": lambda: cupygemm.per_token_cast_to_fp8(x),
            "transposed": lambda: cupygemm.per_token_cast_to_fp8_transposed(x),
            "transposed_rowwise": lambda: cupygemm.per_token_cast_to_fp8_transposed(x, rowwise=True),
            "unfused": lambda: cupygemm.per_token_cast_to_fp8(_transposed_copy(x)),
        }
    return {
        "per_block": lambda: cupygemm.per_block_cast_to_fp8(x),
        "per_block_with_transpose": lambda: cupygemm.per_block_cast_to_fp8(x, with_transpose=True),
    }


def _check(kind: str, x: Any) -> bool:
    """The fused results equal the unfused casts bit for bit."""
    import cupygemm

    xt = _transposed_copy(x)
    if kind == "act":
        fused = cupygemm.per_token_cast_to_fp8_transposed(x, rowwise=True)
        return _same(fused, cupygemm.per_token_cast_to_fp8(xt) + cupygemm.per_token_cast_to_fp8(x))
    fused = cupygemm.per_block_cast_to_fp8(x, with_transpose=True)
    return _same(fused, cupygemm.per_block_cast_to_fp8(x) + cupygemm.per_block_cast_to_fp8(xt))


def _copy_call(nbytes: int) -> tuple[Callable[[], None], Any]:
    import cupy as cp

    half = max(nbytes // 2, 1)
    src, dst = cp.empty(half, cp.uint8), cp.empty(half, cp.uint8)
    src.data.memset_async(1, half)
    return (lambda: dst.data.copy_from_device_async(src.data, half)), (src, dst)


def measure(tensors: list[tuple[str, str, tuple[int, int]]], dtype: str, iters: int, timer: Any,
            copy_bytes_per_s: float, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """One row per (tensor, method): see the module docstring."""
    import cupy as cp

    from .metrics import summarize_times

    rows = []
    for i, (kind, name, shape) in enumerate(tensors):
        x = _input(shape, dtype, seed=i)
        check = _check(kind, x)
        for method, call in _calls(kind, x).items():
            call()  # loads the kernel, warms the memory pool
            us = summarize_times(timer.time_events(call, iters))["us"]
            nbytes = cast_bytes(method, shape[0], shape[1], _DTYPES[dtype])
            copy, keep = _copy_call(nbytes)
            copy()
            copy_us = summarize_times(timer.time_events(copy, iters))["us"]
            del keep
            gbs = nbytes / us / 1e3
            row = {"tensor": kind, "name": name, "shape": list(shape), "dtype": dtype, "method": method, "us": us,
                   "bytes": nbytes, "gbs": gbs, "copy_us": copy_us, "copy_ratio": copy_us / us,
                   "peak_ratio": gbs * 1e9 / copy_bytes_per_s, "check": check if method != "per_token" and
                   method != "per_block" else None}
            rows.append(row)
            log(f"{name:>12} {shape[0]}x{shape[1]:<6} {method:<25} {us:9.1f} us {gbs:7.0f} GB/s  "
                f"copy {copy_us:8.1f} us  x{row['copy_ratio']:.2f}" + ("" if check else "  MISMATCH"))
        del x
        cp.get_default_memory_pool().free_all_blocks()
    return rows


def tensors_for(tokens: int, pairs: tuple[tuple[int, int], ...] = NORMAL_NK) -> list[tuple[str, str, tuple[int, int]]]:
    """(kind, label, shape): the activations / output gradients [tokens, width], then the weights [N, K]."""
    acts = []
    ks, ns = {k for _, k in pairs}, {n for n, _ in pairs}
    for width in activation_widths(pairs):
        label = "/".join(lbl for lbl, ws in (("x", ks), ("dy", ns)) if width in ws)
        acts.append(("act", label, (tokens, width)))
    return acts + [("weight", "w", (n, k)) for n, k in pairs]


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per method: the geometric means of copy_ratio and GB/s over its rows."""
    from .metrics import geomean

    out = {}
    for method in ACT_METHODS + WEIGHT_METHODS:
        sel = [r for r in rows if r["method"] == method]
        if sel:
            out[method] = {"copy_ratio": geomean(r["copy_ratio"] for r in sel), "gbs": geomean(r["gbs"] for r in sel)}
    return out


def markdown(rows: list[dict[str, Any]], copy_gbs: float) -> str:
    lines = [f"1 GiB device-to-device copy: {copy_gbs:.0f} GB/s (read + write)", "",
             "| tensor | shape | method | us | GB/s | copy of the same bytes, us | vs copy | vs 1 GiB copy | bitwise |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        check = "" if r["check"] is None else ("yes" if r["check"] else "NO")
        lines.append(f"| {r['name']} | {r['shape'][0]}x{r['shape'][1]} | {r['method']} | {r['us']:.1f} | "
                     f"{r['gbs']:.0f} | {r['copy_us']:.1f} | {r['copy_ratio']:.2f} | {r['peak_ratio']:.2f} | {check} |")
    lines += ["", "| method | geomean vs copy | geomean GB/s |", "|---|---|---|"]
    for method, s in summary(rows).items():
        lines.append(f"| {method} | {s['copy_ratio']:.2f} | {s['gbs']:.0f} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from .overhead import environment
    from .timing import Timer, measure_copy_bandwidth

    pairs = tuple(tuple(p) for p in args.nk) if args.nk else NORMAL_NK
    tensors = tensors_for(args.tokens, pairs)
    copy_bps = measure_copy_bandwidth()
    timer = Timer()
    rows = measure(tensors, args.dtype, args.iters, timer, copy_bps, log=lambda s: print(s, file=sys.stderr))
    print(markdown(rows, copy_bps / 1e9))
    ok = all(r["check"] is not False for r in rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(["cupygemm cast-bench"] + sys.argv[2:]), "tokens": args.tokens,
                       "dtype": args.dtype, "iters": args.iters, "copy_gbs": copy_bps / 1e9,
                       "timing": "CUDA events around each call on the current stream, after an untimed 1 GiB "
                                 "memset that flushes L2; us = median over iters calls after one untimed call",
                       "environment": environment(), "summary": summary(rows), "all_bitwise_equal": ok,
                       "rows": rows}, f, indent=1)
    return 0 if ok else 1


def _nk_arg(text: str) -> list[tuple[int, int]]:
    """'2112x7168,24576x1536' -> [(2112, 7168), (24576, 1536)]."""
    try:
        pairs = [tuple(int(v) for v in tok.lower().split("x")) for tok in text.replace(" ", "").split(",") if tok]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 or min(p) < 1 for p in pairs):
        raise argparse.ArgumentTypeError(f"--nk {text!r}: expected NxK[,NxK...] with positive N and K")
    return pairs  # type: ignore[return-value]


def add_parser(sub: Any) -> None:
    sp = sub.add_parser("cast-bench", help="bandwidth of the FP8 casts (fused transpose casts included) at DeepSeek-V3 "
                        "training sizes, against a device-to-device copy", description=help_text(__doc__),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("--tokens", type=int, default=4096, help="T, the token count of x and dy (default 4096)")
    sp.add_argument("--nk", type=_nk_arg, default=None, metavar="NxK[,NxK...]",
                    help="the (N, K) pairs (default: DeepSeek-V3's six dense projections)")
    sp.add_argument("--dtype", choices=sorted(_DTYPES), default="bfloat16", help="input dtype (default bfloat16)")
    sp.add_argument("--iters", type=int, default=30, help="timed calls per row (default 30)")
    sp.add_argument("--json", metavar="FILE", help="write the rows, the summary and the environment as JSON")
    sp.set_defaults(func=run)

