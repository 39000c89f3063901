"""torch operators for cupygemm's GEMMs and casts: ``torch.ops.cupygemm.*``, one set per GEMM kind.

Imported by cupygemm itself the first time a torch tensor reaches a public entry point (so only torch users ever
import torch; :mod:`cupygemm.frameworks`), or by you. The public functions route torch tensors through these
operators, so

* ``torch.compile(fullgraph=True)`` traces a function that calls ``cupygemm.gemm_fp8_fp8_bf16_nt`` (or any entry
  point) directly: each call is one opaque operator with a fake (meta) implementation for shapes and dtypes;
* eager calls run the same implementation, which launches on torch's current stream (or ``stream=``), so the
  caller's stream orders the call like any torch operator, and ``torch.cuda.graph`` captures it. Split-K scratch
  comes from torch's caching allocator (from the graph's pool while capturing). Where nothing but plain eager
  execution could observe it (no compile tracing, dispatch mode, functorch transform or autograd), the public
  functions call the implementation without the dispatcher's round trip;
* ``torch.library.opcheck`` passes for every operator;
* the functional operators take ``DTensor`` operands, with sharding rules (:mod:`cupygemm.torch.sharding`, which
  says when they are registered).

The operators are made from the kind descriptors (:mod:`cupygemm.kinds`); for a kind whose public function is
``NAME`` (``stream`` is a raw ``cudaStream_t``, -1 for torch's current stream; the kind's layout operand and static
int follow ``sfb``, e.g. ``Tensor m_indices`` or ``Tensor masked_m, int expected_m``):

* ``NAME(a, sfa, b, sfb, ..., stream=-1) -> Tensor`` (not for kinds that accumulate into ``out``);
* ``NAME_out(a, sfa, b, sfb, ..., Tensor(a!) out, stream=-1) -> ()``;
* for the forward kinds, ``NAME_packed`` and ``NAME_packed_out`` on :class:`~cupygemm.PackedWeights`: ``b`` is the
  packed bytes, and ``int[] b_shape, int base_low, int hash_bits, int[] page_words`` their layout (after the kind's
  own arguments).

Casts: ``per_token_cast_to_fp8(x, stream=-1) -> (Tensor, Tensor)`` and ``per_block_cast_to_fp8`` likewise; the fused
transpose casts ``per_token_cast_to_fp8_transposed(x, bool m_major_scales=False, stream=-1) -> (q_t, s_t)``,
``per_token_cast_to_fp8_transposed_rowwise`` (``-> (q_t, s_t, q, s)``) and
``per_block_cast_to_fp8_with_transpose(x, stream=-1) -> (q, s, q_t, s_t)``.

The GEMMs take A and B as ``float8_e4m3fn`` (or ``uint8`` bits); the casts return ``float8_e4m3fn`` and ``float32``
scales. There is no autograd formula on these operators: the differentiable layers built from them are
:func:`fp8_linear` / :class:`FP8Linear` and, for MoE experts, :func:`fp8_grouped_linear` / :class:`FP8GroupedLinear`
(:mod:`cupygemm.torch.layers`).
"""
from __future__ import annotations

from typing import Any, Callable

try:
    import torch
except ImportError as e:  # a bare "No module named" does not say that the CUDA build is the one needed
    raise type(e)("cupygemm.torch needs PyTorch with CUDA: pip install torch", name=e.name) from e

from .. import frameworks
from ..gemm import run, same_framework
from ..kinds import FORWARD, KINDS, GemmKind
from ..packing import PackedWeights
from ..quantization import BLOCK_WITH_TRANSPOSE, TRANSPOSED, TRANSPOSED_ROWWISE, fused_cast_outputs, run_cast, \
    scale_rows
from ..streams import stream_handle
from ..tensors import BF16, Framework
from ..util import ceil_div

_lib = torch.library.Library("cupygemm", "DEF")
ops = torch.ops.cupygemm

_PACKED_ARGS = ", int[] b_shape, int base_low, int hash_bits, int[] page_words"
_PACKED_COUNT = _PACKED_ARGS.count(",")
_TORCH_DTYPES = {BF16: torch.bfloat16}


def _stream(stream: int) -> Any:
    return None if stream < 0 else stream


