"""The fused transpose casts (cuda_src/cast_transpose.cu, cupygemm.quantization) on CPU.

* NVRTC builds every (input dtype, entry point) to an sm_90a cubin: one kernel per rendered source, no local memory,
  at most 128 registers, and the vector paths (16-byte loads of x, 16-byte stores of q_t) are there.
* The kernels run in a CPU emulation (tests/cuda_emu.py: the same source compiled by g++, a CTA's threads as fibers
  with CUDA's barrier and shuffle semantics), launched with the host's own grid, arguments and output layouts
  (``fused_cast_args``, ``fused_cast_outputs``), and compared bit for bit with compositions of the NumPy references:
  ``per_token_cast_to_fp8(x.T)``, ``per_token_cast_to_fp8(x)``, ``per_block_cast_to_fp8(x)`` and ``(x.T)``. Ragged
  shapes, strided / negative / zero row strides, misaligned inputs and outputs, the M-major scale layout; every
  output buffer is fenced by guard bytes, and x by garbage that would show in an amax if it were read.
* Argument validation and routing, on host-only "fake" CuPy arrays.

On the GPU: tests/test_cast_transpose_gpu.py.
"""
from __future__ import annotations

import concurrent.futures
import re
import subprocess

import ml_dtypes
import numpy as np
import pytest

from cupygemm import reference as ref

cupy = pytest.importorskip("cupy")

import cuda_emu  # noqa: E402
from cast_helpers import assert_equal as _assert_equal, expected, make_input as _make_input  # noqa: E402
from cupygemm import quantization as quant  # noqa: E402
from cupygemm.jit.build import build_cubin  # noqa: E402
from cupygemm.util import ceil_div, round_up  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
IN_DTYPES = [BF16, F32, F16]
FUSED = [quant.TRANSPOSED, quant.TRANSPOSED_ROWWISE, quant.BLOCK_WITH_TRANSPOSE]
ALL_ENTRIES = FUSED + ["per_token_cast_to_fp8", "per_block_cast_to_fp8"]


# ---- NVRTC -------------------------------------------------------------------------------------------------------

def _sass(cubin: bytes, tmp_path) -> tuple[str, str]:
    from sass_helpers import require_tool, tool_env

    f = tmp_path / "k.cubin"
    f.write_bytes(cubin)
    cuobjdump = require_tool("cuobjdump")
    def run(*args: str) -> str:
        return subprocess.run([cuobjdump, *args, str(f)], capture_output=True, text=True, env=tool_env(),
                              check=True).stdout

    return run("-sass"), run("-res-usage")


@pytest.mark.parametrize("entry", FUSED)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
def test_kernel_compiles(dtype, entry, tmp_path, monkeypatch):
    monkeypatch.setenv("CUPYGEMM_CACHE_DIR", str(tmp_path))
    src = quant._kernel_source(dtype, entry)
    assert src.name == "cast_transpose.cu" and src.entry == entry
    _, cubin = build_cubin(src, post_process=False)
    assert cubin.startswith(b"\x7fELF") and entry.encode() + b"\x00" in cubin
    assert not any(e.encode() + b"\x00" in cubin for e in FUSED if e != entry)  # one kernel per rendered source
    sass, res = _sass(cubin, tmp_path)
    assert not re.search(r"\b(LDL|STL)\b", sass), "local-memory traffic (register spills)"
    usage = re.search(r"REG:(\d+).*LOCAL:(\d+)", res)
    assert usage and int(usage.group(2)) == 0
    assert int(usage.group(1)) <= 128  # __launch_bounds__: 512 threads an SM at least
    if quant.fused_cast_defines(dtype, entry)["CUPYGEMM_CT_STAGES"]:
        # x copied 16 bytes at a time into the ring, past L1 (one copy per row of a piece, and as many before the
        # loop for the first tiles), with the L2 fetch size the host asks for, read back 16 bytes a row
        l2_fetch = quant.fused_cast_defines(dtype, entry)["CUPYGEMM_CT_L2_PREFETCH"]
        fetch = {0: "", 128: ".LTC128B", 256: ".LTC256B"}[l2_fetch]
        assert sass.count(f"LDGSTS.E.BYPASS{fetch}.128") == 2 * 16 and not re.search(r"LDG\.E(\.NA)?\.128", sass)
        assert "LDS.128" in sass
    else:
        assert "LDG.E.NA.128.CONSTANT" in sass  # x read 16 bytes at a time, not kept in L1
    assert sass.count("STG.E.128") == 16 // np.dtype(dtype).itemsize  # one 16-byte q_t store per column
    if entry != quant.TRANSPOSED:
        assert ("STG.E.64" if np.dtype(dtype).itemsize == 2 else "STG.E ") in sass  # q's rows, 8 / 4 bytes a store


