"""A portable kernel cache: ``cupygemm cache export FILE`` / ``cache import FILE``.

Build the kernels once (``cupygemm warmup`` on a CPU box), ship one file to the GPU hosts, import it there. The
archive is a gzip'd tar holding ``manifest.json`` and ``kernels/<key>.cubin``. The manifest records what the
cubins were built for: cupygemm version, NVRTC version, architecture, SM count (which kernels the chooser picks
depends on it) and a hash of the CUDA sources, plus each cubin's sha256. Import checks every field against this
installation and every checksum before it writes anything, and refuses a mismatch naming the field; members are
read by name, never extracted as paths.
"""
from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import re
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import CupygemmCacheError
from . import cache

FORMAT = "cupygemm-cache/1"
MANIFEST = "manifest.json"
_KEY = re.compile(r"^[0-9a-f]{64}$")
#: Manifest fields that must equal this installation's for an import (num_sms is checked apart: see import_cache).
CHECKED_FIELDS = ("format", "cupygemm", "nvrtc", "arch", "source_hash")


def local_manifest(num_sms: int | None) -> dict:
    """The manifest fields of this installation (``num_sms`` as given)."""
    import cupygemm

    from .compiler import BASE_OPTIONS, nvrtc_version
    from .source import source_hash

    arch = next(o.split("=", 1)[1] for o in BASE_OPTIONS if o.startswith("-arch="))
    return {"format": FORMAT, "cupygemm": cupygemm.__version__, "nvrtc": list(nvrtc_version()), "arch": arch,
            "num_sms": num_sms, "source_hash": source_hash()}


def _gpu_num_sms() -> int | None:
    from ..device import get_num_sms, gpu_available

    return get_num_sms() if gpu_available() else None


def _check_sms(num_sms: object) -> None:
    if num_sms is not None and (isinstance(num_sms, bool) or not isinstance(num_sms, int) or num_sms < 1):
        raise ValueError(f"num_sms: expected a positive int, got {num_sms!r}")


def cached_keys() -> list[str]:
    """Keys of the entries in the disk cache."""
    root = cache.cache_dir()
    if not root.is_dir():
        return []
    return sorted(p.stem for p in root.glob("*/*.cubin") if _KEY.match(p.stem))


