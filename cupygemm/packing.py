"""L2-side-aware weights: :func:`pack_weights` rewrites B once so that the side-aware GEMMs read each half of N from
the L2 side of the SMs that compute it (``cuda_src/l2_sides.cuh`` has the layout, :mod:`cupygemm.l2` the
measurement).

The packed weights are one uint8 buffer allocated by the caller's framework (CuPy's pool, torch's caching
allocator; JAX arrays are not packed yet), 8 KiB-aligned inside it, with the swap bits that say
which slot of each 8 KiB pair holds which half stored after each group's data. The GEMM reads those bits, so the
math never depends on where the buffer lives: a copy (to another address, another process) computes the same
result, only its pairs may then sit on the wrong sides. Same accumulation order as plain B: the results are bitwise
equal to the unpacked GEMM's with the same config.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import l2
from .streams import cupy_stream, resolve
from .tensors import FP8_E4M3, U8, Framework, View, framework_of, gpu_device_of, read
from .util import ceil_div

PAIR_BYTES = 8192  # two 4 KiB slots on opposite L2 sides
CHUNK_ROWS = 32  # rows of B (of one 128-wide K block) per 4 KiB slot


@dataclass(frozen=True)
class PackedLayout:
    """The byte layout of packed B for one (N, K), as ``PackedB<N, K>`` in ``cuda_src/l2_sides.cuh``."""

    n: int
    k: int

    @property
    def chunks(self) -> int:
        return ceil_div(self.n, CHUNK_ROWS)

    @property
    def pairs(self) -> int:  # per K block: chunk j of each half
        return ceil_div(self.chunks, 2)

    @property
    def k_blocks(self) -> int:
        return ceil_div(self.k, 128)

    @property
    def data_bytes(self) -> int:
        return self.k_blocks * self.pairs * PAIR_BYTES

    @property
    def swap_bytes(self) -> int:
        return ceil_div(ceil_div(self.k_blocks * self.pairs, 32) * 4, PAIR_BYTES) * PAIR_BYTES

    @property
    def group_bytes(self) -> int:
        return self.data_bytes + self.swap_bytes


@dataclass(frozen=True, eq=False)
class PackedWeights:
    """Weights for the GEMMs' ``rhs``, in place of ``(B, SFB)``: ``data`` is B packed side-aware (uint8, one
    dimension) when ``side_aware``, else B itself (the device has no side info, :func:`cupygemm.l2.unavailable_reason`
    says why); ``scales`` is SFB as given. ``shape`` is B's: [N, K] or [G, N, K]."""

    data: Any
    scales: Any
    shape: tuple[int, ...]
    side_aware: bool

    @property
    def n(self) -> int:
        return self.shape[-2]

    @property
    def k(self) -> int:
        return self.shape[-1]

    @property
    def num_groups(self) -> int:
        return self.shape[0] if len(self.shape) == 3 else 1

    @property
    def layout(self) -> PackedLayout:
        return PackedLayout(self.n, self.k)

    def b_view(self, data: View) -> View:
        """The B the problem is validated and planned on: B's shape over the packed data (never read through)."""
        strides = (self.n * self.k, self.k, 1)[-len(self.shape):]
        return View(data.ptr, self.shape, strides, FP8_E4M3, data.device, data.obj)