def test_kernel_sources_are_distinct():
    digests = {quant._kernel_source(d, e).digest for d in IN_DTYPES for e in ALL_ENTRIES}
    assert len(digests) == len(IN_DTYPES) * len(ALL_ENTRIES)


def test_kernel_source_rejects_unknown():
    with pytest.raises(ValueError, match="entry"):
        quant._kernel_source(np.float32, "per_token_cast_to_fp8_transpose")
    with pytest.raises(TypeError, match="float64"):
        quant._kernel_source(np.float64, quant.TRANSPOSED)


# ---- host layouts ------------------------------------------------------------------------------------------------

def test_output_layouts():
    m, n = 300, 130
    names = lambda outs: [o.name for o in outs]  # noqa: E731
    t = quant.fused_cast_outputs(quant.TRANSPOSED, m, n)
    assert names(t) == ["q_t", "s_t"] and t[0].shape == (130, 300) and t[1].shape == t[1].buffer == (130, 3)
    r = quant.fused_cast_outputs(quant.TRANSPOSED_ROWWISE, m, n, m_major_scales=True)
    assert names(r) == ["q_t", "s_t", "q", "s"]
    assert r[1].shape == (130, 3) and r[1].buffer == (3, 132) and r[1].dtype == np.float32
    assert r[2].shape == (300, 130) and r[3].shape == (300, 2)
    b = quant.fused_cast_outputs(quant.BLOCK_WITH_TRANSPOSE, m, n)
    assert names(b) == ["q", "s", "q_t", "s_t"] and b[1].shape == (3, 2) and b[3].shape == (2, 3)
    with pytest.raises(ValueError, match="m_major_scales"):
        quant.fused_cast_outputs(quant.BLOCK_WITH_TRANSPOSE, m, n, m_major_scales=True)
    with pytest.raises(ValueError, match="fused cast"):
        quant.fused_cast_outputs("per_token_cast_to_fp8", m, n)


def test_m_major_output_is_what_the_layout_helper_makes():
    """The M-major s_t (buffer [ceil(T/128), round_up(d, 4)], viewed [:, :d].T) has the shape and strides of
    get_col_major_tma_aligned_tensor(s_t), and the GEMM's validation takes it as M-major (no copy per call)."""
    from cupygemm.layout import _col_major_tma_aligned_copy
    from cupygemm.tensors import read_cupy
    from cupygemm.validate import is_m_major

    for m, n in ((4096, 7168), (300, 130), (1, 1), (129, 4097)):
        out = quant.fused_cast_outputs(quant.TRANSPOSED, m, n, m_major_scales=True)[1]
        s_t = np.zeros(out.buffer, np.float32)[:, :n].T
        helper = _col_major_tma_aligned_copy(np.zeros((n, ceil_div(m, 128)), np.float32), np)  # the helper's layout
        assert s_t.shape == helper.shape == (n, ceil_div(m, 128))
        assert s_t.strides == helper.strides == (4, 4 * round_up(n, 4))
        fake = _fake_cupy(s_t.shape, np.float32, strides=s_t.strides)
        assert is_m_major(read_cupy(fake), round_up(n, 4), ceil_div(m, 128))


