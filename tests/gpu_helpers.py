"""GPU-side helpers for the gpu tests: recipe inputs and an independent float64 reference (cuBLAS DGEMM)."""
from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np

import cupy as cp

import cupygemm
from cupygemm import config as C
from cupygemm.bench.inputs import grouped_weights  # noqa: F401  (the tests import it from here)
from cupygemm.plan import plan_gemm

_LUT = None

# Hopper's FP8 wgmma accumulates with ~14 significant bits (DeepSeek-V3 report, section 3.3; measured here:
# the BF16 output differs from the rounded float64 reference in ~10% of elements by one ulp). Allow 2^-12 of
# the sum of |products| on top of one BF16 ulp.
FP8_ACCUM_EPS = 2.0**-12


def fp8_lut():
    global _LUT
    if _LUT is None:
        vals = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
        vals[~np.isfinite(vals)] = 0.0
        _LUT = cp.asarray(vals)
    return _LUT


def bf16_to_f64(x) -> cp.ndarray:
    bits = x.view(cp.uint16).astype(cp.uint32) << 16
    return bits.view(cp.float32).astype(cp.float64)


def round_to_bf16(x: cp.ndarray) -> cp.ndarray:
    """float64 -> nearest bf16 value (via float32, round to nearest even), as float64."""
    u = x.astype(cp.float32).view(cp.uint32)
    r = (u + cp.uint32(0x7FFF) + ((u >> 16) & cp.uint32(1))) & cp.uint32(0xFFFF0000)
    return r.view(cp.float32).astype(cp.float64)


def randn_bf16(shape, rng: cp.random.Generator) -> cp.ndarray:
    x = rng.standard_normal(shape, dtype=cp.float32)
    u = x.view(cp.uint32)
    r = ((u + cp.uint32(0x7FFF) + ((u >> 16) & cp.uint32(1))) >> 16).astype(cp.uint16)
    return r.view(ml_dtypes.bfloat16)


def make_normal(m: int, n: int, k: int, seed: int = 0):
    """Recipe inputs: randn BF16 quantized per 1x128 (A) and 128x128 (B). Returns a, sfa, b, sfb, x, y."""
    rng = cp.random.default_rng(seed)
    x = randn_bf16((m, k), rng)
    y = randn_bf16((n, k), rng)
    a, sfa = cupygemm.per_token_cast_to_fp8(x)
    b, sfb = cupygemm.per_block_cast_to_fp8(y)
    return a, sfa, b, sfb, x, y


def dequant_rows(q: cp.ndarray, s: cp.ndarray, block_rows: int) -> cp.ndarray:
    """Dequantize [r, k] FP8 bits with scales per (block_rows x 128)."""
    r, k = q.shape
    vals = fp8_lut()[q]
    scale = cp.repeat(cp.repeat(s.astype(cp.float64), block_rows, axis=0)[:r], 128, axis=1)[:, :k]
    return vals * scale


def ref_normal(a, sfa, b, sfb) -> tuple[cp.ndarray, cp.ndarray]:
    """(A @ B.T, |A| @ |B|.T) of the dequantized operands in float64; the second bounds rounding error."""
    da, db = dequant_rows(a, cp.ascontiguousarray(sfa), 1), dequant_rows(b, sfb, 128)
    return da @ db.T, cp.abs(da) @ cp.abs(db).T


_SLEEP_SRC = r"""
extern "C" __global__ void cupygemm_test_sleep(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""
_sleep_kernel = None


def gpu_sleep(cycles: int = 50_000_000) -> None:
    """Keep CuPy's current stream busy for ``cycles`` SM clocks (~30 ms by default), as ``torch.cuda._sleep`` does:
    work queued behind it on that stream is late, so a call that runs anywhere but there reads unfinished inputs."""
    global _sleep_kernel
    if _sleep_kernel is None:
        _sleep_kernel = cp.RawKernel(_SLEEP_SRC, "cupygemm_test_sleep")
    _sleep_kernel((1,), (1,), (np.int64(cycles),))


def poison_bf16(shape) -> cp.ndarray:
    return cp.full(shape, 0xFFFF, dtype=cp.uint16).view(ml_dtypes.bfloat16)


def rel_fro(x: cp.ndarray, y: cp.ndarray) -> float:
    den = float(cp.linalg.norm(y))
    return float(cp.linalg.norm(x - y)) / (den if den else 1.0)


def calc_diff(x: cp.ndarray, y: cp.ndarray) -> float:
    x, y = x.astype(cp.float64), y.astype(cp.float64)
    den = float((x * x + y * y).sum())
    return 0.0 if den == 0 else 1.0 - 2.0 * float((x * y).sum()) / den


def check_against_reference(out, want: cp.ndarray, mag: cp.ndarray) -> dict:
    """Numbers the tests assert on: errors vs the float64 reference and vs its BF16 rounding, and the count of
    elements off by more than one BF16 ulp plus the tensor-core accumulation allowance (FP8_ACCUM_EPS of
    sum |a*b|)."""
    got = bf16_to_f64(out)
    want_bf16 = round_to_bf16(want)
    # One BF16 ulp of the reference (2^-7 relative to the leading power of two).
    ulp = cp.ldexp(cp.ones_like(want), (cp.frexp(cp.abs(want))[1] - 8).astype(cp.int32))
    tol = 1.01 * ulp + FP8_ACCUM_EPS * mag + 1e-30
    return {
        "finite": bool(cp.isfinite(got).all()),
        "rel_fro": rel_fro(got, want),
        "rel_fro_bf16": rel_fro(got, want_bf16),
        "beyond_one_ulp": int((cp.abs(got - want) > tol).sum()),
    }


@contextlib.contextmanager
def plain_like_packed(kind, m, n, k, groups=1, expected_m=None):
    """The plain kernel on the packed plan's tile, split and multicast (the chooser may pick other tiles for packed
    weights, whose B loads want whole 32-row chunks), so that both sum in the same order; yields the packed config."""
    cfg = plan_gemm(kind, m, n, k, groups, cp.cuda.runtime.getDevice(), expected_m=expected_m, sides=True).cfg
    name = C.KIND_NAMES[kind]
    fields = dict(block_m=cfg.block_m, block_n=cfg.block_n, multicast=cfg.multicast, interleave_k=cfg.interleave_k,
                  serial_m=cfg.serial_m)
    if kind == C.KIND_NORMAL:
        fields["split_k"] = cfg.split_k
    if kind in C.STREAM_K_KINDS:
        fields["stream_k"] = False
    C.override_config(name, n, k, **fields)
    try:
        yield cfg
    finally:
        C.override_config(name, n, k)
