"""cupygemm.jax.enable_command_buffers: XLA's command-buffer flags set in one call before JAX starts its backends,
other flags kept, and a warning (no change) once it has started."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")

from cupygemm.jax.flags import COMMAND_BUFFER_FLAGS, merged_xla_flags  # noqa: E402


def test_merged_flags_replace_ours_and_keep_the_others_in_place():
    got = merged_xla_flags("--xla_dump_to=/tmp/d --xla_gpu_graph_min_graph_size=5 --xla_gpu_autotune_level=0")
    assert got.split() == ["--xla_dump_to=/tmp/d", "--xla_gpu_autotune_level=0", *COMMAND_BUFFER_FLAGS]
    assert merged_xla_flags("").split() == list(COMMAND_BUFFER_FLAGS)
    assert merged_xla_flags(merged_xla_flags("")) == merged_xla_flags("")  # idempotent


def test_before_and_after_jax_starts():
    code = """
import json, os, warnings
os.environ["XLA_FLAGS"] = "--xla_gpu_graph_min_graph_size=5 --xla_gpu_autotune_level=0"
import cupygemm.jax as cj
before = cj.enable_command_buffers()
flags = os.environ["XLA_FLAGS"]
import jax.numpy as jnp
jnp.ones(4).block_until_ready()  # the backend starts with the flags (XLA refuses unknown ones)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    after = cj.enable_command_buffers()
print(json.dumps([before, flags, after, [str(w.message) for w in caught], os.environ["XLA_FLAGS"] == flags]))
"""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    before, flags, after, warned, unchanged = json.loads(res.stdout.strip().splitlines()[-1])
    assert before is True and flags.split() == ["--xla_gpu_autotune_level=0", *COMMAND_BUFFER_FLAGS]
    assert after is False and unchanged
    assert len(warned) == 1 and "started its backends already" in warned[0] and "XLA_FLAGS=" in warned[0]