def test_launch_arguments():
    args = quant.fused_cast_args(quant.TRANSPOSED, 1, 2, 3, 0, 0, 300, 130, -130)
    assert args == (1, 2, 3, 0, 0, 300, 130, (1 << 64) - 130, 3, 1, 130)
    assert quant.fused_cast_args(quant.TRANSPOSED, 1, 2, 3, 0, 0, 300, 130, 130, m_major_scales=True)[-3:] == \
        (1, 132, 132)
    assert quant.fused_cast_args(quant.BLOCK_WITH_TRANSPOSE, 1, 2, 3, 4, 5, 300, 130, 130)[-3:] == (3, 1, 2)
    assert quant.fused_cast_threads(BF16) == quant.fused_cast_threads(F16) == 128
    assert quant.fused_cast_threads(F32) == 256


def test_launch_shape():
    """Per-token casts: persistent CTAs (as many as the SMs hold, or the tiles) with a ring of one tile; the per-block
    cast: one CTA per tile, no ring."""
    for entry in (quant.TRANSPOSED, quant.TRANSPOSED_ROWWISE):
        assert quant.fused_cast_defines(BF16, entry)["CUPYGEMM_CT_STAGES"] == 1
        assert quant.fused_cast_smem(BF16, entry) == 128 * 128 * 2
        assert quant.fused_cast_smem(F32, entry) == 128 * 128 * 4
        assert quant.fused_cast_grid(entry, BF16, 4096, 32768, 132) == 132 * 4
        assert quant.fused_cast_grid(entry, F32, 4096, 32768, 132) == 132 * 2
        assert quant.fused_cast_grid(entry, BF16, 300, 130, 132) == 3 * 2
        assert quant.fused_cast_ctas_per_sm(BF16, entry, stages=2) == 3
    assert quant.fused_cast_defines(BF16, quant.BLOCK_WITH_TRANSPOSE)["CUPYGEMM_CT_STAGES"] == 0
    assert quant.fused_cast_smem(BF16, quant.BLOCK_WITH_TRANSPOSE) == 0
    assert quant.fused_cast_grid(quant.BLOCK_WITH_TRANSPOSE, BF16, 4096, 32768, 132) == 32 * 256
    assert quant._FUSED_MAX_SMEM == 128 * 128 * 4


# ---- the kernels, emulated on the CPU ----------------------------------------------------------------------------

#: The ring depths the kernels are emulated with beside the host's own (the probe's candidates).
OTHER_STAGES = (0, 2, 3)
#: SMs the emulated launches are planned for: few, so that every CTA takes several tiles (and its ring turns over).
EMU_SMS = 1


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """{(dtype name, entry): EmulatedKernel} as the host renders them, plus {(dtype name, entry, stages): ...} for
    OTHER_STAGES, all built up front (in parallel)."""
    if cuda_emu.CXX is None:
        pytest.skip("g++ is not installed (the CPU emulation of the kernels needs it)")
    root = tmp_path_factory.mktemp("cuda_emu")
    keys = [(str(d), e) for d in IN_DTYPES for e in FUSED]
    keys += [(str(d), e, st) for d in IN_DTYPES for e in FUSED for st in OTHER_STAGES
             if st != quant.fused_cast_defines(d, e)["CUPYGEMM_CT_STAGES"]]
    dtypes = {str(d): d for d in IN_DTYPES}

    def build(key):
        defines = quant.fused_cast_defines(dtypes[key[0]], key[1], *key[2:])
        kernel = cuda_emu.build(key[0], key[1], root, defines)
        kernel.stages = defines["CUPYGEMM_CT_STAGES"]
        return kernel

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        built = list(pool.map(build, keys))
    return dict(zip(keys, built))


_GUARD = 64
_SENTINEL = 0xA5


class _Buffer:
    """A host buffer for one output, 256-byte aligned (+ ``offset`` bytes), fenced by guard bytes."""

    def __init__(self, shape: tuple[int, int], dtype: np.dtype, offset: int = 0):
        self.nbytes = int(np.prod(shape)) * dtype.itemsize
        self.raw = np.full(self.nbytes + 2 * _GUARD + 512, _SENTINEL, np.uint8)
        self.start = (-self.raw.ctypes.data) % 256 + _GUARD + offset
        self.array = self.raw[self.start:self.start + self.nbytes].view(dtype).reshape(shape)
        self.ptr = self.raw.ctypes.data + self.start

    def check_guards(self) -> None:
        assert (self.raw[:self.start] == _SENTINEL).all(), "written before the buffer"
        assert (self.raw[self.start + self.nbytes:] == _SENTINEL).all(), "written past the buffer"


