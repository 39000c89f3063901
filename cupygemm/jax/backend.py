"""Where cupygemm.jax's custom calls go: the FFI target, its handler per platform, and the planner.

A :class:`Backend` is an XLA platform and a planner. ``plan(kind, m, n, k, num_groups, static)`` (``sides=True``
added for side-aware packed weights, ``scale_rows`` for the flat k-grouped kind) returns ``{xla_device_ordinal:
plan}``, plans with the attributes, ``launch`` and ``bind`` of :func:`cupygemm.plan.plan_gemm`'s (``bind``
optional: the handler then calls ``launch``). The CUDA backend (:data:`CUDA`) plans on every local GPU of this
process. The CPU tests install a backend whose plans compute on the host (:class:`use_backend`), which runs the
whole package, the handler included, without a GPU.

One FFI handler (:class:`cupygemm.xla_ffi.FfiHandler`) per platform serves every kind and shape under the target
name :data:`TARGET`; it is registered with XLA on first use, and a call's ``entry_id`` attribute picks its launch.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import jax

from .. import xla_ffi
from ..errors import CupygemmDeviceError

#: The FFI target name (one handler serves every kind and shape; the call's ``entry_id`` attribute picks).
TARGET = "cupygemm_fp8_gemm"


@dataclass
class Backend:
    """An XLA platform, its planner, and the handler entries made for it (by static problem)."""

    platform: str
    plan: Callable[..., dict[int, Any]]
    use_stream: bool = True
    handler: xla_ffi.FfiHandler | None = None
    entries: dict[tuple, tuple] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def local_gpus() -> list[int]:
    """The ordinals of this process's GPUs as XLA numbers them; RuntimeError where JAX has no GPU backend."""
    ordinals = []
    for dev in jax.devices("gpu"):
        if dev.process_index == jax.process_index():
            # The handler looks a launch up by the ordinal XLA's call frame gives (DeviceOrdinal_Get): the local
            # hardware id, not the global device id (which differs from it in every process but the first).
            hid = getattr(dev, "local_hardware_id", None)
            ordinals.append(int(dev.id if hid is None else hid))
    return ordinals


#: The "ordinal" of a trace-only plan: no XLA device has it, so no launch is ever looked up for it.
TRACE_ONLY = -1


class TraceOnlyPlan:
    """The plan of a GEMM traced where JAX has no GPU backend (``jax.make_jaxpr`` of a model on a CPU machine): the
    traced program is complete (the scales' padding from the kind's check, no scratch), but nothing can run it."""

    sfa_m_pad = sfb_m_pad = None
    scratch_floats = scratch_counters = 0

    def __init__(self, why: str):
        self.why = why

    def launch(self, *args: Any, **kwargs: Any) -> None:
        raise CupygemmDeviceError(f"cupygemm.jax needs JAX with a CUDA GPU backend (e.g. pip install "
                                  f"'jax[cuda12]'): this GEMM was traced without one ({self.why})")

    bind = launch


def plan_cuda(kind: Any, m: int, n: int, k: int, num_groups: int, static: int | None,
              sides: bool = False, scale_rows: int = 0) -> dict[int, Any]:
    """The CUDA backend's planner: :func:`cupygemm.plan.plan_gemm` on every local GPU (compiling and loading the
    kernel there now, at trace time). ``scale_rows``: the flat k-grouped kind's stacked scale rows. Where JAX has no
    GPU backend, one :class:`TraceOnlyPlan`: tracing works, running does not."""
    try:
        gpus = local_gpus()
    except RuntimeError as e:  # no GPU backend: the program can be traced (make_jaxpr), not run
        return {TRACE_ONLY: TraceOnlyPlan(str(e))}
    import cupy

    from ..plan import plan_gemm

    plans = {}
    for ordinal in gpus:
        with cupy.cuda.Device(ordinal):
            plans[ordinal] = plan_gemm(kind, m, n, k, num_groups, ordinal, expected_m=static, sides=sides,
                                       scale_rows=scale_rows)
    return plans


#: The backend of real use: XLA's CUDA platform.
CUDA = Backend("CUDA", plan_cuda)
_current = CUDA
_register_lock = threading.Lock()

#: The handler registered for each platform (lower-case name): XLA refuses a second handler under one name.
handlers: dict[str, xla_ffi.FfiHandler] = {}


def current() -> Backend:
    """The backend new traces lower to."""
    return _current


class use_backend:
    """Test hook: ``with use_backend(platform, plan, use_stream) as backend:`` routes new traces to another
    backend (clearing JAX's caches on the way in and out: jitted callers traced under one backend hold its entry
    ids)."""

    def __init__(self, platform: str, plan: Callable[..., dict[int, Any]], use_stream: bool = False):
        self.backend = Backend(platform, plan, use_stream)

    def __enter__(self) -> Backend:
        global _current
        self._previous, _current = _current, self.backend
        jax.clear_caches()
        return self.backend

    def __exit__(self, *exc: object) -> None:
        global _current
        _current = self._previous
        jax.clear_caches()


def handler(backend: Backend) -> xla_ffi.FfiHandler:
    """The platform's FFI handler, registered with XLA on first use (once per process and platform)."""
    if backend.handler is None:
        with _register_lock:
            found = handlers.get(backend.platform.lower())
            if found is None:
                version = xla_ffi.header_api_version(jax.ffi.include_dir())
                found = xla_ffi.FfiHandler(TARGET, version, use_stream=backend.use_stream)
                jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(found.address), platform=backend.platform)
                handlers[backend.platform.lower()] = found
            backend.handler = found
    return backend.handler
