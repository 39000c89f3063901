"""``cupygemm bench``: time cupygemm against its peers on the seed shapes (or yours), in one run, on one GPU.

What it does, in order:

1. Builds the shape list (28 seed shapes by default: 18 normal, 4 contiguous, 6 masked) and, per shape, the row
   layout of the grouped cases (seeded: group sizes uniform in 0.7-1.3 x the expected rows).
2. Compiles every kernel the library will pick for those shapes, in parallel, before anything is timed.
3. Measures the device-to-device copy bandwidth once (it defines the "floor", the physical limit of a shape).
4. Per shape: makes ``randn`` BF16 inputs on the GPU, quantizes them with the 1x128 / 128x128 recipe
   (:mod:`cupygemm.quantization`), runs every provider once untimed, then ``--iters`` timed calls, each preceded
   by an untimed 1 GiB memset that flushes L2, with CUDA events around the call. Everything runs on the legacy
   default stream, CuPy's and torch's alike, so the providers are ordered with the events.
5. Checks each provider's result on sampled rows against a float64 host reference built from the quantized inputs
   (relative Frobenius error) and against the product of the unquantized BF16 inputs (``calc_diff``).
6. Prints a table (and optionally markdown), writes JSON and a bar chart on request.

Peers are optional and found at run time: cuBLASLt block-scaled FP8 through ``torch._scaled_mm`` (normal shapes
only) and DeepGEMM (its 03d0be3 Python API) when ``import deep_gemm`` works. torch is never required.

The pure parts (shape lists, sizes, formulas, statistics, checks, writers) run without a GPU and are tested on CPU.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

# ---- constants --------------------------------------------------------------------------------------------------

KINDS = ("normal", "contiguous", "masked")
_KIND_ALIASES = {"contig": "contiguous"}

NORMAL_MS = (64, 128, 4096)
NORMAL_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
GROUPED_NK = ((4096, 7168), (7168, 2048))
CONTIGUOUS_GM = ((4, 8192), (8, 4096))  # (groups, expected rows per group)
MASKED_GM = ((1, 1024), (2, 512), (4, 256))  # (groups, expected_m)
MASKED_MAX_M = 4096
M_ALIGNMENT = 128  # rows each contiguous group is padded to
GROUP_SPREAD = (0.7, 1.3)  # group sizes are uniform in this range times the expected rows

#: H100/H200 SXM dense FP8 tensor-core peak (datasheet), the compute half of the floor.
FP8_DENSE_FLOPS = 1979e12
CHECK_ROWS = 16
REL_ERR_TOL = 1e-2
CALC_DIFF_TOL = 1e-3
FLUSH_BYTES = 1 << 30
COPY_BYTES = 1 << 30
DEFAULT_ITERS = 30

PROVIDERS = ("cupygemm", "cublas_block", "deepgemm")
PEERS = ("cublas_block", "deepgemm")
TITLES = {"cupygemm": "cupygemm", "cublas_block": "cuBLAS-block", "deepgemm": "DeepGEMM"}
_PEER_ALIASES = {"cublas": "cublas_block", "cublas_block": "cublas_block", "deepgemm": "deepgemm",
                 "deep_gemm": "deepgemm"}
PROVIDER_DESCRIPTIONS = {
    "cupygemm": "cupygemm (this package), the public API with SFA pre-converted to the M-major TMA-aligned layout",
    "cublas_block": "cuBLASLt 1x128 x 128x128 block-scaled FP8 through torch._scaled_mm: scale_a (M, K/128) "
                    "M-major (strides (1, M)), scale_b (K/128, N/128) = the weight scales transposed, BF16 out",
    "deepgemm": "DeepGEMM through its 03d0be3 Python API (gemm_fp8_fp8_bf16_nt and the m_grouped functions)",
}
MATPLOTLIB_HINT = "--plot needs matplotlib: pip install 'cupygemm[bench]'"
SCHEMA = "cupygemm-bench/1"


class BenchUsageError(ValueError):
    """A bad option combination (reported with exit code 2)."""


# ---- shapes -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """One benchmark case. ``dims``: (M, N, K) for normal, (G, rows per group, N, K) for grouped kinds
    (contiguous: expected rows per group; masked: expected_m)."""

    kind: str
    dims: tuple[int, ...]

    @property
    def label(self) -> str:
        return "x".join(str(d) for d in self.dims)

    @property
    def groups(self) -> int:
        return 1 if self.kind == "normal" else self.dims[0]

    @property
    def m(self) -> int:
        """M (normal) or the expected rows per group (grouped)."""
        return self.dims[0] if self.kind == "normal" else self.dims[1]

    @property
    def n(self) -> int:
        return self.dims[-2]

    @property
    def k(self) -> int:
        return self.dims[-1]


def default_shapes(kinds: Iterable[str] = KINDS) -> list[Shape]:
    """The seed shapes of ``kinds``, in the order normal, contiguous, masked (28 for all three)."""
    kinds = set(kinds)
    shapes: list[Shape] = []
    if "normal" in kinds:
        shapes += [Shape("normal", (m, n, k)) for m in NORMAL_MS for n, k in NORMAL_NK]
    if "contiguous" in kinds:
        shapes += [Shape("contiguous", (g, m, n, k)) for g, m in CONTIGUOUS_GM for n, k in GROUPED_NK]
    if "masked" in kinds:
        shapes += [Shape("masked", (g, m, n, k)) for g, m in MASKED_GM for n, k in GROUPED_NK]
    return shapes


def parse_kinds(text: str | None) -> list[str] | None:
    """'normal,contiguous' -> ['normal', 'contiguous'] (None stays None: all kinds)."""
    if text is None:
        return None
    kinds: list[str] = []
    for tok in text.replace(" ", "").split(","):
        if not tok:
            continue
        kind = _KIND_ALIASES.get(tok.lower(), tok.lower())
        if kind not in KINDS:
            raise BenchUsageError(f"--kinds: unknown kind {tok!r}; expected a comma-separated subset of {','.join(KINDS)}")
        if kind not in kinds:
            kinds.append(kind)
    if not kinds:
        raise BenchUsageError("--kinds: name at least one kind")
    return kinds


def parse_shape_texts(texts: Sequence[str] | None) -> list[tuple[int, ...]] | None:
    """Shape arguments ('MxNxK' or 'GxMxNxK', separated by spaces or commas) -> dimension tuples."""
    if not texts:
        return None
    from .cli import parse_shape

    dims = []
    for text in texts:
        for tok in text.split(","):
            tok = tok.strip()
            if tok:
                try:
                    dims.append(parse_shape(tok))
                except argparse.ArgumentTypeError as e:
                    raise BenchUsageError(f"--shapes: {e}") from None
    if not dims:
        raise BenchUsageError("--shapes: no shape given")
    return dims


def _check_dims(shape: Shape) -> None:
    if min(shape.dims) < 1:
        raise BenchUsageError(f"shape {shape.label}: every dimension must be positive")
    if shape.k % 16:
        raise BenchUsageError(f"shape {shape.label}: K must be a multiple of 16 (got {shape.k})")
    if shape.n % 8:
        raise BenchUsageError(f"shape {shape.label}: N must be a multiple of 8 (got {shape.n})")


def select_shapes(kinds: list[str] | None, dims_list: list[tuple[int, ...]] | None) -> list[Shape]:
    """The shapes to run: the seed shapes of ``kinds`` (None: all), or ``dims_list`` interpreted with ``kinds``.

    MxNxK is a normal shape; GxMxNxK needs exactly one grouped kind in ``kinds`` (contiguous or masked).
    """
    if dims_list is None:
        return default_shapes(kinds if kinds is not None else KINDS)
    grouped = [k for k in (kinds or []) if k != "normal"]
    shapes = []
    for dims in dims_list:
        if len(dims) == 3:
            if kinds is not None and "normal" not in kinds:
                raise BenchUsageError(f"shape {'x'.join(map(str, dims))} is MxNxK (normal) but --kinds excludes normal")
            shape = Shape("normal", tuple(dims))
        else:
            if len(grouped) != 1:
                raise BenchUsageError(
                    f"shape {'x'.join(map(str, dims))} is GxMxNxK: give --kinds contiguous or --kinds masked "
                    "(exactly one grouped kind) to say which layout it is")
            shape = Shape(grouped[0], tuple(dims))
        _check_dims(shape)
        shapes.append(shape)
    return shapes


# ---- per-shape row layout (seeded) --------------------------------------------------------------------------------

def round_up(x: int, align: int) -> int:
    return (x + align - 1) // align * align


def masked_max_m(expected_m: int) -> int:
    """max_m of a masked shape: 4096, or more when 1.3 x expected_m would not fit."""
    return max(MASKED_MAX_M, round_up(math.ceil(expected_m * GROUP_SPREAD[1]), M_ALIGNMENT))


def shape_seed(shape: Shape, seed: int) -> list[int]:
    """Entropy for the shape's generators: the same sizes and data for a shape whatever the shape list."""
    return [int(seed), KINDS.index(shape.kind), *(int(d) for d in shape.dims)]