def _garbage(dtype) -> float:
    """Larger than any value make_input makes: an amax that read it would differ."""
    return 65000.0 if dtype == F16 else 1e30


def _place(x: np.ndarray, lead: int = 3, pad: int = 13) -> np.ndarray:
    """``x`` as a view into a larger array (row stride n + pad, first column at ``lead``) of garbage."""
    m, n = x.shape
    big = np.full((m + 2, lead + n + pad), _garbage(x.dtype), dtype=x.dtype)
    big[1:m + 1, lead:lead + n] = x
    return big[1:m + 1, lead:lead + n]


def _embed(x: np.ndarray) -> np.ndarray:
    """``x`` as a view into a larger array of garbage, rows 16-byte aligned (so the full tiles take the vector loads):
    a load past any edge of x reads garbage, which shows in the amax."""
    m, n = x.shape
    per16 = 16 // x.dtype.itemsize
    big = np.full((m + 2, round_up(n, per16) + per16), _garbage(x.dtype), dtype=x.dtype)
    big[1:m + 1, :n] = x
    view = big[1:m + 1, :n]
    assert view.ctypes.data % 16 == 0 and view.strides[0] % 16 == 0
    return view


def emulate(kernel, entry: str, x: np.ndarray, m_major: bool = False, offsets: dict | None = None,
            grid: int | None = None):
    """Run ``entry`` on host array ``x`` (any row stride) through the emulated kernel, with the host's launch
    arguments, layouts, shared memory and grid (planned for EMU_SMS SMs, or ``grid`` CTAs); returns the outputs as
    ``fused_cast_outputs`` lists them (uint8 bits, float32)."""
    m, n = x.shape
    item = x.dtype.itemsize
    ld = x.strides[0] // item if m > 1 else n
    outs = quant.fused_cast_outputs(entry, m, n, m_major)
    bufs = {o.name: _Buffer(o.buffer, np.dtype(np.uint8) if o.dtype.itemsize == 1 else F32,
                            (offsets or {}).get(o.name, 0)) for o in outs}
    args = quant.fused_cast_args(entry, x.ctypes.data, bufs["q_t"].ptr, bufs["s_t"].ptr,
                                 bufs["q"].ptr if "q" in bufs else 0, bufs["s"].ptr if "s" in bufs else 0,
                                 m, n, ld, m_major)
    if grid is None:
        grid = quant.fused_cast_grid(entry, x.dtype, m, n, EMU_SMS, kernel.stages)
    smem = quant.fused_cast_smem(x.dtype, entry, kernel.stages)
    assert kernel.threads == quant.fused_cast_threads(x.dtype)
    root = x
    while isinstance(root.base, np.ndarray):
        root = root.base
    byte_bounds = getattr(np, "byte_bounds", None) or np.lib.array_utils.byte_bounds  # NumPy 1 / 2
    lo, hi = byte_bounds(root)
    ranges = [(lo, hi - lo)] + [(b.ptr, b.nbytes) for b in bufs.values()]
    kernel.launch(grid, smem, *args, ranges=ranges)
    results = []
    for o in outs:
        b = bufs[o.name]
        b.check_guards()
        if o.buffer == o.shape:
            results.append(b.array)
        else:  # M-major scales: the padding columns are zeros
            np.testing.assert_array_equal(b.array[:, o.shape[0]:].view(np.uint32), 0)
            results.append(b.array[:, :o.shape[0]].T)
    return results


SHAPES = [(1, 1), (1, 128), (128, 1), (7, 200), (127, 129), (129, 127), (128, 128), (256, 384), (300, 200),
          (255, 256), (256, 255), (383, 128), (272, 136), (400, 1000), (130, 3), (4096 + 64, 8), (40, 1000)]