def _extra_schema(kind: GemmKind) -> str:
    """The kind's own arguments after ``sfb``."""
    return (f", Tensor {kind.layout}" if kind.layout else "") + (f", int {kind.static}" if kind.static else "")


def _out_shape(kind: GemmKind, a: torch.Tensor, b_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The output's shape from A's and B's (the kinds whose out shape is not in them accumulate into a given out)."""
    dims = dict(zip(kind.a_dims, a.shape)) | dict(zip(kind.b_dims, b_shape))
    return tuple(dims[d] for d in kind.out_dims)


def _torch_dtype(kind: GemmKind) -> torch.dtype:
    return _TORCH_DTYPES.get(kind.out_dtype, torch.float32)


def _define(kind: GemmKind, packed: bool) -> None:
    """``NAME[_packed]`` and ``NAME[_packed]_out``: schema, CUDA implementation, fake implementation."""
    name = kind.api + ("_packed" if packed else "")
    own = _extra_schema(kind)
    args = f"Tensor a, Tensor sfa, Tensor b, Tensor sfb{own}{_PACKED_ARGS if packed else ''}"
    n_own = bool(kind.layout) + bool(kind.static)
    i_out = 4 + n_own + (_PACKED_COUNT if packed else 0)  # the _out variant's out: before stream

    def call(args: tuple, out: Any, stream: int) -> Any:
        a, sfa, b, sfb = args[:4]
        own_args = args[4:4 + n_own]
        layout = own_args[0] if kind.layout else None
        static = int(own_args[-1]) if kind.static else None
        weights = None
        if packed:
            b_shape, base_low, hash_bits, page_words = args[4 + n_own:]
            weights = PackedWeights(b, sfb, tuple(int(d) for d in b_shape), True, int(base_low), int(hash_bits),
                                    page_words=tuple(int(w) for w in page_words))
        return run(kind, a, sfa, b, sfb, out, layout, static, _stream(stream), Framework.TORCH, weights)

    # The dispatcher leaves out trailing arguments equal to their defaults: stream comes or not.
    def functional(*args: Any) -> Any:
        return call(args[:i_out], None, args[i_out] if len(args) > i_out else -1)

    def out_variant(*args: Any) -> None:
        call(args[:i_out], args[i_out], args[i_out + 1] if len(args) > i_out + 1 else -1)

    def fake(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, *rest: Any) -> torch.Tensor:
        b_shape = tuple(rest[n_own]) if packed else tuple(b.shape)
        return a.new_empty(_out_shape(kind, a, b_shape), dtype=_torch_dtype(kind))

    def fake_out(*args: Any) -> None:
        return None

    if not kind.accumulates:
        _lib.define(f"{name}({args}, int stream=-1) -> Tensor")
        _lib.impl(name, functional, "CUDA")
        torch.library.register_fake(f"cupygemm::{name}", fake, lib=_lib)
    _lib.define(f"{name}_out({args}, Tensor(a!) out, int stream=-1) -> ()")
    _lib.impl(f"{name}_out", out_variant, "CUDA")
    torch.library.register_fake(f"cupygemm::{name}_out", fake_out, lib=_lib)


def _define_cast(name: str) -> None:
    _lib.define(f"{name}(Tensor x, int stream=-1) -> (Tensor, Tensor)")

    def impl(x, stream=-1):
        return run_cast(name, x, _stream(stream), Framework.TORCH)

    def fake(x, stream=-1):
        m, n = x.shape
        return (x.new_empty((m, n), dtype=torch.float8_e4m3fn),
                x.new_empty((scale_rows(name, m), ceil_div(n, 128)), dtype=torch.float32))

    _lib.impl(name, impl, "CUDA")
    torch.library.register_fake(f"cupygemm::{name}", fake, lib=_lib)


_TORCH_CAST_DTYPES = {"float8_e4m3fn": torch.float8_e4m3fn, "float32": torch.float32}


def _define_fused_cast(name: str, results: int, takes_layout: bool) -> None:
    """A fused cast (:func:`cupygemm.quantization.fused_cast_outputs` lists its results, shapes and layouts)."""
    layout_arg = "bool m_major_scales=False, " if takes_layout else ""
    _lib.define(f"{name}(Tensor x, {layout_arg}int stream=-1) -> ({', '.join(['Tensor'] * results)})")

    def split(args: tuple) -> tuple[bool, int]:
        if takes_layout:
            return bool(args[0]) if args else False, args[1] if len(args) > 1 else -1
        return False, args[0] if args else -1

    def impl(x, *args):
        m_major, stream = split(args)
        return run_cast(name, x, _stream(stream), Framework.TORCH, m_major)

    def fake(x, *args):
        m_major, _ = split(args)
        outs = []
        for o in fused_cast_outputs(name, x.shape[0], x.shape[1], m_major):
            buf = x.new_empty(o.buffer, dtype=_TORCH_CAST_DTYPES[o.dtype.name])
            outs.append(buf if o.buffer == o.shape else buf[:, :o.shape[0]].T)
        return tuple(outs)

    _lib.impl(name, impl, "CUDA")
    torch.library.register_fake(f"cupygemm::{name}", fake, lib=_lib)


for _kind in KINDS:
    _define(_kind, packed=False)
    if _kind.family == FORWARD:
        _define(_kind, packed=True)
_define_cast("per_token_cast_to_fp8")
_define_cast("per_block_cast_to_fp8")
_define_fused_cast(TRANSPOSED, 2, True)
_define_fused_cast(TRANSPOSED_ROWWISE, 4, True)
_define_fused_cast(BLOCK_WITH_TRANSPOSE, 4, False)


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


class _TorchAdapter:
    """The core's way into this module (:mod:`cupygemm.frameworks`)."""

    @staticmethod
    def gemm(kind: GemmKind, a: Any, sfa: Any, b: Any, sfb: Any, out: Any, layout: Any, static: int | None,
             stream: Any, packed: PackedWeights | None) -> Any:
        if _plain_eager(a, sfa, b, sfb, out, layout):
            return run(kind, a, sfa, b, sfb, out, layout, static, stream, Framework.TORCH, packed)
        _check_torch(a, sfa, b, sfb, out, layout)
        _dtensor_rules()
        own = ((layout,) if kind.layout else ()) + ((static,) if kind.static else ())
        name = kind.api
        if packed is not None:
            name += "_packed"
            own += (list(packed.shape), packed.base_low, packed.hash_bits, list(packed.page_words))
        if out is None:
            return getattr(ops, name).default(a, sfa, b, sfb, *own, _handle(stream))
        getattr(ops, name + "_out").default(a, sfa, b, sfb, *own, out, _handle(stream))
        return out

    @staticmethod
    def cast(entry: str, x: Any, stream: Any, m_major_scales: bool = False) -> tuple[Any, ...]:
        if _plain_eager(x):
            return run_cast(entry, x, stream, Framework.TORCH, m_major_scales)
        _dtensor_rules()
        if entry in (TRANSPOSED, TRANSPOSED_ROWWISE):
            return getattr(ops, entry).default(x, m_major_scales, _handle(stream))
        return getattr(ops, entry).default(x, _handle(stream))


frameworks.register(Framework.TORCH, _TorchAdapter())


def _public(kind: GemmKind) -> Callable[..., Any]:
    """The torch route of one kind's public function (same arguments as ``cupygemm.<kind.api>`` less ``stream``
    keyword handling), for callers holding torch tensors who want the operators explicitly."""
    def route(a, sfa, b, sfb, out=None, *own, stream=None):
        layout = own[0] if kind.layout else None
        static = own[-1] if kind.static else None
        return _TorchAdapter.gemm(kind, a, sfa, b, sfb, out, layout, static, stream, None)

    route.__name__ = kind.api
    route.__doc__ = f"The torch route of :func:`cupygemm.{kind.api}` ({kind.summary})."
    return route


for _kind in KINDS:
    globals()[_kind.api] = _public(_kind)


# The layers use the operators defined above.
from .layers import FP8GroupedLinear, FP8Linear, fp8_grouped_linear, fp8_linear  # noqa: E402,F401
# DTensor operands: the operators' sharding rules (cupygemm.sharding's, as JAX's partitioner applies them), now if
# DTensor is loaded, else when a call first sees a tensor subclass.
from .sharding import register_if_loaded as _dtensor_rules  # noqa: E402

_dtensor_rules()