@dataclass(frozen=True)
class Sizes:
    """Rows of one shape: ``group_rows`` valid rows per group (normal: (M,)); ``a_rows``: rows of A per
    group dimension (normal M, contiguous the padded total, masked max_m)."""

    group_rows: tuple[int, ...]
    a_rows: int

    @property
    def valid_m(self) -> int:
        return int(sum(self.group_rows))


def make_sizes(shape: Shape, seed: int, valid_rows: int | None = None) -> Sizes:
    """Group sizes like the peers' tests: int(expected x U(0.7, 1.3)) (at least 1); contiguous groups are padded
    to 128 rows; masked ones are clamped to max_m. Deterministic in (shape, seed). ``valid_rows``: make the
    sizes sum to it instead (see :func:`match_total`), to run the very row count a peer table measured."""
    if shape.kind == "normal":
        return Sizes((shape.m,), shape.m)
    rng = np.random.default_rng(shape_seed(shape, seed))
    factors = rng.uniform(GROUP_SPREAD[0], GROUP_SPREAD[1], size=shape.groups)
    rows = [max(1, int(shape.m * f)) for f in factors]
    if valid_rows is not None:
        rows = match_total(rows, valid_rows, shape.m)
    if shape.kind == "contiguous":
        return Sizes(tuple(rows), sum(round_up(r, M_ALIGNMENT) for r in rows))
    max_m = masked_max_m(shape.m)
    return Sizes(tuple(min(r, max_m) for r in rows), max_m)


def match_total(rows: Sequence[int], total: int, expected: int) -> list[int]:
    """``rows`` rescaled to sum to ``total``, each kept within int(0.7 x expected)..int(1.3 x expected) (the
    peers' spread); the remainder of the rounding goes to the first groups with room. ValueError when no such
    sizes exist."""
    lo, hi = max(1, int(expected * GROUP_SPREAD[0])), max(1, int(expected * GROUP_SPREAD[1]))
    if not len(rows) * lo <= total <= len(rows) * hi:
        raise ValueError(f"{total} valid rows cannot be split into {len(rows)} groups of {lo}..{hi} rows")
    scale = total / sum(rows)
    out = [min(hi, max(lo, int(r * scale))) for r in rows]
    while sum(out) != total:
        step = 1 if sum(out) < total else -1
        for i, r in enumerate(out):
            if sum(out) != total and lo <= r + step <= hi:
                out[i] = r + step
    return out


def peer_valid_rows(path: str | os.PathLike) -> dict[tuple[str, tuple[int, ...]], int]:
    """Valid rows of each grouped shape in a peer table (benchmarks/peers/*.json), from its DeepGEMM rows:
    rows = TFLOPS x time / (2 N K). Keys are (kind, dims) as in :class:`Shape`."""
    with open(path) as f:
        table = json.load(f)
    kinds = {"contig": "contiguous", "contiguous": "contiguous", "masked": "masked"}
    out = {}
    for r in table.get("rows", []):
        kind = kinds.get(r.get("kind"))
        if kind is None or r.get("provider") != "deepgemm" or not r.get("tflops") or not r.get("us"):
            continue
        dims = tuple(int(d) for d in r["shape"])
        out[(kind, dims)] = round(r["tflops"] * 1e12 * r["us"] * 1e-6 / (2 * dims[-2] * dims[-1]))
    return out


