"""The ``CUPYGEMM_*`` environment variables, parsed in one place and one way.

Booleans accept ``1/0``, ``true/false``, ``yes/no``, ``on/off`` (case-insensitive, surrounding whitespace ignored);
unset or empty means the default. Any other value raises ``ValueError`` naming the variable and the valid
spellings, so a typo never silently flips a switch (a non-empty-means-on rule would read
``CUPYGEMM_PRINT_CONFIGS=no`` as on).

Values are read on every call, not at import, so tests and long-running processes see changes.
"""
from __future__ import annotations

import os
from typing import Callable, Sequence

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")

# Every variable the package reads; README's table lists the same ones.
CACHE_DIR = "CUPYGEMM_CACHE_DIR"
DISABLE_CACHE = "CUPYGEMM_DISABLE_CACHE"
PRINT_CONFIGS = "CUPYGEMM_PRINT_CONFIGS"
FFMA_INTERLEAVE = "CUPYGEMM_FFMA_INTERLEAVE"
CUPTI = "CUPYGEMM_CUPTI"
B_EVICT_FIRST = "CUPYGEMM_B_EVICT_FIRST"
CHECK_INPUTS = "CUPYGEMM_CHECK_INPUTS"
PDL = "CUPYGEMM_PDL"
B_PREFETCH = "CUPYGEMM_B_PREFETCH_KIB"
L2_SIDES = "CUPYGEMM_L2_SIDES"


def _raw(name: str) -> str | None:
    """The stripped value of ``name``, or None when unset or empty (both mean "default")."""
    value = os.environ.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


# os.environ.get encodes the name on every call; its bytes mapping answers the same in a tenth of the time, which
# matters for a setting read on every GEMM call (as part of the call's plan key).
_ENVIRON_BYTES = getattr(os.environ, "_data", None)


_ENCODED_NAMES: dict[str, object] = {}


def setting_key(name: str) -> object:
    """The unparsed value of ``name`` (None when unset), cheaply: a cache key that changes when the variable does.
    Parsing (and rejecting a bad value) is left to the code that uses the value."""
    if _ENVIRON_BYTES is None:
        return os.environ.get(name)
    key = _ENCODED_NAMES.get(name)
    if key is None:
        key = _ENCODED_NAMES[name] = os.environ.encodekey(name)
    return _ENVIRON_BYTES.get(key)


def parse_bool(name: str, value: str) -> bool:
    """``value`` as a boolean spelling of variable ``name``; ValueError listing the valid spellings otherwise."""
    v = value.strip().lower()
    if v in TRUE_WORDS:
        return True
    if v in FALSE_WORDS:
        return False
    raise ValueError(f"{name}: expected one of {'/'.join(TRUE_WORDS + FALSE_WORDS)} (or unset/empty for the "
                     f"default), got {value!r}")


def env_bool(name: str, default: bool) -> bool:
    """Boolean variable ``name``: ``default`` when unset or empty."""
    raw = _raw(name)
    return default if raw is None else parse_bool(name, raw)


def env_choice(name: str, choices: Sequence[str], default: str) -> str:
    """Variable ``name`` as one of ``choices`` (case-insensitive; returned lower-case); ``default`` when unset or
    empty. If ``choices`` holds ``"on"``/``"off"`` or ``"1"``/``"0"``, the other boolean spellings map onto them
    (``yes`` -> ``on``, ``true`` -> ``1``, ...), so every switch takes the same words."""
    raw = _raw(name)
    if raw is None:
        return default
    v = raw.lower()
    if v in choices:
        return v
    for true_word, false_word in (("on", "off"), ("1", "0")):
        if true_word in choices and false_word in choices and (v in TRUE_WORDS or v in FALSE_WORDS):
            return true_word if v in TRUE_WORDS else false_word
    valid = list(choices)
    if any(c in TRUE_WORDS + FALSE_WORDS for c in choices):
        valid.append("(or " + "/".join(TRUE_WORDS + FALSE_WORDS) + ")")
    raise ValueError(f"{name}: expected one of {', '.join(valid)}, got {raw!r}")


def env_int(name: str, default: int, lo: int, hi: int) -> int:
    """Integer variable ``name`` in [lo, hi]: ``default`` when unset or empty."""
    raw = _raw(name)
    if raw is None:
        return default
    try:
        value = int(raw, 10)
    except ValueError:
        value = None
    if value is None or not lo <= value <= hi:
        raise ValueError(f"{name}: expected an integer from {lo} to {hi} (or unset/empty for the default), "
                         f"got {raw!r}")
    return value


