"""L2-side-aware weights: :func:`pack_weights` rewrites B once so that the side-aware GEMMs read each half of N from
the L2 side of the SMs that compute it (``cuda_src/l2_sides.cuh`` has the layout, :mod:`cupygemm.l2` the
measurement).

The packed weights are one uint8 buffer allocated by the caller's framework (CuPy's pool, torch's caching
allocator, XLA's allocator for JAX arrays), 8 KiB-aligned inside it (at ``data_offset`` of a JAX array, which cannot
be a view). Which slot of each 8 KiB pair holds which half
follows from the buffer's address when it was packed (kept as ``base_low``, its offset in its 2 MiB page), the
device's side hash (``hash_bits``) and one measured bit per 2 MiB page, stored after the last group. The GEMM
computes the slots from those, never from where the buffer lives now: a copy (to another address, another process)
computes the same result, only its pairs may then sit on the wrong sides. Same accumulation order as plain B: the
results are bitwise equal to the unpacked GEMM's with the same config.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import l2
from .jit.loader import SmallKernel
from .jit.source import KernelSource, render
from .launch import PTR, U32, U64
from .streams import cupy_stream, resolve
from .tensors import FP8_E4M3, U8, Framework, View, framework_of, gpu_device_of, read
from .util import ceil_div

PAIR_BYTES = 8192  # two 4 KiB slots on opposite L2 sides
CHUNK_ROWS = 32  # rows of B (of one 128-wide K block) per 4 KiB slot
PAGE_BYTES = 1 << 21  # the page bits' granularity
MAX_PAGE_WORDS = 256  # page bits a side-aware kernel holds (cuda_src/l2_sides.cuh, kMaxPageWords): 16 GiB
PARAM_PAGE_WORDS = 4  # page bits a launch passes as kernel parameters (l2_sides.cuh, kParamPageWords)


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
    def group_bytes(self) -> int:
        return self.k_blocks * self.pairs * PAIR_BYTES

    def page_words(self, base_low: int, groups: int) -> int:
        """uint32 words of page bits after ``groups`` groups of a buffer whose address mod 2 MiB is ``base_low``."""
        return ceil_div(ceil_div(base_low + groups * self.group_bytes, PAGE_BYTES), 32)

    def buffer_bytes(self, base_low: int, groups: int) -> int:
        """The whole buffer: the groups, then the page bits (rounded to the kernel's 16-byte copy)."""
        return groups * self.group_bytes + ceil_div(self.page_words(base_low, groups) * 4, 16) * 16

    @property
    def page_bits_in_params(self) -> bool:
        """Whether a side-aware normal GEMM takes these weights' page bits as kernel parameters: one group spans at
        most PARAM_PAGE_WORDS * 32 pages whatever its base_low (KernelTraits::kSidePageParams); grouped GEMMs and
        larger weights read them from the buffer."""
        return (self.group_bytes + 2 * PAGE_BYTES - PAIR_BYTES - 1) // PAGE_BYTES <= 32 * PARAM_PAGE_WORDS


@dataclass(frozen=True, eq=False)
class PackedWeights:
    """Weights for the GEMMs' ``rhs``, in place of ``(B, SFB)``: ``data`` is B packed side-aware (uint8, one
    dimension) when ``side_aware``, else B itself (no side info, or a GPU where packing does not pay:
    :func:`cupygemm.l2.why_plain` says which); ``scales`` is SFB as given. ``shape`` is B's: [N, K] or [G, N, K].
    ``base_low``, ``hash_bits`` and the page bits fix where each half lies (the module's docstring): the GEMMs pass
    them to the kernel, ``page_words`` being the first :data:`PARAM_PAGE_WORDS` words of the page bits (a host copy
    of those stored after the last group: kernels whose B spans at most 128 pages take them as parameters).
    ``data_offset``: where the packed bytes start in ``data`` (JAX arrays; 0 otherwise).

    For JAX, :mod:`cupygemm.jax` registers the class as a pytree (``data`` and ``scales`` its leaves), so packed
    weights pass through ``jax.jit``, ``lax.scan`` and friends like the arrays they hold."""

    data: Any
    scales: Any
    shape: tuple[int, ...]
    side_aware: bool
    base_low: int = 0
    hash_bits: int = 0
    data_offset: int = 0
    page_words: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.side_aware:
            want = min(PARAM_PAGE_WORDS, self.layout.page_words(self.base_low, self.num_groups))
            if len(self.page_words) != want or not all(0 <= w < 1 << 32 for w in self.page_words):
                raise ValueError(f"page_words: packed weights {self.shape} at base_low {self.base_low} need their "
                                 f"first {want} page-bit words (uint32, as pack_weights keeps them), got "
                                 f"{self.page_words!r}")

    @functools.cached_property
    def launch_sides(self) -> tuple[int, ...]:
        """What a side-aware launch passes (plan.GemmPlan.launch's ``page_sides``); built once, read per call."""
        return launch_sides(self.base_low, self.hash_bits, self.page_words)

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


def launch_sides(base_low: int, hash_bits: int, page_words: tuple[int, ...]) -> tuple[int, ...]:
    """(base_low, hash_bits, the first PARAM_PAGE_WORDS page-bit words, zero-padded): a side-aware launch's sides."""
    return (base_low, hash_bits, *page_words, *(0,) * (PARAM_PAGE_WORDS - len(page_words)))


def pack_weights(b: Any, sfb: Any, *, stream: Any = None) -> PackedWeights:
    """B packed for the L2-side-aware GEMMs, once per weight tensor; pass the result as ``rhs``.

    Args:
        b: FP8 e4m3 (or uint8 holding e4m3 bits) [N, K] or [G, N, K] on a Hopper GPU, unit inner stride, rows
            16-byte aligned (K % 16 == 0).
        sfb: its float32 scales, as the GEMM takes them (kept, not copied).
        stream: as for the GEMMs (default: the caller's current stream). Packing measures the L2 side of every
            2 MiB page of the new buffer on it and waits for that: a set-up step, not for a hot loop.

    Returns a :class:`PackedWeights` whose buffer comes from ``b``'s framework (CuPy or torch). Where the device
    has no side info (not an H100/H200, ``CUPYGEMM_L2_SIDES=0``, or a measurement without two clear sides), or is
    one where side-aware kernels measured slower than plain ones (the H200; ``CUPYGEMM_L2_SIDES=1`` packs anyway),
    it holds ``b`` itself and the GEMMs run as with ``(b, sfb)``; :func:`cupygemm.l2.why_plain` says which.
    """
    framework = framework_of(b)
    device = gpu_device_of(b, "b")
    if framework is Framework.JAX:
        if stream is not None:
            raise TypeError("stream: JAX arrays are packed on a stream of cupygemm's, then synchronized; "
                            "stream= is for CuPy and torch")
        launch_stream = 0  # the legacy default stream: ordered after XLA's work, and synchronized below
    else:
        launch_stream = resolve(stream, framework, device)
    view = read(b, "b", launch_stream)
    _check_b(view)
    shape = tuple(int(d) for d in view.shape)
    if l2.why_plain(device) is not None:  # no side info, or a GPU where packing does not pay
        return PackedWeights(b, sfb, shape, False)
    info = l2.side_info(device)  # measured (and cached) by why_plain
    layout = PackedLayout(shape[-2], shape[-1])
    groups = shape[0] if len(shape) == 3 else 1
    longest = layout.buffer_bytes(PAGE_BYTES - PAIR_BYTES, groups)  # whatever the address turns out to be
    if layout.page_words(PAGE_BYTES - PAIR_BYTES, groups) > MAX_PAGE_WORDS:
        raise ValueError(f"b: {groups * layout.group_bytes / 2**30:.1f} GiB packed is more than side-aware kernels "
                         f"address ({MAX_PAGE_WORDS * 32 * PAGE_BYTES // 2**30} GiB less a page); pass (B, SFB)")
    buf, base, data = _alloc(framework, longest, device, launch_stream)
    base_low = base % PAGE_BYTES
    data_offset = base - data.unsafe_buffer_pointer() if framework is Framework.JAX else 0
    import cupy

    with cupy.cuda.Device(device), cupy_stream(launch_stream, device):
        data_bytes = groups * layout.group_bytes
        bits = l2.page_sides(base, data_bytes, info, _num_sms(device))
        words = np.zeros(layout.page_words(base_low, groups), dtype=np.uint32)
        packed_bits = np.packbits(bits, bitorder="little")
        words.view(np.uint8)[:packed_bits.size] = packed_bits
        raw = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(base, longest, buf), 0)
        dev = cupy.ndarray((longest,), dtype=cupy.uint8, memptr=raw)
        dev[data_bytes:data_bytes + words.nbytes] = cupy.asarray(words.view(np.uint8))
        g_stride = view.strides[0] if len(shape) == 3 else 0
        params = _PACK.pack(device, (view.ptr, view.strides[-2], g_stride, base, base_low, info.hash_bits),
                            layout.n, layout.k)
        _PACK.launch_grid(device, launch_stream, (layout.k_blocks * layout.pairs, groups, 1), 512, 0, params,
                          layout.n, layout.k)
        if framework is Framework.JAX:  # XLA's streams know nothing of ours
            cupy.cuda.Stream.null.synchronize()
    return PackedWeights(data, sfb, shape, True, base_low, info.hash_bits, data_offset,
                         tuple(int(w) for w in words[:PARAM_PAGE_WORDS]))


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
    from .device import _query

    return _query(device).num_sms