@pytest.mark.parametrize("entry", FUSED)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_emulated_bitwise(emulated, dtype, entry, shape):
    x = _make_input(shape, dtype, seed=shape[0] * 31 + shape[1])
    _assert_equal(emulate(emulated[str(dtype), entry], entry, _embed(x)), expected(entry, x))


@pytest.mark.parametrize("stages", OTHER_STAGES)
@pytest.mark.parametrize("entry", FUSED)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
def test_emulated_other_stages(emulated, dtype, entry, stages):
    """The ring depths the probe compares (and the path without a ring), on ragged shapes and any grid."""
    kernel = emulated.get((str(dtype), entry, stages)) or emulated[str(dtype), entry]
    assert kernel.stages == stages
    for shape in ((300, 200), (383, 128), (256, 255), (130, 3), (129, 4097)):
        x = _make_input(shape, dtype, seed=shape[0] + shape[1])
        _assert_equal(emulate(kernel, entry, _embed(x)), expected(entry, x))
    x = _make_input((520, 300), dtype, seed=9)
    for grid in (1, 2, 5, 15):  # 15: one CTA per tile
        _assert_equal(emulate(kernel, entry, _embed(x), grid=grid), expected(entry, x))


@pytest.mark.parametrize("entry", FUSED)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
def test_emulated_strided_inputs(emulated, dtype, entry):
    kernel = emulated[str(dtype), entry]
    x = _make_input((260, 300), dtype, seed=5)
    # rows of a wider array, first column not 16-byte aligned: the element-wise loads, garbage all around
    _assert_equal(emulate(kernel, entry, _place(x)), expected(entry, x))
    # 16-byte aligned rows of a wider array: the vector loads on the full tiles
    big = np.full((260, 304 + 64), _garbage(dtype), dtype=dtype)
    big[:, 64:364] = x
    view = big[:, 64:364]
    assert (view.ctypes.data % 16 == 0) and (view.strides[0] % 16 == 0)
    _assert_equal(emulate(kernel, entry, view), expected(entry, x))
    # negative row stride
    _assert_equal(emulate(kernel, entry, big[::-1, 64:364]), expected(entry, x[::-1]))
    # every other row
    _assert_equal(emulate(kernel, entry, big[::2, 64:364]), expected(entry, x[::2]))
    # zero row stride (one row broadcast)
    bcast = np.broadcast_to(x[7], (131, 300))
    _assert_equal(emulate(kernel, entry, bcast), expected(entry, np.ascontiguousarray(bcast)))


@pytest.mark.parametrize("entry", FUSED)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
def test_emulated_misaligned_outputs(emulated, dtype, entry):
    """Outputs at odd addresses (a caller's own buffers): the kernel stores them byte by byte, the same values."""
    x = _make_input((256, 256), dtype, seed=8)
    got = emulate(emulated[str(dtype), entry], entry, x, offsets={"q_t": 1, "q": 3, "s": 4, "s_t": 8})
    _assert_equal(got, expected(entry, x))


@pytest.mark.parametrize("rowwise", [False, True])
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(300, 130), (256, 256), (1, 5), (129, 4)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_emulated_m_major_scales(emulated, dtype, rowwise, shape):
    entry = quant.TRANSPOSED_ROWWISE if rowwise else quant.TRANSPOSED
    x = _make_input(shape, dtype, seed=3)
    got = emulate(emulated[str(dtype), entry], entry, x, m_major=True)
    assert got[1].strides == (4, 4 * round_up(shape[1], 4))
    _assert_equal(got, expected(entry, x))


def test_emulated_e4m3_matches_the_reference(emulated):
    """The emulation's e4m3 conversion (the stand-in for cvt.rn.satfinite.e4m3x2.f32) is the reference's: every e4m3
    value, every midpoint between neighbours (ties to even), their float32 neighbours, and random values."""
    kernel = emulated[str(BF16), quant.TRANSPOSED]
    grid = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    grid = np.unique(grid[np.isfinite(grid)])
    mids = (grid[:-1].astype(np.float64) + grid[1:]) / 2
    vals = np.concatenate([grid, mids.astype(np.float32), np.nextafter(mids.astype(np.float32), np.float32(np.inf)),
                           np.nextafter(mids.astype(np.float32), np.float32(-np.inf)),
                           np.array([460.0, 464.0, 470.0, 1e30, -1e30, 1e-30, 2.0 ** -10, 2.0 ** -9 * 1.5], np.float32),
                           np.random.default_rng(0).standard_normal(4000).astype(np.float32) * 100])
    np.testing.assert_array_equal(kernel.e4m3(vals), ref.float32_to_fp8(vals))


