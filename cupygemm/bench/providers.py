"""What ``cupygemm bench`` times: cupygemm itself and its optional peers, each prepared as one ready call.

Peers are found at run time: cuBLASLt block-scaled FP8 through ``torch._scaled_mm`` (normal shapes only; it has no
1x128 x 1x128 FP32-accumulating recipe for the weight gradients),
DeepGEMM (its 03d0be3 Python API) when ``import deep_gemm`` works, and DeeperGEMM (ademeure/DeeperGEMM 4b05985,
a DeepGEMM fork with L2-side-aware weights) when ``import deeper_gemm`` (as shipped) or ``import deeper_gemm_s128``
(its one-K-block-scale shortcut turned off: the exact recipe) works; benchmarks/README.md says how to install them.
torch is never required: it is imported only here, only when a peer is asked for. Every provider reads the same
operands (zero-copy views) and writes a buffer of its own: poisoned with NaNs for the forward kinds, so rows it fails
to write fail the check; a copy of the same residual for the weight gradients, which accumulate into it. Which
peer runs which kind, and how a call is made, is each kind's bench code (:mod:`cupygemm.bench.kinds`): the peers
call the function of the kind's public name (``GemmKind.api``, DeepGEMM 03d0be3's names).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..kinds import kind_named
from .cases import BenchUsageError, Shape
from .inputs import Inputs, rows2d

PROVIDERS = ("cupygemm", "cupygemm_packed", "cublas_block", "deepgemm", "deepergemm", "deepergemm_s128")
PEERS = ("cupygemm_packed", "cublas_block", "deepgemm", "deepergemm", "deepergemm_s128")
TITLES = {"cupygemm": "cupygemm", "cupygemm_packed": "cupygemm-packed", "cublas_block": "cuBLAS-block",
          "deepgemm": "DeepGEMM", "deepergemm": "DeeperGEMM", "deepergemm_s128": "DeeperGEMM-s128"}
_PEER_ALIASES = {"packed": "cupygemm_packed", "cupygemm_packed": "cupygemm_packed", "cublas": "cublas_block", "cublas_block": "cublas_block", "deepgemm": "deepgemm",
                 "deep_gemm": "deepgemm", "deepergemm": "deepergemm", "deeper_gemm": "deepergemm",
                 "deepergemm_s128": "deepergemm_s128", "deepergemm-s128": "deepergemm_s128",
                 "deeper_gemm_s128": "deepergemm_s128"}
#: The module each DeeperGEMM peer imports (two installed copies of its package, see benchmarks/README.md).
DEEPERGEMM_MODULES = {"deepergemm": "deeper_gemm", "deepergemm_s128": "deeper_gemm_s128"}
PROVIDER_DESCRIPTIONS = {
    "cupygemm": "cupygemm (this package), the public API with SFA pre-converted to the M-major TMA-aligned layout "
                "(weight gradients: both operands' 1x128 scales in the forms used in place, see the notes)",
    "cupygemm_packed": "cupygemm with B packed once by cupygemm.pack_weights (L2-side-aware), outside the timed call",
    "cublas_block": "cuBLASLt 1x128 x 128x128 block-scaled FP8 through torch._scaled_mm: scale_a (M, K/128) "
                    "M-major (strides (1, M)), scale_b (K/128, N/128) = the weight scales transposed, BF16 out",
    "deepgemm": "DeepGEMM through its 03d0be3 Python API (gemm_fp8_fp8_bf16_nt, the m_grouped functions, "
                "wgrad_gemm_fp8_fp8_fp32_nt and k_grouped_wgrad_gemm_fp8_fp8_fp32_nt)",
    "deepergemm": "DeeperGEMM 4b05985 as shipped (one K block's scales applied to two: not the exact recipe), B "
                  "reordered once by its preprocess_reorder_b into torch memory (its L2-side allocator's, when set up)",
    "deepergemm_s128": "DeeperGEMM 4b05985 with DP_SCALE_256 = false (the exact 1x128 / 128x128 recipe), B reordered "
                       "the same way",
}


def _poisoned(shape: tuple[int, ...]) -> Any:
    """A uint16 buffer of BF16 NaNs: rows a provider fails to write show up in the check."""
    import cupy

    return cupy.full(shape, 0xFFFF, dtype=cupy.uint16)


@dataclass
class Prepared:
    """A provider's ready-to-time call and an accessor of its result (forward kinds: uint16 BF16 bits viewed
    [rows, N]; weight gradients: the FP32 output). ``reset``: for kinds that accumulate into their output, puts the
    output back to its starting value (the checks run the call again from there)."""

    call: Callable[[], Any]
    output: Callable[[], Any]
    reset: Callable[[], Any] | None = None


def _maker(shape: Shape) -> Any:
    from .kinds import bench_kind

    return bench_kind(shape.kind)


def prepare_cupygemm(inp: Any, rhs: Any = None) -> Prepared:
    """cupygemm's call on the shape's operands (``kind.api`` of :mod:`cupygemm`), as its kind's bench code makes it;
    ``rhs``: B replaced (weights packed by :func:`cupygemm.pack_weights`; forward kinds)."""
    return _maker(inp.shape).prepare_cupygemm(inp, rhs)


class PackedPeer:
    """cupygemm on weights packed L2-side-aware (:func:`cupygemm.pack_weights`, once per shape, untimed)."""

    name = "cupygemm_packed"

    def supports(self, shape: Shape) -> bool:
        return _maker(shape).supports(self.name, shape.descriptor)

    def prepare(self, inp: Inputs) -> Prepared:
        import cupygemm

        packed = cupygemm.pack_weights(inp.b, inp.sfb)
        if not packed.side_aware:
            from ..l2 import why_plain
            from ..tensors import gpu_device_of

            raise RuntimeError(f"weights not packed: {why_plain(gpu_device_of(inp.b, 'b'))}")
        return prepare_cupygemm(inp, packed)


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
        return _maker(shape).supports(self.name, shape.descriptor)

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
    """DeepGEMM's 03d0be3 Python API on torch views of the same data: the function of the kind's public name
    (``GemmKind.api``, the same names), called as the kind's bench code prepares it."""

    name = "deepgemm"

    def __init__(self, torch: Any, module: Any):
        self.torch, self.module = torch, module

    def supports(self, shape: Shape) -> bool:
        return _maker(shape).supports(self.name, shape.descriptor) and hasattr(self.module, shape.descriptor.api)

    def weights(self, inp: Inputs) -> Any:
        """B as the library takes it: DeepGEMM reads the operand itself."""
        return torch_fp8(self.torch, inp.b)

    def prepare(self, inp: Any) -> Prepared:
        return _maker(inp.shape).prepare_deepgemm(self, inp)


