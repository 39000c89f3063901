"""The GEMM kinds, each described once.

A :class:`GemmKind` says everything the package needs to know about one kind of GEMM besides its kernel code: the
public name, the operands and their roles, the per-call int32 device operand that lays the groups out (``m_indices``,
``masked_m``, ``batch_sizes``) and the static int argument (``expected_m``), the output's dtype and whether the call
accumulates into it, how the call's operands are checked (:mod:`cupygemm.validate`), which kernel family runs it
(whose config chooser and host contract know the kernel's own rules per kind), and what warm-up and the bench need to
make problems of it. The entry points (:mod:`cupygemm.gemm`), the torch operators (:mod:`cupygemm.torch`),
the JAX custom calls (:mod:`cupygemm.jax`), warm-up (:mod:`cupygemm.serving`), plans (:mod:`cupygemm.plan`) and the
bench read these descriptors; none of them keeps a list of kinds of its own. ``docs/adding-a-kind.md`` in
``cuda_src/README.md`` says which files a new kind touches.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..tensors import BF16, F32

#: Kernel families: the forward kernel (cuda_src/fp8_gemm.cu: A 1x128, B 128x128, BF16 out) and the 1D1D kernel
#: (cuda_src/fp8_wgrad.cu: A and B 1x128, FP32 out accumulated in place).
FORWARD, ONE_D_ONE_D = "forward", "1d1d"


@dataclass(frozen=True, eq=False)
class GemmKind:
    """One kind of GEMM. Identity is the object (one per kind): it is a key of the call and plan caches."""

    name: str  # "normal", "contiguous", "masked", "wgrad", "k_grouped_wgrad"
    kid: int  # the kernel's CUPYGEMM_KIND (cuda_src/scheduler.cuh, GemmKind)
    api: str  # the public function (DeepGEMM 03d0be3's name)
    summary: str  # one line: what it computes
    family: str  # FORWARD or ONE_D_ONE_D
    a_dims: str  # A's dimensions, named: "MK", "GMK" (masked), "F" (flat groups)
    b_dims: str  # B's: "NK", "GNK", "F"
    out_dims: str  # the output's: "MN", "GMN"
    layout: str | None = None  # name of the int32 device operand after ``out`` (None: none)
    static: str | None = None  # name of a static int argument after it (None: none)
    out_dtype: np.dtype = BF16
    accumulates: bool = False  # out += A B^T: ``out`` is read, required, and aliased to the JAX result
    zero_new_out: bool = False  # a new output starts as zeros (grouped kinds leave rows untouched)
    b_block_scales: bool = True  # B scaled per 128x128 block (else per 1x128 row block, like A)
    # -- warm-up and bench --
    shape_dims: str = "MNK"  # a shape on the command line: "MNK" or "GMNK" (M = rows per group)
    aliases: tuple[str, ...] = ()  # other names the CLI and the bench accept
    # the shapes ``cupygemm bench`` runs for this kind unless given --shapes (DeepGEMM 03d0be3 test_core's), each as
    # ``shape_dims`` says; the bench's per-kind code is registered by family in :mod:`cupygemm.bench.kinds`
    seed_shapes: tuple[tuple[int, ...], ...] = ()
    # -- the argument check: (Views of A, SFA, B, SFB, out, layout operand, static argument, operand names) ->
    #    cupygemm.validate.Problem; see the kind modules --
    check: Callable[..., Any] | None = None
    # -- the host check of the layout operand under CUPYGEMM_CHECK_INPUTS=1: (its values, the Problem) -> None,
    #    raising ValueError naming the first bad entry --
    check_layout: Callable[..., None] | None = None


#: Every kind, in the order the CLI and the bench list them (filled by the kind modules' :func:`register` calls).
KINDS: tuple[GemmKind, ...] = ()
BY_NAME: dict[str, GemmKind] = {}
BY_ID: dict[int, GemmKind] = {}


def kind_named(name: str | int | GemmKind) -> GemmKind:
    """The kind of a name (``"normal"``, an alias such as ``"contig"``), a kernel kind id, or the kind itself;
    ValueError naming the known ones otherwise."""
    if isinstance(name, GemmKind):
        return name
    if isinstance(name, str):
        kind = BY_NAME.get(name.lower())
        if kind is None:
            raise ValueError(f"kind: expected one of {names()}, got {name!r}")
        return kind
    if isinstance(name, (int, np.integer)) and not isinstance(name, bool) and int(name) in BY_ID:
        return BY_ID[int(name)]
    raise ValueError(f"kind: expected one of {names()} (or ids {sorted(BY_ID)}), got {name!r}")


def register(kind: GemmKind) -> GemmKind:
    """Add a kind to :data:`KINDS` (the training kinds register themselves where their kernel's host contract is
    stated)."""
    global KINDS
    if kind.name in BY_NAME or kind.kid in BY_ID:
        raise ValueError(f"kind {kind.name!r} (id {kind.kid}) is registered already")
    KINDS = KINDS + (kind,)
    for name in (kind.name, *kind.aliases):
        BY_NAME[name] = kind
    BY_ID[kind.kid] = kind
    return kind


def names() -> list[str]:
    """The kinds' names, in :data:`KINDS` order (aliases left out)."""
    return [k.name for k in KINDS]



from . import forward  # noqa: E402,F401 - registers normal, contiguous, masked
from . import training  # noqa: E402,F401 - registers wgrad, k_grouped_wgrad
