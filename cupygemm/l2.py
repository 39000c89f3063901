"""The two L2 sides of a Hopper GPU, measured: which SMs are near which half of the L2, and which half holds an
address. Side-aware GEMMs (``cuda_src/l2_sides.cuh``) and the weight packing (:mod:`cupygemm.packing`) use them.

An H100's or H200's L2 is two halves; an SM's atomics on an address take longer when the half that owns the address
is the far one. So one kernel (``cupygemm_l2_latency`` in ``cuda_src/l2_probe.cu``) times a chain of dependent
atomics on chosen addresses from every SM, and the rest is arithmetic here:

* **the SM map**: every SM times one 4 KiB chunk; the times fall into two groups, near and far. Side 0 is the
  chunk's near side.
* **the hash**: which half owns an address depends on the parity of some of its bits. Within a 2 MiB page the
  virtual and physical address agree below bit 21, so timing the chunks at ``ref + 2**b`` (b = 4..20) from both
  sides finds those bits (0x0B3000 on the H100s measured: bits 12, 13, 16, 17, 19). The bits above come from the
  page's physical address, so each 2 MiB page of a buffer is timed once (:func:`address_sides`).

Measured once per device and process (:func:`side_info`), in well under a second. Where the measurement does not
show two clean sides, or ``CUPYGEMM_L2_SIDES=0``, there is no side info and packing falls back to plain weights;
:func:`unavailable_reason` says why. Side info is not enough to pack: :func:`packing_off_reason` also leaves the
weights plain on GPUs where the side-aware kernels measured slower than the plain ones (the H200), unless
``CUPYGEMM_L2_SIDES=1``. Nothing here replaces an allocator: probing reads and restores words of
memory the caller's framework allocated.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from .env import L2_SIDES, l2_sides_mode
from .jit.loader import SmallKernel
from .jit.source import KernelSource, render
from .launch import PTR, U32

PAGE = 2 << 20  # within a page, virtual and physical address bits agree
CHUNK = 4096  # the granularity of the side hash
SIDE_MAP_SMS = 256  # SMs the kernel's side map holds (cuda_src/l2_sides.cuh, SideMap)
_PROBE_BITS = range(4, 21)
_SM_VOTES = 3  # chains timed per SM for the SM map
_ADDRESS_VOTES = 5  # chains timed per address (from different SMs)
_BLOCK_SMEM = 120 * 1024  # one probe block per SM at a time


@dataclass(frozen=True)
class SideInfo:
    """One device's L2 sides: ``sm_side[smid]`` (SMs not present: -1), the address bits below 2 MiB that flip the
    side, and the chain times (cycles per 32 atomics) of near and far SMs."""

    device: int
    sm_side: tuple[int, ...]
    hash_bits: int
    near_cycles: float
    far_cycles: float

    @property
    def counts(self) -> tuple[int, int]:
        return self.sm_side.count(0), self.sm_side.count(1)

    @property
    def threshold(self) -> float:
        return (self.near_cycles + self.far_cycles) / 2

    def side_map(self) -> bytes:
        """The kernel's SideMap: bit smid % 32 of word smid // 32 set for SMs on side 1."""
        words = np.zeros(SIDE_MAP_SMS // 32, dtype=np.uint32)
        for sm, side in enumerate(self.sm_side):
            if side == 1:
                words[sm // 32] |= np.uint32(1 << (sm % 32))
        return words.tobytes()

    def describe(self) -> str:
        n0, n1 = self.counts
        return (f"{n0} + {n1} SMs, hash bits {self.hash_bits:#x} (+ per 2 MiB page), near/far "
                f"{self.near_cycles / 32:.0f}/{self.far_cycles / 32:.0f} cycles per atomic")


_lock = threading.Lock()
_info: dict[int, SideInfo | None] = {}
_why: dict[int, str] = {}


class _Unavailable(Exception):
    pass


def side_info(device: int) -> SideInfo | None:
    """The side info of ``device`` (measured on first use, then cached); None where there is none (see
    :func:`unavailable_reason`)."""
    if l2_sides_mode() == "0":
        _why[device] = f"{L2_SIDES}=0"
        return None
    if device in _info:
        return _info[device]
    with _lock:
        if device not in _info:
            try:
                _info[device] = _measure(device)
            except _Unavailable as e:
                _info[device], _why[device] = None, str(e)
    return _info[device]


# GPUs (a substring of the device name) where side-aware kernels measured faster than plain ones: the H100 SXM, 5.6 %
# on geometric mean over the 12 decode shapes and faster on each (benchmarks/NOTES.md, "L2-side-aware weights"). On the
# H200 they were 1.22x slower, and still 1.04-1.14x after that change (its plain kernels read B at up to 3.5 TB/s), so
# auto does not pack.
SIDES_PAY_ON = ("H100",)


def packing_off_reason(device_name: str, info: SideInfo | None, why_no_info: str | None = None) -> str | None:
    """Why ``pack_weights`` leaves weights plain on a GPU named ``device_name`` with side info ``info``, or None
    when it packs them side-aware (see :data:`SIDES_PAY_ON` and ``CUPYGEMM_L2_SIDES``)."""
    if info is None:
        return f"no L2 side info ({why_no_info or 'not measured'})"
    if l2_sides_mode() == "auto" and not any(s in device_name for s in SIDES_PAY_ON):
        return (f"side-aware kernels measured slower than plain ones on {device_name} ({L2_SIDES}=1 packs "
                f"anyway; auto packs on: {', '.join(SIDES_PAY_ON)})")
    return None


def why_plain(device: int) -> str | None:
    """Why ``pack_weights`` leaves weights on ``device`` plain (no side info, or a GPU where packing does not pay),
    or None when it packs them side-aware."""
    from .device import current_device

    import cupy

    info = side_info(device)
    with cupy.cuda.Device(device):
        name = current_device().name
    return packing_off_reason(name, info, unavailable_reason(device))


def unavailable_reason(device: int) -> str | None:
    """Why :func:`side_info` returned None for ``device`` (None if it did not)."""
    return _why.get(device)


def probe_source() -> KernelSource:
    """The rendered ``l2_probe.cu`` (compiles without a GPU)."""
    return render("l2_probe.cu", "cupygemm_l2_latency", {})


# addresses, their count, items, latencies, SM of each item
_PROBE = SmallKernel(probe_source, (PTR, U32, U32, PTR, PTR), post_process=True, dynamic_smem=_BLOCK_SMEM)


def time_chains(addrs: np.ndarray, votes: int, num_sms: int) -> tuple[np.ndarray, np.ndarray]:
    """(cycles, smid) of ``votes`` chains per address (item t times address t % len(addrs)), on the current device's
    current CuPy stream, which this synchronizes."""
    import cupy

    device = cupy.cuda.runtime.getDevice()
    n = len(addrs)
    items = n * votes
    d_addrs = cupy.asarray(np.asarray(addrs, dtype=np.uint64))
    cycles = cupy.zeros(items, dtype=cupy.uint32)
    sms = cupy.zeros(items, dtype=cupy.uint32)
    grid = min(items, 2 * num_sms)
    params = _PROBE.pack(device, (d_addrs.data.ptr, n, items, cycles.data.ptr, sms.data.ptr))
    _PROBE.launch(device, cupy.cuda.get_current_stream().ptr, grid, 32, _BLOCK_SMEM, params)
    return cycles.get(), sms.get()


def _two_groups(times: np.ndarray) -> tuple[float, float]:
    """The medians of the lower and upper groups of ``times`` split at their widest gap; _Unavailable unless both
    groups hold a quarter of the values and the gap is clear."""
    s = np.sort(times)
    gaps = np.diff(s)
    i = int(np.argmax(gaps))
    low, high = s[: i + 1], s[i + 1:]
    if min(len(low), len(high)) < len(s) // 4:
        raise _Unavailable(f"SM chain times do not split into two sides (groups of {len(low)} and {len(high)})")
    near, far = float(np.median(low)), float(np.median(high))
    if gaps[i] < 0.02 * near or far < 1.03 * near:
        raise _Unavailable(f"near and far SM chain times too close ({near:.0f} vs {far:.0f} cycles)")
    return near, far


def _measure(device: int) -> SideInfo:
    import cupy

    from .device import current_device

    with cupy.cuda.Device(device):
        info = current_device()
        if info.compute_capability != "90":
            raise _Unavailable(f"not a Hopper GPU (compute capability {info.compute_capability})")
        buf = cupy.zeros(2 * PAGE, dtype=cupy.uint8)
        ref = -buf.data.ptr % PAGE + buf.data.ptr
        # The SM map: every SM times words of one chunk (32 lines apart, so few chains share a line).
        cycles, sms = time_chains(np.array([ref + 128 * i for i in range(32)], dtype=np.uint64), _SM_VOTES * 2,
                                  info.num_sms)
        per_sm = {int(sm): float(np.median(cycles[sms == sm])) for sm in np.unique(sms)}
        if len(per_sm) < info.num_sms:
            raise _Unavailable(f"the probe reached {len(per_sm)} of {info.num_sms} SMs")
        near, far = _two_groups(np.array(list(per_sm.values())))
        thr = (near + far) / 2
        sm_side = [-1] * (max(per_sm) + 1)
        for sm, t in per_sm.items():
            sm_side[sm] = int(t > thr)
        if len(sm_side) > SIDE_MAP_SMS:
            raise _Unavailable(f"SM ids up to {len(sm_side) - 1}: the side map holds {SIDE_MAP_SMS}")
        partial = SideInfo(device, tuple(sm_side), 0, near, far)
        # The hash: which of bits 4..20 flip the side of the reference chunk.
        probe = np.array([ref] + [ref + (1 << b) for b in _PROBE_BITS], dtype=np.uint64)
        sides = _vote(probe, partial, _ADDRESS_VOTES * 2, info.num_sms)
        bits = 0
        for b, s in zip(_PROBE_BITS, sides[1:]):
            if s != sides[0]:
                bits |= 1 << b
        if bits & (CHUNK - 1) or not bits & CHUNK:
            raise _Unavailable(f"side hash bits {bits:#x}: packing needs 4 KiB chunks (bit 12 in, none below)")
        del buf
        return SideInfo(device, tuple(sm_side), bits, near, far)


def _vote(addrs: np.ndarray, info: SideInfo, votes: int, num_sms: int) -> np.ndarray:
    """The side of each address: each chain votes its SM's side if it was near, the other if far; the majority."""
    cycles, sms = time_chains(addrs, votes, num_sms)
    sm_side = np.array(info.sm_side + (-1,), dtype=np.int64)
    voter = sm_side[np.minimum(sms, len(info.sm_side))]
    vote = np.where(cycles > info.threshold, 1 - voter, voter)
    vote = np.where(voter < 0, -1, vote).reshape(votes, len(addrs))
    ones = (vote == 1).sum(axis=0)
    zeros = (vote == 0).sum(axis=0)
    return (ones > zeros).astype(np.int64)


def page_sides(base: int, nbytes: int, info: SideInfo, num_sms: int) -> np.ndarray:
    """The page bits of the buffer [base, base + nbytes) (base 4 KiB-aligned) on the current device: bit i (uint8
    0/1) is the side of the chunks of the buffer's i-th 2 MiB page (counted from base's page) whose hash parity is 0;
    a chunk's side is that bit xor the parity of its address's hash bits. One chunk per page, inside the buffer, is
    timed. Synchronizes the current CuPy stream; the probed words are restored."""
    first_page, last_page = base >> 21, (base + nbytes - 1) >> 21
    pages = np.arange(first_page, last_page + 1, dtype=np.uint64)
    refs = np.maximum(pages << np.uint64(21), np.uint64(base))  # the first chunk of each page in the buffer
    return (_vote(refs, info, _ADDRESS_VOTES, num_sms) ^ _parity(refs & np.uint64(info.hash_bits))).astype(np.uint8)


def chunk_side(addrs: np.ndarray, base: int, bits: np.ndarray, hash_bits: int) -> np.ndarray:
    """The side of each chunk address, from the page bits of the buffer at ``base`` (as :func:`page_sides` gives)."""
    addrs = np.asarray(addrs, dtype=np.uint64)
    page = (addrs >> np.uint64(21)) - np.uint64(base >> 21)
    return bits[page.astype(np.int64)] ^ _parity(addrs & np.uint64(hash_bits))


def _parity(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64)
    for s in (32, 16, 8, 4, 2, 1):
        x = x ^ (x >> np.uint64(s))
    return (x & np.uint64(1)).astype(np.int64)
