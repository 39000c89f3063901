"""The bench's code for the 1D1D kernel's kinds, the weight gradients: wgrad and k_grouped_wgrad.

Cases are DeepGEMM 03d0be3 test_core's (``GemmKind.seed_shapes``): wgrad MxNxK (K = tokens), k-grouped GxMxNxK with
K the base tokens per group; the groups' K are drawn as test_core draws them (:func:`draw_k_sizes`, seeded per
shape). Operands: randn BF16 x [M, k] and y [N, k] per group, both quantized 1x128 along K by
:func:`cupygemm.per_token_cast_to_fp8`; the scales go to cupygemm in a form it uses in place and to DeepGEMM in its
fastest form, the transposed stack (kb, M) / (kb, N) contiguous (no per-call transposes); ``out`` starts at a
residual (randn x 10) and accumulates: every timed call adds into it. The k-grouped layout operand is an int32
device array for cupygemm (its graph-capturable form) and a Python list for DeepGEMM (the only form it takes).

Checks run after the timing, from the residual: ``out - residual`` against the FP32 product of the unquantized
inputs (``calc_diff`` < 1e-3, the worst group), against the FP32 product of the dequantized FP8 inputs (relative
Frobenius error < 1e-2), and two calls from the residual give the same bits (required of cupygemm; recorded for
the peers). Registered in :mod:`cupygemm.bench.kinds` for the family ``1d1d``.

The array code takes NumPy or CuPy arrays alike (the CPU tests run it on NumPy with the reference casts).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..kinds import ONE_D_ONE_D, GemmKind
from ..kinds.training import K_ALIGN
from ..util import ceil_div
from . import providers
from .cases import BenchUsageError, Shape, Sizes, shape_seed
from .checks import CALC_DIFF_TOL, REL_ERR_TOL
from .inputs import bf16_bits
from .kinds import BenchKind, register

#: test_core's spread of the groups' K: base_k + 128 x randint(-1, 1) for all groups but the last.
K_STEP = 128
#: The residual ``out`` starts from: randn x 10, as test_core's wgrad test.
RESIDUAL_SCALE = 10.0


def draw_k_sizes(groups: int, base_k: int, rng: np.random.Generator) -> list[int]:
    """test_core's group sizes along K: ``base_k + 128 x randint(-1, 1)`` (-1, 0 or +1, uniformly) for the first
    G - 1 groups, and the last takes the rest, so they sum to G x base_k (the last may thus lie up to
    128 x (G - 1) from base_k)."""
    steps = rng.integers(-1, 2, size=groups - 1)
    ks = [base_k + K_STEP * int(s) for s in steps]
    ks.append(base_k * groups - sum(ks))
    return ks


def make_sizes(shape: Shape, seed: int, valid_rows: int | None = None, full_groups: bool = False) -> Sizes:
    """wgrad: one group of M rows and K tokens. k-grouped: G groups of M rows, each with its own K drawn by
    :func:`draw_k_sizes` (seeded by shape and seed). ``valid_rows`` and ``full_groups`` do not apply."""
    if "G" not in shape.descriptor.shape_dims:
        return Sizes((shape.m,), shape.m)
    ks = draw_k_sizes(shape.groups, shape.k, np.random.default_rng(shape_seed(shape, seed)))
    return Sizes((shape.m,) * shape.groups, shape.m, tuple(ks))


def k_sizes(shape: Shape, sizes: Sizes) -> tuple[int, ...]:
    """Each group's K (wgrad: (K,))."""
    return tuple(sizes.group_k) if sizes.group_k else (shape.k,)


def work(shape: Shape, sizes: Sizes) -> tuple[int, int]:
    """(FLOPs, bytes) of one call: 2 M N sum(k) and (M + N) sum(k) + 8 M N G: FP8 A and B once, the FP32 out read
    and written once per group (scales not counted, as for the forward kinds)."""
    ks = k_sizes(shape, sizes)
    m, n, total = shape.m, shape.n, sum(ks)
    return 2 * m * n * total, (m + n) * total + 8 * m * n * len(ks)


def _xp(arr: Any) -> Any:
    """The array module of ``arr`` (NumPy or CuPy)."""
    if isinstance(arr, np.ndarray):
        return np
    import cupy

    return cupy.get_array_module(arr)


