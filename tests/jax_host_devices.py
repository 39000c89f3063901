"""Running a JAX test body in a fresh Python process on XLA's CPU backend with several host devices (the device
count is fixed when JAX starts, so each such test needs its own process)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def run_on_host_devices(code: str, devices: int, timeout: int = 600) -> None:
    """Run ``code`` (dedented) with ``devices`` CPU devices; AssertionError with the tail of its output on failure."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}").strip()
    env["JAX_PLATFORMS"] = "cpu"
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-6000:]
