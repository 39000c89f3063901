"""The XLA FFI handler on the CPU: struct layouts, the metadata handshake, call-frame parsing, the error path and
the dtype map against call frames and an FFI API table built here with ctypes (no JAX needed); then, when JAX is
installed (CPU is enough), cupygemm.jax end to end on XLA's CPU platform with a host-side stand-in for the GPU
plans: jit, scan, vmap, traced masked_m / m_indices, trace-time validation, the no-derivative rule, errors raised
inside the handler, and the jnp FP8 casts against cupygemm.reference."""
from __future__ import annotations

import ctypes
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from cupygemm import reference as ref
from cupygemm import xla_ffi as ffi
from cupygemm.kinds.forward import MASKED, NORMAL
from cupygemm.packing import PackedLayout
from cupygemm.plan import NO_PAGE_SIDES


# --- layouts: the offsets checked with offsetof against jaxlib 0.10.2 (API 0.3) and 0.11.2 (API 0.4) ---------

def test_struct_offsets_match_the_header():
    cf = ffi.CallFrame
    assert (cf.api.offset, cf.ctx.offset, cf.stage.offset, cf.args.offset, cf.rets.offset, cf.attrs.offset,
            cf.future.offset, ctypes.sizeof(cf)) == (16, 24, 32, 40, 80, 120, 168, 176)
    for s, last in ((ffi.Args, "args"), (ffi.Rets, "rets")):
        assert (s.size.offset, s.types.offset, getattr(s, last).offset) == (16, 24, 32)
    b = ffi.Buffer
    assert (b.dtype.offset, b.data.offset, b.rank.offset, b.dims.offset) == (16, 24, 32, 40)
    api = ffi.Api
    assert (api.api_version.offset, api.Error_Create.offset, api.Stream_Get.offset,
            api.DeviceOrdinal_Get.offset) == (16, 48, 80, 184)
    assert ctypes.sizeof(api) == 192  # API 0.3's table; 0.4 appends (200 bytes): only struct_size tells
    md = ffi.Metadata
    assert (md.api_version.offset, md.traits.offset) == (8, 32)
    assert (ffi.ApiVersion.major_version.offset, ffi.ApiVersion.minor_version.offset) == (16, 20)
    assert ffi.MetadataExtension.metadata.offset == 24 and ctypes.sizeof(ffi.ExtensionBase) == 24
    # XLA_FFI_STRUCT_SIZE: without trailing padding.
    assert ffi.ERROR_CREATE_ARGS_SIZE == 28 and ffi.STREAM_GET_ARGS_SIZE == 32
    assert ffi.DEVICE_ORDINAL_GET_ARGS_SIZE == 28 and ffi.CALL_FRAME_SIZE == 168


def test_the_frame_struct_reads_the_header_fields():
    """The handler reads a call frame with one struct unpack: (extension_start, api, ctx, stage, the static bytes
    from args.size to the end of attrs), whose fields _STATIC gives; the layouts' reads are 'Q' words."""
    xla = FakeXla()
    fr = Frame(xla, ARGS, RETS, entry_id=7)
    ext, api, ctx, stage, static = ffi._FRAME.unpack_from(ffi._MEM, fr.address)
    assert (ext, api, ctx, stage) == (0, xla.api, ctypes.addressof(xla.ctx), ffi.EXECUTE)
    f = fr.frame
    assert ffi._STATIC.unpack(static) == (
        len(ARGS), ctypes.cast(f.args.args, ctypes.c_void_p).value, len(RETS),
        ctypes.cast(f.rets.rets, ctypes.c_void_p).value, 1, ctypes.cast(f.attrs.types, ctypes.c_void_p).value,
        ctypes.cast(f.attrs.attrs, ctypes.c_void_p).value)
    assert ffi._FRAME.size == ffi.CALL_FRAME_SIZE and ffi.Buffer.data.offset % 8 == 0
    assert (ffi.Scalar.dtype.offset, ffi.Scalar.value.offset) == (0, 8)


def test_gather_reads_scattered_fields_in_one_unpack():
    words = (ctypes.c_int64 * 16)(*range(100, 116))
    base = ctypes.addressof(words)
    items = [(base + 8 * 9, "q"), (base + 8 * 2, "q"), (base + 8 * 9, "q"), (base + 8 * 5, "i")]
    s, start, positions = ffi._gather(items)
    got = s.unpack_from(ffi._MEM, start)
    assert [got[p] for p in positions] == [109, 102, 109, 105] and len(got) == 3  # the repeated item read once
    assert ffi._getter(positions[1:2])(got) == (102,) and ffi._getter(())(got) == ()
    with pytest.raises(ValueError, match="overlapping"):
        ffi._gather([(base, "q"), (base + 4, "i")])


def test_dtype_map():
    assert ffi.ffi_dtype(np.float32) == 11 and ffi.ffi_dtype(np.dtype(np.float32)) == 11
    assert ffi.ffi_dtype(ml_dtypes.bfloat16) == 16
    assert ffi.ffi_dtype(np.dtype(ml_dtypes.float8_e4m3fn)) == 20
    assert ffi.ffi_dtype(np.uint8) == 6 and ffi.ffi_dtype("int32") == 4 and ffi.ffi_dtype(np.uint32) == 8
    with pytest.raises(TypeError, match="complex64"):
        ffi.ffi_dtype(np.complex64)


def test_header_api_version(tmp_path):
    d = tmp_path / "xla" / "ffi" / "api"
    d.mkdir(parents=True)
    (d / "c_api.h").write_text("#define XLA_FFI_API_MAJOR 0\n// x\n#define XLA_FFI_API_MINOR 4\n")
    assert ffi.header_api_version(str(tmp_path)) == (0, 4)
    with pytest.raises(RuntimeError, match="cannot read"):
        ffi.header_api_version(str(tmp_path / "nowhere"))


def test_unknown_major_version_is_refused():
    with pytest.raises(RuntimeError, match="major version 0"):
        ffi.FfiHandler("t", (1, 0))


# --- a fake XLA: API table, execution context, call frames --------------------------------------------------

class FakeXla:
    """An XLA_FFI_Api table whose Error_Create / Stream_Get / DeviceOrdinal_Get are ctypes callbacks."""

    STREAM = 0xABC0

    def __init__(self, major: int = 0, minor: int = 4, table_size: int = 200, ordinal: int = 0):
        self.errors: list[tuple[str, int]] = []
        self.stream_ctx: list[int] = []
        self.stream_error = 0
        self.ordinal = ordinal
        self._error_objs = []
        self._callbacks = [ffi.API_FN(self._error_create), ffi.API_FN(self._stream_get),
                           ffi.API_FN(self._device_ordinal_get)]
        raw = (ctypes.c_char * max(table_size, ctypes.sizeof(ffi.Api)))()
        self._raw = raw
        api = ffi.Api.from_buffer(raw)
        api.struct_size = table_size
        api.api_version = ffi.ApiVersion(ffi.API_VERSION_SIZE, None, major, minor)
        api.Error_Create, api.Stream_Get, api.DeviceOrdinal_Get = (ctypes.cast(c, ctypes.c_void_p).value
                                                                    for c in self._callbacks)
        self.api = ctypes.addressof(raw)
        self.ctx = ctypes.create_string_buffer(16)  # opaque to the handler

    def _error_create(self, args_ptr):
        args = ffi.ErrorCreateArgs.from_address(args_ptr)
        assert args.struct_size == ffi.ERROR_CREATE_ARGS_SIZE
        self.errors.append((args.message.decode(), args.errc))
        obj = ctypes.create_string_buffer(8)  # a stand-in XLA_FFI_Error*
        self._error_objs.append(obj)
        return ctypes.addressof(obj)

    def _stream_get(self, args_ptr):
        args = ffi.StreamGetArgs.from_address(args_ptr)
        assert args.struct_size == ffi.STREAM_GET_ARGS_SIZE
        self.stream_ctx.append(args.ctx)
        if self.stream_error:
            return self.stream_error
        args.stream = self.STREAM
        return None

    def _device_ordinal_get(self, args_ptr):
        ffi.DeviceOrdinalGetArgs.from_address(args_ptr).device_ordinal = self.ordinal
        return None