def _sync(xp: Any) -> None:
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


@dataclass
class TrainingInputs:
    """One weight-gradient shape's operands (CuPy on the GPU; NumPy in the CPU tests)."""

    shape: Shape
    sizes: Sizes
    a: Any  # uint8 e4m3 bits: [M, K] (wgrad; k-grouped columns: the groups' columns side by side) or flat
    # (k-grouped: the groups' [M, k_g] back to back)
    b: Any  # likewise with N
    sfa_t: Any  # float32 [sum_g ceil(k_g/128), M] C-contiguous: the groups' 1x128 scales stacked transposed
    sfb_t: Any  # float32 [sum_g ceil(k_g/128), N]
    x: Any  # uint16 BF16 bits of the unquantized A (shape of a)
    y: Any  # uint16 BF16 bits of the unquantized B (shape of b)
    residual: Any  # float32 [M, N] / [G, M, N]: what out holds before the first call
    batch_sizes: Any = None  # int32 [G] on the device (k-grouped)

    @property
    def k_sizes(self) -> tuple[int, ...]:
        return k_sizes(self.shape, self.sizes)

    def groups(self) -> list[dict[str, Any]]:
        """Per group: views of its A [M, k], B [N, k], their scales [M, kb] / [N, kb] (views of the stacks), x, y."""
        m, n = self.shape.m, self.shape.n
        columns = self.a.ndim == 2
        a, b, x, y = (v if columns else v.reshape(-1) for v in (self.a, self.b, self.x, self.y))
        out, off, kb_off = [], 0, 0
        for k in self.k_sizes:
            kb = ceil_div(k, 128)
            if columns:
                ga, gb, gx, gy = (v[:, off:off + k] for v in (a, b, x, y))
            else:
                ra, rb = slice(m * off, m * (off + k)), slice(n * off, n * (off + k))
                ga, gb, gx, gy = a[ra].reshape(m, k), b[rb].reshape(n, k), x[ra].reshape(m, k), y[rb].reshape(n, k)
            out.append({"k": k, "a": ga, "b": gb, "sfa": self.sfa_t[kb_off:kb_off + kb].T,
                        "sfb": self.sfb_t[kb_off:kb_off + kb].T, "x": gx, "y": gy})
            off += k
            kb_off += kb
        return out


def build_inputs(shape: Shape, sizes: Sizes, xp: Any, rng: Any,
                 cast: Callable[[Any], tuple[Any, Any]]) -> TrainingInputs:
    """The operands drawn from ``rng`` (x, then y, then the residual) with array module ``xp``, quantized per group
    by ``cast`` (``per_token_cast_to_fp8``: [R, k] BF16 -> uint8 [R, k], float32 [R, ceil(k/128)])."""
    from ..tensors import BF16

    kind = shape.descriptor
    m, n = shape.m, shape.n
    ks = k_sizes(shape, sizes)
    total, kb_total = sum(ks), sum(ceil_div(k, 128) for k in ks)
    x = bf16_bits(rng.standard_normal((m * total,), dtype=xp.float32))
    y = bf16_bits(rng.standard_normal((n * total,), dtype=xp.float32))
    out_shape = (m, n) if "G" not in kind.out_dims else (len(ks), m, n)
    residual = rng.standard_normal(out_shape, dtype=xp.float32) * xp.float32(RESIDUAL_SCALE)
    if not kind.accumulates:  # a storing kind computes A B^T alone: the checks read out - residual
        residual[...] = 0
    a, b = xp.empty(m * total, dtype=xp.uint8), xp.empty(n * total, dtype=xp.uint8)
    sfa_t, sfb_t = xp.empty((kb_total, m), dtype=xp.float32), xp.empty((kb_total, n), dtype=xp.float32)
    off = kb_off = 0
    for k in ks:
        kb = ceil_div(k, 128)
        for src, q_dst, s_dst, rows in ((x, a, sfa_t, m), (y, b, sfb_t, n)):
            q, s = cast(src[rows * off:rows * (off + k)].reshape(rows, k).view(BF16))
            q_dst[rows * off:rows * (off + k)] = q.reshape(-1)
            s_dst[kb_off:kb_off + kb] = s.T
        off += k
        kb_off += kb
    if "F" not in kind.a_dims:  # A [M, K], B [N, K]; k-grouped columns: group g's block is its columns
        cols = []
        for flat, rows in ((a, m), (x, m), (b, n), (y, n)):
            blocks, off = [], 0
            for k in ks:
                blocks.append(flat[rows * off:rows * (off + k)].reshape(rows, k))
                off += k
            cols.append(blocks[0] if len(blocks) == 1 else xp.concatenate(blocks, axis=1))
        a, x, b, y = cols
    inp = TrainingInputs(shape, sizes, a, b, sfa_t, sfb_t, x, y, residual)
    if kind.layout:
        inp.batch_sizes = xp.asarray(np.asarray(ks, dtype=np.int32))
    return inp


