"""Forced config fields per (kind, N, K), for tuning: :func:`override_config` checks and stores them, the chooser
applies them as a rule step of :func:`cupygemm.config.choice.choose`."""
from __future__ import annotations

import threading

from ..util import ceil_div
from .constants import BLOCK_K, KIND_NAMES, KIND_NORMAL, MAX_STAGES_INTERLEAVE_K, STREAM_K_KINDS, kind_id
from .legality import make_config

BOOL_FIELDS = ("interleave_k", "serial_m", "stream_k", "split_cluster", "two_acc_sets")
OVERRIDE_FIELDS = ("block_m", "block_n", "wgmma_n", "num_stages", "num_sms", "raster_n", "multicast", "split_k",
                   *BOOL_FIELDS)
#: The most split-K units an override may ask for.
MAX_OVERRIDE_SPLIT_K = 64

_lock = threading.Lock()
_overrides: dict[tuple[int, int, int], dict] = {}
_version = 0  # bumped on every override change; part of the choice memo's key


def forced(kind: int, n: int, k: int) -> dict:
    """The fields forced for (kind, N, K) (a copy; empty when none)."""
    with _lock:
        return dict(_overrides.get((kind, n, k), {}))


def config_version() -> int:
    """Changes whenever an override changes: part of the key of anything derived from a choice."""
    return _version


def _check_names(fields: dict) -> None:
    """ValueError for names that are not fields, naming the field to use where a name has one."""
    if "k_slices" in fields:
        raise ValueError("override_config: k_slices: the field is split_k (an int: the CTAs over which each tile's K "
                         "blocks are split)")
    if isinstance(fields.get("split_k"), bool):
        raise ValueError("override_config: split_k: expected an int (CTAs over which each tile's K blocks are split), "
                         "got a bool; the two warpgroups' alternate K blocks are interleave_k")
    bad = set(fields) - set(OVERRIDE_FIELDS)
    if bad:
        raise ValueError(f"override_config: unknown fields {sorted(bad)}; allowed: {sorted(OVERRIDE_FIELDS)}")


def _check_fields(kind: int, n: int, k: int, fields: dict) -> dict:
    """``fields`` checked one by one (type and range) and, where the tile is forced, together through make_config;
    returns them with booleans normalized. Refusing here, not at the first GEMM, names the bad field at its source."""
    def need_int(name: str, value: object, ok: bool, expected: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"override_config: {name}: expected {expected}, got {type(value).__name__} {value!r}")
        if not ok:
            raise ValueError(f"override_config: {name}: expected {expected}, got {value}")

    out = dict(fields)
    for name, v in fields.items():
        if name in BOOL_FIELDS:
            if not (isinstance(v, bool) or (isinstance(v, int) and v in (0, 1))):
                raise TypeError(f"override_config: {name}: expected a bool, got {type(v).__name__} {v!r}")
            out[name] = bool(v)
            continue
        isint = isinstance(v, int) and not isinstance(v, bool)
        if name == "block_m":
            legal = (64, 128, 192, 256) if kind == KIND_NORMAL else (64, 128, 256)
            need_int(name, v, isint and v in legal, f"one of {', '.join(map(str, legal))} for {KIND_NAMES[kind]} GEMMs")
        elif name in ("block_n", "wgmma_n"):
            need_int(name, v, isint and v % 8 == 0 and 8 <= v <= 256, "a multiple of 8 in [8, 256]")
        elif name == "num_stages":
            need_int(name, v, isint and 1 <= v <= MAX_STAGES_INTERLEAVE_K, f"an int in [1, {MAX_STAGES_INTERLEAVE_K}]")
        elif name in ("num_sms", "raster_n"):
            need_int(name, v, isint and v >= 1, "a positive int")
        elif name == "multicast":
            need_int(name, v, isint and v in (0, 1, 2), "0 (off), 1 (share A) or 2 (share B)")
        elif name == "split_k":
            most = min(ceil_div(k, BLOCK_K), MAX_OVERRIDE_SPLIT_K)
            need_int(name, v, isint and 1 <= v <= most, f"an int in [1, {most}] (K blocks of 128)")
            if v > 1 and kind != KIND_NORMAL:
                raise ValueError(f"override_config: split_k > 1 (split-K across CTAs) needs a normal GEMM, "
                                 f"got {KIND_NAMES[kind]}")
    if out.get("stream_k") and kind not in STREAM_K_KINDS:
        # Refused here: the chooser prices a forced tail before make_config would refuse it.
        raise ValueError(f"override_config: stream_k needs a normal or masked GEMM, got {KIND_NAMES[kind]}")
    if "block_m" in out and "block_n" in out:
        # The whole tile is forced: make_config's combination rules apply now. (With only one of the two, the other
        # comes from the model for each M, so those rules run at the GEMM.)
        trial = {f: out[f] for f in ("wgmma_n", "num_stages", "raster_n", "multicast", "interleave_k", "serial_m",
                                       "split_k", "stream_k", "split_cluster", "two_acc_sets") if f in out}
        sms = out.get("num_sms", 132)
        if out.get("multicast"):
            sms -= sms % 2
        if out.get("split_cluster"):
            sms -= sms % out.get("split_k", 1)
        try:
            make_config(kind, n, k, out["block_m"], out["block_n"], max(sms, 2), **trial)
        except ValueError as e:
            raise ValueError(f"override_config: {e}") from None
    return out


def override_config(kind: int | str, n: int, k: int, **fields: int | bool) -> None:
    """Force config fields (block_m, block_n, wgmma_n, num_stages, num_sms, raster_n, multicast, split_k,
    interleave_k, serial_m, stream_k, split_cluster, two_acc_sets) for a (kind, N, K).

    For tuning; ``fields`` empty removes the override. Every field is checked here (unknown names, types, ranges,
    and with block_m and block_n both given the combination), raising ValueError or TypeError that names it.
    """
    kind = kind_id(kind)
    for name, value in (("n", n), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"override_config: {name}: expected a positive int, got {type(value).__name__} {value!r}")
        if value < 1:
            raise ValueError(f"override_config: {name}: expected a positive int, got {value}")
    _check_names(fields)
    fields = _check_fields(kind, n, k, fields)
    global _version
    with _lock:
        if fields:
            _overrides[(kind, n, k)] = dict(fields)
        else:
            _overrides.pop((kind, n, k), None)
        _version += 1
