"""What a bench run records about itself: device, driver and library versions, the measured tree, the command."""
from __future__ import annotations

import argparse
import datetime
import subprocess
from pathlib import Path
from typing import Any

from .timing import FLUSH_BYTES, timing_method


def git_revision(pkg: Path | None = None) -> str | None:
    """``git rev-parse --short HEAD`` of the checkout this package (or ``pkg``) lives in, with ``-dirty`` appended
    when tracked files differ from that commit (the run measured something else); None outside a checkout."""
    pkg = Path(__file__).resolve().parents[1] if pkg is None else Path(pkg).resolve()

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(pkg), *args], capture_output=True, text=True, timeout=10)

    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode != 0 or not top.stdout.strip():
            return None
        if Path(top.stdout.strip()).resolve() != pkg.parent:
            return None  # installed inside some other repository
        rev = git("rev-parse", "--short", "HEAD")
        if rev.returncode != 0 or not rev.stdout.strip():
            return None
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = status.returncode != 0 or bool(status.stdout.strip())
    return rev.stdout.strip() + ("-dirty" if dirty else "")


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run."""
    parts = ["cupygemm", "bench"]
    if getattr(args, "kinds", None):
        parts += ["--kinds", args.kinds]
    if getattr(args, "shapes", None):
        parts += ["--shapes", *args.shapes]
    parts += ["--peers", args.peers, "--iters", str(args.iters), "--seed", str(args.seed)]
    if getattr(args, "deepergemm_sideaware", None):
        parts += ["--deepergemm-sideaware", str(args.deepergemm_sideaware)]
    if getattr(args, "match_rows", None):
        parts += ["--match-rows", str(args.match_rows)]
    if getattr(args, "full_groups", False):
        parts.append("--full-groups")
    if getattr(args, "timing", "cupti") != "cupti":
        parts += ["--timing", args.timing]
    if getattr(args, "json", None):
        parts += ["--json", str(args.json)]
    if getattr(args, "markdown", False):
        parts.append("--markdown")
    if getattr(args, "plot", None):
        parts += ["--plot", str(args.plot)]
    return " ".join(parts)


def _cuda_version(v: int) -> str | None:
    return f"{v // 1000}.{v % 1000 // 10}" if v else None


def _nvidia_driver() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    for tok in text.split():
        parts = tok.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return tok
    return None


def environment(info: Any, args: argparse.Namespace, peers: dict[str, Any]) -> dict[str, Any]:
    """Device, driver and library versions, the command and the date (needs CuPy)."""
    import cupy

    import cupygemm

    try:
        from ..jit.compiler import nvrtc_version

        nv = nvrtc_version()
        nvrtc = f"{nv[0]}.{nv[1]}"
    except Exception:
        nvrtc = None
    torch_mod = next((p.torch for p in peers.values() if getattr(p, "torch", None) is not None), None)
    dg = peers.get("deepgemm")
    return {
        "device": info.name,
        "compute_capability": f"{info.compute_capability[0]}.{info.compute_capability[1:]}",
        "num_sms": None,
        "driver": _nvidia_driver(),
        "cuda_driver": _cuda_version(cupy.cuda.runtime.driverGetVersion()),
        "cuda_runtime": _cuda_version(cupy.cuda.runtime.runtimeGetVersion()),
        "nvrtc": nvrtc,
        "cupy": cupy.__version__,
        "cupygemm": cupygemm.__version__,
        "torch": getattr(torch_mod, "__version__", None),
        "deep_gemm": getattr(getattr(dg, "module", None), "__version__", "unknown") if dg else None,
        "deeper_gemm": {name: getattr(p.module, "__file__", None) for name, p in peers.items()
                        if name.startswith("deepergemm")} or None,
        "deepergemm_sideaware": getattr(args, "deepergemm_sideaware", None),
        "git_revision": git_revision(),
        "command": command_line(args),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "iters": args.iters,
        "seed": args.seed,
        "match_rows": getattr(args, "match_rows", None),
        "full_groups": getattr(args, "full_groups", False),
        "method": timing_method(False, FLUSH_BYTES),
    }