def pack_weights(b: Any, sfb: Any, *, stream: Any = None) -> PackedWeights:
    """B packed for the L2-side-aware GEMMs, once per weight tensor; pass the result as ``rhs``.

    Args:
        b: FP8 e4m3 (or uint8 holding e4m3 bits) [N, K] or [G, N, K] on a Hopper GPU, unit inner stride, rows
            16-byte aligned (K % 16 == 0).
        sfb: its float32 scales, as the GEMM takes them (kept, not copied).
        stream: as for the GEMMs (default: the caller's current stream). Packing measures the L2 side of every
            2 MiB page of the new buffer on it and waits for that: a set-up step, not for a hot loop.

    Returns a :class:`PackedWeights` whose buffer comes from ``b``'s framework (CuPy or torch). Where the device
    has no side info (not an H100/H200, ``CUPYGEMM_L2_SIDES=0``, or a measurement without two clear sides), it holds
    ``b`` itself and the GEMMs run as with ``(b, sfb)``.
    """
    framework = framework_of(b)
    if framework is Framework.JAX:
        raise TypeError("b: packing JAX arrays is not supported yet; JAX callers pass (B, SFB)")
    device = gpu_device_of(b, "b")
    launch_stream = resolve(stream, framework, device)
    view = read(b, "b", launch_stream)
    _check_b(view)
    shape = tuple(int(d) for d in view.shape)
    info = l2.side_info(device)
    if info is None:
        return PackedWeights(b, sfb, shape, False)
    layout = PackedLayout(shape[-2], shape[-1])
    groups = shape[0] if len(shape) == 3 else 1
    total = groups * layout.group_bytes
    buf, base, data = _alloc(framework, total, device, launch_stream)
    import cupy

    with cupy.cuda.Device(device), cupy_stream(launch_stream, device):
        addrs = (np.uint64(base) + np.arange(groups, dtype=np.uint64)[:, None] * np.uint64(layout.group_bytes)
                 + np.arange(layout.k_blocks * layout.pairs, dtype=np.uint64)[None, :] * np.uint64(PAIR_BYTES))
        sides = l2.address_sides(addrs.reshape(-1), info, _num_sms(device))
        # Slot 0's side is the pair's swap bit, stored at bit j * k_blocks + kb for pair (kb, j).
        sides = sides.reshape(groups, layout.k_blocks, layout.pairs).transpose(0, 2, 1).reshape(groups, -1)
        words = np.zeros((groups, layout.swap_bytes // 4), dtype=np.uint32)
        bits = np.packbits(sides.astype(np.uint8), axis=1, bitorder="little")
        words.view(np.uint8)[:, :bits.shape[1]] = bits
        host = np.frombuffer(words.tobytes(), dtype=np.uint8).reshape(groups, -1)
        raw = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(base, total, buf), 0)
        dev = cupy.ndarray((groups, layout.group_bytes), dtype=cupy.uint8, memptr=raw)
        dev[:, layout.data_bytes:] = cupy.asarray(host)
        g_stride = view.strides[0] if len(shape) == 3 else 0
        _pack_kernel(layout).function((layout.k_blocks * layout.pairs, groups), (512,),
                                      (np.uint64(view.ptr), np.uint64(view.strides[-2]), np.uint64(g_stride),
                                       np.uint64(base)))
    return PackedWeights(data, sfb, shape, True)


def _check_b(v: View) -> None:
    if v.dtype not in (FP8_E4M3, U8):
        raise TypeError(f"b: expected float8_e4m3fn (or uint8 e4m3 bits), got {v.dtype}")
    if v.ndim not in (2, 3):
        raise ValueError(f"b: expected [N, K] or [G, N, K], got shape {tuple(v.shape)}")
    if v.strides[-1] != 1 or v.shape[-1] % 16 or v.strides[-2] % 16 or v.ptr % 16:
        raise ValueError(f"b: rows must be contiguous and 16-byte aligned (K % 16 == 0), got shape "
                         f"{tuple(v.shape)}, strides {tuple(v.strides)} bytes")
    if v.ndim == 3 and v.strides[0] % 16:
        raise ValueError(f"b: groups must start 16-byte aligned, got a group stride of {v.strides[0]} bytes")
    if min(v.shape) < 1:
        raise ValueError(f"b: empty weights, shape {tuple(v.shape)}")


def _num_sms(device: int) -> int:
    from .device import current_device

    return current_device().num_sms


def _alloc(framework: Framework, nbytes: int, device: int, stream: int) -> tuple[Any, int, Any]:
    """(owner, 8 KiB-aligned address, the framework's uint8 array of nbytes there) from the framework's allocator."""
    if framework is Framework.TORCH:
        import torch

        from .streams import torch_stream

        with torch_stream(stream, device):
            owner = torch.empty(nbytes + PAIR_BYTES, dtype=torch.uint8, device=torch.device("cuda", device))
        off = -owner.data_ptr() % PAIR_BYTES
        data = owner[off:off + nbytes]
        return owner, data.data_ptr(), data
    import cupy

    with cupy.cuda.Device(device), cupy_stream(stream, device):
        owner = cupy.empty(nbytes + PAIR_BYTES, dtype=cupy.uint8)
    off = -owner.data.ptr % PAIR_BYTES
    data = owner[off:off + nbytes]
    return owner, data.data.ptr, data


_pack_kernels: dict[tuple[int, int, int], Any] = {}


def _pack_kernel(layout: PackedLayout) -> Any:
    import cupy

    from .jit.build import load_kernel
    from .jit.source import render

    key = (cupy.cuda.runtime.getDevice(), layout.n, layout.k)
    k = _pack_kernels.get(key)
    if k is None:
        k = _pack_kernels[key] = load_kernel(render("l2_probe.cu", "cupygemm_pack_b",
                                                    {"CUPYGEMM_PACK_N": layout.n, "CUPYGEMM_PACK_K": layout.k}))
    return k
