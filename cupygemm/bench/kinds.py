"""The bench's code per kind, reached through the kind descriptors (:mod:`cupygemm.kinds`): one registry.

``cupygemm bench`` keeps no list of kinds. What it runs comes from the descriptors: the names and aliases ``--kinds``
accepts (:func:`cupygemm.kinds.kind_named`), each kind's default shapes (``GemmKind.seed_shapes``), how a shape on
the command line reads (``GemmKind.shape_dims``), the public function it calls (``GemmKind.api``, DeepGEMM 03d0be3's
name, so the DeepGEMM peer calls the same name) and its layout operand (``GemmKind.layout``). What differs between
kinds beyond that (how group sizes are drawn, how inputs are made and results checked, which peers apply, the work
formula) is a :class:`BenchKind`, registered here by each family's bench module for its kernel family (or for one
kind's name, which wins over its family): :mod:`cupygemm.bench.forward` for the forward kernel's kinds (normal,
contiguous, masked), :mod:`cupygemm.bench.training` for the 1D1D kernel's (wgrad, k_grouped_wgrad).

A new kind of an existing family needs its descriptor (with ``seed_shapes``) and whatever its family's BenchKind
does not yet derive from the descriptor; a new family needs a module that registers a BenchKind, named in
:data:`MODULES`.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

from ..kinds import KINDS, GemmKind, kind_named

#: The bench modules that register BenchKinds, imported on the first lookup.
MODULES = ("cupygemm.bench.forward", "cupygemm.bench.training")

_MAKERS: dict[str, "BenchKind"] = {}
_loaded = False


class BenchKind:
    """What the bench needs to know about a family of kinds (or one kind). Subclasses implement the methods; the
    attributes have defaults."""

    #: Shown above the family's table when a run mixes families, and in its notes.
    title = ""
    #: The kinds run by ``cupygemm bench`` without ``--kinds`` (their seed shapes, in KINDS order).
    default = False
    #: ``--match-rows`` (valid-row totals read from a peer table) applies to these kinds.
    match_rows = False
    #: The peers (providers.PEERS names) that can run these kinds; see :meth:`supports`.
    peers: tuple[str, ...] = ()

    def supports(self, peer: str, kind: GemmKind) -> bool:
        """Whether ``peer`` has this kind (a peer's own availability, e.g. its module's functions, is its own)."""
        return peer in self.peers

    def check_shape(self, shape: Any) -> None:
        """BenchUsageError when the shape cannot run (alignment, sizes)."""
        raise NotImplementedError

    def make_sizes(self, shape: Any, seed: int, valid_rows: int | None = None, full_groups: bool = False) -> Any:
        """The shape's :class:`~cupygemm.bench.cases.Sizes`, seeded (deterministic in shape and seed)."""
        raise NotImplementedError

    def config(self, shape: Any, sizes: Any, num_sms: int, smem_limit: int | None = None, sides: bool = False) -> Any:
        """The kernel config the library picks (compiled before timing), or None when the kind's kernels compile at
        their first (untimed) call instead."""
        return None

    def work(self, shape: Any, sizes: Any) -> tuple[int, int]:
        """(FLOPs, bytes) of one call."""
        raise NotImplementedError

    def make_inputs(self, shape: Any, sizes: Any, seed: int) -> Any:
        """The shape's operands on the GPU (seeded)."""
        raise NotImplementedError

    def prepare_cupygemm(self, inp: Any, rhs: Any = None) -> Any:
        """cupygemm's ready call (a :class:`~cupygemm.bench.providers.Prepared`); ``rhs``: B replaced (packed)."""
        raise NotImplementedError

    def prepare_deepgemm(self, peer: Any, inp: Any) -> Any:
        """The ready call of DeepGEMM's (or a fork's) function ``kind.api`` on torch views of the same operands."""
        raise NotImplementedError

    def checker(self, inp: Any, seed: int) -> Callable[[str, Any], dict[str, Any]]:
        """A function (provider name, Prepared) -> {check: 'ok'|'FAIL', rel_err, calc_diff, ...} for this shape's
        providers, run after they were timed (references are made once per shape)."""
        raise NotImplementedError

    def notes(self, rows: list[dict[str, Any]]) -> list[str]:
        """Lines printed (and kept in the JSON) with these kinds' table: what the numbers mean."""
        return []


def register(key: str, maker: BenchKind) -> BenchKind:
    """Register ``maker`` for a kernel family (``cupygemm.kinds.FORWARD``, ``ONE_D_ONE_D``) or one kind's name."""
    if key in _MAKERS:
        raise ValueError(f"a bench maker for {key!r} is registered already")
    _MAKERS[key] = maker
    return maker


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for name in MODULES:
            importlib.import_module(name)


def lookup(kind: str | GemmKind) -> BenchKind | None:
    """The BenchKind of a kind (name, alias or descriptor): its name's, else its family's; None when it has none."""
    _load()
    k = kind_named(kind)
    return _MAKERS.get(k.name) or _MAKERS.get(k.family)


def bench_kind(kind: str | GemmKind) -> BenchKind:
    """:func:`lookup`, raising ValueError for a kind the bench cannot run."""
    maker = lookup(kind)
    if maker is None:
        k = kind_named(kind)
        raise ValueError(f"kind {k.name!r} (family {k.family!r}) has no bench code: register a BenchKind for it in "
                         "a module of cupygemm.bench.kinds.MODULES")
    return maker


def bench_kinds() -> list[GemmKind]:
    """The kinds the bench can run, in :data:`cupygemm.kinds.KINDS` order."""
    return [k for k in KINDS if lookup(k) is not None]


def default_kinds() -> list[GemmKind]:
    """The kinds ``cupygemm bench`` runs without ``--kinds``."""
    return [k for k in bench_kinds() if bench_kind(k).default]


def shape_format(kind: GemmKind) -> str:
    """How a shape of ``kind`` is written: 'MxNxK' or 'GxMxNxK'."""
    return "x".join(kind.shape_dims)
