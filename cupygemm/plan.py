"""Launch plans: everything about a GEMM launch that does not depend on the operands' addresses, made once.

A :class:`GemmPlan` is one problem shape's launch: the config (chosen by :mod:`cupygemm.config`), the loaded kernel
(:mod:`cupygemm.kernels`) and the launch values the kernel's contract (:mod:`cupygemm.contract`) gives for that config
and shape: grid, block, shared memory, TMA map layouts, scalar arguments, scratch sizes. A call then only supplies
device pointers and a stream: :meth:`GemmPlan.launch` encodes the TMA maps for new pointers (cached per plan, so a
call on the same buffers packs nothing) and launches with ``cuLaunchKernel`` (``cuLaunchKernelEx`` with
programmatic dependent launch, ``CUPYGEMM_PDL``).

Plans are made by :func:`plan_gemm` (memoized) from static sizes and strides alone, so the JAX integration can
make them at trace time; the eager entry points (:mod:`cupygemm.gemm`) cache them per call signature.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from . import contract, l2, tma
from .config import GemmConfig, b_evict_first, choose_config, config_version, model_rows, side_aware_config
from .contract import TmaSpec
from .device import ensure_context, get_num_sms, require_hopper
from .env import B_EVICT_FIRST, B_PREFETCH, PDL, b_prefetch_bytes, pdl_enabled, setting_key
from .errors import CupygemmDeviceError
from .jit.build import LoadedKernel
from .jit.loader import PackedParams
from .kernels import get_gemm_kernel
from .launch import Launcher
from .util import ceil_div

# Pointer sets remembered per plan, the oldest forgotten first. A serving loop cycles through a few buffers; a JAX
# scan whose operand XLA passes as a slice of a stacked array (benchmarks/NOTES.md, "JAX and XLA command buffers")
# through one per step.
_PACKED_LIMIT = 512
#: page_sides of a plain launch (no packed weights): base_low, hash bits, four page-bit words.
NO_PAGE_SIDES = (0,) * 6


@dataclass
class GemmPlan:
    """One GEMM problem's launch, less the operands' addresses. See the module docstring."""

    kind: Any  # the GemmKind (cupygemm.kinds)
    m: int
    n: int
    k: int
    num_groups: int
    device: int
    cfg: GemmConfig
    kernel: LoadedKernel
    launcher: Launcher
    grid: int
    threads: int
    smem_bytes: int
    sfa_m_pad: int  # SFA is read M-major: [G][ceil(K/128)][sfa_m_pad] float32
    scratch_floats: int  # FP32 partial tiles the launch needs (0: none)
    scratch_counters: int  # uint32 tile counters, zero at launch (0: none)
    tmaps: tuple[TmaSpec, TmaSpec, TmaSpec, TmaSpec, TmaSpec]  # A, A's tail, B, SFA, D
    scalars: tuple[int, int, int, int]  # shape_m, num_groups, ld_d (elements), b_evict_first
    pdl: bool = False  # launched with programmatic dependent launch (the kernel is the PDL variant)
    side_map: bytes = b""  # side-aware (cfg.sides): the SM side map, and the clusters that work on half 0 of N
    side_clusters0: int = 0
    _packed: PackedParams = field(default_factory=lambda: PackedParams(_PACKED_LIMIT), repr=False)
    _spans: tuple[int, ...] | None = field(default=None, repr=False)  # the operands' byte extents, made on first use

    def launch(self, stream: int, a: int, sfa: int, b: int, sfb: int, d: int, layout: int = 0, partials: int = 0,
               counters: int = 0, zero_counters: bool = False, page_sides: tuple[int, ...] = NO_PAGE_SIDES,
               tickets: int = 0) -> None:
        """Launch on ``stream`` over the given device pointers.

        ``layout``: m_indices (contiguous) or masked_m (masked). ``partials``/``counters``: scratch of
        :attr:`scratch_floats` floats and :attr:`scratch_counters` uint32, the counters zero unless
        ``zero_counters`` (then they are cleared on ``stream`` first; capturable in a CUDA graph). ``page_sides``
        (side-aware plans; ``b`` is the packed data): the packed weights' (base_low, hash_bits, four page-bit
        words), :attr:`cupygemm.packing.PackedWeights.launch_sides`. ``tickets`` (side-aware plans): the ticket
        set :meth:`cupygemm.workspace.BufferSet.next_tickets` gave this launch, drawn before a PDL kernel's wait;
        0: the last :data:`~cupygemm.contract.SIDE_TICKET_COUNTERS` of ``counters``, drawn after it.
        """
        if self.scratch_floats and not (partials and counters):
            raise ValueError(f"this launch needs scratch ({self.scratch_floats} floats, {self.scratch_counters} "
                             "counters)")
        if zero_counters and self.scratch_counters:
            ensure_context(self.device)  # the memset, a driver call, comes before the launcher's own check
            _memset_u32(counters, self.scratch_counters, stream)
        ptrs = (a, sfa, b, sfb, d, layout, partials, counters, tickets, *page_sides)
        params = self._packed.get(ptrs)
        if params is None:
            params = self._pack(ptrs, bind_context=True)
        if self.pdl:
            self.launcher.launch_pdl(params, self.grid, self.threads, self.smem_bytes, stream)
        else:
            self.launcher.launch(params, self.grid, self.threads, self.smem_bytes, stream)

    def bind(self, a: int, sfa: int, b: int, sfb: int, d: int, layout: int = 0, partials: int = 0, counters: int = 0,
             zero_counters: bool = False, page_sides: tuple[int, ...] = NO_PAGE_SIDES) -> Callable[[int], None]:
        """:meth:`launch` on these pointers as a function of the stream: the checks and the packing done now, so
        that a call queues the counters' memset (``zero_counters``) and the kernel and does nothing else. For a
        caller that launches one pointer set again and again and keeps the result (the XLA FFI handler)."""
        if self.scratch_floats and not (partials and counters):
            raise ValueError(f"this launch needs scratch ({self.scratch_floats} floats, {self.scratch_counters} "
                             "counters)")
        ptrs = (a, sfa, b, sfb, d, layout, partials, counters, 0, *page_sides)
        params = self._packed.get(ptrs)
        if params is None:
            params = self._pack(ptrs)
        launch = self.launcher.bound(params, self.grid, self.threads, self.smem_bytes, self.pdl)
        if not (zero_counters and self.scratch_counters):
            return launch
        # The memset's constant arguments as ctypes values: converting Python ints costs more than the call.
        memset = _memset_gil_fn()
        ptr, zero, count = ctypes.c_uint64(counters), ctypes.c_uint(0), ctypes.c_size_t(self.scratch_counters)

        def fire(stream: int) -> None:
            res = memset(ptr, zero, count, stream)
            if res != 0:
                raise CupygemmDeviceError(f"cuMemsetD32Async failed (CUresult {res})")
            launch(stream)
        return fire

    def _pack(self, ptrs: tuple[int, ...], bind_context: bool = False) -> object:
        """The launch parameters of a pointer set, made once. ``bind_context``: bind the device's context to this
        thread first (encoding the TMA maps is a driver call too; XLA's threads have theirs bound)."""
        a, sfa, b, sfb, d, layout, partials, counters, tickets, *page_sides = ptrs
        self._check_out_overlap(a, sfa, b, sfb, d, layout)
        if bind_context:
            ensure_context(self.device)
        tmaps = tuple(spec.encode(p) for spec, p in zip(self.tmaps, (a, a, b, sfa, d)))
        # In the order of contract.GEMM_PARAM_NAMES (and SIDE_PARAM_NAMES: B is the packed weights).
        if self.side_map and not tickets:
            if not counters:
                raise ValueError("a side-aware launch needs its ticket counters (tickets or counters)")
            tickets_at = counters + 4 * (self.scratch_counters - contract.SIDE_TICKET_COUNTERS)
        else:
            tickets_at = tickets
        sides = () if not self.side_map else (
            self.side_map, b, tickets_at, self.side_clusters0, *page_sides, int(tickets != 0))
        params = self.launcher.pack(tmaps + (sfb, layout, d, partials, counters) + self.scalars + sides)
        return self._packed.put(ptrs, params)


    def _check_out_overlap(self, a: int, sfa: int, b: int, sfb: int, d: int, layout: int) -> None:
        """ValueError when D's bytes overlap an input's: the kernel would read what it writes (``out`` a view of A,
        say), which is always a bug. Run once per pointer set (launches on known pointers skip it)."""
        spans = self._spans
        if spans is None:
            spans = self._spans = _operand_spans(self)
        d_end = d + spans[4]
        for name, ptr, size in (("lhs[0] (A)", a, spans[0]), ("lhs[1] (A scales)", sfa, spans[1]),
                                ("rhs[0] (B)", b, spans[2]), ("rhs[1] (B scales)", sfb, spans[3]),
                                (self.kind.layout, layout, spans[5])):
            if size and spans[4] and ptr < d_end and d < ptr + size:
                raise ValueError(f"out: its memory [0x{d:x}, 0x{d_end:x}) overlaps {name}'s [0x{ptr:x}, "
                                 f"0x{ptr + size:x}); pass an output that shares no memory with the inputs")


def _span(spec: TmaSpec, item: int) -> int:
    """Bytes from the first to past the last element a TMA map's tensor covers (0 when it is empty)."""
    if 0 in spec.dims:
        return 0
    return spec.dims[0] * item + sum((d - 1) * s for d, s in zip(spec.dims[1:], spec.strides))


def _operand_spans(plan: "GemmPlan") -> tuple[int, ...]:
    """The byte extents of A, SFA (as the kernel reads it), B, SFB, D and the layout operand of ``plan``."""
    a, _, b, sfa, d = plan.tmaps
    kb = ceil_div(plan.k, 128)
    layout = plan.m if plan.kind.layout == "m_indices" else plan.num_groups if plan.kind.layout else 0
    sfb = plan.num_groups * ceil_div(plan.n, 128) * kb * 4 if plan.kind.b_block_scales else _span(sfa, 4)
    return (_span(a, 1), _span(sfa, 4), _span(b, 1), sfb, _span(d, plan.kind.out_dtype.itemsize), 4 * layout)


@functools.lru_cache(maxsize=1)
def _memset_fn():
    fn = tma.driver().cuMemsetD32Async
    fn.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


@functools.lru_cache(maxsize=1)
def _memset_gil_fn():
    """cuMemsetD32Async called with the GIL held (for :meth:`GemmPlan.bind`): it only queues the memset, so
    releasing the GIL around it would just let another Python thread take it and make the caller wait."""
    fn = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p)
    return fn(ctypes.cast(tma.driver().cuMemsetD32Async, ctypes.c_void_p).value)


