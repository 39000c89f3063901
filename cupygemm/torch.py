"""torch operators for cupygemm's GEMMs and casts: ``torch.ops.cupygemm.*``.

Imported by cupygemm itself the first time a torch tensor reaches a public entry point (so only torch users ever
import torch), or by you. The public functions route torch tensors through these operators, so

* ``torch.compile(fullgraph=True)`` traces a function that calls ``cupygemm.gemm_fp8_fp8_bf16_nt`` (or any entry
  point) directly: each call is one opaque operator with a fake (meta) implementation for shapes and dtypes;
* eager calls run the same implementation, which launches on torch's current stream (or ``stream=``), so the
  caller's stream orders the call like any torch operator, and ``torch.cuda.graph`` captures it. Split-K scratch
  comes from torch's caching allocator (from the graph's pool while capturing). Where nothing but plain eager
  execution could observe it (no compile tracing, dispatch mode, functorch transform or autograd), the public
  functions call the implementation without the dispatcher's round trip;
* ``torch.library.opcheck`` passes for every operator.

Operators (``stream`` is a raw ``cudaStream_t``, -1 for torch's current stream):

=======================================================================  ==================================
``gemm_fp8_fp8_bf16_nt(a, sfa, b, sfb, stream=-1) -> Tensor``             ``..._out(a, sfa, b, sfb, out!, stream=-1)``
``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(a, sfa, b, sfb, m_indices, ...)``   and ``..._out`` with ``out!``
``m_grouped_gemm_fp8_fp8_bf16_nt_masked(a, sfa, b, sfb, masked_m, int expected_m, ...)``  and ``..._out``
``per_token_cast_to_fp8(x, stream=-1) -> (Tensor, Tensor)``               ``per_block_cast_to_fp8`` likewise
=======================================================================  ==================================

Each GEMM also has a ``..._packed`` operator (and ``..._packed_out``) for :class:`~cupygemm.PackedWeights`: ``b`` is
the packed bytes and ``b_shape``, ``base_low``, ``hash_bits``, ``page_words`` their layout (after the kind's own
arguments).

The GEMMs take A and B as ``float8_e4m3fn`` (or ``uint8`` bits) and return ``bfloat16``; the casts return
``float8_e4m3fn`` and ``float32`` scales. There is no autograd formula: FP8 GEMMs are used for inference and
inside hand-written training steps.
"""
from __future__ import annotations

from typing import Any

try:
    import torch
except ImportError as e:  # a bare "No module named" does not say that the CUDA build is the one needed
    raise type(e)("cupygemm.torch needs PyTorch with CUDA: pip install torch", name=e.name) from e

from .config import KIND_CONTIGUOUS, KIND_MASKED, KIND_NORMAL
from .gemm import same_framework, run
from .packing import PackedWeights
from .quantization import run_cast
from .streams import stream_handle
from .tensors import Framework
from .util import ceil_div

_lib = torch.library.Library("cupygemm", "DEF")

_GEMM_ARGS = {
    "gemm_fp8_fp8_bf16_nt": ("", KIND_NORMAL),
    "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous": (", Tensor m_indices", KIND_CONTIGUOUS),
    "m_grouped_gemm_fp8_fp8_bf16_nt_masked": (", Tensor masked_m, int expected_m", KIND_MASKED),
}


def _stream(stream: int) -> Any:
    return None if stream < 0 else stream


