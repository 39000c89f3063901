"""Result checks of ``cupygemm bench``: sampled output rows against a float64 reference of the quantized inputs
(relative Frobenius error) and against the product of the unquantized BF16 inputs (``calc_diff``)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..reference import calc_diff, gemm_reference
from .inputs import Inputs, bf16_bits_to_f64, rows2d

CHECK_ROWS = 16
REL_ERR_TOL = 1e-2
CALC_DIFF_TOL = 1e-3


def _host(x: Any) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.get()


def _take_rows(arr2d: Any, rows: np.ndarray) -> np.ndarray:
    """Host copy of ``arr2d[rows]`` (NumPy or CuPy)."""
    if isinstance(arr2d, np.ndarray):
        return arr2d[rows]
    import cupy

    return arr2d[cupy.asarray(rows)].get()


def _group(arr: Any, g: int) -> Any:
    return arr if arr.ndim == 2 else arr[g]


def compare(got: np.ndarray, ref_q: np.ndarray, ref_bf16: np.ndarray) -> dict[str, Any]:
    """Check result rows: finite, relative Frobenius error vs the float64 dequantized reference < 1e-2, and
    calc_diff vs the unquantized BF16 product < 1e-3. Returns {check: 'ok'|'FAIL', rel_err, calc_diff}."""
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


def reference_rows(inp: Inputs, rows: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float64 reference from the quantized inputs, float64 product of the unquantized BF16 inputs) for the
    sampled output rows (flat indices into the output viewed as [rows, N])."""
    n = inp.shape.n
    aq = _take_rows(rows2d(inp.a), rows)
    sa = _take_rows(rows2d(inp.sfa), rows)
    xf = bf16_bits_to_f64(_take_rows(rows2d(inp.x), rows))
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
