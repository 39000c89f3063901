"""NVRTC libraries other than CuPy's, found in site-packages and extra directories and driven through ctypes: the SASS
tests and the FFMA-interleave measurement compile one kernel source with several NVRTC versions.

Each library runs in a child process (:func:`compile_ctypes`): two ``libnvrtc.so.12`` of different minor versions must
not share a process. Search directories: ``site-packages/nvidia/cu13/lib`` (``nvidia-cuda-nvrtc``),
``site-packages/nvidia/cuda_nvrtc/lib`` (``nvidia-cuda-nvrtc-cu12``), the ``os.pathsep``-separated
``CUPYGEMM_NVRTC_DIRS`` and any ``.nvrtc*`` directory next to the checkout (e.g. ``pip install --target DIR
nvidia-cuda-nvrtc-cu12==12.8.93``).
"""
from __future__ import annotations

import ctypes
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def site_dirs() -> List[str]:
    """Directories holding the pip packages' ``nvidia/`` tree: entries of ``sys.path`` and the ``nvidia`` namespace."""
    dirs = []
    for p in sys.path:
        if p and os.path.isdir(os.path.join(p, "nvidia")):
            dirs.append(p)
    try:
        import importlib.util

        spec = importlib.util.find_spec("nvidia")
        if spec and spec.submodule_search_locations:
            dirs += [os.path.dirname(x) for x in spec.submodule_search_locations]
    except (ImportError, ValueError):
        pass
    out = []
    for d in dirs:
        d = os.path.realpath(d)
        if d not in out:
            out.append(d)
    return out


def _extra_dirs() -> List[str]:
    dirs = [d for d in os.environ.get("CUPYGEMM_NVRTC_DIRS", "").split(os.pathsep) if d]
    dirs += sorted(glob.glob(os.path.join(os.path.dirname(_REPO), ".nvrtc*")))
    return [os.path.realpath(d) for d in dirs if os.path.isdir(d)]


@dataclass(frozen=True)
class NvrtcLib:
    """A libnvrtc found on disk and its (major, minor) version."""

    path: str
    version: Tuple[int, int]


def _version_from_builtins(libpath: str) -> Optional[Tuple[int, int]]:
    for b in glob.glob(os.path.join(os.path.dirname(libpath), "libnvrtc-builtins.so.*")):
        m = re.search(r"libnvrtc-builtins\.so\.(\d+)\.(\d+)$", b)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def find_nvrtc_libs() -> List[NvrtcLib]:
    """Every libnvrtc.so.12 / .so.13 in site-packages and the extra dirs, with its version (from the builtins lib)."""
    seen, out = set(), []
    for d in site_dirs() + _extra_dirs():
        for pat in ("nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
                    "libnvrtc.so.1[23]", "lib/libnvrtc.so.1[23]"):
            for p in glob.glob(os.path.join(d, pat)):
                rp = os.path.realpath(p)
                if rp in seen:
                    continue
                seen.add(rp)
                v = _version_from_builtins(rp)
                if v is not None:
                    out.append(NvrtcLib(p, v))
    return out


class CtypesNvrtc:
    """Minimal ctypes NVRTC wrapper (create/compile/getCUBIN/log). Use it in a fresh process per libnvrtc."""

    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)
        self.path = path
        for fn in ("nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetCUBINSize", "nvrtcGetCUBIN",
                   "nvrtcGetProgramLogSize", "nvrtcGetProgramLog", "nvrtcDestroyProgram", "nvrtcVersion",
                   "nvrtcGetErrorString"):
            getattr(self.lib, fn).restype = ctypes.c_char_p if fn == "nvrtcGetErrorString" else ctypes.c_int

    def _check(self, rc: int, what: str, log: str = "") -> None:
        if rc != 0:
            err = self.lib.nvrtcGetErrorString(rc).decode()
            raise RuntimeError(f"{what} failed: {err} ({rc})\n{log}")

    def version(self) -> Tuple[int, int]:
        a, b = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(a), ctypes.byref(b)), "nvrtcVersion")
        return a.value, b.value

    def compile(self, src: str, opts: Sequence[str], name: str = "kernels.cu") -> bytes:
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None),
                    "nvrtcCreateProgram")
        try:
            arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
            rc = self.lib.nvrtcCompileProgram(prog, len(opts), arr)
            n = ctypes.c_size_t()
            self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
            log = ctypes.create_string_buffer(max(n.value, 1))
            self.lib.nvrtcGetProgramLog(prog, log)
            self._check(rc, "nvrtcCompileProgram", log.value.decode(errors="replace"))
            self._check(self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(n)), "nvrtcGetCUBINSize")
            buf = ctypes.create_string_buffer(n.value)
            self._check(self.lib.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
            return buf.raw  # the full image (no byte is dropped on this path)
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _subprocess_main() -> None:  # pragma: no cover - runs in the child
    job = json.loads(sys.stdin.read())
    nv = CtypesNvrtc(job["lib"])
    outs = []
    for i, (src, opts) in enumerate(job["jobs"]):
        path = os.path.join(job["outdir"], f"{i}.cubin")
        with open(path, "wb") as f:
            f.write(nv.compile(src, opts))
        outs.append(path)
    print(json.dumps({"version": list(nv.version()), "cubins": outs}))


def compile_ctypes(lib: str, jobs: Sequence[Tuple[str, Sequence[str]]]) -> Tuple[Tuple[int, int], List[bytes]]:
    """Compile each (source, options) with the given libnvrtc in a child process; returns (version, cubins)."""
    with tempfile.TemporaryDirectory() as td:
        job = {"lib": lib, "outdir": td, "jobs": [[s, list(o)] for s, o in jobs]}
        code = (f"import sys; sys.path.insert(0, {_REPO!r}); "
                "from sass_tools.nvrtc import _subprocess_main; _subprocess_main()")
        # libnvrtc loads libnvrtc-builtins.so.<version> by name: the library's own directory goes first.
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(lib))] +
                                                 [d for d in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d])
        r = subprocess.run([sys.executable, "-c", code], input=json.dumps(job), capture_output=True, text=True,
                           timeout=300, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"NVRTC ({lib}) compile failed:\n{r.stderr[-4000:]}")
        res = json.loads(r.stdout.strip().splitlines()[-1])
        cubins = []
        for p in res["cubins"]:
            with open(p, "rb") as f:
                cubins.append(f.read())
        return tuple(res["version"]), cubins  # type: ignore[return-value]