def make_inputs(shape: Shape, sizes: Sizes, seed: int) -> TrainingInputs:
    """The operands on the GPU, seeded per shape, quantized by cupygemm's cast."""
    import cupy

    from ..quantization import per_token_cast_to_fp8

    return build_inputs(shape, sizes, cupy, cupy.random.default_rng(shape_seed(shape, seed)), per_token_cast_to_fp8)


def cupygemm_operands(inp: TrainingInputs) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """(A, SFA), (B, SFB) as cupygemm uses them in place: k-grouped takes the stacks; wgrad the [M, kb] M-major
    view of the stack (strides (1, M): TMA-aligned since M % 4 == 0), which reads unambiguously even when M equals
    ceil(K/128) (a [kb, M] array then has the shape of an [M, kb] one)."""
    if "F" in inp.shape.descriptor.a_dims:
        return (inp.a, inp.sfa_t), (inp.b, inp.sfb_t)
    return (inp.a, inp.sfa_t.T), (inp.b, inp.sfb_t.T)


# ---- checks ------------------------------------------------------------------------------------------------------

def calc_diff(x: Any, y: Any) -> float:
    """:func:`cupygemm.reference.calc_diff` on the arrays' own device (float64 sums), for outputs too large to copy
    to the host."""
    xp = _xp(x)
    x, y = x.astype(xp.float64), y.astype(xp.float64)
    denominator = float((x * x + y * y).sum())
    if denominator == 0.0:
        return 0.0
    return float(1.0 - 2.0 * float((x * y).sum()) / denominator)


def _e4m3_table(xp: Any) -> Any:
    from ..reference import fp8_to_float32

    return xp.asarray(fp8_to_float32(np.arange(256, dtype=np.uint8)))


def dequantize(q: Any, s: Any, table: Any) -> Any:
    """float32 values of e4m3 bits ``q`` [R, k] with 1x128 scales ``s`` [R, ceil(k/128)] (any layout)."""
    xp = _xp(q)
    k = q.shape[1]
    return table[q.astype(xp.int32)] * xp.repeat(s, 128, axis=1)[:, :k]


def bf16_to_f32(bits: Any) -> Any:
    """uint16 BF16 bits -> float32 (exact), on the array's device."""
    xp = _xp(bits)
    return (bits.astype(xp.uint32) << xp.uint32(16)).view(xp.float32)


def references(inp: TrainingInputs) -> tuple[list[Any], list[Any]]:
    """Per group, float32 [M, N]: the product of the unquantized BF16 inputs x_g y_g^T, and the product of the
    dequantized FP8 inputs (both FP32 GEMMs of the array module: cuBLAS on the GPU)."""
    xp = _xp(inp.residual)
    table = _e4m3_table(xp)
    ref_x, ref_q = [], []
    for g in inp.groups():
        ref_x.append(bf16_to_f32(g["x"]) @ bf16_to_f32(g["y"]).T)
        ref_q.append(dequantize(g["a"], g["sfa"], table) @ dequantize(g["b"], g["sfb"], table).T)
    return ref_x, ref_q