# ---- validation and routing (no GPU) -----------------------------------------------------------------------------

def _fake_cupy(shape, dtype, strides=None):
    """A CuPy array header over memory that does not exist: enough for argument validation, never launched on."""
    mem = cupy.cuda.memory.UnownedMemory(0x10000000, 1 << 24, None, device_id=0)
    return cupy.ndarray(shape, dtype=dtype, memptr=cupy.cuda.memory.MemoryPointer(mem, 1 << 20), strides=strides)


_FUSED_CALLS = [lambda x: quant.per_token_cast_to_fp8_transposed(x),
                lambda x: quant.per_token_cast_to_fp8_transposed(x, rowwise=True, m_major_scales=True),
                lambda x: quant.per_block_cast_to_fp8(x, with_transpose=True)]


@pytest.mark.parametrize("fn", _FUSED_CALLS, ids=["transposed", "rowwise", "block"])
def test_rejects_bad_inputs(fn):
    with pytest.raises(TypeError, match="NumPy"):
        fn(np.zeros((4, 128), np.float32))
    with pytest.raises(ValueError, match="2-D"):
        fn(_fake_cupy((128,), np.float32))
    with pytest.raises(TypeError, match="float64"):
        fn(_fake_cupy((4, 128), np.float64))
    with pytest.raises(TypeError, match="FP8"):
        fn(_fake_cupy((4, 128), np.uint8))
    with pytest.raises(ValueError, match="unit stride"):
        fn(_fake_cupy((4, 64), BF16, strides=(2, 8)))  # a transposed view: pass x itself
    with pytest.raises(ValueError, match="row stride"):
        fn(_fake_cupy((4, 64), np.float32, strides=(258, 4)))


def test_block_with_transpose_has_no_m_major_option():
    with pytest.raises(TypeError):
        quant.per_block_cast_to_fp8(_fake_cupy((4, 128), BF16), with_transpose=True, m_major_scales=True)


def test_jax_arrays_go_to_cupygemm_jax():
    """JAX arrays take cupygemm.jax's casts (the jnp arithmetic off CUDA): bit for bit the compositions of the
    references; their scales are row-major only, so asking for M-major ones is an error, not a silent no-op."""
    jnp = pytest.importorskip("jax.numpy")
    x = _make_input((130, 260), F32, seed=4)
    calls = {quant.TRANSPOSED: lambda a, **kw: quant.per_token_cast_to_fp8_transposed(a, **kw),
             quant.TRANSPOSED_ROWWISE: lambda a, **kw: quant.per_token_cast_to_fp8_transposed(a, rowwise=True, **kw),
             quant.BLOCK_WITH_TRANSPOSE: lambda a, **kw: quant.per_block_cast_to_fp8(a, with_transpose=True)}
    for entry, call in calls.items():
        got = call(jnp.asarray(x))
        _assert_equal(tuple(np.asarray(g) for g in got), expected(entry, x))
    for entry in (quant.TRANSPOSED, quant.TRANSPOSED_ROWWISE):
        with pytest.raises(TypeError, match="m_major_scales: JAX arrays have no strides"):
            calls[entry](jnp.asarray(x), m_major_scales=True)
    with pytest.raises(TypeError, match="stream: JAX calls run on XLA's stream"):
        quant.per_token_cast_to_fp8_transposed(jnp.asarray(x), stream=0)


def test_exported():
    import cupygemm

    assert cupygemm.per_token_cast_to_fp8_transposed is quant.per_token_cast_to_fp8_transposed
    assert "per_token_cast_to_fp8_transposed" in cupygemm.__all__
