"""Warm-up for serving: build, ahead of time, exactly the kernels the chooser picks for ranges of M.

A serving process sees every M from 1 to its batch limit; each M the chooser maps to a kernel not yet compiled costs
seconds of NVRTC at the first call. :func:`warmup` plans every problem of the given (N, K) pairs and M ranges with
:func:`cupygemm.config.choose_config` (the call the GEMM makes), reduces the picks to distinct kernels (configs that
differ only in their grid share one cubin: the cache key), and compiles the missing ones in parallel processes into
the disk cache. Needs no GPU: give ``num_sms``.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from .config import (KIND_CONTIGUOUS, KIND_MASKED, KIND_NAMES, KIND_NORMAL, M_CLASS_ROWS, GemmConfig, choose_config,
                     kind_id, m_class, model_rows)
from .device import check_num_sms
from .errors import CupygemmCacheError, CupygemmError
from .layout import M_ALIGNMENT_FOR_CONTIGUOUS_LAYOUT as M_ALIGNMENT
from .shapes import GROUPED_NK, NORMAL_NK
from .util import round_up
from .validate import check_k_n, check_limits

#: (N, K) pairs per kind of model presets. DeepSeek-V3 and R1 share their GEMM shapes: the seed shapes.
PRESETS: dict[str, dict[str, tuple[tuple[int, int], ...]]] = {
    "deepseek-v3": {"normal": NORMAL_NK, "contiguous": GROUPED_NK, "masked": GROUPED_NK},
}
PRESETS["deepseek-r1"] = PRESETS["deepseek-v3"]
#: The M range a preset warms by default for normal GEMMs (grouped kinds need an explicit range and group count).
DEFAULT_M_RANGE = (1, 4096)


@dataclass(frozen=True)
class Problem:
    """One call the chooser is asked about: kind, rows (M, contiguous total rows, or masked expected_m), N, K, G;
    masked: the groups' max_m where it is known (explicit shapes), which caps the sizes the chooser plans for.
    ``count``: the problems of an M range it stands for, the M of its memo class (which all get its config)."""

    kind: int
    m: int
    n: int
    k: int
    groups: int = 1
    max_m: int | None = None
    count: int = 1


@dataclass
class WarmupReport:
    """What a warm-up planned and did. ``kernels`` = ``cached`` + ``built`` (+ the failures in ``errors``)."""

    problems: int = 0  # (kind, M, N, K, G) problems planned
    configs: int = 0  # distinct configs the chooser picked for them
    kernels: int = 0  # distinct kernels (cubins) those configs need
    cached: int = 0  # of them already in the cache
    built: int = 0  # compiled now
    seconds: float = 0.0  # wall time of the whole warm-up
    build_seconds: float = 0.0  # of which compiling
    jobs: int = 1
    keys: list[str] = field(default_factory=list)  # the kernels' cache keys
    descriptions: list[str] = field(default_factory=list)  # one config per kernel, described
    errors: list[str] = field(default_factory=list)
    dry_run: bool = False

    def summary(self) -> str:
        head = f"{self.problems} problems -> {self.configs} configs -> {self.kernels} kernels: {self.cached} already cached, "
        if self.dry_run:
            return head + f"{self.kernels - self.cached} to build (dry run); planned in {self.seconds:.1f}s"
        return head + (f"{self.built} built ({self.build_seconds:.1f}s with {self.jobs} processes), "
                       f"{len(self.errors)} failed; {self.seconds:.1f}s in all")


def parse_m_ranges(text: str) -> list[tuple[int, int]]:
    """``'1:4096'``, ``'64'`` or a comma list (``'1:128,4096'``) -> inclusive (lo, hi) pairs; ValueError otherwise."""
    out = []
    for tok in text.replace(" ", "").split(","):
        if not tok:
            continue
        lo_s, sep, hi_s = tok.partition(":")
        try:
            lo, hi = int(lo_s), int(hi_s if sep else lo_s)
        except ValueError:
            raise ValueError(f"m: expected LO:HI or M (comma-separated), got {text!r}") from None
        if lo < 1 or hi < lo:
            raise ValueError(f"m: expected 1 <= LO <= HI, got {tok!r}")
        out.append((lo, hi))
    if not out:
        raise ValueError(f"m: expected LO:HI or M (comma-separated), got {text!r}")
    return out


def _m_classes(kind: int, ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """(an M, how many M of ``ranges`` share its memo class) per memo class that ``ranges`` reach. The chooser
    answers alike for a whole class (:func:`~cupygemm.config.m_class`: 64 rows of M; masked: one expected_m), so
    planning asks once per class and the M of a range are counted, not listed: any range plans in time linear in
    its classes. Contiguous M are the total rows, whole 128-row groups: the multiples of 128."""
    merged: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    step = M_ALIGNMENT if kind == KIND_CONTIGUOUS else 1
    rows = 1 if kind == KIND_MASKED else M_CLASS_ROWS
    out = []
    for lo, hi in merged:
        for c in range(m_class(kind, lo), m_class(kind, hi) + 1):
            first, last = max(lo, (c - 1) * rows + 1), min(hi, c * rows)
            count = last // step - (first - 1) // step  # multiples of step in [first, last]
            if count:
                out.append((last // step * step, count))
    return out


def problems_for(kind: int | str, nk: Iterable[tuple[int, int]], m_ranges: Sequence[tuple[int, int]],
                 groups: int = 1) -> list[Problem]:
    """The problems of ``nk`` x the M ranges, one per memo class of M (its ``count``: the M it stands for). M is M
    (normal), the total rows of A (contiguous: the multiples of 128 in the range, groups being padded to 128) or
    expected_m (masked, with max_m >= expected_m); below 2^31, as the kernels need."""
    kid = kind_id(kind)
    if kid == KIND_NORMAL and groups != 1:
        raise ValueError(f"groups: normal GEMMs have 1 group, got {groups}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups: expected a positive int, got {groups!r}")
    for lo, hi in m_ranges:
        if not 1 <= lo <= hi:
            raise ValueError(f"m: expected 1 <= LO <= HI, got {lo}:{hi}")
        if kid == KIND_MASKED:
            _check_dims("m", expected_m=hi, G=groups, total_rows=groups * hi)
        else:
            _check_dims("m", M=hi, G=groups)
    classes = _m_classes(kid, m_ranges)
    if not classes:
        raise ValueError(f"m: no M in {m_ranges} (contiguous total rows are multiples of {M_ALIGNMENT})")
    return [Problem(kid, m, n, k, groups, count=count) for n, k in nk for m, count in classes]


def _check_dims(what: str, **dims: int) -> None:
    """The GEMMs' own shape rules (:mod:`cupygemm.validate`) for a planned problem: ValueError naming ``what`` (the
    request) and the rule. ``dims``: name=size as the GEMM names them."""
    try:
        check_limits(**dims)
        if "K" in dims:
            check_k_n(dims["K"], dims["N"])
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None


def problems_from_shapes(kind: int | str, shapes: Iterable[Sequence[int]]) -> list[Problem]:
    """Explicit shapes: MxNxK (normal) or GxMxNxK (grouped: contiguous = G groups of M rows, each padded to 128;
    masked = G groups with expected_m = max_m = M); the weight-gradient kinds: MxNxK (wgrad, K = tokens) and
    GxMxNxK (k-grouped, K = tokens per group, which only picks the config)."""
    from .kinds import FORWARD, kind_named

    wkind = kind_named(kind)
    if wkind.family != FORWARD:
        return [_training_problem(wkind, tuple(s)) for s in shapes]
    kid = kind_id(kind)
    out = []
    for s in shapes:
        s = tuple(s)
        text = "x".join(map(str, s))
        if kid == KIND_NORMAL:
            if len(s) != 3:
                raise ValueError(f"shapes: normal shapes are MxNxK, got {text}")
            (m, n, k), g = s, 1
        else:
            if len(s) != 4:
                raise ValueError(f"shapes: grouped shapes are GxMxNxK (M = rows per group), got {text}")
            g, m, n, k = s
        if min(s) < 1:
            raise ValueError(f"shapes {text}: every dimension must be positive (with M = 0 a GEMM returns at once: "
                             "no kernel to build)")
        if kid == KIND_NORMAL:
            _check_dims(f"shapes {text}", M=m, N=n, K=k)
        elif kid == KIND_CONTIGUOUS:
            m = g * round_up(m, M_ALIGNMENT)  # A's rows: the groups, each padded to 128
            _check_dims(f"shapes {text}", M=m, N=n, K=k, G=g)
        else:
            _check_dims(f"shapes {text}", max_m=m, N=n, K=k, G=g, total_rows=g * m)
        out.append(Problem(kid, model_rows(kid, m), n, k, g, m if kid == KIND_MASKED else None))
    return out


def _training_problem(kind: object, s: tuple[int, ...]) -> Problem:
    """A weight-gradient kind's shape as a Problem (kind id, M, N, K, G)."""
    text = "x".join(map(str, s))
    want = len(kind.shape_dims)
    if len(s) != want:
        raise ValueError(f"shapes: {kind.name} shapes are {'x'.join(kind.shape_dims)}, got {text}")
    g, m, n, k = s if want == 4 else (1, *s)
    if min(s) < 1:
        raise ValueError(f"shapes {text}: every dimension must be positive")
    _check_dims(f"shapes {text}", M=m, N=n, G=g)
    if k % 16:
        raise ValueError(f"shapes {text}: K must be a multiple of 16 (16-byte aligned FP8 rows for TMA), got K = {k}")
    return Problem(kind.kid, m, n, k, g)