class Frame:
    """An execute call frame: buffers (dtype, dims, data address) for args and rets, an int64 entry_id attribute.
    ``buffers`` (args then rets), ``arg_ptrs``/``ret_ptrs`` (the frame's pointer arrays), ``scalar``, ``value`` and
    ``attr_ptrs`` are the frame's own memory, which a test may change in place as XLA does."""

    def __init__(self, xla: FakeXla, args, rets, entry_id: int = 0, attr_dtype: int = 5, nattrs: int = 1):
        self._keep = []
        self.buffers = []
        self.frame = ffi.CallFrame()
        f = self.frame
        f.struct_size = ffi.CALL_FRAME_SIZE
        f.api = xla.api
        f.ctx = ctypes.addressof(xla.ctx)
        f.stage = ffi.EXECUTE
        for part, field, bufs in ((f.args, "args", args), (f.rets, "rets", rets)):
            part.struct_size = ctypes.sizeof(type(part))
            part.size = len(bufs)
            ptrs = (ctypes.c_void_p * max(len(bufs), 1))(*[self._buffer(*b) for b in bufs])
            types = (ctypes.c_int * max(len(bufs), 1))(*([1] * len(bufs)))
            self._keep += [ptrs, types]
            setattr(part, field, ctypes.cast(ptrs, ctypes.POINTER(ctypes.c_void_p)))
            part.types = ctypes.cast(types, ctypes.POINTER(ctypes.c_int))
            setattr(self, "arg_ptrs" if field == "args" else "ret_ptrs", ptrs)
        self.value = ctypes.c_int64(entry_id)
        self.scalar = ffi.Scalar(attr_dtype, ctypes.addressof(self.value))
        self.attr_ptrs = (ctypes.c_void_p * 1)(ctypes.addressof(self.scalar))
        attr_types = (ctypes.c_int * 1)(ffi.ATTR_SCALAR)
        self._keep += [attr_types]
        f.attrs.size = nattrs
        f.attrs.attrs = ctypes.cast(self.attr_ptrs, ctypes.POINTER(ctypes.c_void_p))
        f.attrs.types = ctypes.cast(attr_types, ctypes.POINTER(ctypes.c_int))

    def _buffer(self, dtype: int, dims: tuple, data: int) -> int:
        d = (ctypes.c_int64 * max(len(dims), 1))(*dims)
        b = ffi.Buffer(ctypes.sizeof(ffi.Buffer), None, dtype, data, len(dims), ctypes.cast(d, ctypes.POINTER(ctypes.c_int64)))
        self._keep += [d, b]
        self.buffers.append(b)
        return ctypes.addressof(b)

    def new_buffer(self, dtype: int, dims: tuple, data: int) -> int:
        """A buffer struct that is not (yet) in the frame: its address."""
        return self._buffer(dtype, dims, data)

    @property
    def address(self) -> int:
        return ctypes.addressof(self.frame)


def call_through_c(handler: ffi.FfiHandler, frame: "Frame | int") -> int | None:
    """Call the handler as XLA does: through its C function pointer. Pass the Frame itself, not its address, so
    that it stays alive during the call (a temporary's memory would be freed before the handler reads it)."""
    return ffi.HANDLER_FN(handler.address)(frame.address if isinstance(frame, Frame) else frame)


ARGS = [(20, (64, 256), 0x1000), (11, (2, 64), 0x2000), (20, (128, 256), 0x3000), (11, (1, 2), 0x4000)]
RETS = [(16, (64, 128), 0x5000), (11, (32,), 0x6000), (8, (4,), 0x7000)]


def recording_entry(name="normal GEMM", expected=None, fail=None):
    seen = []

    def launch(stream, args, rets):
        if fail is not None:
            raise fail
        seen.append((stream, list(args), list(rets)))
    return ffi.FfiEntry(name, len(ARGS), len(RETS), {0: launch}, expected), seen


def handler_with_frame(expected=None):
    """A fake XLA, a handler with one recording entry, and a frame calling it: (xla, handler, seen, frame)."""
    xla = FakeXla()
    h = ffi.FfiHandler("t", (0, 4))
    entry, seen = recording_entry(expected=expected)
    return xla, h, seen, Frame(xla, ARGS, RETS, entry_id=h.add(entry))


def test_handshake_writes_version_and_traits_and_does_not_run():
    h = ffi.FfiHandler("t", (0, 4))
    entry, seen = recording_entry()
    h.add(entry)
    md = ffi.Metadata(ctypes.sizeof(ffi.Metadata), ffi.ApiVersion(ffi.API_VERSION_SIZE))
    other = ffi.ExtensionBase(ctypes.sizeof(ffi.ExtensionBase), 99, None)  # an extension we do not know comes first
    ext = ffi.MetadataExtension(ffi.ExtensionBase(ctypes.sizeof(ffi.MetadataExtension), ffi.EXTENSION_METADATA),
                                ctypes.pointer(md))
    other.next = ctypes.cast(ctypes.pointer(ext), ctypes.POINTER(ffi.ExtensionBase))
    frame = ffi.CallFrame(ffi.CALL_FRAME_SIZE, ctypes.pointer(other))  # api = NULL, as XLA sends it
    frame.stage = ffi.EXECUTE
    assert call_through_c(h, ctypes.addressof(frame)) is None
    assert (md.api_version.major_version, md.api_version.minor_version) == (0, 4)
    assert md.traits == ffi.TRAIT_COMMAND_BUFFER_COMPATIBLE
    assert seen == [] and h.handshakes == 1


def test_execute_reads_pointers_and_xla_stream():
    xla = FakeXla()
    h = ffi.FfiHandler("t", (0, 4))
    entry, seen = recording_entry()
    eid = h.add(entry)
    fr = Frame(xla, ARGS, RETS, entry_id=eid)
    assert call_through_c(h, fr.address) is None
    assert seen == [(FakeXla.STREAM, [0x1000, 0x2000, 0x3000, 0x4000], [0x5000, 0x6000, 0x7000])]
    assert xla.stream_ctx == [ctypes.addressof(xla.ctx)] and xla.errors == []
    assert call_through_c(h, fr.address) is None and len(seen) == 2  # the bound API table is reused


def test_cpu_handler_passes_stream_zero():
    xla = FakeXla()
    h = ffi.FfiHandler("t", (0, 4), use_stream=False)
    entry, seen = recording_entry()
    assert call_through_c(h, Frame(xla, ARGS, RETS, entry_id=h.add(entry))) is None
    assert seen[0][0] == 0 and xla.stream_ctx == []


@pytest.mark.parametrize("exc, code", [(ValueError("bad masked_m"), ffi.INVALID_ARGUMENT),
                                       (TypeError("bad dtype"), ffi.INVALID_ARGUMENT),
                                       (RuntimeError("cuLaunchKernel failed"), ffi.INTERNAL)])
def test_launch_errors_become_ffi_errors(exc, code):
    xla = FakeXla()
    h = ffi.FfiHandler("cupygemm_fp8_gemm", (0, 4))
    entry, _ = recording_entry(fail=exc)
    err = call_through_c(h, Frame(xla, ARGS, RETS, entry_id=h.add(entry)))
    assert err  # a non-NULL XLA_FFI_Error*
    (message, errc), = xla.errors
    assert errc == code and str(exc) in message and "cupygemm (cupygemm_fp8_gemm)" in message


def test_frame_mismatches_are_invalid_argument():
    xla = FakeXla()
    h = ffi.FfiHandler("t", (0, 4))
    entry, seen = recording_entry()
    eid = h.add(entry)
    cases = [(Frame(xla, ARGS, RETS, entry_id=eid + 5), "unknown entry_id"),
             (Frame(xla, ARGS[:3], RETS, entry_id=eid), "expected 4 operands and 3 results, XLA passed 3 and 3"),
             (Frame(xla, ARGS, RETS, entry_id=eid, attr_dtype=4), "int64 scalar"),
             (Frame(xla, ARGS, RETS, entry_id=eid, nattrs=2), "one attribute")]
    for fr, why in cases:
        assert call_through_c(h, fr.address)
        assert xla.errors[-1][1] == ffi.INVALID_ARGUMENT and why in xla.errors[-1][0], xla.errors[-1]
    assert seen == []


def test_buffer_check_names_the_operand():
    xla = FakeXla()
    h = ffi.FfiHandler("t", (0, 4))
    expected = tuple((d, dims) for d, dims, _ in ARGS + RETS)
    entry, seen = recording_entry(expected=expected)
    eid = h.add(entry)
    assert call_through_c(h, Frame(xla, ARGS, RETS, entry_id=eid)) is None and len(seen) == 1
    bad = list(ARGS)
    bad[1] = (11, (2, 60), 0x2000)
    assert call_through_c(h, Frame(xla, bad, RETS, entry_id=eid))
    assert "operand 1: expected dtype 11 with shape (2, 64), XLA passed dtype 11 with shape (2, 60)" in xla.errors[-1][0]


def test_unknown_api_major_in_the_frame_is_an_error():
    xla = FakeXla(major=1, minor=0)
    h = ffi.FfiHandler("t", (0, 4))
    entry, seen = recording_entry()
    assert call_through_c(h, Frame(xla, ARGS, RETS, entry_id=h.add(entry)))
    assert xla.errors[-1][1] == ffi.INTERNAL and "API version 1.0" in xla.errors[-1][0] and seen == []


def test_stream_get_error_is_passed_back():
    xla = FakeXla()
    sentinel = ctypes.create_string_buffer(8)
    xla.stream_error = ctypes.addressof(sentinel)
    h = ffi.FfiHandler("t", (0, 4))
    entry, seen = recording_entry()
    assert call_through_c(h, Frame(xla, ARGS, RETS, entry_id=h.add(entry))) == ctypes.addressof(sentinel)
    assert seen == []