def compare(out: Any, residual: Any, ref_x: Sequence[Any], ref_q: Sequence[Any]) -> dict[str, Any]:
    """Check ``out - residual`` per group: finite, calc_diff against the unquantized product < 1e-3 (the worst group
    counts) and relative Frobenius error against the dequantized product < 1e-2 (over all groups). Returns
    {check, rel_err, calc_diff, calc_diff_groups}."""
    xp = _xp(out)
    g = len(ref_x)
    outs, res = out.reshape((g,) + tuple(ref_x[0].shape)), residual.reshape((g,) + tuple(ref_x[0].shape))
    finite, diffs, num, den = True, [], 0.0, 0.0
    for i in range(g):
        d = outs[i].astype(xp.float64) - res[i].astype(xp.float64)
        if not bool(xp.isfinite(d).all()):
            finite = False
            break
        diffs.append(calc_diff(d, ref_x[i]))
        q = ref_q[i].astype(xp.float64)
        num += float(((d - q) ** 2).sum())
        den += float((q * q).sum())
    if not finite:
        return {"check": "FAIL", "rel_err": math.nan, "calc_diff": math.nan, "calc_diff_groups": None}
    rel = math.sqrt(num / den) if den > 0 else math.sqrt(num)
    diff = max(diffs)
    ok = rel < REL_ERR_TOL and diff < CALC_DIFF_TOL
    return {"check": "ok" if ok else "FAIL", "rel_err": rel, "calc_diff": diff,
            "calc_diff_groups": diffs if g > 1 else None}


def same_bits(x: Any, y: Any) -> bool:
    """Whether two float32 arrays hold identical bits."""
    xp = _xp(x)
    return bool(xp.array_equal(x.view(xp.uint32), y.view(xp.uint32)))


# ---- the BenchKind -----------------------------------------------------------------------------------------------

NOTES = (
    "time: per call, the sum of the durations of every kernel the call launches (CUPTI; with --timing events, the "
    "events around the call): DeepGEMM 03d0be3's k-grouped call is one launch per group (G kernels, the gaps "
    "between them not counted by CUPTI), cupygemm's one call whatever kernels it launches (e.g. a small prep kernel "
    "and the GEMM): the columns compare the total time per grouped call",
    "work: FLOPs = 2 M N sum(k); bytes = (M + N) sum(k) (FP8 A and B) + 8 M N per group (the FP32 out read and "
    "written), scales not counted; TFLOPS = FLOPs / time; floor = max(bytes / copy bandwidth, FLOPs / 1979 TFLOPS)",
    "operands: randn BF16 x [M, k], y [N, k] per group, quantized 1x128 along K (per_token_cast_to_fp8); scales to "
    "cupygemm in place (wgrad: [M, kb] M-major, k-grouped: the [sum kb, M] stack), to DeepGEMM as (kb, M) "
    "contiguous (its fastest form); out starts at residual = randn x 10 and every timed call adds into it; "
    "k-grouped sizes: an int32 device array for cupygemm, a Python list for DeepGEMM",
    "checks: out - residual after one call from the residual, against the FP32 product of the unquantized BF16 "
    f"inputs (calc_diff < {CALC_DIFF_TOL:g}, the worst group) and of the dequantized FP8 inputs (rel_err < "
    f"{REL_ERR_TOL:g}); cupygemm must give the same bits twice (repeatable)",
    "cuBLAS-block: no column (cuBLASLt has no 1x128 x 1x128 FP32-accumulating recipe here)",
)