def plan(problems: Iterable[Problem], num_sms: int, packed: bool = False) -> list:
    """The config the chooser picks for each problem (in order): the forward kernel's
    (:func:`~cupygemm.config.choose_config`) or the 1D1D kernel's (:func:`cupygemm.contract_wgrad.choose_wgrad_config`),
    as the problem's kind says. ``packed``: forward kernels for weights packed by :func:`cupygemm.pack_weights`
    (L2-side-aware configs, and the variants that fetch the weights before the PDL wait:
    :class:`~cupygemm.kernels.GemmVariant`), as a GEMM on packed weights plans them."""
    from . import contract_wgrad as cw
    from .config import SM90_MAX_SMEM_PER_BLOCK
    from .env import pdl_enabled
    from .kernels import GemmVariant
    from .kinds import FORWARD, kind_named
    from .plan import kernel_choice

    out: list = []
    for p in problems:
        kind = kind_named(p.kind)
        if kind.family == FORWARD and packed:
            out.append(GemmVariant(*kernel_choice(p.kind, p.m, p.n, p.k, p.groups, num_sms, SM90_MAX_SMEM_PER_BLOCK,
                                                  p.max_m, True, pdl_enabled())))
        elif kind.family == FORWARD:
            out.append(choose_config(p.kind, p.m, p.n, p.k, p.groups, num_sms, max_m=p.max_m))
        elif kind.layout:  # k-grouped: the groups' M and N are the kernel's; K (tokens) only picks the config
            out.append(cw.choose_wgrad_config(cw.KIND_K_GROUPED, p.m, p.n, p.k, p.groups, num_sms))
        else:
            out.append(cw.choose_wgrad_config(cw.KIND_WGRAD, p.m, p.n, p.k, 1, num_sms, store=not kind.accumulates))
    return out