def env_path(name: str) -> str | None:
    """Path variable ``name`` (user-expanded), or None when unset or empty."""
    raw = _raw(name)
    return os.path.expanduser(raw) if raw is not None else None


# ---- the variables ------------------------------------------------------------------------------------------------

def cache_disabled() -> bool:
    """``CUPYGEMM_DISABLE_CACHE``: keep kernels in memory only (default off)."""
    return env_bool(DISABLE_CACHE, False)


def print_configs() -> bool:
    """``CUPYGEMM_PRINT_CONFIGS``: print each chosen kernel config to stderr (default off)."""
    return env_bool(PRINT_CONFIGS, False)


def ffma_interleave_mode() -> str:
    """``CUPYGEMM_FFMA_INTERLEAVE``: ``auto`` (default), ``on`` or ``off`` (boolean spellings accepted)."""
    return env_choice(FFMA_INTERLEAVE, ("auto", "on", "off"), "auto")


def b_evict_first_mode() -> str:
    """``CUPYGEMM_B_EVICT_FIRST``: ``auto`` (default), ``1`` or ``0`` (boolean spellings accepted)."""
    return env_choice(B_EVICT_FIRST, ("auto", "1", "0"), "auto")


def pdl_enabled() -> bool:
    """``CUPYGEMM_PDL``: launch the GEMMs with programmatic dependent launch (default on)."""
    return env_bool(PDL, True)


#: The default of ``CUPYGEMM_B_PREFETCH_KIB`` (benchmarks/NOTES.md, "PDL").
B_PREFETCH_DEFAULT_KIB = 8192


def b_prefetch_bytes() -> int:
    """``CUPYGEMM_B_PREFETCH_KIB``: under PDL, how much of constant weights' first K blocks (packed weights) a GEMM
    fetches into L2 before it waits for the kernel before it, in KiB (default 8192; 0: none)."""
    return 1024 * env_int(B_PREFETCH, B_PREFETCH_DEFAULT_KIB, 0, 1 << 20)


def l2_sides_mode() -> str:
    """``CUPYGEMM_L2_SIDES``: ``auto`` (default: measure the L2 sides; ``pack_weights`` packs side-aware only on GPUs
    where the side-aware kernels measured faster than plain ones), ``1`` (pack wherever two sides are measured) or
    ``0`` (no measurement; ``pack_weights`` returns the weights unpacked). Boolean spellings accepted."""
    return env_choice(L2_SIDES, ("auto", "1", "0"), "auto")


def check_inputs_enabled() -> bool:
    """``CUPYGEMM_CHECK_INPUTS``: verify m_indices / masked_m on the host, which synchronizes (default off)."""
    return env_bool(CHECK_INPUTS, False)


def cupti_path() -> str | None:
    """``CUPYGEMM_CUPTI``: the libcupti to try first, or None."""
    return env_path(CUPTI)


def cache_dir_override() -> str | None:
    """``CUPYGEMM_CACHE_DIR``, or None (then the XDG default applies, see cupygemm.jit.cache.cache_dir)."""
    return env_path(CACHE_DIR)


#: Every variable and its parser: what :func:`invalid_settings` checks.
SETTINGS: dict[str, Callable[[], object]] = {
    CACHE_DIR: cache_dir_override, DISABLE_CACHE: cache_disabled, PRINT_CONFIGS: print_configs,
    FFMA_INTERLEAVE: ffma_interleave_mode, CUPTI: cupti_path, B_EVICT_FIRST: b_evict_first_mode,
    CHECK_INPUTS: check_inputs_enabled, PDL: pdl_enabled, L2_SIDES: l2_sides_mode, B_PREFETCH: b_prefetch_bytes,
}


def invalid_settings() -> list[str]:
    """One message (variable, value, what is allowed) per variable set to a value its parser rejects. The CLI
    checks them all before a command starts, so a typo is one line up front, not a traceback half way through a
    command that happens to read it late (or never, until a GEMM runs)."""
    bad = []
    for read in SETTINGS.values():
        try:
            read()
        except ValueError as e:
            bad.append(str(e))
    return bad
