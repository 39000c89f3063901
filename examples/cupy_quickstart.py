"""CuPy quick start: quantize, multiply, check against a float64 reference. Run on a Hopper GPU."""
import cupygemm

cupygemm.device.require_hopper_or_exit()  # one clear line, not CuPy's driver error, where there is no Hopper GPU

import cupy as cp  # noqa: E402

from cupygemm.reference import calc_diff, gemm_reference  # noqa: E402

m, n, k = 4096, 2112, 7168
x = cp.random.standard_normal((m, k), dtype=cp.float32)  # activations
w = cp.random.standard_normal((n, k), dtype=cp.float32)  # weights

a, sfa = cupygemm.per_token_cast_to_fp8(x)  # e4m3 bits (uint8) + one FP32 scale per 1x128
b, sfb = cupygemm.per_block_cast_to_fp8(w)  # one FP32 scale per 128x128
d = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))  # ml_dtypes.bfloat16 CuPy array [m, n]

rows = slice(0, 64)
ref = gemm_reference(a[rows].get(), sfa[rows].get(), b.get(), sfb.get())
got = d[rows].get().astype("float32")
print(f"D {d.shape} {d.dtype}; calc_diff vs dequantized float64 reference: {calc_diff(got, ref):.2e}")
print(f"calc_diff vs unquantized product: {calc_diff(got, (x[rows] @ w.T).get()):.2e} (DeepGEMM's gate: < 1e-3)")