def config_source(cfg: object):
    """The rendered kernel source of a config of either kernel family, or of a :class:`~cupygemm.kernels.GemmVariant`
    (its cache key's input)."""
    from .contract_wgrad import WgradConfig
    from .kernels import GemmVariant, gemm_source

    if isinstance(cfg, WgradConfig):
        from .plan_wgrad import wgrad_source

        return wgrad_source(cfg)
    if isinstance(cfg, GemmVariant):
        return gemm_source(cfg.cfg, None, cfg.b_prefetch)
    return gemm_source(cfg)


def compile_config(cfg: object) -> None:
    """Build ``cfg``'s kernel into the disk cache (worker-process entry; returns nothing, to ship no bytes)."""
    from .jit.build import build_cubin

    build_cubin(config_source(cfg), config=cfg)


def kernel_keys(cfgs: Iterable) -> dict[str, object]:
    """Distinct kernels of ``cfgs``: {cache key: first config needing it}. Configs differing only in their grid (or
    anything else the kernel source does not see) share one cubin."""
    from .jit.build import cache_key

    out: dict[str, object] = {}
    by_cfg: dict[object, str] = {}
    for c in cfgs:
        if c not in by_cfg:
            by_cfg[c] = cache_key(config_source(c))
            out.setdefault(by_cfg[c], c)
    return out


