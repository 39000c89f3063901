"""Which CUDA stream a call runs on.

The contract, the same for every entry point and framework: a call runs after all work the caller queued on its
current stream, and all work queued on that stream after the call runs after it. So the kernels launch on

* the ``stream=`` argument when given: an int handle (``cudaStream_t``), a CuPy or torch stream, or any object
  with ``cuda_stream`` (torch), ``ptr`` (CuPy) or the ``__cuda_stream__`` protocol;
* else, for torch tensors, torch's current stream on the tensors' device;
* else CuPy's current stream (CuPy arrays and other DLPack producers).

JAX arrays never come here: they go through :mod:`cupygemm.jax`, whose custom calls run on XLA's stream.

Nothing here synchronizes.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any

from .tensors import Framework, cupy


def stream_handle(stream: Any) -> int:
    """The raw ``cudaStream_t`` of a ``stream=`` argument; TypeError for anything else."""
    if isinstance(stream, bool):
        raise TypeError("stream: expected an int handle or a CUDA stream object, got bool")
    if isinstance(stream, int):
        if stream < 0:
            raise ValueError(f"stream: expected a non-negative stream handle, got {stream}")
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        return int(value[1])
    for attr in ("cuda_stream", "ptr"):
        value = getattr(stream, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise TypeError(f"stream: expected an int handle, a CuPy or torch stream, or an object with cuda_stream, ptr "
                    f"or __cuda_stream__, got {type(stream).__name__}")


def current_stream(framework: Framework, device: int) -> int:
    """The caller's current stream on ``device`` for tensors of ``framework``."""
    if framework is Framework.TORCH:
        return sys.modules["torch"]._C._cuda_getCurrentRawStream(device)
    return cupy.cuda.get_current_stream(device).ptr


def resolve(stream: Any, framework: Framework, device: int) -> int:
    """The stream a call launches on: ``stream`` when given, else the caller's current stream."""
    if stream is not None:
        return stream_handle(stream)
    return current_stream(framework, device)


def is_capturing(stream: int) -> bool:
    """Whether ``stream`` is being captured into a CUDA graph."""
    return bool(cupy.cuda.runtime.streamIsCapturing(stream))


def torch_stream(stream: int, device: int):
    """A context in which torch allocates and queues work in ``stream``'s order: nothing to switch when it is
    torch's current stream already (always so for calls without ``stream=``)."""
    torch = sys.modules["torch"]
    if torch._C._cuda_getCurrentRawStream(device) == stream:
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.ExternalStream(stream, device=torch.device("cuda", device)))


class _Handle:
    """A raw stream handle speaking the CUDA stream protocol (how CuPy wraps foreign streams)."""

    __slots__ = ("handle",)

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return 0, self.handle


_cupy_streams: dict[tuple[int, int], Any] = {}


def cupy_stream(handle: int, device: int) -> Any:
    """A CuPy stream object over a raw handle (cached: wrapping one costs microseconds)."""
    s = _cupy_streams.get((handle, device))
    if s is None:
        with cupy.cuda.Device(device):
            make = getattr(cupy.cuda.Stream, "from_external", None)
            s = make(_Handle(handle)) if make is not None else cupy.cuda.ExternalStream(handle, device)
        if len(_cupy_streams) > 256:
            _cupy_streams.clear()
        _cupy_streams[(handle, device)] = s
    return s
