"""What ``cupygemm bench`` times: cupygemm itself and its optional peers, each prepared as one ready call.

Peers are found at run time: cuBLASLt block-scaled FP8 through ``torch._scaled_mm`` (normal shapes only) and
DeepGEMM (its 03d0be3 Python API) when ``import deep_gemm`` works. torch is never required: it is imported only
here, only when a peer is asked for. Every provider reads the same operands (zero-copy views) and writes a buffer
poisoned with NaNs, so rows it fails to write fail the check.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .cases import BenchUsageError, Shape
from .inputs import Inputs, rows2d

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

    from ..tensors import BF16

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
    return Prepared(call, lambda: rows2d(bits))


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

        return Prepared(call, lambda: rows2d(_cupy_bits(holder["out"], torch)))


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
        return Prepared(call, lambda: rows2d(bits))


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
