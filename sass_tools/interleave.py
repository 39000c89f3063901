"""The FFMA yield/reuse interleave pass (DeepGEMM's ``interleave_ffma``, re-implemented from its description).

In each maximal run of at least :data:`MIN_RUN` consecutive FFMA instructions, over the first ``floor(fraction * N)``
FFMAs of a run of N, walk the run keeping the set of b-slot registers seen so far (the promotion scale register), and
whether the previous FFMA kept its reuse flag and which b register it used. An FFMA whose b-reuse flag is set gets
*yield* (hi bit 45 cleared) and loses **all** its reuse flags (hi bits 58-61 cleared) when its b register was not seen
before in the run, or when the previous FFMA kept reuse on the same b register. On a run with one scale register the
result is ``Y r Y r ...``. Only hi bits 45 and 58-61 of FFMA words are ever written, with explicit set/clear;
stall, scoreboards, wait mask and ``lo`` are never touched.

ptxas/NVRTC >= 12.9 already emits this pattern for kernels whose launch bounds guarantee >= 384 resident threads:
such kernels are detected (a long FFMA run containing yielded FFMAs with stall 1) and left alone unless ``force``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .elf import Cubin, Kernel
from .sass import REUSE_B, REUSE_MASK_HI, YIELD_MASK_HI, decode, is_ffma

__all__ = [
    "MIN_RUN",
    "DEFAULT_FRACTION",
    "KernelReport",
    "InterleaveResult",
    "find_ffma_runs",
    "kernel_already_interleaved",
    "interleave_ffma",
    "is_interleaved",
]

MIN_RUN = 8
"""Minimum number of consecutive FFMAs for a run to be considered."""

DEFAULT_FRACTION = 9 / 16
"""Fraction of each run (from its start) that the pass rewrites (DeepGEMM 03d0be3 / PR #42)."""

NATIVE_MIN_YIELDS = 2
"""A run counts as compiler-interleaved when it holds at least this many yielded FFMAs with stall 1."""


@dataclass
class KernelReport:
    """What the pass found / did in one kernel."""

    name: str
    runs: int = 0
    ffmas_in_runs: int = 0
    changed: int = 0
    already_interleaved: bool = False
    skipped_reason: Optional[str] = None
    yields_before: int = 0
    yields_after: int = 0
    changed_offsets: List[int] = field(default_factory=list)

    def summary(self) -> str:
        s = (f"{self.name}: runs={self.runs} ffmas_in_runs={self.ffmas_in_runs} changed={self.changed} "
             f"yields {self.yields_before}->{self.yields_after}")
        if self.already_interleaved:
            s += " [already interleaved]"
        if self.skipped_reason:
            s += f" (skipped: {self.skipped_reason})"
        return s


@dataclass
class InterleaveResult:
    """Output of :func:`interleave_ffma`: the (possibly) patched cubin and one report per kernel."""

    cubin: bytes
    kernels: List[KernelReport]

    @property
    def changed(self) -> int:
        """Total number of instructions changed over all kernels."""
        return sum(k.changed for k in self.kernels)

    def report(self) -> str:
        return "\n".join(k.summary() for k in self.kernels)


def find_ffma_runs(words: List[Tuple[int, int]], min_run: int = MIN_RUN) -> List[Tuple[int, int]]:
    """Maximal runs of consecutive FFMA words (any operand form) with at least ``min_run`` FFMAs.

    Returns (start index, length) pairs.
    """
    runs: List[Tuple[int, int]] = []
    start = None
    for i, (lo, _hi) in enumerate(words + [(0, 0)]):
        if i < len(words) and is_ffma(lo):
            if start is None:
                start = i
        else:
            if start is not None and i - start >= min_run:
                runs.append((start, i - start))
            start = None
    return runs


def kernel_already_interleaved(words: List[Tuple[int, int]], runs: Optional[List[Tuple[int, int]]] = None) -> bool:
    """True if some long FFMA run already holds yielded FFMAs with stall 1 (ptxas >= 12.9's native interleave).

    Plain ptxas (<= 12.8) only sets yield after long stalls (S04/S05), never on S01 FFMAs inside a run.
    """
    runs = find_ffma_runs(words) if runs is None else runs
    for s, ln in runs:
        n = 0
        for lo, hi in words[s : s + ln]:
            ins = decode(lo, hi)
            if ins.yield_ and ins.stall == 1:
                n += 1
        if n >= NATIVE_MIN_YIELDS:
            return True
    return False


def _count_yields(words: List[Tuple[int, int]], runs: List[Tuple[int, int]]) -> int:
    return sum(1 for s, ln in runs for lo, hi in words[s : s + ln] if not hi & YIELD_MASK_HI)


def _interleave_run(words: List[Tuple[int, int]], start: int, length: int, fraction: float) -> List[int]:
    """Apply the rule to one run in place; returns the indices of changed words."""
    count = math.floor(length * fraction + 1e-9)
    seen = set()
    last_reused = False
    last_reg: Optional[int] = None
    changed: List[int] = []
    for i in range(start, start + count):
        lo, hi = words[i]
        reg = (lo >> 32) & 0xFF  # b slot: the promotion scale register in the R,R,R form
        reused = bool((hi >> 58) & REUSE_B)
        if reused and (reg not in seen or (last_reused and reg == last_reg)):
            new_hi = hi & ~YIELD_MASK_HI & ~REUSE_MASK_HI  # yield active (bit 45 = 0), no reuse at all
            if new_hi != hi:
                words[i] = (lo, new_hi)
                changed.append(i)
            reused = False
        seen.add(reg)
        last_reused = reused
        last_reg = reg
    return changed


def _check_fraction(fraction: float) -> None:
    if not isinstance(fraction, (int, float)) or not 0.0 <= float(fraction) <= 1.0 or math.isnan(fraction):
        raise ValueError(f"fraction must be a number in [0, 1], got {fraction!r}")


def interleave_ffma(cubin: bytes, fraction: float = DEFAULT_FRACTION, force: bool = False) -> InterleaveResult:
    """Run the FFMA interleave pass over every kernel of ``cubin``.

    Args:
        cubin: cubin bytes (CUDA 12 or 13 format).
        fraction: part of each FFMA run (from its start) that is rewritten; 9/16 by default, 1.0 = whole run.
        force: also rewrite kernels whose FFMA runs the compiler already interleaved.

    Returns:
        :class:`InterleaveResult` with the patched cubin bytes (identical to the input when nothing changed) and a
        :class:`KernelReport` per kernel.

    Raises:
        ValueError: not a cubin, or ``fraction`` outside [0, 1].
    """
    _check_fraction(fraction)
    cb = Cubin.from_bytes(cubin)
    reports: List[KernelReport] = []
    for k in cb.kernels:
        words = cb.instructions(k)
        runs = find_ffma_runs(words)
        rep = KernelReport(name=k.name, runs=len(runs), ffmas_in_runs=sum(ln for _, ln in runs))
        rep.yields_before = rep.yields_after = _count_yields(words, runs)
        if not runs:
            rep.skipped_reason = f"no run of >= {MIN_RUN} consecutive FFMAs"
            reports.append(rep)
            continue
        rep.already_interleaved = kernel_already_interleaved(words, runs)
        if rep.already_interleaved and not force:
            rep.skipped_reason = "already interleaved by the compiler (yielded stall-1 FFMAs in a run)"
            reports.append(rep)
            continue
        changed: List[int] = []
        for s, ln in runs:
            changed += _interleave_run(words, s, ln, fraction)
        for i in changed:
            cb.set_instruction(k, i, *words[i])
        rep.changed = len(changed)
        rep.changed_offsets = [16 * i for i in changed]
        rep.yields_after = _count_yields(words, runs)
        reports.append(rep)
    return InterleaveResult(cubin=cb.to_bytes(), kernels=reports)


def is_interleaved(cubin: bytes) -> bool:
    """True if every kernel that has FFMA runs of >= 8 already carries the interleave (vacuously True if none has).

    Use it to decide whether :func:`interleave_ffma` has anything to do.
    """
    cb = Cubin.from_bytes(cubin)
    for k in cb.kernels:
        words = cb.instructions(k)
        runs = find_ffma_runs(words)
        if runs and not kernel_already_interleaved(words, runs):
            return False
    return True


def kernel_runs(cb: Cubin, kernel: Kernel) -> List[Tuple[int, int]]:
    """Convenience: FFMA runs of one kernel of a parsed cubin."""
    return find_ffma_runs(cb.instructions(kernel))