class DeeperGemmPeer(DeepGemmPeer):
    """DeeperGEMM (a DeepGEMM fork with the same Python API): B is reordered once per shape, outside the timed call,
    by its own preprocess step, into a tensor torch allocates (from its L2-side-aware allocator when
    :func:`init_sideaware` set it up; else its side logic is compiled out)."""

    def __init__(self, torch: Any, module: Any, name: str):
        super().__init__(torch, module)
        self.name = name

    def weights(self, inp: Inputs) -> Any:
        b = torch_fp8(self.torch, inp.b)
        reordered = self.torch.empty_like(b)
        kind = kind_named(inp.shape.kind)
        if "G" not in kind.b_dims:
            self.module.preprocess_reorder_b(b, reordered)
        else:
            self.module.preprocess_reorder_b_grouped(b, reordered, "G" in kind.a_dims)  # masked: A is [G, max_m, K]
        return reordered


#: DeeperGEMM's sideaware module state that sideaware_init fills (4b05985): shared with a second copy of the package,
#: since torch's allocator can be replaced only once per process.
_SIDEAWARE_STATE = ("_lib", "_info", "_info_str", "_torch_side_index", "_gpu_side_index", "_cpu_side_index")


def init_sideaware(modules: Sequence[Any], library: str) -> None:
    """Set up DeeperGEMM's L2-side-aware allocator (its compiled ``sideaware.so``) for the whole process, through the
    first module, and share its state with the other copies. Must run before torch allocates GPU memory."""
    first = modules[0]
    first.sideaware_init(library)
    src = importlib.import_module(first.__name__ + ".jit_kernels.sideaware")
    for mod in modules[1:]:
        dst = importlib.import_module(mod.__name__ + ".jit_kernels.sideaware")
        for attr in _SIDEAWARE_STATE:
            setattr(dst, attr, getattr(src, attr))


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
            raise BenchUsageError(f"--peers: unknown peer {tok!r}; expected auto, none or a list of packed, cublas, "
                                  "deepgemm, deepergemm, deepergemm_s128")
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


def _import_peer(name: str, module_name: str, needs: str, otherwise: str, notes: list[str]) -> Any:
    """The peer's module, or None with a note saying why it cannot run."""
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or a broken install
        notes.append(f"{TITLES[name]}: not run (import {module_name} failed: {type(e).__name__}: {e})")
        return None
    if not hasattr(module, needs):
        notes.append(f"{TITLES[name]}: not run ({module_name} has no {needs}: {otherwise})")
        return None
    return module


def load_peers(names: Sequence[str], sideaware: str | None = None,
               device: int | None = None) -> tuple[dict[str, Any], list[str]]:
    """The peers that can run here, and a note for each one that cannot. ``sideaware``: DeeperGEMM's compiled
    ``sideaware.so``, to set up its L2-side-aware allocator (without it DeeperGEMM runs with its side logic off).
    ``device``: the GPU the bench runs on; where :func:`cupygemm.pack_weights` keeps weights plain there (an H200,
    no side info), cupygemm-packed would time cupygemm's own kernels again, so it is left out with a note."""
    peers: dict[str, Any] = {}
    notes: list[str] = []
    if "cupygemm_packed" in names:
        from ..l2 import why_plain

        why = why_plain(device) if device is not None else None
        if why is None:
            peers["cupygemm_packed"] = PackedPeer()
        else:
            notes.append(f"{TITLES['cupygemm_packed']}: not run (pack_weights keeps the weights plain here: {why})")
        names = [n for n in names if n != "cupygemm_packed"]
    if not names:
        return peers, notes
    torch, why = _import_torch()
    deeper: list[Any] = []
    for name in names:
        if torch is None:
            notes.append(f"{TITLES[name]}: not run ({why})")
        elif name == "cublas_block":
            if hasattr(torch, "_scaled_mm"):
                peers[name] = CublasBlockPeer(torch)
            else:
                notes.append(f"{TITLES[name]}: not run (torch {torch.__version__} has no _scaled_mm)")
        elif name == "deepgemm":
            module = _import_peer(name, "deep_gemm", "gemm_fp8_fp8_bf16_nt", "not the 03d0be3 API", notes)
            if module is not None:
                peers[name] = DeepGemmPeer(torch, module)
        elif name in DEEPERGEMM_MODULES:
            module = _import_peer(name, DEEPERGEMM_MODULES[name], "preprocess_reorder_b", "not DeeperGEMM", notes)
            if module is not None:
                peers[name] = DeeperGemmPeer(torch, module, name)
                deeper.append(module)
    if deeper:
        if sideaware:
            init_sideaware(deeper, sideaware)
        else:
            notes.append("DeeperGEMM: its L2-side-aware allocator is not set up (--deepergemm-sideaware PATH): it runs "
                         "with its side logic off")
    return peers, notes
