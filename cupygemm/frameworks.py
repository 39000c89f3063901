"""How the core reaches the framework adapters, which depend on it and never the other way round.

The entry points take CuPy arrays and any DLPack producer themselves. torch tensors and JAX arrays go to their
framework's adapter: ``cupygemm.torch`` (``torch.library`` operators, so ``torch.compile`` and autograd's dispatch see
one opaque op) and ``cupygemm.jax`` (XLA FFI custom calls on XLA's stream). An adapter module registers itself here
when it is imported; the core imports it the first time that framework's tensors reach an entry point (a caller
holding a torch tensor has imported torch already), so ``import cupygemm`` imports neither framework.
"""
from __future__ import annotations

from importlib import import_module
from typing import Any, Protocol

from .tensors import Framework

#: The adapter module of each framework that has one.
_MODULES = {Framework.TORCH: "cupygemm.torch", Framework.JAX: "cupygemm.jax"}
_adapters: dict[Framework, "Adapter"] = {}


class Adapter(Protocol):
    """What the core asks of a framework's adapter."""

    def gemm(self, kind: Any, a: Any, sfa: Any, b: Any, sfb: Any, out: Any, layout: Any, static: int | None,
             stream: Any, packed: Any) -> Any:
        """One GEMM of ``kind`` (a :class:`cupygemm.kinds.GemmKind`) on this framework's tensors; ``packed``: the
        :class:`~cupygemm.PackedWeights` whose data and scales are ``b`` and ``sfb`` (else None)."""

    def cast(self, entry: str, x: Any, stream: Any, **options: Any) -> tuple[Any, ...]:
        """One FP8 cast (``entry``: a :mod:`cupygemm.quantization` entry point) of a tensor of this framework."""


def register(framework: Framework, adapter: Adapter) -> None:
    """Called by an adapter module when it is imported."""
    _adapters[framework] = adapter


def adapter(framework: Framework) -> Adapter:
    """The adapter of ``framework`` (TORCH or JAX), importing its module on first use."""
    found = _adapters.get(framework)
    if found is None:
        import_module(_MODULES[framework])
        found = _adapters[framework]
    return found