def _out_shape(kind: int, a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
    n = b.shape[-2]
    return (a.shape[0], a.shape[1], n) if kind == KIND_MASKED else (a.shape[0], n)


def _define_gemm(name: str, extra: str, kind: int) -> None:
    _lib.define(f"{name}(Tensor a, Tensor sfa, Tensor b, Tensor sfb{extra}, int stream=-1) -> Tensor")
    _lib.define(f"{name}_out(Tensor a, Tensor sfa, Tensor b, Tensor sfb{extra}, Tensor(a!) out, int stream=-1) -> ()")

    # The dispatcher leaves out trailing arguments equal to their defaults: the kernels take them as keywords.
    if kind == KIND_NORMAL:
        def functional(a, sfa, b, sfb, stream=-1):
            return run(kind, a, sfa, b, sfb, None, None, None, _stream(stream), Framework.TORCH)

        def out_variant(a, sfa, b, sfb, out, stream=-1):
            run(kind, a, sfa, b, sfb, out, None, None, _stream(stream), Framework.TORCH)
    elif kind == KIND_CONTIGUOUS:
        def functional(a, sfa, b, sfb, m_indices, stream=-1):
            return run(kind, a, sfa, b, sfb, None, m_indices, None, _stream(stream), Framework.TORCH)

        def out_variant(a, sfa, b, sfb, m_indices, out, stream=-1):
            run(kind, a, sfa, b, sfb, out, m_indices, None, _stream(stream), Framework.TORCH)
    else:
        def functional(a, sfa, b, sfb, masked_m, expected_m, stream=-1):
            return run(kind, a, sfa, b, sfb, None, masked_m, expected_m, _stream(stream), Framework.TORCH)

        def out_variant(a, sfa, b, sfb, masked_m, expected_m, out, stream=-1):
            run(kind, a, sfa, b, sfb, out, masked_m, expected_m, _stream(stream), Framework.TORCH)

    def fake(a, sfa, b, sfb, *rest):
        return a.new_empty(_out_shape(kind, a, b), dtype=torch.bfloat16)

    def fake_out(a, sfa, b, sfb, *rest):
        return None

    _lib.impl(name, functional, "CUDA")
    _lib.impl(f"{name}_out", out_variant, "CUDA")
    torch.library.register_fake(f"cupygemm::{name}", fake, lib=_lib)
    torch.library.register_fake(f"cupygemm::{name}_out", fake_out, lib=_lib)


_PACKED_ARGS = ", int[] b_shape, int base_low, int hash_bits, int[] page_words"


def _define_packed_gemm(name: str, extra: str, kind: int) -> None:
    """``{name}_packed`` and ``..._out``: the GEMM on packed weights (``b`` their bytes, the layout as ints)."""
    _lib.define(f"{name}_packed(Tensor a, Tensor sfa, Tensor b, Tensor sfb{extra}{_PACKED_ARGS}, int stream=-1) "
                "-> Tensor")
    _lib.define(f"{name}_packed_out(Tensor a, Tensor sfa, Tensor b, Tensor sfb{extra}{_PACKED_ARGS}, "
                "Tensor(a!) out, int stream=-1) -> ()")
    n_extra = {KIND_NORMAL: 0, KIND_CONTIGUOUS: 1, KIND_MASKED: 2}[kind]
    i_out = 4 + n_extra + _PACKED_ARGS.count(",")  # the _out variant's out: after the layout, before stream

    def call(args: tuple, out: Any) -> Any:
        a, sfa, b, sfb = args[:4]
        extra_args = args[4:4 + n_extra]
        b_shape, base_low, hash_bits, page_words = args[4 + n_extra:i_out]
        stream = args[i_out] if len(args) > i_out else -1
        packed = PackedWeights(b, sfb, tuple(int(d) for d in b_shape), True, int(base_low), int(hash_bits),
                               page_words=tuple(int(w) for w in page_words))
        layout = extra_args[0] if n_extra else None
        expected_m = int(extra_args[1]) if n_extra == 2 else None
        return run(kind, a, sfa, b, sfb, out, layout, expected_m, _stream(stream), Framework.TORCH, packed)

    def functional(*args):
        return call(args, None)

    def out_variant(*args):
        call(args[:i_out] + args[i_out + 1:], args[i_out])

    def fake(a, sfa, b, sfb, *rest):
        n = rest[n_extra][-2]
        return a.new_empty((a.shape[0], a.shape[1], n) if kind == KIND_MASKED else (a.shape[0], n),
                           dtype=torch.bfloat16)

    def fake_out(*args):
        return None

    _lib.impl(f"{name}_packed", functional, "CUDA")
    _lib.impl(f"{name}_packed_out", out_variant, "CUDA")
    torch.library.register_fake(f"cupygemm::{name}_packed", fake, lib=_lib)
    torch.library.register_fake(f"cupygemm::{name}_packed_out", fake_out, lib=_lib)


def _define_cast(name: str, rows: Any) -> None:
    _lib.define(f"{name}(Tensor x, int stream=-1) -> (Tensor, Tensor)")

    def impl(x, stream=-1):
        return run_cast(name, x, _stream(stream), Framework.TORCH)

    def fake(x, stream=-1):
        m, n = x.shape
        return (x.new_empty((m, n), dtype=torch.float8_e4m3fn),
                x.new_empty((rows(m), ceil_div(n, 128)), dtype=torch.float32))

    _lib.impl(name, impl, "CUDA")
    torch.library.register_fake(f"cupygemm::{name}", fake, lib=_lib)


for _name, (_extra, _kind) in _GEMM_ARGS.items():
    _define_gemm(_name, _extra, _kind)
    _define_packed_gemm(_name, _extra, _kind)
_define_cast("per_token_cast_to_fp8", lambda m: m)
_define_cast("per_block_cast_to_fp8", lambda m: ceil_div(m, 128))

ops = torch.ops.cupygemm


def _handle(stream: Any) -> int:
    return -1 if stream is None else stream_handle(stream)


_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_functorch_active = torch._C._are_functorch_transforms_active


def _check_torch(*tensors: Any) -> None:
    """Before the dispatcher (whose message would not say what to do): every operand a torch tensor."""
    for t in tensors:
        if t is not None and not isinstance(t, _Tensor):
            same_framework(*tensors)


def _plain_eager(*tensors: Any) -> bool:
    """Nothing but plain eager execution would see the operator: no torch.compile tracing, no dispatch mode (fake
    tensors, opcheck, make_fx), no functorch transform, no tensor subclass or meta tensor, no autograd. Then the operator's body
    runs directly, saving the dispatcher's round trip (a few microseconds per call); the result is the same."""
    for t in tensors:
        if t is not None and (type(t) is not _Tensor or t.requires_grad):
            return False
    # Meta operands (shape inference) go to the fake implementation; a meta tensor beside CUDA ones gets the
    # eager path's "expected a CUDA tensor" error, which names it.
    return not tensors[0].is_meta and not _is_compiling() and _dispatch_modes() == 0 and not _functorch_active()


def gemm_fp8_fp8_bf16_nt(a, sfa, b, sfb, out=None, stream=None):
    """The torch route of :func:`cupygemm.gemm_fp8_fp8_bf16_nt`."""
    if _plain_eager(a, sfa, b, sfb, out):
        return run(KIND_NORMAL, a, sfa, b, sfb, out, None, None, stream, Framework.TORCH)
    _check_torch(a, sfa, b, sfb, out)
    if out is None:
        return ops.gemm_fp8_fp8_bf16_nt.default(a, sfa, b, sfb, _handle(stream))
    ops.gemm_fp8_fp8_bf16_nt_out.default(a, sfa, b, sfb, out, _handle(stream))
    return out


def m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(a, sfa, b, sfb, out, m_indices, stream=None):
    """The torch route of :func:`cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous`."""
    if _plain_eager(a, sfa, b, sfb, out, m_indices):
        return run(KIND_CONTIGUOUS, a, sfa, b, sfb, out, m_indices, None, stream, Framework.TORCH)
    _check_torch(a, sfa, b, sfb, out, m_indices)
    if out is None:
        return ops.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous.default(a, sfa, b, sfb, m_indices, _handle(stream))
    ops.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_out.default(a, sfa, b, sfb, m_indices, out, _handle(stream))
    return out


def m_grouped_gemm_fp8_fp8_bf16_nt_masked(a, sfa, b, sfb, out, masked_m, expected_m, stream=None):
    """The torch route of :func:`cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked`."""
    if _plain_eager(a, sfa, b, sfb, out, masked_m):
        return run(KIND_MASKED, a, sfa, b, sfb, out, masked_m, expected_m, stream, Framework.TORCH)
    _check_torch(a, sfa, b, sfb, out, masked_m)
    if out is None:
        return ops.m_grouped_gemm_fp8_fp8_bf16_nt_masked.default(a, sfa, b, sfb, masked_m, expected_m,
                                                                 _handle(stream))
    ops.m_grouped_gemm_fp8_fp8_bf16_nt_masked_out.default(a, sfa, b, sfb, masked_m, expected_m, out, _handle(stream))
    return out


_PACKED_OPS = {kind: name + "_packed" for name, (_, kind) in _GEMM_ARGS.items()}


def gemm_packed(kind, a, sfa, rhs: PackedWeights, out, layout, expected_m, stream=None):
    """The torch route of the GEMMs on side-aware :class:`~cupygemm.PackedWeights` (one operator per kind)."""
    if _plain_eager(a, sfa, rhs.data, rhs.scales, out, layout):
        return run(kind, a, sfa, rhs.data, rhs.scales, out, layout, expected_m, stream, Framework.TORCH, rhs)
    _check_torch(a, sfa, rhs.data, rhs.scales, out, layout)
    extra = () if kind == KIND_NORMAL else (layout,) if kind == KIND_CONTIGUOUS else (layout, int(expected_m))
    tail = (list(rhs.shape), rhs.base_low, rhs.hash_bits, list(rhs.page_words))
    op = getattr(ops, _PACKED_OPS[kind])
    if out is None:
        return op.default(a, sfa, rhs.data, rhs.scales, *extra, *tail, _handle(stream))
    getattr(ops, _PACKED_OPS[kind] + "_out").default(a, sfa, rhs.data, rhs.scales, *extra, *tail, out,
                                                     _handle(stream))
    return out


def per_token_cast_to_fp8(x, stream=None):
    """The torch route of :func:`cupygemm.per_token_cast_to_fp8`."""
    if _plain_eager(x):
        return run_cast("per_token_cast_to_fp8", x, stream, Framework.TORCH)
    return ops.per_token_cast_to_fp8.default(x, _handle(stream))


def per_block_cast_to_fp8(x, stream=None):
    """The torch route of :func:`cupygemm.per_block_cast_to_fp8`."""
    if _plain_eager(x):
        return run_cast("per_block_cast_to_fp8", x, stream, Framework.TORCH)
    return ops.per_block_cast_to_fp8.default(x, _handle(stream))