def contiguous_m_indices(group_rows: Sequence[int], align: int = M_ALIGNMENT) -> np.ndarray:
    """int32 group index per row of the contiguous layout; -1 on each group's padding rows."""
    parts = []
    for g, rows in enumerate(group_rows):
        parts.append(np.full(rows, g, dtype=np.int32))
        parts.append(np.full(round_up(rows, align) - rows, -1, dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def config_m_rows(shape: Shape, sizes: Sizes) -> int:
    """The ``m_rows`` the API passes to choose_config: M, the contiguous total rows, or masked expected_m."""
    from .config import kind_id, model_rows

    kid = kind_id(shape.kind)
    if shape.kind == "normal":
        return model_rows(kid, shape.m)
    if shape.kind == "contiguous":
        return model_rows(kid, sizes.a_rows)
    return model_rows(kid, sizes.a_rows, shape.m)


def shape_config(shape: Shape, sizes: Sizes, num_sms: int, smem_limit: int | None = None):
    """The GemmConfig the library picks for this shape (same arguments as cupygemm.gemm)."""
    from .config import choose_config, kind_id

    kid = kind_id(shape.kind)
    kwargs = {} if smem_limit is None else {"smem_limit": smem_limit}
    return choose_config(kid, config_m_rows(shape, sizes), shape.n, shape.k, shape.groups, num_sms, **kwargs)


def check_rows(shape: Shape, sizes: Sizes, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows to verify, as (flat row indices into the output viewed as 2-D [rows, N], their groups).

    Only valid rows: not contiguous padding, not masked rows past masked_m. Sorted, at most ``count``.
    """
    if shape.kind == "normal":
        flat = np.arange(shape.m)
        groups = np.zeros(shape.m, dtype=np.int64)
    else:
        flat_parts, group_parts, offset = [], [], 0
        for g, rows in enumerate(sizes.group_rows):
            start = offset if shape.kind == "contiguous" else g * sizes.a_rows
            flat_parts.append(start + np.arange(rows))
            group_parts.append(np.full(rows, g, dtype=np.int64))
            offset += round_up(rows, M_ALIGNMENT)
        flat = np.concatenate(flat_parts)
        groups = np.concatenate(group_parts)
    if len(flat) > count:
        rng = np.random.default_rng(shape_seed(shape, seed) + [1])
        pick = np.sort(rng.choice(len(flat), size=count, replace=False))
        flat, groups = flat[pick], groups[pick]
    return flat.astype(np.int64), groups.astype(np.int64)


# ---- formulas -----------------------------------------------------------------------------------------------------

def work(shape: Shape, sizes: Sizes) -> tuple[int, int]:
    """(FLOPs, bytes) of one call, the peers' formulas: 2*valid_m*N*K and valid_m*K + G*N*K + 2*valid_m*N
    (FP8 A and B, BF16 D; scales not counted; grouped shapes count valid rows only)."""
    vm, n, k, g = sizes.valid_m, shape.n, shape.k, shape.groups
    return 2 * vm * n * k, vm * k + g * n * k + 2 * vm * n


def floor_us(flops: float, nbytes: float, copy_bytes_per_s: float, peak_flops: float = FP8_DENSE_FLOPS) -> float:
    """The physical floor in microseconds: max(bytes / copy bandwidth, FLOPs / FP8 dense peak)."""
    return max(nbytes / copy_bytes_per_s, flops / peak_flops) * 1e6


def throughput(us: float, flops: float, nbytes: float, floor: float) -> dict[str, float]:
    """TFLOPS, GB/s and the % of the floor achieved by a call of ``us`` microseconds."""
    s = us * 1e-6
    return {"tflops": flops / s / 1e12, "gbs": nbytes / s / 1e9, "pct_floor": 100.0 * floor / us}


def summarize_times(times_us: Sequence[float]) -> dict[str, float]:
    """Median, p10, p90, min and max of per-call times (microseconds)."""
    t = np.asarray(times_us, dtype=np.float64)
    p10, med, p90 = np.percentile(t, [10, 50, 90])
    return {"us": float(med), "p10": float(p10), "p90": float(p90), "min": float(t.min()), "max": float(t.max())}


def geomean(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return float(math.exp(sum(math.log(v) for v in vals) / len(vals)))


# ---- result checks --------------------------------------------------------------------------------------------------

def bf16_bits(x: Any) -> Any:
    """float32 array (NumPy or CuPy) -> uint16 BF16 bits, round to nearest even (finite inputs)."""
    u = x.view(np.uint32)
    one, bias, sixteen = np.uint32(1), np.uint32(0x7FFF), np.uint32(16)
    return ((u + ((u >> sixteen) & one) + bias) >> sixteen).astype(np.uint16)


def bf16_bits_to_f64(bits: Any) -> np.ndarray:
    """uint16 BF16 bits (host) -> float64."""
    b = np.asarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def _host(x: Any) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.get()


def _take_rows(arr2d: Any, rows: np.ndarray) -> np.ndarray:
    """Host copy of ``arr2d[rows]`` (NumPy or CuPy)."""
    if isinstance(arr2d, np.ndarray):
        return arr2d[rows]
    import cupy

    return arr2d[cupy.asarray(rows)].get()


def _rows2d(arr: Any) -> Any:
    return arr.reshape(-1, arr.shape[-1])


def _group(arr: Any, g: int) -> Any:
    return arr if arr.ndim == 2 else arr[g]


def compare(got: np.ndarray, ref_q: np.ndarray, ref_bf16: np.ndarray) -> dict[str, Any]:
    """Check result rows: finite, relative Frobenius error vs the float64 dequantized reference < 1e-2, and
    calc_diff vs the unquantized BF16 product < 1e-3. Returns {check: 'ok'|'FAIL', rel_err, calc_diff}."""
    from .reference import calc_diff

    got = np.asarray(got, dtype=np.float64)
    finite = bool(np.isfinite(got).all())
    if finite:
        denom = float(np.linalg.norm(ref_q))
        rel = float(np.linalg.norm(got - ref_q)) / (denom if denom > 0 else 1.0)
        diff = calc_diff(got, ref_bf16)
    else:
        rel, diff = math.nan, math.nan
    ok = finite and rel < REL_ERR_TOL and diff < CALC_DIFF_TOL
    return {"check": "ok" if ok else "FAIL", "rel_err": rel, "calc_diff": diff}


@dataclass
class Inputs:
    """One shape's operands (CuPy on the GPU; NumPy works for the host-side helpers)."""

    shape: Shape
    sizes: Sizes
    a: Any  # uint8 e4m3 bits [M, K] / [G, max_m, K]
    sfa: Any  # float32 row-major [M, K/128] / [G, max_m, K/128]
    sfa_mn: Any  # the same scales in the M-major TMA-aligned layout (what the kernels read)
    b: Any  # uint8 [N, K] / [G, N, K]
    sfb: Any  # float32 [N/128, K/128] / [G, N/128, K/128]
    x: Any  # uint16 BF16 bits of the unquantized A (shape of a)
    y: Any  # uint16 BF16 bits of the unquantized B (shape of b)
    m_indices: Any = None  # int32 [M] (contiguous)
    masked_m: Any = None  # int32 [G] (masked)


def reference_rows(inp: Inputs, rows: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float64 reference from the quantized inputs, float64 product of the unquantized BF16 inputs) for the
    sampled output rows (flat indices into the output viewed as [rows, N])."""
    from .reference import gemm_reference

    n = inp.shape.n
    aq = _take_rows(_rows2d(inp.a), rows)
    sa = _take_rows(_rows2d(inp.sfa), rows)
    xf = bf16_bits_to_f64(_take_rows(_rows2d(inp.x), rows))
    ref_q = np.empty((len(rows), n), dtype=np.float64)
    ref_x = np.empty((len(rows), n), dtype=np.float64)
    for g in np.unique(groups):
        sel = groups == g
        bq, sb = _host(_group(inp.b, int(g))), _host(_group(inp.sfb, int(g)))
        ref_q[sel] = gemm_reference(aq[sel], sa[sel], bq, sb)
        yf = bf16_bits_to_f64(_host(_group(inp.y, int(g))))
        ref_x[sel] = xf[sel] @ yf.T
        del yf
    return ref_q, ref_x


def output_rows(out2d_bits: Any, rows: np.ndarray) -> np.ndarray:
    """float64 values of the sampled rows of a provider's output (uint16 BF16 bits viewed as [rows, N])."""
    return bf16_bits_to_f64(_take_rows(out2d_bits, rows))


# ---- report rows -----------------------------------------------------------------------------------------------------

def make_row(shape: Shape, sizes: Sizes, provider: str, stats: dict[str, float] | None, flops: int, nbytes: int,
             floor: float | None, config: str | None = None, check: dict[str, Any] | None = None,
             error: str | None = None) -> dict[str, Any]:
    """One JSON row: a provider's result on a shape."""
    row: dict[str, Any] = {
        "kind": shape.kind, "shape": list(shape.dims), "label": shape.label, "provider": provider,
        "valid_m": sizes.valid_m, "flops": flops, "bytes": nbytes,
        "floor_us": floor, "us": None, "p10": None, "p90": None, "min": None, "max": None,
        "tflops": None, "gbs": None, "pct_floor": None, "config": config,
        "check": None, "rel_err": None, "calc_diff": None, "error": error,
    }
    if stats is not None:
        row.update(stats)
        if floor is not None:
            row.update(throughput(stats["us"], flops, nbytes, floor))
    if check is not None:
        row.update(check)
    if error is not None:
        row["check"] = "FAIL"
    return row


def row_failed(row: dict[str, Any]) -> bool:
    return row.get("check") == "FAIL" or row.get("error") is not None or row.get("us") is None


@dataclass
class ShapeResult:
    kind: str
    label: str
    by_provider: dict[str, dict[str, Any]]


def group_by_shape(rows: Sequence[dict[str, Any]]) -> list[ShapeResult]:
    """Rows grouped per (kind, shape), in first-seen order."""
    out: dict[tuple[str, str], ShapeResult] = {}
    for r in rows:
        key = (r["kind"], r.get("label") or "x".join(str(d) for d in r["shape"]))
        if key not in out:
            out[key] = ShapeResult(key[0], key[1], {})
        out[key].by_provider[r["provider"]] = r
    return list(out.values())


def providers_in(rows: Sequence[dict[str, Any]]) -> list[str]:
    seen = {r["provider"] for r in rows}
    return [p for p in PROVIDERS if p in seen] + sorted(seen - set(PROVIDERS))


def speedup(ours: dict[str, Any] | None, peer: dict[str, Any] | None) -> float | None:
    """Peer time / our time (> 1: cupygemm is faster); None when either is missing."""
    if not ours or not peer or ours.get("us") is None or peer.get("us") is None or ours.get("error"):
        return None
    if peer.get("error") or ours["us"] <= 0:
        return None
    return peer["us"] / ours["us"]


# ---- table writers ---------------------------------------------------------------------------------------------------

def _fmt(v: float | None, spec: str, missing: str = "-") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return missing
    return format(v, spec)


def _fmt_us(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _fmt_x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _peer_cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    if row.get("error"):
        return "err"
    cell = _fmt_us(row.get("us"))
    return cell + ("!" if row.get("check") == "FAIL" else "")


def table_data(rows: Sequence[dict[str, Any]], peers: Sequence[str] | None = None) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the comparison table (one line per shape). ``peers``: the peer columns to show
    (default: those present in ``rows``); a peer without a result for a shape shows '-'."""
    if peers is None:
        peers = [p for p in providers_in(rows) if p != "cupygemm"]
    headers = ["kind", "shape", "floor us", "cupygemm us", "p10-p90", "TFLOPS", "GB/s", "% floor"]
    headers += [f"{TITLES.get(p, p)} us" for p in peers]
    headers += [f"vs {TITLES.get(p, p)}" for p in peers]
    headers += ["calc_diff", "check"]
    body = []
    for sr in group_by_shape(rows):
        ours = sr.by_provider.get("cupygemm")
        any_row = ours or next(iter(sr.by_provider.values()))
        line = [sr.kind, sr.label, _fmt_us(any_row.get("floor_us"))]
        if ours is None:
            line += ["-"] * 5
        elif ours.get("error") or ours.get("us") is None:
            line += ["error", "-", "-", "-", "-"]
        else:
            line += [_fmt_us(ours["us"]), f"{_fmt_us(ours['p10'])}-{_fmt_us(ours['p90'])}",
                     _fmt(ours.get("tflops"), ".0f"), _fmt(ours.get("gbs"), ".0f"),
                     _fmt(ours.get("pct_floor"), ".0f") + ("%" if ours.get("pct_floor") is not None else "")]
        line += [_peer_cell(sr.by_provider.get(p)) for p in peers]
        line += [_fmt_x(speedup(ours, sr.by_provider.get(p))) for p in peers]
        line += [_fmt(ours.get("calc_diff") if ours else None, ".1e"), (ours.get("check") or "-") if ours else "-"]
        body.append(line)
    return headers, body


_LEFT_COLUMNS = {"kind", "shape", "check"}


def format_table(rows: Sequence[dict[str, Any]], peers: Sequence[str] | None = None) -> str:
    """Plain-text table, columns aligned."""
    headers, body = table_data(rows, peers)
    widths = [max(len(h), *(len(line[i]) for line in body)) if body else len(h) for i, h in enumerate(headers)]

    def fmt_line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if h in _LEFT_COLUMNS else c.rjust(w)
                         for c, w, h in zip(cells, widths, headers)).rstrip()

    out = [fmt_line(headers), "  ".join("-" * w for w in widths)]
    out += [fmt_line(line) for line in body]
    return "\n".join(out)


def format_markdown(rows: Sequence[dict[str, Any]], peers: Sequence[str] | None = None) -> str:
    """GitHub markdown table."""
    headers, body = table_data(rows, peers)
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(line) + " |" for line in body]
    return "\n".join(out)


def format_configs(rows: Sequence[dict[str, Any]]) -> str:
    """One line per shape: the kernel config cupygemm used."""
    lines = []
    for r in rows:
        if r["provider"] == "cupygemm" and r.get("config"):
            lines.append(f"  {r['kind']} {r['label']}: {r['config']}")
    return "\n".join(["cupygemm configs:"] + lines) if lines else ""


def format_notes(rows: Sequence[dict[str, Any]]) -> str:
    """Errors and failed checks, one line each."""
    lines = []
    for r in rows:
        who = f"{TITLES.get(r['provider'], r['provider'])} on {r['kind']} {r['label']}"
        if r.get("error"):
            lines.append(f"  {who}: error: {r['error']}")
        elif r.get("check") == "FAIL":
            lines.append(f"  {who}: check FAIL (rel_err {_fmt(r.get('rel_err'), '.2e', 'nan')} vs < {REL_ERR_TOL:g}, "
                         f"calc_diff {_fmt(r.get('calc_diff'), '.2e', 'nan')} vs < {CALC_DIFF_TOL:g})")
    return "\n".join(["notes:"] + lines) if lines else ""


def summary(rows: Sequence[dict[str, Any]], peers: Sequence[str] | None = None) -> dict[str, Any]:
    """Geometric means: % of floor of cupygemm, and its speedup over each peer (shapes where both ran)."""
    groups = group_by_shape(rows)
    if peers is None:
        peers = [p for p in providers_in(rows) if p != "cupygemm"]
    ours = [sr.by_provider.get("cupygemm") for sr in groups]
    ok = [r for r in ours if r is not None and not row_failed(r)]
    out: dict[str, Any] = {
        "shapes": len(groups),
        "failed": sum(1 for r in ours if r is None or row_failed(r)),
        "pct_floor_geomean": geomean(r.get("pct_floor") for r in ok),
        "speedup_geomean": {},
    }
    for p in peers:
        vals = [speedup(sr.by_provider.get("cupygemm"), sr.by_provider.get(p)) for sr in groups]
        vals = [v for v in vals if v is not None]
        out["speedup_geomean"][p] = {"geomean": geomean(vals), "shapes": len(vals)}
    return out


def format_summary(rows: Sequence[dict[str, Any]], peers: Sequence[str] | None = None) -> str:
    s = summary(rows, peers)
    parts = [f"cupygemm: {_fmt(s['pct_floor_geomean'], '.0f')}% of the floor (geometric mean, "
             f"{s['shapes'] - s['failed']} shapes)"]
    for p, v in s["speedup_geomean"].items():
        if v["shapes"]:
            parts.append(f"{_fmt(v['geomean'], '.2f')}x vs {TITLES.get(p, p)} ({v['shapes']} shapes)")
    line = "; ".join(parts)
    if s["failed"]:
        line += f"\nFAILED: {s['failed']} of {s['shapes']} shapes (wrong results or errors)"
    else:
        line += "\nall cupygemm results checked: ok"
    return line


# ---- JSON -------------------------------------------------------------------------------------------------------------

def _json_safe(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (np.floating, np.integer)):
        return _json_safe(v.item())
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


def build_report(meta: dict[str, Any], rows: Sequence[dict[str, Any]], peers: Sequence[str] | None = None) -> dict[str, Any]:
    """The JSON document: ``meta`` (device, versions, command, date, copy bandwidth, ...), the providers, the rows
    and the summary. Non-finite numbers become null."""
    provs = ["cupygemm"] + list(peers if peers is not None else [p for p in providers_in(rows) if p != "cupygemm"])
    report = {"schema": SCHEMA, **meta,
              "providers": {p: PROVIDER_DESCRIPTIONS.get(p, p) for p in provs},
              "summary": summary(rows, [p for p in provs if p != "cupygemm"]),
              "ok": not any(row_failed(r) for r in rows if r["provider"] == "cupygemm"),
              "rows": list(rows)}
    return _json_safe(report)


def write_json(path: str | os.PathLike, report: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")


# ---- plot ---------------------------------------------------------------------------------------------------------------

def plot_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def write_plot(path: str | os.PathLike, rows: Sequence[dict[str, Any]], title: str = "") -> None:
    """Bar chart, one bar per provider and shape: time relative to cuBLAS block-scaled where it ran (lower is
    better), absolute TFLOPS for the other shapes (higher is better). Raises ImportError without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(MATPLOTLIB_HINT) from e

    groups = group_by_shape(rows)
    providers = providers_in(rows)

    def has_ref(sr: ShapeResult) -> bool:
        ref = sr.by_provider.get("cublas_block")
        return bool(ref and ref.get("us") and not ref.get("error"))

    panels = [(mode, gs) for mode, gs in (("relative", [g for g in groups if has_ref(g)]),
                                          ("tflops", [g for g in groups if not has_ref(g)])) if gs]
    if not panels:
        raise ValueError("write_plot: no rows to plot")
    def ran(p: str, sr: ShapeResult) -> bool:
        r = sr.by_provider.get(p)
        return bool(r and r.get("us") is not None and not r.get("error"))

    widest = max(len(gs) for _, gs in panels)
    fig = Figure(figsize=(max(8.0, 0.35 * widest * max(1, len(providers)) + 2), 4.8 * len(panels)))
    FigureCanvasAgg(fig)
    for i, (mode, gs) in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, i + 1)
        shown = [p for p in providers if any(ran(p, sr) for sr in gs)] or providers
        width = 0.8 / len(shown)
        for j, p in enumerate(shown):
            vals = []
            for sr in gs:
                r = sr.by_provider.get(p)
                if not ran(p, sr):
                    vals.append(math.nan)
                elif mode == "relative":
                    vals.append(r["us"] / sr.by_provider["cublas_block"]["us"])
                else:
                    vals.append(r.get("tflops") if r.get("tflops") is not None else math.nan)
            xs = [x + (j - (len(shown) - 1) / 2) * width for x in range(len(gs))]
            ax.bar(xs, vals, width, label=TITLES.get(p, p))
        ax.set_xticks(list(range(len(gs))))
        ax.set_xticklabels([f"{sr.kind} {sr.label}" for sr in gs], rotation=60, ha="right", fontsize=7)
        if mode == "relative":
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_ylabel("time / cuBLAS block-scaled\n(lower is better)")
        else:
            ax.set_ylabel("TFLOPS (higher is better)")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(str(path), dpi=120)


# ---- environment ------------------------------------------------------------------------------------------------------

def git_revision(pkg: Path | None = None) -> str | None:
    """``git rev-parse --short HEAD`` of the checkout this package (or ``pkg``) lives in, with ``-dirty`` appended
    when tracked files differ from that commit (the run measured something else); None outside a checkout."""
    pkg = Path(__file__).resolve().parent if pkg is None else Path(pkg).resolve()

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(pkg), *args], capture_output=True, text=True, timeout=10)

    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode != 0 or not top.stdout.strip():
            return None
        if Path(top.stdout.strip()).resolve() != pkg.parent:
            return None  # installed inside some other repository
        rev = git("rev-parse", "--short", "HEAD")
        if rev.returncode != 0 or not rev.stdout.strip():
            return None
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = status.returncode != 0 or bool(status.stdout.strip())
    return rev.stdout.strip() + ("-dirty" if dirty else "")


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run."""
    parts = ["cupygemm", "bench"]
    if getattr(args, "kinds", None):
        parts += ["--kinds", args.kinds]
    if getattr(args, "shapes", None):
        parts += ["--shapes", *args.shapes]
    parts += ["--peers", args.peers, "--iters", str(args.iters), "--seed", str(args.seed)]
    if getattr(args, "match_rows", None):
        parts += ["--match-rows", str(args.match_rows)]
    if getattr(args, "timing", "cupti") != "cupti":
        parts += ["--timing", args.timing]
    if getattr(args, "json", None):
        parts += ["--json", str(args.json)]
    if getattr(args, "markdown", False):
        parts.append("--markdown")
    if getattr(args, "plot", None):
        parts += ["--plot", str(args.plot)]
    return " ".join(parts)


def _cuda_version(v: int) -> str | None:
    return f"{v // 1000}.{v % 1000 // 10}" if v else None


def _nvidia_driver() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    for tok in text.split():
        parts = tok.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return tok
    return None


def environment(info: Any, args: argparse.Namespace, peers: dict[str, Any]) -> dict[str, Any]:
    """Device, driver and library versions, the command and the date (needs CuPy)."""
    import cupy

    import cupygemm

    try:
        from .jit.compiler import nvrtc_version

        nv = nvrtc_version()
        nvrtc = f"{nv[0]}.{nv[1]}"
    except Exception:
        nvrtc = None
    torch_mod = next((p.torch for p in peers.values() if getattr(p, "torch", None) is not None), None)
    dg = peers.get("deepgemm")
    return {
        "device": info.name,
        "compute_capability": f"{info.compute_capability[0]}.{info.compute_capability[1:]}",
        "num_sms": None,
        "driver": _nvidia_driver(),
        "cuda_driver": _cuda_version(cupy.cuda.runtime.driverGetVersion()),
        "cuda_runtime": _cuda_version(cupy.cuda.runtime.runtimeGetVersion()),
        "nvrtc": nvrtc,
        "cupy": cupy.__version__,
        "cupygemm": cupygemm.__version__,
        "torch": getattr(torch_mod, "__version__", None),
        "deep_gemm": getattr(getattr(dg, "module", None), "__version__", "unknown") if dg else None,
        "git_revision": git_revision(),
        "command": command_line(args),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "iters": args.iters,
        "seed": args.seed,
        "match_rows": getattr(args, "match_rows", None),
        "method": timing_method(False, FLUSH_BYTES),
    }


def timing_method(cupti: bool, flush_bytes: int) -> str:
    what = ("kernel time per call from CUPTI activity records (sum of the kernels the call launches)" if cupti
            else "CUDA events around each call on the current stream")
    return (f"{what}; before each call an untimed {flush_bytes >> 20} MiB memset flushes L2; us = median "
            "(p10/p90, min/max) over iters calls after one untimed call; floor = max(bytes / copy bandwidth, "
            "FLOPs / 1979 TFLOPS)")


# ---- GPU: inputs, providers, timing ------------------------------------------------------------------------------------

def make_inputs(shape: Shape, sizes: Sizes, seed: int) -> Inputs:
    """randn BF16 A and B on the GPU (seeded per shape), quantized 1x128 (A) and 128x128 (B, per group)."""
    import cupy

    from .layout import get_col_major_tma_aligned_tensor
    from .quantization import per_block_cast_to_fp8, per_token_cast_to_fp8
    from .tensors import BF16

    g, n, k = shape.groups, shape.n, shape.k
    kb = (k + 127) // 128
    if shape.kind == "normal":
        a_shape, b_shape = (shape.m, k), (n, k)
    elif shape.kind == "contiguous":
        a_shape, b_shape = (sizes.a_rows, k), (g, n, k)
    else:
        a_shape, b_shape = (g, sizes.a_rows, k), (g, n, k)
    rng = cupy.random.default_rng(shape_seed(shape, seed))
    x = bf16_bits(rng.standard_normal(a_shape, dtype=cupy.float32))
    y = bf16_bits(rng.standard_normal(b_shape, dtype=cupy.float32))
    a2, sfa2 = per_token_cast_to_fp8(x.reshape(-1, k).view(BF16))
    a, sfa = a2.reshape(a_shape), sfa2.reshape(a_shape[:-1] + (kb,))
    if len(b_shape) == 2:
        b, sfb = per_block_cast_to_fp8(y.view(BF16))
    else:
        parts = [per_block_cast_to_fp8(y[i].view(BF16)) for i in range(g)]
        b = cupy.stack([p[0] for p in parts])
        sfb = cupy.stack([p[1] for p in parts])
        del parts
    inp = Inputs(shape, sizes, a, sfa, get_col_major_tma_aligned_tensor(sfa), b, sfb, x, y)
    if shape.kind == "contiguous":
        inp.m_indices = cupy.asarray(contiguous_m_indices(sizes.group_rows))
    elif shape.kind == "masked":
        inp.masked_m = cupy.asarray(np.asarray(sizes.group_rows, dtype=np.int32))
    return inp


def _out_shape(inp: Inputs) -> tuple[int, ...]:
    return tuple(inp.a.shape[:-1]) + (inp.shape.n,)


def _poisoned(shape: tuple[int, ...]) -> Any:
    """A uint16 buffer of BF16 NaNs: rows a provider fails to write show up in the check."""
    import cupy

    return cupy.full(shape, 0xFFFF, dtype=cupy.uint16)


@dataclass
class Prepared:
    """A provider's ready-to-time call and an accessor of its result as uint16 BF16 bits viewed [rows, N]."""

    call: Callable[[], Any]
    output: Callable[[], Any]


def prepare_cupygemm(inp: Inputs) -> Prepared:
    import cupygemm

    from .tensors import BF16

    bits = _poisoned(_out_shape(inp))
    out = bits.view(BF16)
    lhs, rhs = (inp.a, inp.sfa_mn), (inp.b, inp.sfb)
    if inp.shape.kind == "normal":
        def call():
            cupygemm.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)
    elif inp.shape.kind == "contiguous":
        def call():
            cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(lhs, rhs, out, inp.m_indices)
    else:
        expected = inp.shape.m

        def call():
            cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked(lhs, rhs, out, inp.masked_m, expected)
    return Prepared(call, lambda: _rows2d(bits))


