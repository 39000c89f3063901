"""Inputs and expected results of the fused transpose casts, shared by their CPU (emulated) and GPU tests."""
from __future__ import annotations

import numpy as np

from cupygemm import reference as ref

TRANSPOSED = "per_token_cast_to_fp8_transposed"
TRANSPOSED_ROWWISE = "per_token_cast_to_fp8_transposed_rowwise"
BLOCK_WITH_TRANSPOSE = "per_block_cast_to_fp8_with_transpose"


def make_input(shape, dtype, seed=0) -> np.ndarray:
    """Host input: magnitudes varying by row and by column; an all-zero row and column, tiny ones (below the 1e-4
    clamp), exact e4m3 rounding ties and subnormals (in groups whose amax is 448, so that the factor is exactly 1)."""
    rng = np.random.default_rng(seed)
    m, n = shape
    x = rng.standard_normal(shape, dtype=np.float32)
    x *= np.exp2(rng.uniform(-6, 6, (m, 1))).astype(np.float32) * np.exp2(rng.uniform(-6, 6, (1, n))).astype(np.float32)
    special = np.array([448.0, 1.0625, -1.1875, 3 * 2.0 ** -10, 2.0 ** -10, -2.0 ** -10, 0.0, -0.0], np.float32)
    if m >= 8 and n >= 8:
        x[:8, 0] = special  # column 0's first group: ties for the transposed casts
        x[0, :8] = special  # row 0's first group: ties for the row-wise ones
    if m > 3 and n > 3:
        x[2] = 0.0
        x[:, 2] = 0.0
        x[3] *= np.float32(1e-7)
        x[:, 3] *= np.float32(1e-7)
    if np.dtype(dtype) == np.float16:
        x = np.clip(x, -60000, 60000)
    return x.astype(dtype)


def expected(entry: str, x: np.ndarray) -> tuple[np.ndarray, ...]:
    """The compositions of the NumPy references a fused cast of host array ``x`` must equal, in its result order."""
    if entry == TRANSPOSED:
        return ref.per_token_cast_to_fp8_reference(x.T)
    if entry == TRANSPOSED_ROWWISE:
        return ref.per_token_cast_to_fp8_reference(x.T) + ref.per_token_cast_to_fp8_reference(x)
    assert entry == BLOCK_WITH_TRANSPOSE
    return ref.per_block_cast_to_fp8_reference(x) + ref.per_block_cast_to_fp8_reference(x.T)


def bits(a) -> np.ndarray:
    """A host array's bits (uint32 for float32 scales, uint8 for e4m3 bits), C-contiguous."""
    a = np.ascontiguousarray(a)
    return a.view(np.uint32) if a.dtype == np.float32 else a.view(np.uint8)


def assert_equal(got, want) -> None:
    """Bitwise equality of two result tuples of host arrays (float32 compared as bits: NaN and -0.0 count)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert g.dtype.itemsize == w.dtype.itemsize
        np.testing.assert_array_equal(bits(g), bits(w))
