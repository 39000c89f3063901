"""The SFA layout copy on CPU: its kernel compiles to an sm_90a cubin, and which strides it takes (validation
works them out once per call signature; the rest go through the framework's own copy). Its results against the M-major layout: tests/test_gemm_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from cupygemm import sfa_layout, validate  # noqa: E402
from cupygemm.jit.build import build_cubin  # noqa: E402
from cupygemm.tensors import View  # noqa: E402

F32 = np.dtype(np.float32)


def test_kernel_compiles(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPYGEMM_CACHE_DIR", str(tmp_path))
    src = sfa_layout.kernel_source()
    assert src.entry == "sfa_to_m_major"
    _, cubin = build_cubin(src, post_process=False)
    assert cubin.startswith(b"\x7fELF") and b"sfa_to_m_major" in cubin


def _view(shape, strides):
    return View(0x10000000, shape, strides, F32, 0)


@pytest.mark.parametrize("shape,strides,want", [
    ((300, 12), (48, 4), (0, 12, 1)),              # row-major [m, kb] (the casts')
    ((300, 12), (68, 4), (0, 17, 1)),              # padded rows
    ((300, 12), (4, 1200), (0, 1, 300)),           # column-major, M stride not 16-byte aligned
    ((300, 12), (4, 0), (0, 1, 0)),                # one column broadcast
    ((3, 200, 8), (6400, 32, 4), (1600, 8, 1)),    # masked [G, max_m, kb]
    ((3, 200, 8), (8160, 40, 4), (2040, 10, 1)),   # masked, a slice of a larger array
    ((300, 12), (-48, 4), None),                   # negative: the framework's copy
    ((300, 12), (48, 2), None),                    # not whole elements
])
def test_copy_strides(shape, strides, want):
    assert validate.sfa_copy_strides(_view(shape, strides), False) == want


def test_m_major_sfa_is_not_copied():
    assert validate.sfa_copy_strides(_view((300, 12), (4, 1216)), True) is None


def test_copy_launch_packs_once_per_pointer_set(monkeypatch):
    """The copy's parameters are packed once per (device, pointers, strides, sizes) and launched through its small
    kernel; the capture answer the call has goes on to the per-stream buffer."""
    from types import SimpleNamespace

    from cupygemm.kinds.forward import MASKED
    from cupygemm.jit.loader import PackedParams
    from cupygemm.tensors import Framework

    packs, launches, buffers = [], [], []

    class Copy:
        def pack(self, device, values):
            packs.append((device, values))
            return ("packed", values)

        def launch(self, device, stream, grid, block, smem, params):
            launches.append((device, stream, grid, block, smem, params))

    monkeypatch.setattr(sfa_layout, "_COPY", Copy())
    monkeypatch.setattr(sfa_layout, "_params", PackedParams())
    monkeypatch.setattr(sfa_layout, "single_gpu", lambda: True)
    monkeypatch.setattr(sfa_layout, "sfa_buffer", lambda floats, device, stream, framework, capturing=None, operand="a":
                        buffers.append((floats, capturing)) or (0x2000, "owner"))
    problem = SimpleNamespace(kind=MASKED, num_groups=3, k=1000, m=200, sfa_m_pad=208, device=1,
                              sfa_strides=(1600, 8, 1))
    for capturing in (None, False, True):
        assert sfa_layout.to_m_major(problem, 0x1000, None, 7, Framework.TORCH, capturing) == (0x2000, "owner")
    assert buffers == [(3 * 8 * 208, None), (3 * 8 * 208, False), (3 * 8 * 208, True)]
    assert packs == [(1, (0x1000, 0x2000, 1600, 8, 1, 200, 8, 208, 3))]
    assert launches == [(1, 7, 19, 256, 0, ("packed", packs[0][1]))] * 3  # ceil(3 * 8 * 200 / 256) blocks