def _progress(text: str, end: str = "\n") -> None:
    print(text, end=end, file=sys.stderr, flush=True)


def build_kernels(cfgs: Sequence[GemmConfig], jobs: int, progress: bool = False,
                  errors: list[str] | None = None) -> float:
    """Compile ``cfgs`` (one per kernel) into the disk cache in ``jobs`` worker processes; returns the seconds.

    Processes, not threads: NVRTC holds the GIL. Workers are spawned, never forked, so no CUDA context is copied.
    A failing kernel is reported in ``errors`` when given (the others still build), else raised.
    """
    t0 = time.time()
    total = len(cfgs)

    def report(done: int) -> None:
        if progress:
            _progress(f"\r[cupygemm] built {done}/{total} kernels, {time.time() - t0:.1f}s", end="")

    if jobs <= 1 or total <= 1:
        for i, c in enumerate(cfgs):
            try:
                compile_config(c)
            except Exception as e:
                if errors is None:
                    raise
                errors.append(f"{c.describe()}: {e}")
            report(i + 1)
    else:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(jobs, total), mp_context=ctx) as pool:
            futures = {pool.submit(compile_config, c): c for c in cfgs}
            for done, f in enumerate(as_completed(futures), 1):
                try:
                    f.result()
                except Exception as e:
                    if errors is None:
                        raise
                    errors.append(f"{futures[f].describe()}: {e}")
                report(done)
    if progress and total:
        _progress("")
    return time.time() - t0


def resolve_nk(preset: str | None, kind: str, nk: Iterable[tuple[int, int]] | None) -> list[tuple[int, int]]:
    """The (N, K) pairs of ``nk`` and of ``preset`` for ``kind``, without repeats."""
    pairs = list(nk or [])
    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f"preset: expected one of {sorted(PRESETS)}, got {preset!r}")
        pairs += list(PRESETS[preset][kind])
    for n, k in pairs:
        if min(n, k) < 1:
            raise ValueError(f"nk: N and K must be positive, got {n}x{k}")
        _check_dims(f"nk {n}x{k}", N=n, K=k)
    return list(dict.fromkeys(pairs))