def _memset_u32(ptr: int, count: int, stream: int) -> None:
    res = _memset_fn()(ptr, 0, count, stream)
    if res != 0:
        raise CupygemmDeviceError(f"cuMemsetD32Async failed (CUresult {res})")


def plan_gemm(kind: Any, m: int, n: int, k: int, num_groups: int, device_id: int, *, expected_m: int | None = None,
              a_strides: tuple[int, ...] | None = None, b_strides: tuple[int, ...] | None = None,
              d_strides: tuple[int, ...] | None = None, sides: bool = False, sfa_m_pad: int = 0, sfb_m_pad: int = 0,
              scale_rows: int = 0) -> GemmPlan:
    """The launch plan of a GEMM whose operands are already validated (see :mod:`cupygemm.validate`).

    ``kind``: a :class:`cupygemm.kinds.GemmKind` (or its name). ``m``: rows (normal, contiguous) or max rows per group
    (masked). Strides are in bytes, outermost first, as the arrays have them (None: C-contiguous). Chooses the
    config, builds and loads the kernel on ``device_id``
    (so the first call for a shape compiles); memoized on everything it depends on. ``sides``: B is packed
    side-aware (:mod:`cupygemm.packing`), for the device whose side info :mod:`cupygemm.l2` holds.

    The 1D1D kinds (wgrad, k-grouped wgrad) get a :class:`cupygemm.plan_wgrad.WgradPlan`, which launches alike;
    ``sfa_m_pad``/``sfb_m_pad`` are their scales' row strides as the kernel reads them (default: the rows rounded
    up to 4) and ``scale_rows`` the k-grouped kind's stacked scale rows.
    """
    from .kinds import FORWARD, kind_named

    kind = kind_named(kind)
    if kind.family != FORWARD:
        from . import plan_wgrad

        pad = lambda rows: ((rows + 3) // 4) * 4  # noqa: E731
        return plan_wgrad.plan(kind, m, n, k, num_groups, device_id, a_strides, b_strides, d_strides,
                               sfa_m_pad or pad(m), sfb_m_pad or pad(n), scale_rows)
    dims = {"G": num_groups, "M": m, "N": n, "K": k}
    return _plan(kind, m, n, k, num_groups, device_id, model_rows(kind.kid, m, expected_m),
                 _strides(a_strides, tuple(dims[d] for d in kind.a_dims), 1),
                 _strides(b_strides, tuple(dims[d] for d in kind.b_dims), 1),
                 _strides(d_strides, tuple(dims[d] for d in kind.out_dims), kind.out_dtype.itemsize),
                 get_num_sms(device_id), config_version(), b_evict_first_mode(), pdl_mode(), sides)


def b_evict_first_mode() -> object:
    """The setting :func:`cupygemm.config.b_evict_first` reads (part of a plan's key)."""
    return setting_key(B_EVICT_FIRST)


def pdl_mode() -> object:
    """The PDL settings as :func:`cupygemm.env.pdl_enabled` and :func:`cupygemm.env.b_prefetch_bytes` read them
    (part of a plan's key)."""
    return setting_key(PDL), setting_key(B_PREFETCH)


#: A's rows up to which PDL kernels on packed weights prefetch B before the wait: the M = 64 decode chain took
#: 1.5-2.5 % less time with it, the M = 128 chain 1-2 % more (benchmarks/NOTES.md, "PDL").
B_PREFETCH_MAX_ROWS = 64


def b_prefetch(pdl: bool, sides: bool, rows: int) -> int:
    """Bytes of B a PDL kernel fetches into L2 before it waits for the kernel before it (cuda_src/b_prefetch.cuh).
    Only packed weights: they are constant until repacked (:func:`cupygemm.pack_weights`), so no kernel before this
    one on the stream writes them. A plain B may be the output of that kernel (an optimizer step, a cast).
    ``rows``: A's rows the config was chosen for (masked: the expected rows per group)."""
    return b_prefetch_bytes() if pdl and sides and rows <= B_PREFETCH_MAX_ROWS else 0


def kernel_choice(kind_id: int, rows: int, n: int, k: int, num_groups: int, num_sms: int, smem_limit: int,
                  max_m: int | None, sides: bool, pdl: bool) -> tuple[GemmConfig, int]:
    """The config a forward GEMM's kernel is built from, and its bytes of B fetched before the PDL wait
    (:func:`b_prefetch`): the chooser's pick, made side-aware for packed weights (``sides``). Calls and warm-ups
    (:func:`cupygemm.serving.plan`) both take it from here."""
    cfg = choose_config(kind_id, rows, n, k, num_groups, num_sms, smem_limit=smem_limit, max_m=max_m, sides=sides)
    if sides:
        cfg = side_aware_config(cfg, num_sms, smem_limit)
    return cfg, b_prefetch(pdl, sides, rows)


def _strides(given: tuple[int, ...] | None, shape: tuple[int, ...], item: int) -> tuple[int, ...]:
    if given is not None:
        return tuple(int(s) for s in given)
    out, acc = [], item
    for d in reversed(shape):
        out.insert(0, acc)
        acc *= max(d, 1)
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _plan(kind: Any, m: int, n: int, k: int, num_groups: int, device_id: int, rows: int, a_strides: tuple[int, ...],
          b_strides: tuple[int, ...], d_strides: tuple[int, ...], num_sms: int, _config_version: int,
          _evict_mode: str, _pdl_mode: object, sides: bool = False) -> GemmPlan:
    import cupy

    with cupy.cuda.Device(device_id):
        info = require_hopper()
        evict_b = b_evict_first(num_groups, n, k, info.l2_bytes, info.name)
        side_map, clusters0 = b"", 0
        if sides:
            side = l2.side_info(device_id)
            if side is None:
                raise CupygemmDeviceError(f"weights packed side-aware, but device {device_id} has no L2 side info "
                                          f"({l2.unavailable_reason(device_id)}); pack them on this device")
        pdl = pdl_enabled()
        cfg, prefetch = kernel_choice(kind.kid, rows, n, k, num_groups, num_sms, info.max_smem_per_block,
                                      m if kind.static == "expected_m" else None, sides, pdl)
        kernel = get_gemm_kernel(cfg, device_id, pdl, prefetch)
        # PDL launches go through cuLaunchKernelEx with the packed parameters, which needs a driver that reports
        # the parameter layout (CUDA >= 12.4); elsewhere the PDL variant runs as a plain launch (its waits are no-ops).
        pdl = pdl and hasattr(kernel.launcher, "launch_pdl")
    c = contract.launch_contract(cfg, m, n, k, num_groups, a_strides, b_strides, d_strides, evict_b)
    grid = contract.grid(cfg, kernel.max_clusters)
    if sides:
        side_map = side.side_map()
        clusters0 = contract.side_clusters0(cfg, grid, side.counts[0], sum(side.counts),
                                            contract.side_unit_tiles(cfg, m, num_groups))
    return GemmPlan(kind, m, n, k, num_groups, device_id, cfg, kernel, kernel.launcher, grid, c.threads,
                    c.smem_bytes, c.sfa_m_pad, c.scratch_floats, c.scratch_counters, c.tmaps, c.scalars, pdl,
                    side_map, clusters0)


def clear() -> None:
    """Forget every plan (tests; after the kernel cache was cleared)."""
    _plan.cache_clear()

