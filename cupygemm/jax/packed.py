"""Packed (L2-side-aware) weights in JAX: :class:`~cupygemm.PackedWeights` as a pytree, and unpacking a ``b``.

The class is registered as a pytree here (leaves: the packed bytes and the scales; the layout is static), so packed
weights pass through ``jit`` and ``scan`` as an argument. :func:`unpack` turns a ``b`` argument into the operands
of the custom call and, for side-aware weights, the static :class:`PackedSpec` their launch needs.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

from ..packing import PackedLayout, PackedWeights


class PackedSpec(NamedTuple):
    """What a side-aware launch needs of packed weights besides their bytes: static under ``jit``."""

    shape: tuple[int, ...]  # B's
    data_offset: int
    launch_sides: tuple[int, ...]  # PackedWeights.launch_sides


def _flatten(p: PackedWeights) -> tuple[tuple[Any, Any], tuple]:
    return (p.data, p.scales), (p.shape, p.side_aware, p.base_low, p.hash_bits, p.data_offset, p.page_words)


def _unflatten(aux: tuple, leaves: tuple[Any, Any]) -> PackedWeights:
    return PackedWeights(leaves[0], leaves[1], *aux)


jax.tree_util.register_pytree_node(PackedWeights, _flatten, _unflatten)


def unpack(b: Any, sfb: Any) -> tuple[Any, Any, PackedSpec | None]:
    """``(b, sfb, spec)``: plain weights as given (spec None), or packed weights' bytes and scales and their spec;
    weights that fell back to plain B (no side info) as ``(B, SFB)``. B's shape is checked by the kind's check."""
    if not isinstance(b, PackedWeights):
        return b, sfb, None
    if sfb is not None:
        raise TypeError("sfb: packed weights carry their scales; pass sfb=None with PackedWeights as b")
    if not b.side_aware:
        return b.data, b.scales, None
    lay = PackedLayout(b.shape[-2], b.shape[-1])
    groups = b.shape[0] if len(b.shape) == 3 else 1
    if not hasattr(b.data, "shape") or not hasattr(b.data, "dtype"):
        raise TypeError(f"b.data: expected a JAX array, got {type(b.data).__name__}")
    shape, dtype = tuple(int(d) for d in b.data.shape), np.dtype(b.data.dtype)
    need = b.data_offset + lay.buffer_bytes(b.base_low, groups)
    if dtype != np.uint8 or len(shape) != 1 or shape[0] < need:
        raise ValueError(f"b.data: packed weights {b.shape} need a uint8 vector of at least {need} bytes, got "
                         f"{dtype} {shape}")
    return b.data, b.scales, PackedSpec(tuple(b.shape), b.data_offset, b.launch_sides)
