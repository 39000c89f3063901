"""PyTorch users: torch tensors in (float8_e4m3fn), a torch bfloat16 tensor out, no copies. Hopper GPU."""
import cupygemm

cupygemm.device.require_hopper_or_exit()  # one clear line, not CuPy's driver error, where there is no Hopper GPU

import torch  # noqa: E402

m, n, k = 4096, 7168, 2048
x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)

a, sfa = cupygemm.per_token_cast_to_fp8(x)  # torch.float8_e4m3fn + float32 scales, on torch's current stream
b, sfb = cupygemm.per_block_cast_to_fp8(w)

d = cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))  # torch.bfloat16 [m, n], same device and stream
out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), out)  # or write into your own tensor

ref = x.float() @ w.float().T
diff = 1 - 2 * (d.double() * ref.double()).sum() / (d.double().square() + ref.double().square()).sum()
print(f"{type(d).__name__} {tuple(d.shape)} {d.dtype}; calc_diff {diff.item():.2e}; in-place equal: {torch.equal(d, out)}")
