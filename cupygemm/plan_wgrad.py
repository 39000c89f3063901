"""Launch plans of the 1D1D kernel's kinds (wgrad, k-grouped wgrad): as :mod:`cupygemm.plan` for the forward kernel.

A :class:`WgradPlan` is one problem's launch less the operands' addresses: the config
(:func:`cupygemm.contract_wgrad.choose_wgrad_config`), the loaded kernel, and the launch values the kernel's contract
(:mod:`cupygemm.contract_wgrad`) gives. Its :meth:`~WgradPlan.launch` takes the same arguments as a forward plan's,
so the call path (:mod:`cupygemm.gemm`) and the JAX custom calls treat both alike: the layout operand is the
k-grouped kind's ``batch_sizes``, and the "partials" scratch is the workspace the k-grouped prep kernel writes the
groups' TMA maps into (launched on the same stream just before the GEMM, so a CUDA graph replay reads the sizes of
the moment).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from . import contract_wgrad as cw
from .contract import TmaSpec
from .device import ensure_context, get_num_sms, require_hopper
from .jit.loader import PackedParams, SmallKernel, load
from .jit.source import KernelSource, render
from .util import ceil_div

_PACKED_LIMIT = 512


def wgrad_source(cfg: cw.WgradConfig) -> KernelSource:
    """The rendered GEMM kernel of ``cfg`` (compiles without a GPU)."""
    return render(cw.WGRAD_FILE, cw.WGRAD_ENTRY, cw.defines(cfg))


def prep_source() -> KernelSource:
    """The rendered k-grouped prep kernel (compiles without a GPU)."""
    return render(cw.PREP_FILE, cw.PREP_ENTRY, {})


_PREP = SmallKernel(prep_source, cw.PREP_PARAMS)


def get_wgrad_kernel(cfg: cw.WgradConfig, device: int) -> Any:
    """The loaded GEMM kernel of ``cfg`` on ``device`` (and, for clusters, how many fit at once)."""
    k = load(device, wgrad_source(cfg), cw.WGRAD_PARAMS, config=cfg, dynamic_smem=cfg.smem_bytes)
    if cfg.cluster_size > 1 and not k.max_clusters:
        from .jit.build import relaxed_capture
        from .kernels import max_active_clusters

        with relaxed_capture():
            k.max_clusters = max_active_clusters(k, cfg) or cfg.num_sms // cfg.cluster_size
    return k


@dataclass
class WgradPlan:
    """One 1D1D problem's launch, less the operands' addresses."""

    kind: Any  # the GemmKind
    m: int
    n: int
    k: int  # dense: K; k-grouped: the tokens the operands hold (the groups' sizes come on the device)
    num_groups: int
    device: int
    cfg: cw.WgradConfig
    kernel: Any
    grid: int
    threads: int
    smem_bytes: int
    sfa_m_pad: int  # the A scales' row stride as the kernel reads them: [kb][sfa_m_pad]
    sfb_m_pad: int
    scratch_floats: int  # the k-grouped workspace, in floats (0: none)
    tmaps: tuple[TmaSpec, ...]  # A, B, SFA, SFB, D
    scale_rows: int = 0  # k-grouped: the stacked scales' rows
    row_strides: tuple[int, int] = (0, 0)  # k-grouped, columns layout: A's and B's row strides in bytes (flat: 0)
    scratch_counters: int = 0
    pdl: bool = False
    side_map: bytes = b""  # no L2-side-aware weight-gradient kernels (the call path reads it as GemmPlan's)
    _packed: PackedParams = field(default_factory=lambda: PackedParams(_PACKED_LIMIT), repr=False)

    @property
    def grouped(self) -> bool:
        return self.cfg.kind == cw.KIND_K_GROUPED

    def launch(self, stream: int, a: int, sfa: int, b: int, sfb: int, d: int, layout: int = 0, partials: int = 0,
               counters: int = 0, zero_counters: bool = False, page_sides: tuple[int, ...] = ()) -> None:
        """Launch on ``stream``: ``layout`` is the k-grouped kind's int32 ``batch_sizes``, ``partials`` its workspace
        (:attr:`scratch_floats` floats, 128-byte aligned); the dense kind takes neither."""
        if self.grouped and not (partials and layout):
            raise ValueError(f"a k-grouped launch needs batch_sizes and a workspace of {self.scratch_floats} floats")
        ptrs = (a, sfa, b, sfb, d, layout, partials)
        got = self._packed.get(ptrs)
        if got is None:
            got = self._pack(ptrs)
        prep, params = got
        if prep is not None:
            _PREP.launch(self.device, stream, cw.prep_grid(self.num_groups), cw.PREP_THREADS, 0, prep)
        self.kernel.launcher.launch(params, self.grid, self.threads, self.smem_bytes, stream)

    def _pack(self, ptrs: tuple[int, ...]) -> tuple[Any, Any]:
        a, sfa, b, sfb, d, layout, workspace = ptrs
        self._check_out_overlap(a, sfa, b, sfb, d, layout)
        ensure_context(self.device)  # encoding the TMA maps is a driver call too
        maps = tuple(spec.encode(p) for spec, p in zip(self.tmaps, (a, b, sfa, sfb, d)))
        prep = None
        if self.grouped:
            k_capacity = min(self.k, 2**32 - 1)
            prep = _PREP.pack(self.device, (maps[0], maps[1], layout, a, b, workspace, self.num_groups, self.m, self.n,
                                            k_capacity, self.scale_rows) + self.row_strides)
        params = self.kernel.launcher.pack(maps + (workspace if self.grouped else 0, self.m, self.num_groups))
        return self._packed.put(ptrs, (prep, params))


    def _check_out_overlap(self, a: int, sfa: int, b: int, sfb: int, d: int, layout: int) -> None:
        """ValueError when D's bytes overlap an input's (as :meth:`cupygemm.plan.GemmPlan._check_out_overlap`)."""
        from .plan import _span

        ta, tb, tsa, tsb, td = self.tmaps
        if self.grouped:
            lda, ldb = self.row_strides
            a_bytes, b_bytes = (lda or self.k) * self.m, (ldb or self.k) * self.n
        else:
            a_bytes, b_bytes = _span(ta, 1), _span(tb, 1)
        d_bytes = _span(td, 4)
        d_end = d + d_bytes
        for name, ptr, size in (("lhs[0] (A)", a, a_bytes), ("lhs[1] (A scales)", sfa, _span(tsa, 4)),
                                ("rhs[0] (B)", b, b_bytes), ("rhs[1] (B scales)", sfb, _span(tsb, 4)),
                                ("batch_sizes", layout, 4 * self.num_groups if self.grouped else 0)):
            if size and d_bytes and ptr < d_end and d < ptr + size:
                raise ValueError(f"out: its memory [0x{d:x}, 0x{d_end:x}) overlaps {name}'s [0x{ptr:x}, "
                                 f"0x{ptr + size:x}); pass an output that shares no memory with the inputs")


def plan(kind: Any, m: int, n: int, k: int, num_groups: int, device: int, a_strides: tuple[int, ...] | None,
         b_strides: tuple[int, ...] | None, d_strides: tuple[int, ...] | None, sfa_m_pad: int, sfb_m_pad: int,
         scale_rows: int) -> WgradPlan:
    """The plan of a validated 1D1D problem (see :func:`cupygemm.plan.plan_gemm`); memoized. Strides in bytes, as the
    arrays have them (None: C-contiguous); ``sfa_m_pad``/``sfb_m_pad``: the scales' row strides in floats as the
    kernel reads them; ``scale_rows``: the flat k-grouped kind's stacked scales' rows (the other kinds' follow from
    K)."""
    grouped, flat = "G" in kind.out_dims, "F" in kind.a_dims
    ld_a = 0 if flat else (a_strides or (k,))[0]
    ld_b = 0 if flat else (b_strides or (k,))[0]
    if grouped and not flat:
        scale_rows = ceil_div(k, cw.BLOCK_K)
    d_strides = d_strides or ((m * n * 4, n * 4, 4) if grouped else (n * 4, 4))
    return _plan(kind, m, n, k, num_groups, device, ld_a, ld_b, tuple(d_strides), sfa_m_pad, sfb_m_pad, scale_rows,
                 get_num_sms(device))


@functools.lru_cache(maxsize=1024)
def _plan(kind: Any, m: int, n: int, k: int, num_groups: int, device: int, ld_a: int, ld_b: int,
          d_strides: tuple[int, ...], sfa_m_pad: int, sfb_m_pad: int, scale_rows: int, num_sms: int) -> WgradPlan:
    import cupy

    grouped = "G" in kind.out_dims
    with cupy.cuda.Device(device):
        info = require_hopper()
    expected = max(1, k // max(num_groups, 1)) if grouped else k
    cfg = cw.choose_wgrad_config(cw.KIND_K_GROUPED if grouped else cw.KIND_WGRAD, m, n, expected, num_groups, num_sms,
                                 smem_limit=info.max_smem_per_block, store=not kind.accumulates)
    return plan_config(kind, cfg, m, n, k, num_groups, device, ld_a, ld_b, d_strides, sfa_m_pad, sfb_m_pad, scale_rows)


def plan_config(kind: Any, cfg: cw.WgradConfig, m: int, n: int, k: int, num_groups: int, device: int, ld_a: int,
                ld_b: int, d_strides: tuple[int, ...], sfa_m_pad: int, sfb_m_pad: int, scale_rows: int) -> WgradPlan:
    """The plan of one problem on a given ``cfg`` (not memoized: the chooser's plans are, through :func:`plan`;
    tests and tuning force configs here). Row strides ``ld_a``/``ld_b`` in bytes (dense and the k-grouped columns
    layout; 0 for the flat k-grouped one), ``d_strides`` D's in bytes."""
    import cupy

    with cupy.cuda.Device(device):
        kernel = get_wgrad_kernel(cfg, device)
        if cfg.kind == cw.KIND_K_GROUPED:
            _PREP.get(device)
    ld_d = d_strides[-2] // 4
    if cfg.kind == cw.KIND_K_GROUPED:
        specs = cw.tma_specs(cfg, m, sfa_ld=sfa_m_pad, sfb_ld=sfb_m_pad, ld_d=ld_d, d_group_stride=d_strides[0] // 4,
                             num_groups=num_groups, sfa_rows=scale_rows, sfb_rows=scale_rows)
        workspace = ceil_div(cw.workspace_bytes(num_groups), 4)
    else:
        specs = cw.tma_specs(cfg, m, lda=ld_a, ldb=ld_b, sfa_ld=sfa_m_pad, sfb_ld=sfb_m_pad, ld_d=ld_d)
        workspace = 0
    row_strides = (ld_a, ld_b) if cfg.kind == cw.KIND_K_GROUPED else (0, 0)
    return WgradPlan(kind, m, n, k, num_groups, device, cfg, kernel, cw.grid(cfg, kernel.max_clusters), cfg.threads,
                     cfg.smem_bytes, sfa_m_pad, sfb_m_pad, workspace, specs, scale_rows, row_strides)


def clear() -> None:
    """Forget every plan (tests)."""
    _plan.cache_clear()