def export_cache(path: str | os.PathLike, num_sms: int | None = None) -> int:
    """Write every cached kernel and a manifest to ``path``; returns the number of kernels.

    ``num_sms``: the SM count the kernels were planned for (default: this GPU's; required without a GPU). Entries
    that fail their checksum are left out (the cache drops them). The file is written whole or not at all.
    """
    _check_sms(num_sms)
    if num_sms is None:
        num_sms = _gpu_num_sms()
        if num_sms is None:
            raise ValueError("num_sms: no GPU here; give the SM count the cache was warmed for (--num-sms)")
    manifest = local_manifest(num_sms)
    manifest["created"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    blobs = {}
    for key in cached_keys():
        cubin = cache.load(key)
        if cubin is not None:
            blobs[key] = cubin
    manifest["kernels"] = {key: hashlib.sha256(b).hexdigest() for key, b in blobs.items()}
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w:gz") as tar:
            _add(tar, MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
            for key, blob in blobs.items():
                _add(tar, f"kernels/{key}.cubin", blob)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return len(blobs)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


@dataclass
class ImportResult:
    added: int  # kernels written into the cache
    present: int  # kernels the cache already held
    cache_dir: Path
    note: str = ""  # e.g. that the SM count could not be checked


def read_archive(path: str | os.PathLike) -> tuple[dict, dict[str, bytes]]:
    """(manifest, {key: cubin}) of an archive, every member checked against the manifest; CupygemmCacheError if
    the archive is damaged (also cut short) or was altered."""
    try:
        return _read_archive(path)
    except (EOFError, zlib.error, tarfile.TarError, OSError) as e:
        # gzip and tarfile meet a cut-short download only as they read on: while listing or reading members
        raise CupygemmCacheError(f"{path}: truncated or damaged archive ({type(e).__name__}: {e}); copy it "
                                 "again") from None


def _read_archive(path: str | os.PathLike) -> tuple[dict, dict[str, bytes]]:
    try:
        tar = tarfile.open(path, mode="r:gz")
    except (tarfile.TarError, OSError) as e:
        raise CupygemmCacheError(f"{path}: not a cupygemm cache archive ({e})") from None
    with tar:
        members = {m.name: m for m in tar.getmembers()}
        if MANIFEST not in members:
            raise CupygemmCacheError(f"{path}: no {MANIFEST}: not a cupygemm cache archive")
        try:
            manifest = json.loads(_read_member(tar, members[MANIFEST]))
            kernels = dict(manifest["kernels"])
        except (ValueError, KeyError, TypeError) as e:
            raise CupygemmCacheError(f"{path}: unreadable {MANIFEST} ({e})") from None
        expected = {f"kernels/{k}.cubin" for k in kernels} | {MANIFEST}
        extra = sorted(set(members) - expected)
        if extra:
            raise CupygemmCacheError(f"{path}: members not listed in the manifest: {extra[:5]}")
        blobs = {}
        for key, digest in kernels.items():
            if not _KEY.match(str(key)):
                raise CupygemmCacheError(f"{path}: bad kernel key {key!r} in the manifest")
            member = members.get(f"kernels/{key}.cubin")
            if member is None:
                raise CupygemmCacheError(f"{path}: kernel {key[:16]}... listed in the manifest is missing")
            blob = _read_member(tar, member)
            if hashlib.sha256(blob).hexdigest() != digest:
                raise CupygemmCacheError(f"{path}: kernel {key[:16]}... does not match its checksum (damaged or altered)")
            blobs[key] = blob
    return manifest, blobs


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    if not member.isfile():
        raise CupygemmCacheError(f"archive member {member.name!r} is not a regular file")
    f = tar.extractfile(member)
    assert f is not None
    return f.read()


def import_cache(path: str | os.PathLike, num_sms: int | None = None) -> ImportResult:
    """Verify ``path`` against this installation and add its kernels to the cache.

    Refused (CupygemmCacheError naming each differing field, nothing written) when the cupygemm version, NVRTC
    version, architecture or CUDA-source hash differ, or when the SM count differs from ``num_sms`` (default: this
    GPU's; without a GPU and without ``num_sms`` it is not checked, and the result's note says so).
    """
    _check_sms(num_sms)
    manifest, blobs = read_archive(path)
    here_sms = num_sms if num_sms is not None else _gpu_num_sms()
    local = local_manifest(here_sms)
    diffs = [f"{f}: archive {manifest.get(f)!r}, here {local[f]!r}" for f in CHECKED_FIELDS if manifest.get(f) != local[f]]
    note = ""
    if here_sms is None:
        note = f"SM count not checked (archive: {manifest.get('num_sms')}; no GPU here: give --num-sms to check it)"
    elif manifest.get("num_sms") != here_sms:
        diffs.append(f"num_sms: archive {manifest.get('num_sms')!r}, here {here_sms!r} (the chooser picks other kernels "
                     "for another SM count: warm up for this one)")
    if diffs:
        raise CupygemmCacheError(f"{path}: refused, it was built for another setup:\n  " + "\n  ".join(diffs))
    if not cache.cache_enabled():
        raise CupygemmCacheError("CUPYGEMM_DISABLE_CACHE is set: there is no disk cache to import into")
    added = present = 0
    for key, blob in blobs.items():
        if cache.entry_path(key).is_file() and cache.load(key) is not None:
            present += 1
            continue
        cache.store(key, blob)
        if not cache.entry_path(key).is_file():  # store() fell back to memory (it warned why)
            raise CupygemmCacheError(f"cannot write the cache in {cache.cache_dir()}: set CUPYGEMM_CACHE_DIR "
                                     "to a writable directory")
        added += 1
    return ImportResult(added, present, cache.cache_dir(), note)