def _alloc(framework: Framework, nbytes: int, device: int, stream: int) -> tuple[Any, int, Any]:
    """(owner, 8 KiB-aligned address, the framework's uint8 array of nbytes there) from the framework's allocator;
    for JAX, whose arrays cannot be views, the array holds the aligned bytes at an offset."""
    if framework is Framework.JAX:
        import jax
        import jax.numpy as jnp

        gpu = next(d for d in jax.devices("gpu") if int(getattr(d, "local_hardware_id", None) or d.id) == device)
        owner = jax.device_put(jnp.zeros(nbytes + PAIR_BYTES, jnp.uint8), gpu)
        owner.block_until_ready()
        ptr = owner.unsafe_buffer_pointer()
        return owner, ptr + (-ptr % PAIR_BYTES), owner
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


def pack_source(n: int, k: int) -> KernelSource:
    """The rendered ``pack_b.cu`` for B of [N, K] (compiles without a GPU)."""
    return render("pack_b.cu", "cupygemm_pack_b", {"CUPYGEMM_PACK_N": n, "CUPYGEMM_PACK_K": k})


# B, its row and group strides (bytes), the packed buffer, base_low, hash_bits; one build per (N, K)
_PACK = SmallKernel(pack_source, (PTR, U64, U64, PTR, U32, U32), post_process=True)