def warmup(nk: Iterable[tuple[int, int]] | None = None, m: str | Sequence[tuple[int, int]] | None = None, *,
           kind: int | str = "normal", groups: int = 1, shapes: Iterable[Sequence[int]] = (),
           preset: str | None = None, num_sms: int | None = None, jobs: int | None = None,
           progress: bool = False, dry_run: bool = False, packed: bool = False) -> WarmupReport:
    """Build into the disk cache every kernel the chooser picks for ``nk`` x ``m`` (and ``shapes``).

    ``nk``: (N, K) pairs; ``preset``: a model's pairs for ``kind`` (see :data:`PRESETS`: ``"deepseek-v3"``);
    ``m``: inclusive ranges, ``"1:4096"`` or ``[(1, 4096)]`` (default 1:4096 for normal GEMMs; grouped kinds need
    it: contiguous = total rows of A, masked = expected_m, with ``groups`` groups); ``shapes``: explicit MxNxK /
    GxMxNxK tuples. ``num_sms``: the target GPU's SM count (default: this GPU's). ``jobs``: worker processes
    (default: the CPU count). ``dry_run``: plan and count, build nothing. ``packed``: the kernels for weights packed
    by :func:`cupygemm.pack_weights` instead of plain ones (forward kinds; for GPUs where it packs, the H100s by
    default: ``cupygemm info`` says). Returns a :class:`WarmupReport`;
    raises CupygemmError when kernels fail to build, CupygemmCacheError when the disk cache is disabled or cannot be
    written (checked before building: a warm-up exists to fill it).
    """
    from .jit import cache

    from .kinds import FORWARD, kind_named

    t0 = time.time()
    kname = kind_named(kind).name
    if kind_named(kind).family != FORWARD and (nk or preset or m is not None):
        raise ValueError(f"{kname}: warm up the weight-gradient kinds with explicit shapes (MxNxK, GxMxNxK)")
    if kind_named(kind).family != FORWARD and packed:
        raise ValueError(f"packed: weights are packed for the forward kinds only, not {kname}")
    pairs = resolve_nk(preset, kname, nk)
    problems: list[Problem] = []
    if pairs:
        if m is None:
            if kname != "normal":
                raise ValueError(f"m: give the M range for {kname} GEMMs (contiguous: total rows, masked: expected_m)")
            m = [DEFAULT_M_RANGE]
        ranges = parse_m_ranges(m) if isinstance(m, str) else [tuple(r) for r in m]
        problems += problems_for(kname, pairs, ranges, groups)
    elif m is not None:
        raise ValueError("m: give the (N, K) pairs it applies to (nk or preset)")
    problems += problems_from_shapes(kname, shapes)
    if not problems:
        raise ValueError("warmup: nothing to plan: give nk/preset with m, or shapes")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"jobs: expected a positive int, got {jobs!r}")
    if num_sms is None:
        from .device import get_num_sms, gpu_available

        if not gpu_available():
            raise ValueError("num_sms: no GPU here; give the target GPU's SM count (132 for H100/H200 SXM)")
        num_sms = get_num_sms()
    check_num_sms(num_sms)
    if not dry_run:
        if not cache.cache_enabled():
            raise CupygemmCacheError("warm-up fills the disk cache, but CUPYGEMM_DISABLE_CACHE is set: nothing would "
                                     "be kept")
        cache.check_writable()
    if progress:
        # a search takes milliseconds: wide ranges plan for a while, which should not look like a hang
        _progress(f"[cupygemm] planning {sum(p.count for p in problems)} problems: {len(problems)} config searches")
    cfgs = plan(problems, num_sms, packed)
    kernels = kernel_keys(cfgs)
    report = WarmupReport(problems=sum(p.count for p in problems), configs=len(set(cfgs)), kernels=len(kernels),
                          jobs=jobs or os.cpu_count() or 1,
                          keys=list(kernels), descriptions=[c.describe() for c in kernels.values()],
                          dry_run=dry_run)
    missing = {key: c for key, c in kernels.items() if cache.load(key) is None}
    report.cached = report.kernels - len(missing)
    if progress:
        _progress(f"[cupygemm] planned {report.problems} problems -> {report.configs} configs -> {report.kernels} "
                  f"kernels ({report.cached} already cached)"
                  + ("" if dry_run or not missing else f"; building {len(missing)} with {min(report.jobs, len(missing))} processes"))
    if not dry_run and missing:
        report.build_seconds = build_kernels(list(missing.values()), report.jobs, progress, report.errors)
        report.built = len(missing) - len(report.errors)
        # store() falls back to memory (with a warning) where it cannot write, e.g. on a disk that filled up
        unwritten = sum(not cache.entry_path(key).is_file() for key in missing) - len(report.errors)
        if unwritten > 0:
            raise CupygemmCacheError(f"warm-up: {unwritten} of the {report.built} kernels built could not be written "
                                     f"to the cache in {cache.cache_dir()}")
    report.seconds = time.time() - t0
    if report.errors:
        raise CupygemmError(f"warm-up: {len(report.errors)} of {report.kernels} kernels failed to build:\n"
                            + "\n".join(report.errors))
    return report