def torch_fp8(torch: Any, u8: Any) -> Any:
    """Zero-copy torch float8_e4m3fn view of a CuPy uint8 array."""
    return torch.from_dlpack(u8).view(torch.float8_e4m3fn)


def _cupy_bits(t: Any, torch: Any) -> Any:
    """Zero-copy CuPy uint16 view of a torch bfloat16 tensor."""
    import cupy

    return cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16)


class CublasBlockPeer:
    """cuBLASLt block-scaled FP8 via torch._scaled_mm (normal shapes only: no block-scaled grouped API)."""

    name = "cublas_block"

    def __init__(self, torch: Any):
        self.torch = torch

    def supports(self, shape: Shape) -> bool:
        return shape.kind == "normal"

    def prepare(self, inp: Inputs) -> Prepared:
        torch = self.torch
        a = torch_fp8(torch, inp.a)
        bt = torch_fp8(torch, inp.b).t()  # (K, N), column-major
        scale_a = torch.from_dlpack(inp.sfa).t().contiguous().t()  # (M, K/128), strides (1, M)
        scale_b = torch.from_dlpack(inp.sfb).t()  # (K/128, N/128): the weight scales transposed
        holder: dict[str, Any] = {}

        def call():
            r = torch._scaled_mm(a, bt, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
            holder["out"] = r[0] if isinstance(r, tuple) else r

        return Prepared(call, lambda: _rows2d(_cupy_bits(holder["out"], torch)))


class DeepGemmPeer:
    """DeepGEMM's 03d0be3 Python API on torch views of the same data."""

    name = "deepgemm"
    _FUNCS = {"normal": "gemm_fp8_fp8_bf16_nt", "contiguous": "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
              "masked": "m_grouped_gemm_fp8_fp8_bf16_nt_masked"}

    def __init__(self, torch: Any, module: Any):
        self.torch, self.module = torch, module

    def supports(self, shape: Shape) -> bool:
        return hasattr(self.module, self._FUNCS[shape.kind])

    def prepare(self, inp: Inputs) -> Prepared:
        import cupy

        torch = self.torch
        fn = getattr(self.module, self._FUNCS[inp.shape.kind])
        lhs = (torch_fp8(torch, inp.a), torch.from_dlpack(inp.sfa_mn))
        rhs = (torch_fp8(torch, inp.b), torch.from_dlpack(inp.sfb))
        bits = _poisoned(_out_shape(inp))
        out = torch.from_dlpack(bits.view(cupy.int16)).view(torch.bfloat16)
        if inp.shape.kind == "normal":
            def call():
                fn(lhs, rhs, out)
        elif inp.shape.kind == "contiguous":
            idx = torch.from_dlpack(inp.m_indices)

            def call():
                fn(lhs, rhs, out, idx)
        else:
            mm, expected = torch.from_dlpack(inp.masked_m), inp.shape.m

            def call():
                fn(lhs, rhs, out, mm, expected)
        return Prepared(call, lambda: _rows2d(bits))


def parse_peers(text: str) -> tuple[list[str], bool]:
    """'auto' -> (all peers, optional); 'none' -> ([], False); 'cublas,deepgemm' -> (those, required)."""
    t = text.strip().lower()
    if t == "auto":
        return list(PEERS), False
    if t in ("none", ""):
        return [], False
    names = []
    for tok in t.split(","):
        tok = tok.strip()
        if tok not in _PEER_ALIASES:
            raise BenchUsageError(f"--peers: unknown peer {tok!r}; expected auto, none or a list of cublas, deepgemm")
        if _PEER_ALIASES[tok] not in names:
            names.append(_PEER_ALIASES[tok])
    return names, True


def _import_torch() -> tuple[Any, str | None]:
    """torch as an optional benchmark peer (cuBLAS block-scaled): only when installed, never a dependency."""
    try:
        torch = importlib.import_module("torch")
    except Exception as e:  # ImportError, or a broken install
        return None, f"torch is not importable ({type(e).__name__}: {e})"
    if not torch.cuda.is_available():
        return None, "torch has no CUDA device"
    if not hasattr(torch, "float8_e4m3fn"):
        return None, f"torch {torch.__version__} has no float8_e4m3fn"
    return torch, None


def load_peers(names: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """The peers that can run here, and a note for each one that cannot."""
    peers: dict[str, Any] = {}
    notes: list[str] = []
    if not names:
        return peers, notes
    torch, why = _import_torch()
    for name in names:
        if torch is None:
            notes.append(f"{TITLES[name]}: not run ({why})")
        elif name == "cublas_block":
            if hasattr(torch, "_scaled_mm"):
                peers[name] = CublasBlockPeer(torch)
            else:
                notes.append(f"{TITLES[name]}: not run (torch {torch.__version__} has no _scaled_mm)")
        elif name == "deepgemm":
            try:
                import deep_gemm
            except Exception as e:
                notes.append(f"{TITLES[name]}: not run (import deep_gemm failed: {type(e).__name__}: {e})")
                continue
            if not hasattr(deep_gemm, "gemm_fp8_fp8_bf16_nt"):
                notes.append(f"{TITLES[name]}: not run (deep_gemm has no gemm_fp8_fp8_bf16_nt: not the 03d0be3 API)")
                continue
            peers[name] = DeepGemmPeer(torch, deep_gemm)
    return peers, notes


class Timer:
    """Times calls after flushing L2 (untimed memset) before each: kernel time from CUPTI records when a
    :class:`~cupygemm.kernel_timer.KernelTimer` is given (what profilers report), else CUDA events."""

    def __init__(self, flush_bytes: int = FLUSH_BYTES, kernel_timer: Any = None):
        import cupy

        self.flush_buf = cupy.empty(flush_bytes, dtype=cupy.uint8)
        self.kernel_timer = kernel_timer

    def flush(self) -> None:
        self.flush_buf.data.memset_async(0, self.flush_buf.nbytes)

    def time(self, call: Callable[[], Any], iters: int) -> list[float]:
        """Per-call times in microseconds."""
        import cupy

        stream = cupy.cuda.get_current_stream()
        if self.kernel_timer is not None:
            return self.kernel_timer.time(call, iters, before=self.flush, sync=stream.synchronize)
        return self.time_events(call, iters)

    def time_events(self, call: Callable[[], Any], iters: int) -> list[float]:
        """Event-timed microseconds. A few flushes first give the host a head start, so Python launch overhead
        hides behind the flushes instead of showing between the events."""
        import cupy

        stream = cupy.cuda.get_current_stream()
        starts = [cupy.cuda.Event() for _ in range(iters)]
        ends = [cupy.cuda.Event() for _ in range(iters)]
        for _ in range(3):
            self.flush()
        for s, e in zip(starts, ends):
            self.flush()
            s.record(stream)
            call()
            e.record(stream)
        ends[-1].synchronize()
        return [cupy.cuda.get_elapsed_time(s, e) * 1e3 for s, e in zip(starts, ends)]


_NOOP_NAME = "cupygemm_bench_noop"


def _noop_call() -> Callable[[], None]:
    """A call launching one empty kernel (compiled and run once here): the probe for timing overheads."""
    import cupy

    noop = cupy.RawKernel(f'extern "C" __global__ void {_NOOP_NAME}() {{}}', _NOOP_NAME)

    def call():
        noop((1,), (32,), ())

    call()
    cupy.cuda.get_current_stream().synchronize()
    return call


def open_cupti_timer(backend: str = "ctypes") -> tuple[Any, str]:
    """A CUPTI kernel timer (``backend``: see kernel_timer.open_kernel_timer) checked on an empty kernel, or None
    and why not."""
    import cupy

    from .kernel_timer import open_kernel_timer

    return open_kernel_timer(_noop_call(), _NOOP_NAME, cupy.cuda.get_current_stream().synchronize, backend)


def measure_copy_bandwidth(nbytes: int = COPY_BYTES, reps: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted), best of ``reps`` after a warm copy."""
    import cupy

    src = cupy.empty(nbytes, dtype=cupy.uint8)
    dst = cupy.empty(nbytes, dtype=cupy.uint8)
    src.data.memset_async(1, nbytes)
    stream = cupy.cuda.get_current_stream()
    best = math.inf
    for i in range(reps + 1):
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record(stream)
        dst.data.copy_from_device_async(src.data, nbytes)
        e.record(stream)
        e.synchronize()
        if i:
            best = min(best, cupy.cuda.get_elapsed_time(s, e) * 1e-3)
    del src, dst
    cupy.get_default_memory_pool().free_all_blocks()
    return 2 * nbytes / best


def measure_event_overhead(timer: Timer, iters: int = 50) -> float | None:
    """Median event-timed microseconds of an empty kernel, measured like the GEMMs (flush, events): what event
    timing adds to a kernel's own time (profilers, which the published peer tables use, do not count it)."""
    try:
        call = _noop_call()
        return summarize_times(timer.time_events(call, iters))["us"]
    except Exception:
        return None


def _err(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


def _progress(text: str) -> None:
    print(f"[cupygemm] {text}", file=sys.stderr, flush=True)


def run_provider(name: str, prepare: Callable[[Inputs], Prepared], inp: Inputs, timer: Timer,
                 iters: int) -> tuple[Prepared | None, dict[str, float] | None, str | None]:
    """Prepare, call once untimed (loads modules, JIT), synchronize, then time ``iters`` calls."""
    import cupy

    try:
        prep = prepare(inp)
        prep.call()
        cupy.cuda.get_current_stream().synchronize()
        times = timer.time(prep.call, iters)
    except Exception as e:
        try:
            cupy.cuda.get_current_stream().synchronize()
        except Exception:
            pass
        return None, None, _err(e)
    return prep, summarize_times(times), None


def bench_shape(shape: Shape, sizes: Sizes, seed: int, iters: int, timer: Timer, copy_bw: float,
                config: str | None, peers: dict[str, Any]) -> list[dict[str, Any]]:
    """All providers on one shape: inputs, timing, checks. Returns one row per provider that applies."""
    flops, nbytes = work(shape, sizes)
    floor = floor_us(flops, nbytes, copy_bw)
    try:
        inp = make_inputs(shape, sizes, seed)
    except Exception as e:
        return [make_row(shape, sizes, "cupygemm", None, flops, nbytes, floor, config, error=f"inputs: {_err(e)}")]
    runners: list[tuple[str, Callable[[Inputs], Prepared]]] = [("cupygemm", prepare_cupygemm)]
    runners += [(name, p.prepare) for name, p in peers.items() if p.supports(shape)]
    results = []
    for name, prepare in runners:
        prep, stats, error = run_provider(name, prepare, inp, timer, iters)
        results.append((name, prep, stats, error))
    rows, ref = [], None
    sel_rows, sel_groups = check_rows(shape, sizes, CHECK_ROWS, seed)
    for name, prep, stats, error in results:
        check = None
        if prep is not None:
            try:
                if ref is None:
                    ref = reference_rows(inp, sel_rows, sel_groups)
                check = compare(output_rows(prep.output(), sel_rows), *ref)
            except Exception as e:
                error = f"check: {_err(e)}"
        rows.append(make_row(shape, sizes, name, stats, flops, nbytes, floor,
                             config if name == "cupygemm" else None, check, error))
    return rows


def _precompile(shapes: Sequence[Shape], sizes: dict[Shape, Sizes], num_sms: int, smem_limit: int,
                jobs: int) -> dict[Shape, str]:
    """Pick every shape's config and compile them all in parallel; returns the configs' descriptions."""
    from .cli import compile_all

    cfgs, described = [], {}
    for s in shapes:
        cfg = shape_config(s, sizes[s], num_sms, smem_limit)
        cfgs.append(cfg)
        described[s] = cfg.describe()
    n = len(set(cfgs))
    _progress(f"compiling {n} kernel{'s' if n != 1 else ''} for {len(shapes)} shapes with {jobs} jobs")
    try:
        compile_all(cfgs, jobs)
    except Exception as e:  # the failing shapes fail again at their first call and are reported there
        _progress(f"pre-compilation failed: {_err(e)}")
    return described


def _stream_context(peers: dict[str, Any]) -> contextlib.ExitStack:
    """Run CuPy and torch on the legacy default stream of CuPy's current device, so events order everything."""
    import cupy

    stack = contextlib.ExitStack()
    stack.enter_context(cupy.cuda.Stream.null)
    torch_mod = next((p.torch for p in peers.values() if getattr(p, "torch", None) is not None), None)
    if torch_mod is not None:
        dev = cupy.cuda.runtime.getDevice()
        stack.enter_context(torch_mod.cuda.device(dev))
        stack.enter_context(torch_mod.cuda.stream(torch_mod.cuda.default_stream(dev)))
    return stack


def _print_header(meta: dict[str, Any], peers: dict[str, Any], notes: Sequence[str]) -> None:
    print(f"device: {meta['device']} (compute capability {meta['compute_capability']}, {meta['num_sms']} SMs); "
          f"compare published numbers only with the same device")
    versions = [f"cupygemm {meta['cupygemm']}" + (f" ({meta['git_revision']})" if meta["git_revision"] else ""),
                f"CuPy {meta['cupy']}", f"CUDA runtime {meta['cuda_runtime']}", f"NVRTC {meta['nvrtc']}",
                f"driver {meta['driver'] or meta['cuda_driver']}"]
    if meta.get("torch"):
        versions.append(f"torch {meta['torch']}")
    if meta.get("deep_gemm"):
        versions.append(f"deep_gemm {meta['deep_gemm']}")
    print(", ".join(versions))
    print(f"peers: {', '.join(TITLES[p] for p in peers) or 'none'}")
    for n in notes:
        print(f"  {n}")


def shape_sizes(shapes: Sequence[Shape], seed: int, match_rows: str | None) -> dict[Shape, Sizes]:
    """Each shape's rows; with ``match_rows`` (a peer table) grouped shapes get the valid-row totals it measured."""
    targets: dict[tuple[str, tuple[int, ...]], int] = {}
    if match_rows:
        try:
            targets = peer_valid_rows(match_rows)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise BenchUsageError(f"--match-rows: cannot read a peer table from {match_rows!r}: {e}") from None
    out = {}
    for s in shapes:
        try:
            out[s] = make_sizes(s, seed, targets.get((s.kind, tuple(s.dims))))
        except ValueError as e:
            raise BenchUsageError(f"--match-rows: {s.kind} {s.label}: {e}") from None
    return out


def run_bench(args: argparse.Namespace) -> int:
    """The ``cupygemm bench`` command; returns the exit code (0 ok, 1 a cupygemm result failed, 2 usage/setup)."""
    try:
        shapes = select_shapes(parse_kinds(args.kinds), parse_shape_texts(args.shapes))
        peer_names, peers_required = parse_peers(args.peers)
        if args.iters < 1:
            raise BenchUsageError("--iters must be at least 1")
        if args.seed < 0:
            raise BenchUsageError("--seed must be non-negative")
        sizes = shape_sizes(shapes, args.seed, args.match_rows)
    except BenchUsageError as e:
        print(f"cupygemm bench: {e}", file=sys.stderr)
        return 2
    if args.plot and not plot_available():
        print(f"cupygemm bench: {MATPLOTLIB_HINT}", file=sys.stderr)
        return 2
    try:
        __import__("cupy")
    except ImportError:
        print("cupygemm bench: CuPy is not installed: pip install 'cupygemm[cuda12]' (or '[cuda13]')", file=sys.stderr)
        return 2
    from .device import get_num_sms, gpu_available, require_hopper
    from .errors import CupygemmDeviceError

    if not gpu_available():
        print("cupygemm bench: no CUDA GPU visible", file=sys.stderr)
        return 2
    try:
        info = require_hopper()
    except CupygemmDeviceError as e:
        print(f"cupygemm bench: {e}", file=sys.stderr)
        return 2
    peers, notes = load_peers(peer_names)
    if peers_required and len(peers) < len(peer_names):
        print("cupygemm bench: a requested peer cannot run:\n  " + "\n  ".join(notes), file=sys.stderr)
        return 2
    meta = environment(info, args, peers)
    num_sms = get_num_sms()
    meta["num_sms"] = num_sms
    with _stream_context(peers):
        return _run(args, shapes, sizes, peers, notes, meta, info, num_sms)


def _run(args: argparse.Namespace, shapes: Sequence[Shape], sizes: dict[Shape, Sizes], peers: dict[str, Any],
         notes: Sequence[str], meta: dict[str, Any], info: Any, num_sms: int) -> int:
    import cupy

    _print_header(meta, peers, notes)
    configs = _precompile(shapes, sizes, num_sms, info.max_smem_per_block, args.jobs)
    copy_bw = measure_copy_bandwidth()
    meta["copy_gbs"] = copy_bw / 1e9
    meta["flush_bytes"] = max(FLUSH_BYTES, 2 * info.l2_bytes)
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s (device-to-device, read + write); "
          f"floor = max(bytes / copy bandwidth, FLOPs / {FP8_DENSE_FLOPS / 1e12:.0f} TFLOPS)")
    kernel_timer, why = ((None, "--timing events") if args.timing == "events"
                         else open_cupti_timer("python" if args.timing == "cupti-python" else "ctypes"))
    timer = Timer(meta["flush_bytes"], kernel_timer)
    meta["timing"] = f"cupti ({why})" if kernel_timer is not None else "events"
    meta["method"] = timing_method(kernel_timer is not None, meta["flush_bytes"])
    meta["event_overhead_us"] = measure_event_overhead(timer)
    if kernel_timer is not None:
        print(f"timing: kernel time from CUPTI activity records ({why}), as the peer tables' profiler reports it")
    else:
        print(f"timing: CUDA events ({why}); an empty kernel measures {meta['event_overhead_us'] or 0:.2f} us, "
              "included in every time below (profiler-based tables do not count it)")
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    for i, shape in enumerate(shapes):
        shape_rows = bench_shape(shape, sizes[shape], args.seed, args.iters, timer, copy_bw, configs.get(shape),
                                 peers)
        rows += shape_rows
        done = ", ".join(f"{TITLES.get(r['provider'], r['provider'])} "
                         f"{'error' if r.get('error') else _fmt_us(r.get('us')) + ' us'}"
                         f"{' FAIL' if r.get('check') == 'FAIL' and not r.get('error') else ''}" for r in shape_rows)
        _progress(f"{i + 1}/{len(shapes)} {shape.kind} {shape.label}: {done} ({time.time() - t0:.0f}s)")
        cupy.get_default_memory_pool().free_all_blocks()
    peer_cols = list(peers)
    print()
    print(format_table(rows, peer_cols))
    print()
    for block in (format_configs(rows), format_notes(rows), format_summary(rows, peer_cols)):
        if block:
            print(block)
    if args.markdown:
        print()
        print(format_markdown(rows, peer_cols))
    report = build_report(meta, rows, peer_cols)
    if args.json:
        write_json(args.json, report)
        print(f"wrote {args.json}")
    if args.plot:
        write_plot(args.plot, rows, title=f"cupygemm bench, {meta['device']}")
        print(f"wrote {args.plot}")
    return 0 if report["ok"] else 1


# ---- argparse ---------------------------------------------------------------------------------------------------------

def _int_at_least(lowest: int, what: str):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {what} integer, got {text!r}") from None
        if v < lowest:
            raise argparse.ArgumentTypeError(f"expected a {what} integer, got {v}")
        return v

    return parse


_positive_int = _int_at_least(1, "positive")
_non_negative_int = _int_at_least(0, "non-negative")


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``cupygemm bench`` on the CLI's subparsers."""
    p = subparsers.add_parser(
        "bench",
        help="time cupygemm (and cuBLAS block-scaled / DeepGEMM when importable) on the seed shapes",
        description=(
            "Benchmark cupygemm on the 28 seed shapes (18 normal, 4 contiguous, 6 masked) or on --shapes. "
            "Kernels are compiled first (in parallel); each call is timed after an untimed 1 GiB L2 flush, "
            "as kernel time from CUPTI activity records (the profiler's view, as in the peer tables; CUDA events "
            "when CUPTI is missing or with --timing events); every result is checked against a float64 "
            "reference on sampled rows. Peers run "
            "in the same process when importable: cuBLASLt block-scaled FP8 via torch._scaled_mm (normal "
            "shapes) and DeepGEMM (03d0be3 API). Exit code: 0 all cupygemm results correct, 1 a result was "
            "wrong or a call failed, 2 usage or setup error."),
    )
    p.add_argument("--kinds", default=None, metavar="LIST",
                   help="comma-separated kinds to run: normal,contiguous,masked (default: all)")
    p.add_argument("--shapes", nargs="+", default=None, metavar="SHAPE",
                   help="shapes instead of the seed list: MxNxK (normal) or GxMxNxK (grouped; M = expected "
                        "rows per group; needs --kinds naming one grouped kind); space- or comma-separated")
    p.add_argument("--json", default=None, metavar="FILE", help="write the results as JSON to FILE")
    p.add_argument("--markdown", action="store_true", help="also print the table as markdown")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="write a bar chart (needs matplotlib: pip install 'cupygemm[bench]')")
    p.add_argument("--peers", default="auto", metavar="auto|none|LIST",
                   help="peers to time in the same run: auto (those importable), none, or a list of "
                        "cublas,deepgemm (then required); default: %(default)s")
    p.add_argument("--iters", type=_positive_int, default=DEFAULT_ITERS, help="timed calls per shape and provider (default: %(default)s)")
    p.add_argument("--seed", type=_non_negative_int, default=0, help="seed of the inputs and the group sizes (default: %(default)s)")
    p.add_argument("--match-rows", default=None, metavar="PEERS.json",
                   help="grouped shapes: draw group sizes that sum to the valid rows the peer table measured "
                        "(e.g. benchmarks/peers/h200-2026-11-21.json in the source tree), so both runs do the same work")
    p.add_argument("--timing", choices=("cupti", "cupti-python", "events"), default="cupti",
                   help="cupti: kernel time from CUPTI activity records, falling back to events when libcupti "
                        "is missing (CUPYGEMM_CUPTI names the library); cupti-python: the same records through "
                        "NVIDIA's cupti-python package (pip install cupti-python); events: CUDA events around each "
                        "call (default: %(default)s)")
    p.add_argument("--jobs", type=_positive_int, default=os.cpu_count() or 1, help="parallel kernel compilations (default: the CPU count, %(default)s here)")
    p.set_defaults(func=run_bench)
    return p
