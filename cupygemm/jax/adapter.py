"""The core's way into cupygemm.jax (:mod:`cupygemm.frameworks`): the eager entry points' JAX arrays come here.

``cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))`` and the other public functions hand JAX arrays to
:class:`JaxAdapter`, which calls the kind's :mod:`cupygemm.jax` function (so the call is a custom call on XLA's
stream, ordered like any JAX computation); the casts likewise.
"""
from __future__ import annotations

from typing import Any

from .. import frameworks
from ..gemm import same_framework
from ..kinds import GemmKind
from ..packing import PackedWeights
from ..tensors import Framework
from . import casts
from .calls import has_out
from .frontend import public


def _no_stream(stream: Any) -> None:
    if stream is not None:
        raise TypeError("stream: JAX calls run on XLA's stream, in JAX's order; stream= is for CuPy and torch")


class JaxAdapter:
    """What :mod:`cupygemm.frameworks` asks of a framework's adapter, for JAX arrays."""

    @staticmethod
    def gemm(kind: GemmKind, a: Any, sfa: Any, b: Any, sfb: Any, out: Any, layout: Any, static: int | None,
             stream: Any, packed: PackedWeights | None) -> Any:
        _no_stream(stream)
        same_framework(a, sfa, b, sfb, out, layout)
        own = ((layout,) if kind.layout else ()) + ((static,) if kind.static else ())
        if out is not None and not has_out(kind):
            raise TypeError("out: JAX arrays are immutable, so a dense GEMM cannot write into one; call without out "
                            "and use the result")
        b_arg, sfb_arg = (packed, None) if packed is not None else (b, sfb)
        return public(kind)(a, sfa, b_arg, sfb_arg, *own, **({} if out is None else {"out": out}))

    @staticmethod
    def cast(entry: str, x: Any, stream: Any, m_major_scales: bool = False) -> tuple[Any, ...]:
        _no_stream(stream)
        if m_major_scales:
            raise TypeError("m_major_scales: JAX arrays have no strides, so the scales come row-major; cupygemm.jax's "
                            "GEMMs take them as they are")
        return getattr(casts, entry)(x)


frameworks.register(Framework.JAX, JaxAdapter())