class TrainingBench(BenchKind):
    title = "weight-gradient kinds (1D1D kernel: A and B scaled 1x128 along K, FP32 out accumulated)"
    peers = ("deepgemm",)

    def supports(self, peer: str, kind: GemmKind) -> bool:
        """DeepGEMM has no columns layout (its k-grouped call wants each group's own block)."""
        return peer in self.peers and not ("G" in kind.out_dims and "F" not in kind.a_dims)

    def check_shape(self, shape: Shape) -> None:
        if shape.m % 4 or shape.n % 4:
            raise BenchUsageError(f"shape {shape.label}: M and N must be multiples of 4 (16-byte aligned scale "
                                  f"stacks and FP32 out rows; DeepGEMM's fastest scale form), got M = {shape.m}, "
                                  f"N = {shape.n}")
        if shape.k % K_ALIGN:
            raise BenchUsageError(f"shape {shape.label}: K must be a multiple of {K_ALIGN} (got {shape.k})")
        columns = "G" in shape.descriptor.out_dims and "F" not in shape.descriptor.a_dims
        if columns and shape.k % K_STEP:
            raise BenchUsageError(f"shape {shape.label}: the columns layout's groups start on multiples of "
                                  f"{K_STEP} columns: K must be one (got {shape.k})")
        if shape.groups > 1 and shape.k <= K_STEP * (shape.groups - 1):
            raise BenchUsageError(f"shape {shape.label}: K (each group's base tokens) must exceed "
                                  f"{K_STEP} x (G - 1) = {K_STEP * (shape.groups - 1)}, so that every group's drawn "
                                  "K is positive")

    def make_sizes(self, shape: Shape, seed: int, valid_rows: int | None = None, full_groups: bool = False) -> Sizes:
        return make_sizes(shape, seed)

    def work(self, shape: Shape, sizes: Sizes) -> tuple[int, int]:
        return work(shape, sizes)

    def make_inputs(self, shape: Shape, sizes: Sizes, seed: int) -> TrainingInputs:
        return make_inputs(shape, sizes, seed)

    def prepare_cupygemm(self, inp: TrainingInputs, rhs: Any = None) -> providers.Prepared:
        import cupygemm

        if rhs is not None:
            raise ValueError("packed weights apply to the forward kinds only")
        kind = inp.shape.descriptor
        fn = getattr(cupygemm, kind.api)
        out = inp.residual.copy()
        lhs, rhs = cupygemm_operands(inp)
        args = (lhs, rhs, out) + ((inp.batch_sizes,) if kind.layout else ())

        def call():
            fn(*args)

        def reset():
            out[...] = inp.residual

        return providers.Prepared(call, lambda: out, reset)

    def prepare_deepgemm(self, peer: Any, inp: TrainingInputs) -> providers.Prepared:
        torch = peer.torch
        kind = inp.shape.descriptor
        fn = getattr(peer.module, kind.api)
        buf = inp.residual.copy()
        out = torch.from_dlpack(buf)
        lhs = (providers.torch_fp8(torch, inp.a), torch.from_dlpack(inp.sfa_t))
        rhs = (providers.torch_fp8(torch, inp.b), torch.from_dlpack(inp.sfb_t))
        args = (lhs, rhs, out) + (([int(k) for k in inp.k_sizes],) if kind.layout else ())

        def call():
            fn(*args)

        def reset():
            buf[...] = inp.residual

        return providers.Prepared(call, lambda: buf, reset)

    def checker(self, inp: TrainingInputs, seed: int) -> Callable[[str, providers.Prepared], dict[str, Any]]:
        refs: list[Any] = []
        xp = _xp(inp.residual)

        def check(name: str, prep: providers.Prepared) -> dict[str, Any]:
            prep.reset()
            prep.call()
            _sync(xp)
            first = prep.output().copy()
            prep.reset()
            prep.call()
            _sync(xp)
            out = prep.output()
            repeatable = same_bits(first, out)
            del first
            if not refs:
                refs.append(references(inp))
            res = compare(out, inp.residual, *refs[0])
            res["repeatable"] = repeatable
            if name == "cupygemm" and not repeatable:
                res["check"] = "FAIL"
            return res

        return check

    def notes(self, rows: list[dict[str, Any]]) -> list[str]:
        lines = list(NOTES)
        counts: dict[str, dict[str, set[int]]] = {}
        for r in rows:
            if r.get("kernels_per_call"):
                counts.setdefault(r["kind"], {}).setdefault(r["provider"], set()).add(int(r["kernels_per_call"]))
        for kind, per in counts.items():
            lines.append(f"kernels per call (CUPTI) on {kind}: " + ", ".join(
                f"{providers.TITLES.get(p, p)} {'/'.join(str(c) for c in sorted(n))}" for p, n in per.items()))
        seen = set()
        for r in rows:
            if r.get("k_sizes") and r["label"] not in seen:
                seen.add(r["label"])
                lines.append(f"k sizes of {r['kind']} {r['label']}: {', '.join(str(k) for k in r['k_sizes'])}")
        return lines


TRAINING_BENCH = register(ONE_D_ONE_D, TrainingBench())
