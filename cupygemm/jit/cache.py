"""On-disk cubin cache, safe across processes and threads.

Entry file = MAGIC + sha256(cubin) + cubin, written to a temporary file and ``os.replace``d into place,
so readers never see a partial entry; a corrupt or truncated entry fails the checksum and is rebuilt.
An unwritable cache directory falls back to memory with one warning.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import warnings
from pathlib import Path

from ..env import cache_dir_override, cache_disabled
from ..errors import CupygemmCacheError

_MAGIC = b"CUPYGEMM-CUBIN-1\n"
_lock = threading.Lock()
_memory: dict[str, bytes] = {}
_warned_dirs: set[str] = set()


def cache_dir() -> Path:
    """``$CUPYGEMM_CACHE_DIR``, else ``$XDG_CACHE_HOME/cupygemm``, else ``~/.cache/cupygemm``.

    The XDG base-directory spec says a relative ``XDG_CACHE_HOME`` is invalid and must be ignored.
    """
    env = cache_dir_override()
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "cupygemm"
    return Path.home() / ".cache" / "cupygemm"


def cache_enabled() -> bool:
    """False when ``CUPYGEMM_DISABLE_CACHE`` is set true (kernels then live in memory only)."""
    return not cache_disabled()


def entry_path(key: str) -> Path:
    return cache_dir() / key[:2] / f"{key}.cubin"


def make_key(*parts: object) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\x1f")
    return h.hexdigest()


def load(key: str) -> bytes | None:
    """The cached cubin for ``key``, or None when absent or corrupt (a corrupt file is removed)."""
    with _lock:
        if key in _memory:
            return _memory[key]
    if not cache_enabled():
        return None
    path = entry_path(key)
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    head = len(_MAGIC) + 32
    if len(blob) > head and blob.startswith(_MAGIC):
        cubin = blob[head:]
        if hashlib.sha256(cubin).digest() == blob[len(_MAGIC):head]:
            with _lock:
                _memory[key] = cubin
            return cubin
    try:  # corrupt: drop it so the rebuilt entry replaces it
        path.unlink()
    except OSError:
        pass
    return None


def store(key: str, cubin: bytes) -> None:
    """Store ``cubin`` under ``key`` (memory always; disk when possible)."""
    with _lock:
        _memory[key] = cubin
    if not cache_enabled():
        return
    path = entry_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key[:16]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + hashlib.sha256(cubin).digest() + cubin)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as e:
        d = str(cache_dir())
        with _lock:
            first = d not in _warned_dirs
            _warned_dirs.add(d)
        if first:
            warnings.warn(
                f"cupygemm: cannot write the kernel cache in {d} ({e}); keeping kernels in memory only. "
                "Set CUPYGEMM_CACHE_DIR to a writable directory.",
                RuntimeWarning,
                stacklevel=3,
            )


def check_writable() -> None:
    """CupygemmCacheError naming the directory when the disk cache cannot take a new entry. For callers whose point
    is the disk cache (warm-up): store() itself falls back to memory, which would leave them with nothing."""
    root = cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".probe.", suffix=".tmp")
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise CupygemmCacheError(f"cannot write the kernel cache in {root} ({e}); set CUPYGEMM_CACHE_DIR to a "
                                 "writable directory") from None


def clear_memory() -> None:
    """Forget in-memory entries (tests use this to exercise the disk path)."""
    with _lock:
        _memory.clear()


def disk_usage() -> tuple[int, int]:
    """(number of entries, total bytes) on disk."""
    n = total = 0
    root = cache_dir()
    if root.is_dir():
        for p in root.glob("*/*.cubin"):
            n += 1
            total += p.stat().st_size
    return n, total
