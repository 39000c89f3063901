"""Kernel source: locate ``cuda_src/``, render a kernel with its compile-time constants.

The rendered source is the kernel file prefixed by ``#define`` lines; headers are handed to NVRTC
in memory, so compilation needs no include path and the cache key covers every file it reads.
"""
from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


@functools.lru_cache(maxsize=1)
def cuda_src_dir() -> Path:
    """Directory holding the CUDA sources: ``cupygemm/cuda_src`` where installed (the build maps the repository's
    top-level ``cuda_src/`` there, as package data), else the checkout's ``cuda_src/`` next to this package."""
    try:
        import cupygemm.cuda_src as installed  # a namespace package: .cu/.cuh files, no __init__.py

        for entry in getattr(installed, "__path__", []):
            p = Path(entry)
            if (p / "fp8_gemm.cu").is_file():
                return p
    except ImportError:
        pass
    p = Path(__file__).resolve().parents[2] / "cuda_src"
    if (p / "fp8_gemm.cu").is_file():
        return p
    raise FileNotFoundError("cupygemm cannot find its CUDA sources (cuda_src/fp8_gemm.cu); reinstall the package")


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """sha256 over every CUDA source file (name and bytes, sorted by name): identifies the kernels' sources as a
    whole, for cache archives (each cache key already covers the files its kernel reads)."""
    h = hashlib.sha256()
    root = cuda_src_dir()
    for p in sorted(list(root.glob("*.cu")) + list(root.glob("*.cuh"))):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _read(name: str) -> str:
    return (cuda_src_dir() / name).read_text()


def included_headers(name: str) -> dict[str, str]:
    """Every header ``name`` includes, transitively: {include name: text}."""
    found: dict[str, str] = {}
    todo = _INCLUDE.findall(_read(name))
    while todo:
        inc = todo.pop()
        if inc in found:
            continue
        found[inc] = _read(inc)
        todo.extend(_INCLUDE.findall(found[inc]))
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class KernelSource:
    """A rendered kernel: the main text, its headers, and the C name of its entry point."""

    name: str
    text: str
    headers: dict[str, str]
    entry: str

    @functools.cached_property
    def digest(self) -> str:
        h = hashlib.sha256()
        for part in (self.name, self.entry, self.text, *[f"{k}\0{v}" for k, v in self.headers.items()]):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()


def render(file: str, entry: str, defines: dict[str, object]) -> KernelSource:
    """Prefix ``file`` with ``#define NAME VALUE`` lines (in the order given)."""
    prefix = "".join(f"#define {k} {v}\n" for k, v in defines.items())
    return KernelSource(name=file, text=prefix + _read(file), headers=included_headers(file), entry=entry)
