"""XLA's command buffers for cupygemm's custom calls, in one call before JAX starts its GPU backend.

XLA replays a jitted function's kernels from CUDA graphs ("command buffers"); with custom calls among what it
captures, cupygemm's Python handler runs only when XLA records a graph, not on every step (README, "JAX inside
jit"). The flags are read once, when JAX starts its backend, so they must be in ``XLA_FLAGS`` before the first JAX
computation (creating an array on the device counts).
"""
from __future__ import annotations

import os
import shlex
import warnings

#: The flags: custom calls (and fusions) captured into command buffers, graphs of any size.
COMMAND_BUFFER_FLAGS = ("--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL", "--xla_gpu_graph_min_graph_size=1")


def _backends_started() -> bool:
    from jax._src import xla_bridge

    started = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(started()) if started is not None else bool(getattr(xla_bridge, "_backends", None))


def merged_xla_flags(current: str, flags: tuple[str, ...] = COMMAND_BUFFER_FLAGS) -> str:
    """``current`` (an ``XLA_FLAGS`` value) with ``flags`` set: a flag already there with another value is
    replaced, every other flag kept in its place."""
    names = {f.split("=", 1)[0] for f in flags}
    kept = [f for f in shlex.split(current) if f.split("=", 1)[0] not in names]
    return " ".join(kept + list(flags))


def enable_command_buffers() -> bool:
    """Set XLA's command-buffer flags for custom calls (:data:`COMMAND_BUFFER_FLAGS`) in ``XLA_FLAGS``, keeping the
    other flags there. Call it before the first JAX computation.

    Returns True when the flags will take effect. When JAX has started its backends already, the flags could not
    change anything: it leaves ``XLA_FLAGS`` as it is, warns (RuntimeWarning, saying what to do instead) and returns
    False.
    """
    if _backends_started():
        warnings.warn("cupygemm.jax.enable_command_buffers(): JAX has started its backends already, so XLA_FLAGS is "
                      "read; call it before the first JAX computation, or set XLA_FLAGS="
                      f"\"{' '.join(COMMAND_BUFFER_FLAGS)}\" in the environment", RuntimeWarning, stacklevel=2)
        return False
    os.environ["XLA_FLAGS"] = merged_xla_flags(os.environ.get("XLA_FLAGS", ""))
    return True
