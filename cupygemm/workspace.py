"""Scratch memory of split-K across CTAs (``GemmConfig.k_slices > 1``) and of the stream-K tail
(``GemmConfig.stream_k``): FP32 partial tiles and arrival counters, one set per (device, stream).

Kernels on one stream run in order, so they can share a set; kernels on different streams may overlap, so each
stream gets its own. The counters start at zero and every kernel leaves them at zero (the last CTA of a tile
resets its counter). Sets are freed least recently used first beyond ``MAX_SETS`` streams; CuPy's memory pool
hands freed memory out again only in that stream's order. A set used while its stream is being captured into a
CUDA graph is kept for the life of the process (the graph holds its addresses), as are the arrays it outgrows.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from .config import GemmConfig
from .layout import ceil_div

MAX_SETS = 64
MAX_PARTIALS = 1 << 30  # floats (4 GiB)


@dataclass
class _Scratch:
    partials: Any  # cupy float32 array
    counters: Any  # cupy uint32 array, all zero between kernels
    pinned: bool = False  # captured into a CUDA graph: never freed
    outgrown: list = field(default_factory=list)  # pinned arrays this set has replaced


_lock = threading.Lock()
_sets: OrderedDict[tuple[int, int], _Scratch] = OrderedDict()
_pinned: list[_Scratch] = []  # evicted pinned sets, kept alive


def scratch_sizes(cfg: GemmConfig, m: int) -> tuple[int, int]:
    """(FP32 partials, uint32 counters) a launch of ``cfg`` on M rows needs; (0, 0) without K slices or stream-K."""
    if cfg.stream_k:
        # One partial tile per CTA (its piece of a tail unit); a counter per tail tile and row group
        # (cuda_src/scheduler.cuh).
        return cfg.num_sms * cfg.block_m * cfg.block_n, cfg.num_sms * cfg.num_math_wg
    if cfg.k_slices <= 1:
        return 0, 0
    tiles = ceil_div(m, cfg.block_m) * ceil_div(cfg.shape_n, cfg.block_n)
    n_partials = tiles * cfg.k_slices * cfg.block_m * cfg.block_n
    if n_partials > MAX_PARTIALS:  # the kernel indexes the scratch with 32-bit offsets
        raise ValueError(f"k_slices={cfg.k_slices} on M={m}, N={cfg.shape_n} with {cfg.block_m}x{cfg.block_n} tiles "
                         f"needs {n_partials * 4 / 2**30:.1f} GiB of split-K scratch (at most "
                         f"{MAX_PARTIALS * 4 / 2**30:.0f} GiB); use fewer k_slices or none for a problem this large")
    return n_partials, tiles * cfg.num_math_wg


def split_k_scratch(cfg: GemmConfig, m: int, device_id: int, stream: object) -> tuple[int, int]:
    """Device pointers (partials, counters) for a launch of ``cfg`` on ``stream`` (a cupy Stream, the current one);
    (0, 0) if unused.

    Call with ``device_id`` current. The first call on a stream allocates (not capturable in a CUDA graph: run
    the GEMM once before capturing it, as is needed anyway to load the kernel)."""
    n_partials, n_counters = scratch_sizes(cfg, m)
    if n_partials == 0:
        return 0, 0
    import cupy

    key = (device_id, stream.ptr)
    with _lock:
        s = _sets.get(key)
        if s is None or s.partials.size < n_partials or s.counters.size < n_counters:
            # Grow with headroom so a few larger problems do not each reallocate.
            p_size = max(n_partials, 0 if s is None else s.partials.size) * 5 // 4
            c_size = max(n_counters, 0 if s is None else s.counters.size) * 5 // 4
            new = _Scratch(cupy.empty(p_size, dtype=cupy.float32), cupy.zeros(c_size, dtype=cupy.uint32))
            if s is not None and s.pinned:
                new.pinned = True
                new.outgrown = s.outgrown + [s.partials, s.counters]
            _sets[key] = s = new
        _sets.move_to_end(key)
        if stream.is_capturing():
            s.pinned = True
        while len(_sets) > MAX_SETS:
            _, old = _sets.popitem(last=False)
            if old.pinned:
                _pinned.append(old)
        return s.partials.data.ptr, s.counters.data.ptr
