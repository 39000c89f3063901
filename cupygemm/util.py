"""Helpers shared by the host modules: integer arithmetic, and the bounded caches of launch parameters."""
from __future__ import annotations

import threading
from typing import Hashable, TypeVar

_V = TypeVar("_V")
_keep_lock = threading.Lock()


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints, ``b > 0`` (unchecked: the public, checked one is :func:`cupygemm.layout.ceil_div`)."""
    return (a + b - 1) // b


def round_up(a: int, b: int) -> int:
    """``a`` rounded up to a multiple of ``b``."""
    return (a + b - 1) // b * b


def keep_newest(entries: dict, key: Hashable, value: _V, limit: int) -> _V:
    """``entries[key] = value``, the oldest entries dropped first to stay within ``limit`` (a cache cleared whenever
    full would miss on every call of a cycle longer than the limit), and return ``value``. Under a lock: threads
    that missed at once each dropped "the oldest" on their own, and the dict lost a key twice (KeyError) or grew
    past the limit. Readers take no lock (a dict lookup)."""
    with _keep_lock:
        while len(entries) >= limit:
            del entries[next(iter(entries))]
        entries[key] = value
    return value
