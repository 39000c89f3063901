"""Integer helpers shared by the host modules."""
from __future__ import annotations


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints, ``b > 0`` (unchecked: the public, checked one is :func:`cupygemm.layout.ceil_div`)."""
    return (a + b - 1) // b


def round_up(a: int, b: int) -> int:
    """``a`` rounded up to a multiple of ``b``."""
    return (a + b - 1) // b * b
