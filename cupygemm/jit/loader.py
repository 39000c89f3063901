"""One way to load a kernel: rendered source -> a function loaded on a device, with a launcher for its parameters.

:func:`load` is the step every kernel takes: the cubin from the disk cache or NVRTC
(:func:`cupygemm.jit.build.build_cubin`), its module loaded on the device, memoized per (device, source digest,
options) (:func:`cupygemm.jit.build.load_kernel`), the dynamic shared memory it is launched with allowed, and a
launcher for its parameter kinds (:func:`cupygemm.launch.make_launcher`: the values packed into one buffer, launched
through the driver). Module loads, function attributes and the parameter layout query run in relaxed capture mode
(:func:`cupygemm.jit.build.relaxed_capture`), so a first call inside a torch graph capture leaves it valid. The
:class:`~cupygemm.jit.build.LoadedKernel` it returns holds the module: whoever keeps it keeps the function loaded.

The GEMM kernels (:mod:`cupygemm.kernels`) load through it per config. Each small kernel (the casts, the SFA copy,
the B packing, the L2 probe) is declared once, by the module that launches it, as a :class:`SmallKernel`, which
loads it per device on first use and keeps it::

    _COPY = SmallKernel(lambda: render("copy.cu", "copy", {}), (PTR, PTR, U32))
    _params = PackedParams()  # where a caller's launches repeat their values

    params = _params.get(key)
    if params is None:
        params = _params.put(key, _COPY.pack(device, (src, dst, n)))
    _COPY.launch(device, stream, grid, block, smem, params)  # the current device must be ``device``

(``launch_grid`` takes a grid of (x, y, z) blocks.) Packed parameters depend only on the kinds, so one set serves every device and variant of a small kernel.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Hashable, Sequence

from ..device import on_device
from ..launch import make_launcher
from ..util import keep_newest
from . import build
from .build import LoadedKernel, load_kernel, relaxed_capture
from .source import KernelSource

_lock = threading.Lock()
_declared: list["SmallKernel"] = []


def load(device: int, src: KernelSource, kinds: Sequence[str], *, options: tuple[str, ...] = (),
         post_process: bool = True, config: object = None, dynamic_smem: int = 0) -> LoadedKernel:
    """``src`` compiled (or fetched from the cache) and loaded on ``device``, with a launcher for parameters of
    ``kinds`` and ``dynamic_smem`` bytes of dynamic shared memory allowed. ``options``, ``post_process`` (the SASS
    pass) and ``config`` (for compile errors) as for :func:`cupygemm.jit.build.build_cubin`. Memoized per device
    and source: loading the same source again returns the same kernel."""
    kinds = tuple(kinds)
    with on_device(device):
        k = load_kernel(src, options, post_process, config)
        k.ensure_dynamic_smem(dynamic_smem)
        if k.launcher is None:
            with _lock:
                if k.launcher is None:
                    with relaxed_capture():
                        launcher = make_launcher(k.function, kinds, device)
                    k.kinds = kinds
                    k.launcher = launcher
    if k.kinds != kinds:
        raise ValueError(f"kernel {src.entry} ({src.name}) is loaded with parameter kinds {k.kinds}, not {kinds}")
    return k


class SmallKernel:
    """A small kernel, declared once (at import, by the module that launches it); loaded per device on first use.

    ``source(*variant)`` renders it: a variant is the compile-time choices of one build (a cast's input dtype and
    entry point, the packed weights' N and K), none for most. ``kinds``: its parameters' kinds (``PTR``, ``U32``,
    ``I64``, ... of :mod:`cupygemm.launch`), in order; every variant takes the same. ``post_process``: whether the
    SASS pass may run on it (part of its cache key). ``dynamic_smem``: the dynamic shared memory it is launched with
    (above 48 KiB a function must be allowed it). ``check(device)``: run before the first load on a device (e.g.
    its compute capability).
    """

    def __init__(self, source: Callable[..., KernelSource], kinds: Sequence[str], *, post_process: bool = False,
                 dynamic_smem: int = 0, check: Callable[[int], None] | None = None):
        self.source = source
        self.kinds = tuple(kinds)
        self.post_process = post_process
        self.dynamic_smem = dynamic_smem
        self.check = check
        # (device, *variant), or the device alone for a kernel without variants -> the kernel (it holds the module)
        self._on: dict[Hashable, LoadedKernel] = {}
        with _lock:
            _declared.append(self)

    def get(self, device: int, *variant: Hashable) -> LoadedKernel:
        """The kernel (of ``variant``) loaded on ``device``: loaded on first use, then one dict lookup."""
        k = self._on.get((device,) + variant if variant else device)
        if k is None:
            k = self._load(device, variant)
        return k

    def pack(self, device: int, values: Sequence[object], *variant: Hashable) -> Any:
        """``values`` (one per parameter kind) packed for a launch."""
        k = self._on.get((device,) + variant if variant else device)
        if k is None:
            k = self._load(device, variant)
        return k.launcher.pack(values)

    def launch(self, device: int, stream: int, grid: int, block: int, smem: int, params: Any,
               *variant: Hashable) -> None:
        """Launch on ``stream`` over ``grid`` blocks of ``block`` threads, with ``smem`` bytes of dynamic shared
        memory and packed ``params``. ``device`` must be the current device. (On a hot path: one dict lookup.)"""
        k = self._on.get((device,) + variant if variant else device)
        if k is None:
            k = self._load(device, variant)
        k.launcher.launch(params, grid, block, smem, stream)

    def launch_grid(self, device: int, stream: int, grid: tuple[int, int, int], block: int, smem: int, params: Any,
                    *variant: Hashable) -> None:
        """As :meth:`launch`, over a grid of (x, y, z) blocks."""
        k = self._on.get((device,) + variant if variant else device)
        if k is None:
            k = self._load(device, variant)
        k.launcher.launch_grid(params, grid, block, smem, stream)

    def _load(self, device: int, variant: tuple) -> LoadedKernel:
        if self.check is not None:
            self.check(device)
        k = load(device, self.source(*variant), self.kinds, post_process=self.post_process,
                 dynamic_smem=self.dynamic_smem)
        with _lock:
            return self._on.setdefault((device,) + variant if variant else device, k)

    def loaded(self) -> dict[tuple, LoadedKernel]:
        """What is loaded: {(device, *variant): kernel}."""
        return {key if isinstance(key, tuple) else (key,): k for key, k in self._on.items()}


class PackedParams:
    """Packed parameter sets by a caller's key (its values, or what determines them), the last ``limit`` kept: a
    launch whose values repeat finds them with ``get`` (a dict lookup) instead of packing them again."""

    def __init__(self, limit: int = 256):
        self._sets: dict[Hashable, Any] = {}
        self._limit = limit
        self.get = self._sets.get

    def put(self, key: Hashable, params: Any) -> Any:
        """Keep ``params`` under ``key`` (:func:`cupygemm.util.keep_newest`) and return them."""
        return keep_newest(self._sets, key, params, self._limit)

    def __len__(self) -> int:
        return len(self._sets)


def clear() -> None:
    """Forget the loaded kernels: every small kernel's and the per-source memo (tests, and tools that clear the
    cache), so that the next use loads its module again. A module stays loaded while something still holds its
    kernel (a launch plan, say)."""
    with _lock:
        for kernel in _declared:
            kernel._on.clear()
    with build._lock:
        build._loaded.clear()