def test_device_ordinal_picks_the_plan():
    xla = FakeXla(ordinal=1)
    h = ffi.FfiHandler("t", (0, 4))
    ran = []
    entry = ffi.FfiEntry("e", len(ARGS), len(RETS), {0: lambda *a: ran.append(0), 1: lambda *a: ran.append(1)})
    eid = h.add(entry)
    assert call_through_c(h, Frame(xla, ARGS, RETS, entry_id=eid)) is None and ran == [1]
    xla.ordinal = 3
    assert call_through_c(h, Frame(xla, ARGS, RETS, entry_id=eid))
    assert "no kernel was planned for XLA device 3" in xla.errors[-1][0]


# --- the per-call-site layout cache ---------------------------------------------------------------------------

def _pointers(seen):
    return [(stream, tuple(a), tuple(r)) for stream, a, r in seen]


def test_pointers_that_move_between_calls_are_read_on_every_call():
    """XLA keeps a call site's frame and rewrites its buffers' data pointers in place: the cached layout must give
    the new pointers, and a pointer set seen before gets its launch back without a new bind."""
    xla = FakeXla()
    h = ffi.FfiHandler("t", (0, 4))
    binds, fired = [], []

    def bind(args, rets):
        binds.append((tuple(args), tuple(rets)))
        return lambda stream: fired.append((stream, tuple(args), tuple(rets)))
    eid = h.add(ffi.FfiEntry("e", len(ARGS), len(RETS), {0: None}, binds={0: bind}))
    fr = Frame(xla, ARGS, RETS, entry_id=eid)
    first = ((0x1000, 0x2000, 0x3000, 0x4000), (0x5000, 0x6000, 0x7000))
    assert call_through_c(h, fr) is None
    for i, b in enumerate(fr.buffers):
        b.data += 0x100 * (i + 1)  # the next call's buffers, as XLA writes them into the frame it keeps
    moved = ((0x1100, 0x2200, 0x3300, 0x4400), (0x5500, 0x6600, 0x7700))
    assert call_through_c(h, fr) is None
    for i, b in enumerate(fr.buffers):
        b.data -= 0x100 * (i + 1)
    assert call_through_c(h, fr) is None and call_through_c(h, fr) is None
    assert fired == [(FakeXla.STREAM, *first), (FakeXla.STREAM, *moved), (FakeXla.STREAM, *first),
                     (FakeXla.STREAM, *first)]
    assert binds == [first, moved]  # a known pointer set is not bound again
    assert len(h._sites) == 1 and xla.errors == [] and h.executes == 4


def test_call_sites_keep_their_own_layouts():
    """Two call sites (different entries, operand counts and buffers) called in turn: each call launches its own
    entry on its own pointers."""
    xla = FakeXla()
    h = ffi.FfiHandler("t", (0, 4))
    e1, seen1 = recording_entry("first")
    seen2 = []
    e2 = ffi.FfiEntry("second", 2, 1, {0: lambda stream, a, r: seen2.append((stream, list(a), list(r)))})
    f1 = Frame(xla, ARGS, RETS, entry_id=h.add(e1))
    f2 = Frame(xla, [(20, (8, 8), 0xA000), (11, (1,), 0xB000)], [(16, (8, 8), 0xC000)], entry_id=h.add(e2))
    for _ in range(3):
        assert call_through_c(h, f1) is None and call_through_c(h, f2) is None
    assert seen1 == [(FakeXla.STREAM, [0x1000, 0x2000, 0x3000, 0x4000], [0x5000, 0x6000, 0x7000])] * 3
    assert seen2 == [(FakeXla.STREAM, [0xA000, 0xB000], [0xC000])] * 3
    assert len(h._sites) == 2 and xla.errors == []


def test_a_frame_rebuilt_in_the_same_memory_is_read_anew():
    """XLA frees a frame with its executable; another call site's frame may then sit at the same addresses with the
    same static words. Whatever changed behind them (the buffer structs, the attribute, the entry id) is read, not
    taken from the layout cached for the old frame."""
    xla = FakeXla()
    h = ffi.FfiHandler("t", (0, 4))
    e0, seen0 = recording_entry("zero")
    e1, seen1 = recording_entry("one")
    i0, i1 = h.add(e0), h.add(e1)
    fr = Frame(xla, ARGS, RETS, entry_id=i0)
    assert call_through_c(h, fr) is None
    # new buffer structs behind the same pointer array: their pointers, not the old structs'
    fr.arg_ptrs[2] = fr.new_buffer(20, (128, 256), 0x9000)
    fr.ret_ptrs[0] = fr.new_buffer(16, (64, 128), 0x9900)
    assert call_through_c(h, fr) is None
    assert seen0[-1] == (FakeXla.STREAM, [0x1000, 0x2000, 0x9000, 0x4000], [0x9900, 0x6000, 0x7000])
    # the entry id changed in place: the other entry runs
    fr.value.value = i1
    assert call_through_c(h, fr) is None and len(seen1) == 1 and len(seen0) == 2
    # a new scalar struct behind the same attribute array
    value = ctypes.c_int64(i0)
    scalar = ffi.Scalar(5, ctypes.addressof(value))
    fr.attr_ptrs[0] = ctypes.addressof(scalar)
    assert call_through_c(h, fr) is None and len(seen0) == 3
    # and what is wrong now is caught as on a first call
    value.value = 99
    assert call_through_c(h, fr) and "unknown entry_id 99" in xla.errors[-1][0]
    value.value = i0
    scalar.dtype = 4
    assert call_through_c(h, fr) and "int64 scalar" in xla.errors[-1][0]
    assert len(seen0) == 3 and len(seen1) == 1


def test_the_buffer_check_runs_on_every_call_of_a_known_layout():
    """CUPYGEMM_CHECK_INPUTS=1 gives the entry ``expected``: a frame whose dims change after its layout was
    cached is still refused."""
    xla, h, seen, fr = handler_with_frame(expected=tuple((d, dims) for d, dims, _ in ARGS + RETS))
    assert call_through_c(h, fr) is None and len(seen) == 1
    fr.buffers[0].dims[1] = 255
    assert call_through_c(h, fr)
    assert "operand 0: expected dtype 20 with shape (64, 256), XLA passed dtype 20 with shape (64, 255)" in \
        xla.errors[-1][0]
    fr.buffers[0].dims[1] = 256
    fr.buffers[4].dtype = 15
    assert call_through_c(h, fr) and "result 0: expected dtype 16" in xla.errors[-1][0]
    assert len(seen) == 1


def test_a_frame_the_entry_was_not_made_for_is_refused_before_binding():
    """Under CUPYGEMM_CHECK_INPUTS=1 a mismatched frame is refused before its pointers are bound (packed)."""
    xla = FakeXla()
    h = ffi.FfiHandler("t", (0, 4))
    binds = []
    entry = ffi.FfiEntry("e", len(ARGS), len(RETS), {0: None}, tuple((d, dims) for d, dims, _ in ARGS + RETS),
                         binds={0: lambda a, r: binds.append(a) or (lambda stream: None)})
    bad = list(ARGS)
    bad[3] = (11, (1, 3), 0x4000)
    assert call_through_c(h, Frame(xla, bad, RETS, entry_id=h.add(entry)))
    assert "operand 3: expected dtype 11 with shape (1, 2)" in xla.errors[-1][0] and binds == []


def test_profile_parts_and_trace():
    """The benchmarks' diagnostics: each alone or together, per call."""
    xla, h, seen, fr = handler_with_frame()
    h.profile_parts = []
    assert call_through_c(h, fr) is None
    (read, stream, end), = h.profile_parts
    assert 0 < read <= stream <= end
    h.profile_parts, h.profile, h.trace = None, [], []
    assert call_through_c(h, fr) is None and call_through_c(h, fr) is None
    assert len(h.profile) == 2 and all(t > 0 for t in h.profile)
    assert h.trace == [(0, (0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0x7000))] * 2 and len(seen) == 3


def test_null_pointers_in_the_frame_are_errors():
    """NULL arrays or values where the frame must hold them are refused (reading them would crash the process)."""
    xla = FakeXla()
    h = ffi.FfiHandler("t", (0, 4))
    entry, seen = recording_entry()
    eid = h.add(entry)
    cases = []
    fr = Frame(xla, ARGS, RETS, entry_id=eid)
    fr.frame.args.args = None
    cases.append((fr, "buffer arrays are NULL"))
    fr = Frame(xla, ARGS, RETS, entry_id=eid)
    fr.frame.attrs.attrs = None
    cases.append((fr, "attribute arrays are NULL"))
    fr = Frame(xla, ARGS, RETS, entry_id=eid)
    fr.scalar.value = None
    cases.append((fr, "int64 scalar"))
    fr = Frame(xla, ARGS, RETS, entry_id=eid)
    fr.ret_ptrs[1] = None
    cases.append((fr, "NULL buffer"))
    for fr, why in cases:
        assert call_through_c(h, fr)
        assert xla.errors[-1][1] == ffi.INVALID_ARGUMENT and why in xla.errors[-1][0], xla.errors[-1]
    assert seen == []


def test_launches_per_device_and_pointer_set():
    """An entry planned for two devices binds one fire per (device, pointers): the ordinal is asked on every call."""
    xla = FakeXla(ordinal=1)
    h = ffi.FfiHandler("t", (0, 4))
    binds, fired = [], []

    def binder(dev):
        def bind(args, rets):
            binds.append(dev)
            return lambda stream: fired.append((dev, tuple(args)))
        return bind
    entry = ffi.FfiEntry("e", len(ARGS), len(RETS), {0: None, 1: None}, binds={0: binder(0), 1: binder(1)})
    fr = Frame(xla, ARGS, RETS, entry_id=h.add(entry))
    for ordinal in (1, 1, 0, 1, 0):
        xla.ordinal = ordinal
        assert call_through_c(h, fr) is None
    assert [d for d, _ in fired] == [1, 1, 0, 1, 0] and binds == [1, 0]
    xla.ordinal = 5
    assert call_through_c(h, fr) and "no kernel was planned for XLA device 5" in xla.errors[-1][0]
    with pytest.raises(ValueError, match="binds for devices"):
        ffi.FfiEntry("e", 1, 1, {0: None, 1: None}, binds={0: binder(0)})


def test_kept_launches_are_bounded(monkeypatch):
    """A cycle of more pointer sets than the handler keeps still launches each on its own pointers."""
    monkeypatch.setattr(ffi, "_FIRE_LIMIT", 4)
    xla, h, seen, fr = handler_with_frame()
    for _ in range(2):
        for step in range(6):
            fr.buffers[0].data = 0x10000 * (step + 1)
            assert call_through_c(h, fr) is None
            assert seen[-1][1][0] == 0x10000 * (step + 1)
    site, = h._sites.values()
    assert len(site.fires) <= 4 and len(h.entry(0).fires) <= 4 and len(seen) == 12


def test_frames_built_anew_for_every_call_are_parsed_without_layouts(monkeypatch):
    """Where every call comes with a new frame (an XLA that does not keep its frames), the handler stops keeping
    layouts once most calls made one, and parses each frame instead."""
    monkeypatch.setattr(ffi, "_SITE_LIMIT", 8)
    xla = FakeXla()
    h = ffi.FfiHandler("t", (0, 4))
    entry, seen = recording_entry()
    eid = h.add(entry)
    frames = [Frame(xla, [(d, dims, data + i) for d, dims, data in ARGS], RETS, entry_id=eid) for i in range(20)]
    for fr in frames:
        assert call_through_c(h, fr) is None
    assert h._unkept and not h._sites
    assert [s[1][0] for s in seen] == [0x1000 + i for i in range(20)]
    assert call_through_c(h, Frame(xla, ARGS, RETS, entry_id=eid + 3)) and "unknown entry_id" in xla.errors[-1][0]


def test_layouts_that_pile_up_are_forgotten(monkeypatch):
    """Frames of executables made and dropped, each called many times: the layouts are dropped when too many, and
    the handler keeps making them."""
    monkeypatch.setattr(ffi, "_SITE_LIMIT", 4)
    xla = FakeXla()
    h = ffi.FfiHandler("t", (0, 4))
    entry, seen = recording_entry()
    eid = h.add(entry)
    for i in range(10):
        fr = Frame(xla, ARGS, RETS, entry_id=eid)
        for _ in range(5):
            assert call_through_c(h, fr) is None
    assert not h._unkept and 1 <= len(h._sites) <= 4 and len(seen) == 50


def _thread_states() -> int:
    """How many Python thread states the interpreter holds."""
    api = ctypes.pythonapi
    api.PyInterpreterState_Get.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.restype = api.PyThreadState_Next.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.argtypes = api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
    n, t = 0, api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Get())
    while t:
        n, t = n + 1, api.PyThreadState_Next(t)
    return n


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pthread_create through ctypes")
@pytest.mark.parametrize("keep", [True, False])
def test_a_native_thread_keeps_its_python_thread_state(keep):
    """XLA runs executables on threads Python did not start, where a ctypes callback gets a new Python thread state
    per call and drops it on return (microseconds a call). The handler keeps the state of each thread it runs on:
    a thread that called it leaves one behind."""
    xla, h, seen, fr = handler_with_frame()
    h.keep_thread_states = keep
    libc = ctypes.CDLL(None)
    libc.pthread_create.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
    before = _thread_states()
    thread = ctypes.c_ulong()
    # the handler is a void *(void *): a thread's start routine, run with the frame as its argument
    assert libc.pthread_create(ctypes.byref(thread), None, h.address, fr.address) == 0
    assert libc.pthread_join(thread.value, None) == 0
    assert len(seen) == 1 and xla.errors == [] and len(h.threads) == 1
    assert _thread_states() - before == (1 if keep else 0)


def test_import_cupygemm_imports_no_framework():
    code = ("import sys, cupygemm, cupygemm.xla_ffi; "
            "bad = [m for m in ('jax', 'torch') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- cupygemm.jax on XLA's CPU platform, with host-side plans ------------------------------------------------

def _host(ptr: int, dtype, shape) -> np.ndarray:
    count = int(np.prod(shape))
    raw = (ctypes.c_char * max(count * np.dtype(dtype).itemsize, 1)).from_address(ptr)
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


def _packed_rows(n, k, g, base_low, hash_bits, page_bits):
    """Where packed B's rows lie (cuda_src/l2_sides.cuh's layout, modelled in NumPy): for group gi, K block kb and
    row r, the byte offset of the row's 128 bytes, whose 16-byte units are stored swizzled (unit u at u ^ r % 8)."""
    from cupygemm.packing import PackedLayout

    lay = PackedLayout(n, k)
    gi, kb, r = np.meshgrid(np.arange(g), np.arange(lay.k_blocks), np.arange(n), indexing="ij")
    chunk = r // 32
    half = (chunk >= (lay.chunks + 1) // 2).astype(np.int64)
    pair = gi * lay.group_bytes + (kb * lay.pairs + chunk - half * ((lay.chunks + 1) // 2)) * 8192
    at = base_low + pair
    parity = np.array([bin(int(x) & hash_bits).count("1") & 1 for x in at.ravel()]).reshape(at.shape)
    side = page_bits[at >> 21] ^ parity
    return pair + (half ^ side) * 4096 + (r % 32) * 128, lay


def pack_host(b, base_low, hash_bits, page_bits):
    """Packed bytes of B [G, N, K] uint8 (and the page bits after the groups), as pack_weights lays them out."""
    g, n, k = b.shape
    rows, lay = _packed_rows(n, k, g, base_low, hash_bits, page_bits)
    out = np.zeros(lay.buffer_bytes(base_low, g), np.uint8)
    kpad = np.zeros((g, n, lay.k_blocks * 128), np.uint8)
    kpad[:, :, :k] = b
    units = kpad.reshape(g, n, lay.k_blocks, 8, 16).transpose(0, 2, 1, 3, 4)  # [g, kb, n, unit, 16]
    swz = (np.arange(8)[None, :] ^ (np.arange(n)[:, None] % 8))  # stored position of unit u of row r
    for u in range(8):
        dst = rows + swz[None, None, :, u] * 16
        out[dst[..., None] + np.arange(16)] = units[:, :, :, u, :]
    words = np.zeros(lay.page_words(base_low, g), np.uint32)
    bits = np.packbits(page_bits.astype(np.uint8), bitorder="little")
    words.view(np.uint8)[:bits.size] = bits[:words.nbytes]
    out[g * lay.group_bytes:g * lay.group_bytes + words.nbytes] = words.view(np.uint8)
    return out


def unpack_host(ptr, n, k, g, base_low, hash_bits, param_words=None):
    """B [G, N, K] uint8 back from packed bytes at ``ptr``, reading the page bits they hold, or ``param_words`` (the
    launch's page-bit parameters, which a normal GEMM on few pages reads instead), as the kernel does."""
    from cupygemm.packing import PackedLayout

    lay = PackedLayout(n, k)
    raw = _host(ptr, np.uint8, (lay.buffer_bytes(base_low, g),))
    words = raw[g * lay.group_bytes:g * lay.group_bytes + 4 * lay.page_words(base_low, g)]
    if param_words is not None:
        words = np.asarray(param_words, np.uint32).view(np.uint8)
    page_bits = np.unpackbits(words, bitorder="little").astype(np.int64)
    rows, _ = _packed_rows(n, k, g, base_low, hash_bits, page_bits)
    b = np.zeros((g, lay.k_blocks, n, 8, 16), np.uint8)
    swz = (np.arange(8)[None, :] ^ (np.arange(n)[:, None] % 8))
    for u in range(8):
        b[:, :, :, u, :] = raw[(rows + swz[None, None, :, u] * 16)[..., None] + np.arange(16)]
    return b.transpose(0, 2, 1, 3, 4).reshape(g, n, lay.k_blocks * 128)[:, :, :k]


class HostPlan:
    """Does what the GPU plan's launch does, on host buffers, from the same pointers and layouts (SFA M-major,
    padded to sfa_m_pad), including rows the kernel skips and the scratch counters' zeroing; side-aware plans read
    B from packed weights (``page_sides``: their base_low and hash bits), as the kernel does."""

    def __init__(self, kind, m, n, k, g, expected_m, floats=0, counters=0, fail=None, sides=False):
        self.kind, self.m, self.n, self.k, self.g, self.expected_m = kind, m, n, k, g, expected_m
        self.sfa_m_pad = (m + 3) // 4 * 4
        self.scratch_floats, self.scratch_counters = floats, counters
        self.fail = fail
        self.sides = sides
        self.calls = self.binds = 0

    def bind(self, *args, **kwargs):
        """The launch on these pointers as the handler keeps it (the GPU plan packs its parameters here)."""
        self.binds += 1
        return lambda stream: self.launch(stream, *args, **kwargs)

    def launch(self, stream, a, sfa, b, sfb, d, layout=0, partials=0, counters=0, zero_counters=False,
               page_sides=NO_PAGE_SIDES):
        if self.fail is not None:
            raise self.fail
        self.calls += 1
        kind, m, n, k, g = self.kind, self.m, self.n, self.k, self.g
        kb, nb = -(-k // 128), -(-n // 128)
        ga = g if kind is MASKED else 1
        A = _host(a, np.uint8, (ga, m, k))
        SFA = _host(sfa, np.float32, (ga, kb, self.sfa_m_pad))[:, :, :m].transpose(0, 2, 1)
        base_low, hash_bits, *words = page_sides
        assert self.sides == (hash_bits != 0) and len(words) == 4
        in_params = kind is NORMAL and PackedLayout(n, k).page_bits_in_params
        B = (unpack_host(b, n, k, g, base_low, hash_bits, words if in_params else None) if self.sides
             else _host(b, np.uint8, (g, n, k)))
        SFB = _host(sfb, np.float32, (g, nb, kb))
        D = _host(d, ml_dtypes.bfloat16, (ga, m, n))
        assert bool(partials) == bool(self.scratch_floats) and bool(counters) == bool(self.scratch_counters)
        if counters:
            assert zero_counters
        if kind is NORMAL:
            D[0] = ref.gemm_reference(A[0], SFA[0], B[0], SFB[0])
        elif kind is MASKED:
            mm = _host(layout, np.int32, (g,))
            for i in range(g):
                r = int(np.clip(mm[i], 0, m))
                D[i, :r] = ref.gemm_reference(A[i, :r], SFA[i, :r], B[i], SFB[i])
        else:
            idx = _host(layout, np.int32, (m,))
            for r in np.nonzero((idx >= 0) & (idx < g))[0]:
                D[0, r] = ref.gemm_reference(A[0, r:r + 1], SFA[0, r:r + 1], B[idx[r]], SFB[idx[r]])[0]


class HostPlanner:
    def __init__(self, **kw):
        self.kw, self.plans = kw, []

    def __call__(self, kind, m, n, k, g, expected_m, sides=False):
        p = HostPlan(kind, m, n, k, g, expected_m, sides=sides, **self.kw)
        self.plans.append(p)
        return {0: p}


@pytest.fixture
def cj():
    pytest.importorskip("jax")
    import cupygemm.jax as cj

    from cupygemm.jax import backend

    with backend.use_backend("cpu", HostPlanner(floats=64, counters=4)):
        yield cj


def _backend():
    """The backend new traces lower to (the fixture's host backend)."""
    from cupygemm.jax import backend

    return backend.current()


def _operands(m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    a, sfa = ref.per_token_cast_to_fp8_reference(x)
    b, sfb = ref.per_block_cast_to_fp8_reference(w)
    return a.view(ml_dtypes.float8_e4m3fn), sfa, b.view(ml_dtypes.float8_e4m3fn), sfb


def _close(d, r, tol=1e-5):
    got = np.asarray(d).astype(np.float64)
    assert ref.calc_diff(got, r) < tol


def test_jax_dense_eager_jit_scan(cj):
    import jax

    a, sfa, b, sfb = _operands(72, 136, 272)  # M not a multiple of 4 (SFA padding), N and K ragged vs 128
    r = ref.gemm_reference(a.view(np.uint8), sfa, b.view(np.uint8), sfb)
    d = cj.gemm_fp8_fp8_bf16_nt(a, sfa, b, sfb)
    assert d.shape == (72, 136) and d.dtype == np.dtype(ml_dtypes.bfloat16)
    _close(d, r)
    # uint8 bits are accepted as well
    _close(cj.gemm_fp8_fp8_bf16_nt(a.view(np.uint8), sfa, b.view(np.uint8), sfb), r)

    plan = _backend().plan.plans[0]
    before = plan.calls

    @jax.jit
    def scanned(a3, sfa, b, sfb):
        # Per-step operands: XLA hoists a loop-invariant custom call out of the loop.
        return jax.lax.scan(lambda c, a: (c, cj.gemm_fp8_fp8_bf16_nt(a, sfa, b, sfb)), 0, a3)[1]
    ds = scanned(np.stack([a] * 3), sfa, b, sfb)
    assert ds.shape == (3, 72, 136)
    for i in range(3):
        _close(ds[i], r)
    assert plan.calls == before + 3 and 1 <= plan.binds <= plan.calls  # launches bound per pointer set


def test_jax_vmap_dense(cj):
    import jax
    import jax.numpy as jnp

    ops = [_operands(40, 128, 256, seed=s) for s in range(3)]
    A, SA, B, SB = (jnp.stack([o[i] for o in ops]) for i in range(4))
    a0, sa0, b0, sb0 = ops[0]
    shared = jax.vmap(cj.gemm_fp8_fp8_bf16_nt, in_axes=(0, 0, None, None))(A, SA, b0, sb0)
    per = jax.vmap(cj.gemm_fp8_fp8_bf16_nt)(A, SA, B, SB)
    for i, (a, sa, b, sb) in enumerate(ops):
        _close(shared[i], ref.gemm_reference(a.view(np.uint8), sa, b0.view(np.uint8), sb0))
        _close(per[i], ref.gemm_reference(a.view(np.uint8), sa, b.view(np.uint8), sb))
    kinds = [(p.kind, p.m, p.g) for p in _backend().plan.plans]
    assert (NORMAL, 120, 1) in kinds  # the mapped axis folded into M
    assert (MASKED, 40, 3) in kinds  # per-element weights: one masked grouped GEMM


def _masked_operands(g, m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    xs = [ref.per_token_cast_to_fp8_reference(rng.standard_normal((m, k)).astype(np.float32)) for _ in range(g)]
    ws = [ref.per_block_cast_to_fp8_reference(rng.standard_normal((n, k)).astype(np.float32)) for _ in range(g)]
    a = np.stack([x[0] for x in xs]).view(ml_dtypes.float8_e4m3fn)
    b = np.stack([w[0] for w in ws]).view(ml_dtypes.float8_e4m3fn)
    return a, np.stack([x[1] for x in xs]), b, np.stack([w[1] for w in ws])


def test_jax_masked_traced_masked_m(cj):
    import jax
    import jax.numpy as jnp

    a, sfa, b, sfb = _masked_operands(3, 64, 128, 256)
    f = jax.jit(lambda mm, out: cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(a, sfa, b, sfb, mm, 32, out=out))
    for mm in ([64, 0, 17], [5, 64, 33]):
        mm = jnp.asarray(mm, jnp.int32)
        filler = jnp.full((3, 64, 128), 7.0, jnp.bfloat16)
        d = np.asarray(f(mm, filler)).astype(np.float64)
        full = ref.grouped_masked_reference(a.view(np.uint8), sfa, b.view(np.uint8), sfb, np.full(3, 64))
        for g in range(3):
            r = int(mm[g])
            if r:
                assert ref.calc_diff(d[g, :r], full[g, :r]) < 1e-5
            assert (d[g, r:] == 7.0).all()  # rows past masked_m keep `out`
    d0 = np.asarray(cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(a, sfa, b, sfb, jnp.asarray([1, 2, 3], jnp.int32), 2))
    assert (d0[0, 1:].astype(np.float32) == 0).all()  # default out: zeros
    assert len({id(p) for p in _backend().plan.plans}) == 2  # one plan per static problem, not per masked_m
    assert _backend().plan.plans[0].expected_m == 32


def test_jax_contiguous_traced_m_indices_and_vmap(cj):
    import jax
    import jax.numpy as jnp

    a, sfa, _, _ = _operands(256, 128, 256, seed=1)
    _, _, b, sfb = _masked_operands(2, 1, 128, 256, seed=2)
    f = jax.jit(cj.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous)
    for idx in (np.repeat([0, 1], 128), np.concatenate([np.full(128, 1), np.full(100, 0), np.full(28, -1)])):
        idx = idx.astype(np.int32)
        d = np.asarray(f(a, sfa, b, sfb, jnp.asarray(idx))).astype(np.float64)
        r = ref.grouped_contiguous_reference(a.view(np.uint8), sfa, b.view(np.uint8), sfb, idx)
        ok = idx >= 0
        assert ref.calc_diff(d[ok], r[ok]) < 1e-5 and (d[~ok] == 0).all()
    idx = jnp.asarray(np.stack([np.repeat([0, 1], 128), np.repeat([1, 0], 128)]).astype(np.int32))
    dv = jax.vmap(cj.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous, in_axes=(None, None, None, None, 0))(a, sfa, b, sfb, idx)
    for i in range(2):
        r = ref.grouped_contiguous_reference(a.view(np.uint8), sfa, b.view(np.uint8), sfb, np.asarray(idx[i]))
        assert ref.calc_diff(np.asarray(dv[i]).astype(np.float64), r) < 1e-5


def test_jax_trace_time_validation(cj):
    import jax.numpy as jnp

    a, sfa, b, sfb = _operands(64, 128, 256)
    with pytest.raises(ValueError, match=r"sfa: expected shape \(64, 2\), got \(64, 1\)"):
        cj.gemm_fp8_fp8_bf16_nt(a, sfa[:, :1], b, sfb)
    with pytest.raises(TypeError, match="a: expected float8_e4m3fn .* got float32"):
        cj.gemm_fp8_fp8_bf16_nt(a.astype(np.float32), sfa, b, sfb)
    with pytest.raises(ValueError, match="K differs"):
        cj.gemm_fp8_fp8_bf16_nt(a, sfa, b[:, :128], sfb[:, :1])
    with pytest.raises(ValueError, match="N must be a multiple of 8"):
        cj.gemm_fp8_fp8_bf16_nt(a, sfa, b[:100], sfb)
    ga, gsa, gb, gsb = _masked_operands(2, 16, 128, 256)
    with pytest.raises(TypeError, match="masked_m: expected int32, got float32"):
        cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(ga, gsa, gb, gsb, jnp.zeros(2, jnp.float32), 8)
    with pytest.raises(TypeError, match="expected_m"):
        cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(ga, gsa, gb, gsb, jnp.zeros(2, jnp.int32), 8.0)
    with pytest.raises(ValueError, match=r"m_indices: expected shape \(64,\)"):
        cj.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(a, sfa, gb, gsb, jnp.zeros(63, jnp.int32))
    assert _backend().plan.plans == []  # nothing was planned for a bad call


def test_jax_grad_is_a_clear_error(cj):
    import jax

    a, sfa, b, sfb = _operands(64, 128, 256)
    with pytest.raises(TypeError, match="has no derivative"):
        jax.grad(lambda s: cj.gemm_fp8_fp8_bf16_nt(a, s, b, sfb).astype(np.float32).sum())(sfa)


def test_jax_error_inside_the_handler(cj):
    import jax

    a, sfa, b, sfb = _operands(64, 128, 256)
    from cupygemm.jax import backend

    with backend.use_backend("cpu", HostPlanner(fail=ValueError("the test hook refused this launch"))):
        with pytest.raises(Exception, match="INVALID_ARGUMENT: cupygemm .*the test hook refused this launch") as e:
            jax.block_until_ready(cj.gemm_fp8_fp8_bf16_nt(a, sfa, b, sfb))
        assert type(e.value).__name__ in ("JaxRuntimeError", "XlaRuntimeError")


def test_jax_handler_checks_buffers_when_asked(cj, monkeypatch):
    monkeypatch.setenv("CUPYGEMM_CHECK_INPUTS", "1")
    a, sfa, b, sfb = _operands(64, 128, 256)
    r = ref.gemm_reference(a.view(np.uint8), sfa, b.view(np.uint8), sfb)
    _close(cj.gemm_fp8_fp8_bf16_nt(a, sfa, b, sfb), r)
    from cupygemm.jax import backend

    entry = backend.handlers["cpu"].entry(_backend().entries[next(iter(_backend().entries))][0])
    assert entry.expected is not None and entry.expected[1] == (11, (2, 64))  # SFA as the kernel reads it


def test_jax_empty_problems(cj):
    a, sfa, b, sfb = _operands(64, 128, 256)
    d = cj.gemm_fp8_fp8_bf16_nt(a[:0], sfa[:0], b, sfb)
    assert d.shape == (0, 128)
    assert _backend().plan.plans == []


@pytest.mark.parametrize("shape", [(1, 1), (3, 200), (130, 128), (257, 300)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_jax_casts_bit_exact(shape, dtype):
    jax = pytest.importorskip("jax")
    import cupygemm.jax as cj

    rng = np.random.default_rng(sum(shape))
    spread = 6 if dtype == "float16" else 12  # float16 overflows past 65504
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-spread, spread, shape))).astype(np.float32)
    x[0, :min(shape[1], 5)] = 0  # all-zero groups take the 1e-4 floor
    if shape[1] > 100:
        x[-1, 90:] = rng.uniform(-3e-4, 3e-4, shape[1] - 90)  # small values: e4m3 subnormals after scaling
    x = x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    for ours, theirs in ((cj.per_token_cast_to_fp8, ref.per_token_cast_to_fp8_reference),
                         (cj.per_block_cast_to_fp8, ref.per_block_cast_to_fp8_reference)):
        q, s = ours(jax.numpy.asarray(x))
        rq, rs = theirs(x)
        assert q.dtype == np.dtype(ml_dtypes.float8_e4m3fn) and s.dtype == np.float32
        np.testing.assert_array_equal(np.asarray(q).view(np.uint8), rq)
        np.testing.assert_array_equal(np.asarray(s).view(np.uint32), rs.view(np.uint32))


def test_jax_e4m3_rounding_every_float_pattern():
    """The integer rounding against ml_dtypes on every e4m3 value, midpoints between them and their neighbours."""
    jax = pytest.importorskip("jax")
    from cupygemm.jax import casts

    vals = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    vals = np.unique(np.abs(vals[np.isfinite(vals)]))
    mids = (vals[:-1] + vals[1:]) / 2
    probe = np.concatenate([vals, mids, np.nextafter(mids, 0), np.nextafter(mids, 1000), [448.0]]).astype(np.float32)
    probe = np.concatenate([probe, -probe])
    got = np.asarray(jax.jit(casts.f32_to_e4m3fn)(probe)).view(np.uint8)
    np.testing.assert_array_equal(got, ref.float32_to_fp8(probe))


# --- packed (L2-side-aware) weights through cupygemm.jax --------------------------------------------------------

def _packed_weights(b3, sfb, grouped, offset=48, seed=0):
    """PackedWeights over a JAX array holding packed bytes at a 16-byte (not 8 KiB) offset, laid out for a buffer
    that started 24 KiB before a 2 MiB page boundary (groups straddle pages) with random page bits."""
    import jax.numpy as jnp

    from cupygemm.packing import PackedLayout, PackedWeights

    g, n, k = b3.shape
    base_low, hash_bits = (1 << 21) - 3 * 8192, 0xB3000
    lay = PackedLayout(n, k)
    pages = -(-(base_low + g * lay.group_bytes) // (1 << 21))
    page_bits = np.random.default_rng(seed).integers(0, 2, pages)
    raw = pack_host(b3.view(np.uint8), base_low, hash_bits, page_bits)
    data = np.zeros(offset + raw.size + 64, np.uint8)
    data[offset:offset + raw.size] = raw
    shape = tuple(b3.shape) if grouped else tuple(b3.shape[1:])
    words = raw[g * lay.group_bytes:g * lay.group_bytes + 4 * lay.page_words(base_low, g)].view(np.uint32)
    return PackedWeights(jnp.asarray(data), jnp.asarray(sfb), shape, True, base_low, hash_bits, offset,
                         tuple(int(w) for w in words[:4]))


def test_host_packing_model_round_trips():
    rng = np.random.default_rng(3)
    b = rng.integers(0, 256, (2, 200, 272), dtype=np.uint8)  # an odd chunk count: half 1 one chunk short
    bits = rng.integers(0, 2, 3)
    raw = pack_host(b, 8192, 0xB3000, bits)
    assert np.array_equal(unpack_host(raw.ctypes.data, 200, 272, 2, 8192, 0xB3000), b)


def test_jax_packed_weights_eager_jit_scan(cj):
    import jax

    a, sfa, b, sfb = _operands(72, 136, 272)
    r = ref.gemm_reference(a.view(np.uint8), sfa, b.view(np.uint8), sfb)
    packed = _packed_weights(b[None], sfb, grouped=False)
    _close(cj.gemm_fp8_fp8_bf16_nt(a, sfa, packed), r)
    plan = _backend().plan.plans[-1]
    assert plan.sides and plan.calls == 1

    @jax.jit
    def scanned(a3, sfa, w):  # packed weights as a jit argument (a pytree) and closed over by the scan body
        return jax.lax.scan(lambda c, x: (c, cj.gemm_fp8_fp8_bf16_nt(x, sfa, w)), 0, a3)[1]
    ds = scanned(np.stack([a] * 3), sfa, packed)
    for i in range(3):
        _close(ds[i], r)
    leaves, tree = jax.tree_util.tree_flatten(packed)
    assert len(leaves) == 2 and jax.tree_util.tree_unflatten(tree, leaves).data_offset == packed.data_offset


def test_jax_packed_weights_grouped(cj):
    import jax.numpy as jnp

    a, sfa, b, sfb = _masked_operands(3, 64, 128, 256)
    packed = _packed_weights(b, sfb, grouped=True, seed=1)
    mm = jnp.asarray([64, 0, 17], jnp.int32)
    d = np.asarray(cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(a, sfa, packed, None, mm, 32)).astype(np.float64)
    full = ref.grouped_masked_reference(a.view(np.uint8), sfa, b.view(np.uint8), sfb, np.full(3, 64))
    assert ref.calc_diff(d[0], full[0]) < 1e-5 and ref.calc_diff(d[2, :17], full[2, :17]) < 1e-5
    assert (d[1] == 0).all() and (d[2, 17:] == 0).all()
    # contiguous: 128-row blocks of groups 2, 0 over the same packed weights
    ac = np.concatenate([a[2], a[2], a[0], a[0]])
    sfac = np.concatenate([sfa[2], sfa[2], sfa[0], sfa[0]])
    idx = jnp.asarray(np.repeat([2, 0], 128).astype(np.int32))
    dc = np.asarray(cj.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(ac, sfac, packed, None, idx)).astype(np.float64)
    assert ref.calc_diff(dc[:64], full[2]) < 1e-5 and ref.calc_diff(dc[128:192], full[0]) < 1e-5


def test_jax_packed_weights_bad_input(cj):
    import dataclasses

    a, sfa, b, sfb = _operands(64, 136, 272)
    packed = _packed_weights(b[None], sfb, grouped=False)
    with pytest.raises(TypeError, match="sfb=None"):
        cj.gemm_fp8_fp8_bf16_nt(a, sfa, packed, sfb)
    with pytest.raises(ValueError, match="b.data"):
        cj.gemm_fp8_fp8_bf16_nt(a, sfa, dataclasses.replace(packed, data=packed.data[:1000]))
    with pytest.raises(ValueError, match=r"b: expected a 3-D array"):
        cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked(a[None], sfa[None], packed, None, np.ones(1, np.int32), 8)
    with pytest.raises(ValueError, match="K differs"):
        cj.gemm_fp8_fp8_bf16_nt(a[:, :256], sfa[:, :2], packed)


# --- the JAX functions are made from the kind descriptors -------------------------------------------------------

def test_jax_functions_from_the_descriptors(cj):
    import inspect
    import typing

    import jax

    from cupygemm.kinds import KINDS

    def params(f):
        return [p.name + ("=None" if p.default is None else "") for p in inspect.signature(f).parameters.values()]

    assert params(cj.gemm_fp8_fp8_bf16_nt) == ["a", "sfa", "b", "sfb=None"]
    assert params(cj.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous) == ["a", "sfa", "b", "sfb", "m_indices", "out=None"]
    assert params(cj.m_grouped_gemm_fp8_fp8_bf16_nt_masked) == ["a", "sfa", "b", "sfb", "masked_m", "expected_m",
                                                               "out=None"]
    assert set(cj.__all__) == {"TARGET", "per_token_cast_to_fp8", "per_block_cast_to_fp8",
                               "per_token_cast_to_fp8_transposed", "per_block_cast_to_fp8_with_transpose",
                               "fp8_linear", "fp8_grouped_linear", "enable_command_buffers", *(k.api for k in KINDS)}
    for kind in KINDS:
        f = getattr(cj, kind.api)
        assert f.__module__ == "cupygemm.jax" and f.__name__ == kind.api
        assert f.__doc__.startswith(kind.summary[0].upper() + kind.summary[1:]) and "Args:" in f.__doc__
        assert typing.get_type_hints(f)["return"] is jax.Array


def test_jax_arrays_through_the_eager_entry_points(cj):
    """cupygemm.<function>((a, sfa), (b, sfb), ...) on JAX arrays: cupygemm.jax's custom calls (the adapter)."""
    import jax.numpy as jnp

    import cupygemm

    a, sfa, b, sfb = (jnp.asarray(x) for x in _operands(64, 128, 256))
    r = ref.gemm_reference(np.asarray(a).view(np.uint8), np.asarray(sfa), np.asarray(b).view(np.uint8),
                           np.asarray(sfb))
    _close(cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb)), r)
    with pytest.raises(TypeError, match="stream: JAX calls run on XLA's stream"):
        cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), stream=0)
    with pytest.raises(TypeError, match="out: JAX arrays are immutable"):
        cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb), jnp.zeros((64, 128), jnp.bfloat16))
    ga, gsa, gb, gsb = (jnp.asarray(x) for x in _masked_operands(2, 16, 128, 256))
    mm = jnp.asarray([16, 5], jnp.int32)
    filler = jnp.full((2, 16, 128), 3.0, jnp.bfloat16)
    d = np.asarray(cupygemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked((ga, gsa), (gb, gsb), filler, mm, 8))
    full = ref.grouped_masked_reference(np.asarray(ga).view(np.uint8), np.asarray(gsa), np.asarray(gb).view(np.uint8),
                                        np.asarray(gsb), np.full(2, 16))
    assert ref.calc_diff(d[0].astype(np.float64), full[0]) < 1e-5 and (d[1, 5:].astype(np.float32) == 3.0).all()
    q, s = cupygemm.per_token_cast_to_fp8(jnp.ones((4, 256), jnp.float32))
    assert q.dtype == jnp.float8_e4m3fn and s.shape == (4, 2)


def test_jax_out_as_bfloat16_bits(cj):
    """out as uint16 bits (the eager path takes them too): the result comes back as the same kind of bits."""
    import jax.numpy as jnp

    a, sfa, _, _ = _operands(128, 128, 256, seed=1)
    _, _, b, sfb = _masked_operands(2, 1, 128, 256, seed=2)
    idx = jnp.asarray(np.concatenate([np.full(100, 1), np.full(28, -1)]).astype(np.int32))
    bits = jnp.full((128, 128), 0x4040, jnp.uint16)  # bfloat16 3.0
    d = cj.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(a, sfa, b, sfb, idx, out=bits)
    assert d.dtype == jnp.uint16
    got = np.asarray(d).view(ml_dtypes.bfloat16).astype(np.float64)
    r = ref.grouped_contiguous_reference(a.view(np.uint8), sfa, b.view(np.uint8), sfb, np.asarray(idx))
    assert ref.calc_diff(got[:100], r[:100]) < 1e-5 and (got[100:] == 3.0).all()


# A kind no module registers, with what the training kinds bring (cupygemm.jax has no code of its own for it): FP32
# out accumulated in place (a required operand aliased to the result), B scaled per 1x128 like A (so SFB is laid out
# for the kernel like SFA), scales given row-major [rows, KB] or as DeepGEMM's transposed stack [KB, rows] (used in
# place when aligned, else padded), an int32 layout operand and a static int, and split-K scratch.
# out[g] += A @ B[g].T for the groups g whose flag is set.

def _fake_kind():
    from cupygemm import validate
    from cupygemm.kinds import ONE_D_ONE_D, GemmKind
    from cupygemm.layout import get_tma_aligned_size
    from cupygemm.tensors import F32, View

    def scales(sf, rows, kb, name):
        """(in place, pad, copy strides) of 1x128 scales [..., rows, KB] or stacked [..., KB, rows]."""
        if sf.dtype == F32 and sf.ndim >= 2 and tuple(sf.shape[-2:]) == (kb, rows):  # the stack, read first
            sf = View(sf.ptr, sf.shape[:-2] + (rows, kb), sf.strides[:-2] + (sf.strides[-1], sf.strides[-2]),
                      sf.dtype, sf.device)
        validate.f32(sf, name, tuple(sf.shape[:-2]) + (rows, kb))
        pad = get_tma_aligned_size(rows, 4)
        in_place = validate.is_m_major(sf, pad, kb)
        return in_place, pad, validate.sfa_copy_strides(sf, in_place)

    def check(views, static, names):
        a, sfa, b, sfb, out, flags = views
        if out is None:
            raise TypeError(f"{names.out}: the flagged GEMM accumulates into out; pass it")
        validate.fp8(a, names.a, 2)
        validate.fp8(b, names.b, 3)
        (m, k), (g, n, _) = a.shape, b.shape
        kb = -(-k // 128)
        a_in_place, m_pad, a_strides = scales(sfa, m, kb, names.sfa)
        if sfb.ndim != 3:
            raise ValueError(f"{names.sfb}: expected [G, N, KB] or [G, KB, N], got shape {tuple(sfb.shape)}")
        b_in_place, n_pad, b_strides = scales(sfb, n, kb, names.sfb)
        validate.int32_vector(flags, names.layout, g)
        validate.out_operand(out, (g, m, n), names.out, dtype=F32)
        return validate.Problem(kind, m, n, k, g, a_in_place, m_pad, 0, (g, m, n), a_strides, b_in_place, n_pad,
                                b_strides)

    kind = GemmKind(name="flagged_wgrad", kid=99, api="flagged_gemm_fp8_fp8_fp32_nt",
                    summary="out[g] += A @ B[g].T where flags[g]", family=ONE_D_ONE_D, a_dims="MK", b_dims="GNK",
                    out_dims="GMN", layout="flags", static="expected_m", out_dtype=F32, accumulates=True,
                    b_block_scales=False, check=check)
    return kind


class FlaggedPlan:
    """The fake kind's launch on host buffers: SFA [kb][sfa_m_pad] and SFB [g][kb][sfb_m_pad] as the kernel reads
    them, out accumulated in place, scratch present."""

    def __init__(self, m, n, k, g, static):
        self.m, self.n, self.k, self.g, self.static = m, n, k, g, static
        self.sfa_m_pad, self.sfb_m_pad = -(-m // 4) * 4, -(-n // 4) * 4
        self.scratch_floats, self.scratch_counters = 32, 2
        self.calls = 0

    def launch(self, stream, a, sfa, b, sfb, d, layout=0, partials=0, counters=0, zero_counters=False):
        assert partials and counters and zero_counters
        self.calls += 1
        m, n, k, g = self.m, self.n, self.k, self.g
        kb = -(-k // 128)
        A = _host(a, np.uint8, (m, k))
        SFA = _host(sfa, np.float32, (kb, self.sfa_m_pad))[:, :m].T
        B = _host(b, np.uint8, (g, n, k))
        SFB = _host(sfb, np.float32, (g, kb, self.sfb_m_pad))[:, :, :n].transpose(0, 2, 1)
        D = _host(d, np.float32, (g, m, n))
        flags = _host(layout, np.int32, (g,))
        x = ref.dequantize_per_token(A, SFA)
        for i in np.nonzero(flags)[0]:
            D[i] += (x @ ref.dequantize_per_token(B[i], SFB[i]).T).astype(np.float32)


def _flagged_operands(m, n, k, g, seed=0, b_from=None):
    rng = np.random.default_rng(seed)
    a, sfa = ref.per_token_cast_to_fp8_reference(rng.standard_normal((m, k)).astype(np.float32))
    if b_from is None:
        bs = [ref.per_token_cast_to_fp8_reference(rng.standard_normal((n, k)).astype(np.float32)) for _ in range(g)]
        b, sfb = np.stack([x[0] for x in bs]), np.stack([x[1] for x in bs])
    else:
        b, sfb = b_from[0].view(np.uint8), b_from[1]
    want = np.stack([ref.dequantize_per_token(a, sfa) @ ref.dequantize_per_token(b[i], sfb[i]).T for i in range(g)])
    return a.view(ml_dtypes.float8_e4m3fn), sfa, b.view(ml_dtypes.float8_e4m3fn), sfb, want


def test_jax_a_new_kind_plugs_in_by_its_descriptor(monkeypatch):
    jax = pytest.importorskip("jax")
    import inspect

    import jax.numpy as jnp

    from cupygemm.jax import backend, frontend

    kind = _fake_kind()
    plans = []

    def planner(k_, m, n, k, g, static):
        assert k_ is kind
        plans.append(FlaggedPlan(m, n, k, g, static))
        return {0: plans[-1]}

    f = frontend.public(kind)
    assert [p.name for p in inspect.signature(f).parameters.values()] == \
        ["a", "sfa", "b", "sfb", "flags", "expected_m", "out"]
    assert all(p.default is inspect.Parameter.empty for p in inspect.signature(f).parameters.values())
    assert "accumulated into" in f.__doc__ and "float32 [G, N, ceil(K/128)]" in f.__doc__
    monkeypatch.setenv("CUPYGEMM_CHECK_INPUTS", "1")
    a, sfa, b, sfb, want = _flagged_operands(40, 136, 272, 3)
    flags = jnp.asarray([1, 0, 1], jnp.int32)
    out = np.random.default_rng(9).standard_normal((3, 40, 136)).astype(np.float32)
    with backend.use_backend("cpu", planner) as be:
        d = jax.jit(f, static_argnums=5, donate_argnums=6)(a, sfa, b, sfb, flags, 7, jnp.asarray(out))
        assert d.dtype == jnp.float32 and d.shape == (3, 40, 136)
        got = np.asarray(d)
        for i, on in enumerate([1, 0, 1]):
            assert ref.calc_diff(got[i], out[i] + on * want[i]) < 1e-9
        assert len(plans) == 1 and plans[0].static == 7 and plans[0].calls == 1
        entry = backend.handlers["cpu"].entry(next(iter(be.entries.values()))[0])
        assert entry.expected[1] == (11, (3, 40)) and entry.expected[3] == (11, (3, 3, 136))  # kernel layouts
        assert entry.num_rets == 3  # out, partials, counters
        # the scales as DeepGEMM's transposed stacks: SFB [G, KB, N] used in place (N % 4 == 0), SFA [KB, M]
        # padded (M = 42)
        a2, sfa2, _, _, want2 = _flagged_operands(42, 136, 272, 3, seed=1, b_from=(b, sfb))
        d = f(a2, np.ascontiguousarray(sfa2.T), b, np.ascontiguousarray(sfb.transpose(0, 2, 1)), flags, 7,
              jnp.zeros((3, 42, 136), jnp.float32))
        for i, on in enumerate([1, 0, 1]):
            assert ref.calc_diff(np.asarray(d[i]), on * want2[i]) < 1e-9 if on else not np.asarray(d[i]).any()
        entry = backend.handlers["cpu"].entry(list(be.entries.values())[-1][0])
        assert entry.expected[1] == (11, (3, 44)) and entry.expected[3] == (11, (3, 3, 136))
        # the shared check's messages, with the JAX names
        with pytest.raises(ValueError, match=r"sfb: expected shape \(3, 136, 3\)"):
            f(a, sfa, b, sfb[:, :, :2], flags, 7, jnp.asarray(out))
        with pytest.raises(ValueError, match=r"flags: expected shape \(3,\)"):
            f(a, sfa, b, sfb, flags[:2], 7, jnp.asarray(out))
        with pytest.raises(TypeError, match="out: expected a float32 array"):
            f(a, sfa, b, sfb, flags, 7, jnp.asarray(out).astype(jnp.bfloat16))
        with pytest.raises(TypeError, match="out: the flagged GEMM accumulates into out"):
            f(a, sfa, b, sfb, flags, 7, None)
        # empty problems leave out as it is; vmap runs one call per element; no derivative
        np.testing.assert_array_equal(np.asarray(f(a[:0], sfa[:0], b, sfb, flags, 7, jnp.zeros((3, 0, 136)))),
                                      np.zeros((3, 0, 136)))
        dv = jax.vmap(f, in_axes=(None, None, None, None, 0, None, 0))(
            a, sfa, b, sfb, jnp.asarray([[1, 0, 0], [0, 0, 1]], jnp.int32), 7, jnp.stack([out, out]))
        assert ref.calc_diff(np.asarray(dv[0, 0]), out[0] + want[0]) < 1e-9
        assert ref.calc_diff(np.asarray(dv[1, 2]), out[2] + want[2]) < 1e-9
        np.testing.assert_array_equal(np.asarray(dv[1, 0]), out[0])
        with pytest.raises(TypeError, match="has no derivative"):
            jax.grad(lambda o: f(a, sfa, b, sfb, flags, 7, o).sum())(jnp.asarray(out))


def test_jax_scales_given_as_stacks_or_row_major():
    """Which of the two forms the kernel layout is made from: the shape where it tells, the Problem where it does
    not (KB == rows)."""
    pytest.importorskip("jax")
    from cupygemm.jax.calls import _kernel_scales_shape, _stacked

    assert not _stacked((40, 3), 40, False, (0, 3, 1))  # row-major
    assert _stacked((3, 42), 42, False, (0, 1, 42)) and _stacked((3, 40), 40, True, None)  # stacks
    assert _stacked((5, 1), 1, False, (0, 1, 1))  # a stack of one row
    assert not _stacked((4, 4), 4, False, (0, 4, 1)) and _stacked((4, 4), 4, False, (0, 1, 4))
    assert _stacked((4, 4), 4, True, None) and not _stacked((1, 1), 1, True, None)
    assert _kernel_scales_shape((2, 40, 3), 40, 40, False, (120, 3, 1)) == (2, 3, 40)
    assert _kernel_scales_shape((3, 42), 42, 44, False, (0, 1, 42)) == (3, 44)
    assert _kernel_scales_shape((3, 40), 40, 40, True, None) == (3, 40)
    assert _kernel_scales_shape((72, 1), 72, 72, True, None) == (1, 72)  # row-major in place: laid out as before
