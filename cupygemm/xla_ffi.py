"""XLA FFI from pure Python: ctypes mirrors of ``xla/ffi/api/c_api.h`` and a handler that launches our kernels.

XLA calls an FFI handler with one pointer, an ``XLA_FFI_CallFrame*``, and takes back an ``XLA_FFI_Error*`` (NULL
= success). :class:`FfiHandler` is such a handler written as a ``ctypes.CFUNCTYPE(c_void_p, c_void_p)``
callback, so no compiled extension is needed. It

* answers XLA's metadata handshake (a frame whose ``extension_start`` chain holds a metadata extension, sent once
  per registration with ``api == NULL``): it writes the FFI API version it speaks and the trait
  COMMAND_BUFFER_COMPATIBLE, so XLA may capture the call into its CUDA graphs, and returns NULL without running;
* on an execute frame, reads the frame with one ``struct`` unpack of raw memory, confirms the call site's layout
  (where its buffers' data pointers and its ``entry_id`` attribute, an int64 scalar, sit: parsed on the site's first
  call, confirmed with three more unpacks), asks XLA for the stream (``Stream_Get`` with the frame's context) and
  calls the launch bound to the call's pointers (made at the first call on them from the entry built at trace
  time: kernel chosen, compiled and loaded, parameters packed): the per-call work is a few memory reads, XLA's
  stream and one launch. The Python thread state of a thread XLA calls from is kept between calls
  (:func:`_keep_thread_state`);
* never lets a Python exception cross the C boundary: it returns an FFI error made with the API's
  ``Error_Create`` (INVALID_ARGUMENT for ValueError/TypeError, INTERNAL otherwise) carrying our message, which
  the JAX user sees as ``JaxRuntimeError: INVALID_ARGUMENT: cupygemm ...``.

This module imports neither jax nor CuPy (only ctypes and NumPy): the CPU tests drive the handler with call frames built from the
Structures below. Layouts follow the header of XLA FFI API 0.3/0.4 (jaxlib 0.10/0.11), whose offsets are the same
for every field read here (checked on both with ``offsetof`` against ``jax.ffi.include_dir()``); the API table
grew at its end between them, so only fields up to ``DeviceOrdinal_Get`` are mirrored and the table's
``struct_size`` is checked before a field is used. An API table of another major version is refused.
"""
from __future__ import annotations

import ctypes
import operator
import os
import re
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from _thread import get_ident
from typing import Callable, Sequence

import numpy as np

from .util import keep_newest

__all__ = [
    "KNOWN_API_MAJOR", "EXECUTE", "EXTENSION_METADATA", "TRAIT_COMMAND_BUFFER_COMPATIBLE", "INVALID_ARGUMENT",
    "INTERNAL", "DTYPES", "ffi_dtype", "header_api_version", "FfiEntry", "FfiHandler", "HANDLER_FN",
    "CallFrame", "Args", "Rets", "Attrs", "Buffer", "Scalar", "Api", "ApiVersion", "ExtensionBase", "Metadata",
    "MetadataExtension", "ErrorCreateArgs", "StreamGetArgs", "DeviceOrdinalGetArgs", "Launch", "Fire", "Bind",
]

#: The FFI API major version these mirrors follow; frames and headers of another major version are refused.
KNOWN_API_MAJOR = 0
#: XLA_FFI_ExecutionStage_EXECUTE (the only stage a handler registered as a single function receives).
EXECUTE = 3
#: XLA_FFI_Extension_Metadata.
EXTENSION_METADATA = 1
#: XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE.
TRAIT_COMMAND_BUFFER_COMPATIBLE = 1
#: XLA_FFI_Error_Code values we return.
INVALID_ARGUMENT, INTERNAL = 3, 13
#: XLA_FFI_AttrType_SCALAR.
ATTR_SCALAR = 3

#: NumPy/ml_dtypes dtype name -> XLA_FFI_DataType.
DTYPES = {
    "bool": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint8": 6, "uint16": 7, "uint32": 8, "uint64": 9,
    "float16": 10, "float32": 11, "float64": 12, "bfloat16": 16, "float8_e5m2": 19, "float8_e4m3fn": 20,
}
_S64 = DTYPES["int64"]


def ffi_dtype(dtype: object) -> int:
    """The XLA_FFI_DataType of a NumPy/ml_dtypes/JAX dtype (or its name); TypeError for one we do not map."""
    try:
        name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
        return DTYPES[name]
    except KeyError:
        raise TypeError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}") from None


# --- Struct mirrors (xla/ffi/api/c_api.h) ---------------------------------------------------------------------

class ExtensionBase(ctypes.Structure):
    pass


ExtensionBase._fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int),
                          ("next", ctypes.POINTER(ExtensionBase))]


class ApiVersion(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("major_version", ctypes.c_int), ("minor_version", ctypes.c_int)]


class Metadata(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("api_version", ApiVersion), ("traits", ctypes.c_uint32),
                ("state_type_id", ctypes.c_int64)]


class MetadataExtension(ctypes.Structure):
    _fields_ = [("extension_base", ExtensionBase), ("metadata", ctypes.POINTER(Metadata))]


class Buffer(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p), ("dtype", ctypes.c_int),
                ("data", ctypes.c_void_p), ("rank", ctypes.c_int64), ("dims", ctypes.POINTER(ctypes.c_int64))]


class Args(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p), ("size", ctypes.c_int64),
                ("types", ctypes.POINTER(ctypes.c_int)), ("args", ctypes.POINTER(ctypes.c_void_p))]


class Rets(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p), ("size", ctypes.c_int64),
                ("types", ctypes.POINTER(ctypes.c_int)), ("rets", ctypes.POINTER(ctypes.c_void_p))]


class Attrs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p), ("size", ctypes.c_int64),
                ("types", ctypes.POINTER(ctypes.c_int)), ("names", ctypes.POINTER(ctypes.c_void_p)),
                ("attrs", ctypes.POINTER(ctypes.c_void_p))]


class Scalar(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("value", ctypes.c_void_p)]


class CallFrame(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.POINTER(ExtensionBase)),
                ("api", ctypes.c_void_p), ("ctx", ctypes.c_void_p), ("stage", ctypes.c_int), ("args", Args),
                ("rets", Rets), ("attrs", Attrs), ("future", ctypes.c_void_p)]


class ErrorCreateArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("message", ctypes.c_char_p), ("errc", ctypes.c_int)]


class StreamGetArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p), ("ctx", ctypes.c_void_p),
                ("stream", ctypes.c_void_p)]


class DeviceOrdinalGetArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p), ("ctx", ctypes.c_void_p),
                ("device_ordinal", ctypes.c_int32)]


#: An API-table function taking one argument struct pointer and returning an XLA_FFI_Error* (NULL = OK).
API_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
#: The same, called with the GIL held: for XLA's accessors (Stream_Get, DeviceOrdinal_Get), which return at
#: once, so releasing the GIL around them would only let another thread take it and make the handler wait.
API_FN_GIL = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
#: The handler's C type: XLA_FFI_Error* handler(XLA_FFI_CallFrame*).
HANDLER_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)


class Api(ctypes.Structure):
    # Only the prefix this module knows; later API versions append fields, so never take sizeof(Api) as the
    # table's size: read struct_size.
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p), ("api_version", ApiVersion),
                ("internal_api", ctypes.c_void_p)] + [
        (name, ctypes.c_void_p) for name in (
            "Error_Create", "Error_GetMessage", "Error_Destroy", "Handler_Register", "Stream_Get", "Type_Register",
            "ExecutionContext_Get", "State_Set", "State_Get", "DeviceMemory_Allocate", "DeviceMemory_Free",
            "ThreadPool_Schedule", "ThreadPool_NumThreads", "Future_Create", "Future_SetAvailable",
            "Future_SetError", "RunId_Get", "DeviceOrdinal_Get")]


def _struct_size(cls: type, last: str) -> int:
    """XLA_FFI_STRUCT_SIZE: offsetof(last) + sizeof(last), without the trailing padding ctypes' sizeof adds."""
    f = getattr(cls, last)
    return f.offset + f.size


ERROR_CREATE_ARGS_SIZE = _struct_size(ErrorCreateArgs, "errc")
STREAM_GET_ARGS_SIZE = _struct_size(StreamGetArgs, "stream")
DEVICE_ORDINAL_GET_ARGS_SIZE = _struct_size(DeviceOrdinalGetArgs, "device_ordinal")
CALL_FRAME_SIZE = _struct_size(CallFrame, "attrs")
API_VERSION_SIZE = _struct_size(ApiVersion, "minor_version")

# Byte offsets for the per-call reads (plain integers: a ctypes Structure view costs microseconds a call).
_CF_EXT = CallFrame.extension_start.offset
_CF_API = CallFrame.api.offset
_CF_CTX = CallFrame.ctx.offset
_CF_STAGE = CallFrame.stage.offset
_CF_NARGS = CallFrame.args.offset + Args.size.offset
_CF_ARGV = CallFrame.args.offset + Args.args.offset
_CF_NRETS = CallFrame.rets.offset + Rets.size.offset
_CF_RETV = CallFrame.rets.offset + Rets.rets.offset
_CF_NATTRS = CallFrame.attrs.offset + Attrs.size.offset
_CF_ATTR_TYPES = CallFrame.attrs.offset + Attrs.types.offset
_CF_ATTRV = CallFrame.attrs.offset + Attrs.attrs.offset
_BUF_DTYPE, _BUF_DATA, _BUF_RANK, _BUF_DIMS = Buffer.dtype.offset, Buffer.data.offset, Buffer.rank.offset, \
    Buffer.dims.offset
_EXT_TYPE, _EXT_NEXT = ExtensionBase.type.offset, ExtensionBase.next.offset
_MDEXT_METADATA = MetadataExtension.metadata.offset
_MD_MAJOR = Metadata.api_version.offset + ApiVersion.major_version.offset
_MD_MINOR = Metadata.api_version.offset + ApiVersion.minor_version.offset
_MD_TRAITS = Metadata.traits.offset
_API_SIZE = Api.struct_size.offset
_API_MAJOR = Api.api_version.offset + ApiVersion.major_version.offset
_API_MINOR = Api.api_version.offset + ApiVersion.minor_version.offset

# Process memory as one read-only buffer, for struct.unpack_from at raw addresses: a read there takes about a third
# of the time of a ctypes object made per read (from_address), and several scattered fields come back from one
# unpack (their gaps are pad bytes, which struct skips without touching them).
_MEM = memoryview((ctypes.c_char * sys.maxsize).from_address(0)).cast("B").toreadonly()
_CODE_SIZE = {"i": 4, "q": 8, "Q": 8}


def _gather(items: Sequence[tuple[int, str]]) -> tuple[struct.Struct, int, tuple[int, ...]]:
    """One struct reading every ``(address, code)`` item ('i' int32, 'q' int64, 'Q' uint64): ``(s, base,
    positions)``, where ``s.unpack_from(_MEM, base)[positions[i]]`` is item i. Repeated items share a value;
    ValueError when two different items overlap."""
    order = sorted(set(items))
    fmt, end, index = ["<"], None, {}
    for addr, code in order:
        if end is not None and addr < end:
            raise ValueError(f"overlapping call-frame fields at 0x{addr:x}")
        if end is not None and addr > end:
            fmt.append(f"{addr - end}x")
        fmt.append(code)
        index[(addr, code)] = len(index)
        end = addr + _CODE_SIZE[code]
    base = order[0][0] if order else 0
    return struct.Struct("".join(fmt)), base, tuple(index[item] for item in items)


def _getter(positions: Sequence[int]) -> Callable[[tuple], tuple]:
    """A function picking ``positions`` out of a tuple, as a tuple (itemgetter gives a bare value for one)."""
    if len(positions) == 1:
        p = positions[0]
        return lambda values: (values[p],)
    return operator.itemgetter(*positions) if positions else (lambda values: ())


#: An execute call frame, one unpack: (extension_start, api, ctx, stage, static), where static is the bytes from
#: args.size to the end of attrs, the same on every call of one call site's frame: the key of its layout.
_FRAME = struct.Struct(f"<{_CF_EXT}xQQQi{_CF_NARGS - _CF_STAGE - 4}x{CALL_FRAME_SIZE - _CF_NARGS}s")
#: The fields of the static bytes read: (args.size, args.args, rets.size, rets.rets, attrs.size, attrs.types,
#: attrs.attrs).
_STATIC = _gather([(off - _CF_NARGS, code) for off, code in (
    (_CF_NARGS, "q"), (_CF_ARGV, "Q"), (_CF_NRETS, "q"), (_CF_RETV, "Q"), (_CF_NATTRS, "q"), (_CF_ATTR_TYPES, "Q"),
    (_CF_ATTRV, "Q"))])[0]
_SCALAR = struct.Struct("<i4xQ")  # XLA_FFI_Scalar: dtype (int32), value pointer
_I32, _I64, _U64 = struct.Struct("<i"), struct.Struct("<q"), struct.Struct("<Q")
_CTX_STREAM = struct.Struct("<QQ")  # StreamGetArgs' ctx and stream
#: Call-site layouts kept per handler; past this many (executables made and dropped) they are forgotten at once.
_SITE_LIMIT = 4096
#: Launches kept per entry and per call-site layout, one per pointer set (a scan whose operands move goes through
#: one per step).
_FIRE_LIMIT = 512


_u64 = ctypes.c_uint64.from_address
_i64 = ctypes.c_int64.from_address
_i32 = ctypes.c_int32.from_address
_u32 = ctypes.c_uint32.from_address


def header_api_version(include_dir: str) -> tuple[int, int]:
    """(major, minor) of the FFI API from ``<include_dir>/xla/ffi/api/c_api.h`` (``jax.ffi.include_dir()``).

    XLA accepts a handler only if its handshake reports the framework's own version, and the handshake frame
    carries no API table to ask, so the installed jaxlib's header is the source of truth.
    """
    path = os.path.join(include_dir, "xla", "ffi", "api", "c_api.h")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise RuntimeError(f"cannot read the XLA FFI header {path} to learn the FFI API version ({e})") from e
    found = [re.search(rf"#define\s+XLA_FFI_API_{part}\s+(\d+)", text) for part in ("MAJOR", "MINOR")]
    if not all(found):
        raise RuntimeError(f"{path} defines no XLA_FFI_API_MAJOR/XLA_FFI_API_MINOR")
    return int(found[0].group(1)), int(found[1].group(1))


def check_api_major(major: int, minor: int, where: str) -> None:
    """RuntimeError unless ``major`` is the FFI API major version these mirrors follow."""
    if major != KNOWN_API_MAJOR:
        raise RuntimeError(f"{where} reports XLA FFI API version {major}.{minor}; cupygemm's call-frame mirrors "
                           f"follow major version {KNOWN_API_MAJOR} (0.3/0.4), whose layout a new major version may "
                           f"change: update cupygemm or use a jaxlib with FFI API {KNOWN_API_MAJOR}.x")


#: ``launch(stream, arg_ptrs, ret_ptrs)``: one GEMM on XLA's stream over the call's device pointers.
Launch = Callable[[int, Sequence[int], Sequence[int]], None]
#: ``fire(stream)``: a launch whose pointers were bound beforehand; it only queues the work on the stream.
Fire = Callable[[int], None]
#: ``bind(arg_ptrs, ret_ptrs)``: the per-pointer work of a launch done once (checks, the kernel's packed
#: parameters), returning the :data:`Fire` that launches on those pointers.
Bind = Callable[[Sequence[int], Sequence[int]], Fire]


@dataclass
class FfiEntry:
    """One traced call site's launch, built at trace time for static shapes.

    ``launches`` maps an XLA device ordinal to a :data:`Launch`; with one device XLA is not asked for the ordinal.
    ``binds`` (optional, the same ordinals) maps it to a :data:`Bind`; without it the handler binds by wrapping the
    launch. The handler keeps the fires of the pointer sets it has seen (``fires``; :meth:`make_fire`), so a call
    on known pointers is one fire. ``expected`` (optional) holds ``(dtype, dims)`` per argument then per result,
    checked on every call when given (``CUPYGEMM_CHECK_INPUTS=1``): the handler's own guard against a mismatched
    frame.
    """
    name: str
    num_args: int
    num_rets: int
    launches: dict[int, Launch]
    expected: tuple[tuple[int, tuple[int, ...]], ...] | None = None
    binds: dict[int, Bind] | None = None
    single: Launch | None = field(init=False, default=None)
    #: pointers (arguments then results), or (ordinal, pointers) where several devices were planned -> fire
    fires: dict[tuple, Fire] = field(init=False, default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if len(self.launches) == 1:
            self.single = next(iter(self.launches.values()))
        if self.binds is not None and set(self.binds) != set(self.launches):
            raise ValueError(f"{self.name}: binds for devices {sorted(self.binds)}, launches for "
                             f"{sorted(self.launches)}")

    def make_fire(self, ordinal: int | None, ptrs: tuple[int, ...]) -> Fire:
        """The launch on ``ptrs`` (arguments then results) on XLA device ``ordinal`` (None: the only planned one),
        made now and kept in :attr:`fires`; ValueError for a device nothing was planned for."""
        if ordinal is None:
            dev, key = next(iter(self.launches)), ptrs
        else:
            dev, key = ordinal, (ordinal, ptrs)
            if dev not in self.launches:
                raise ValueError(f"{self.name}: no kernel was planned for XLA device {dev} (planned: "
                                 f"{sorted(self.launches)})")
        args, rets = ptrs[:self.num_args], ptrs[self.num_args:]
        if self.binds is not None:
            fire = self.binds[dev](args, rets)
        else:
            launch = self.launches[dev]

            def fire(stream: int) -> None:
                launch(stream, args, rets)
        keep_newest(self.fires, key, fire, _FIRE_LIMIT)
        return fire


class _BoundApi:
    """The API table's functions we call, bound once per table address (XLA has one table per process)."""

    def __init__(self, api: int, need_stream: bool):
        size = _u64(api + _API_SIZE).value
        major, minor = _i32(api + _API_MAJOR).value, _i32(api + _API_MINOR).value
        self.version = (major, minor)
        self.error_create = API_FN(_u64(api + Api.Error_Create.offset).value)
        check_api_major(major, minor, "XLA's FFI API table")
        self.stream_get = self.device_ordinal_get = None
        if need_stream:
            if size < Api.Stream_Get.offset + 8:
                raise RuntimeError(f"XLA's FFI API table ({size} bytes) has no Stream_Get")
            self.stream_get = API_FN_GIL(_u64(api + Api.Stream_Get.offset).value)
        if size >= Api.DeviceOrdinal_Get.offset + 8:
            self.device_ordinal_get = API_FN_GIL(_u64(api + Api.DeviceOrdinal_Get.offset).value)


class _Site:
    """One call site's frame layout: where the buffers' data pointers and the entry_id attribute sit, found on the
    first call of a frame with these static bytes (:meth:`FfiHandler._new_site`) and confirmed on every later call.

    XLA keeps a call site's frame from call to call (updating the buffers' data pointers in place) but frees it with
    its executable, and another call site's frame may then be built in the same memory, so the static bytes alone
    do not identify a call site. Each call therefore reads again, with one unpack each, every pointer the layout was
    derived from: the buffer arrays' entries and the attribute's type and scalar pointer ("anchors", at addresses
    the frame at hand gives); then the scalar and the buffers' data pointers at the addresses just confirmed
    ("found", as the deref struct returns them: in address order); then the entry id at the scalar's value pointer.
    ``fires`` maps "found" (with the device ordinal first where several devices were planned) to the launch made
    for it after the scalar was checked, so a hit confirms the scalar too. Any difference sends the frame back to
    :meth:`FfiHandler._resolve`.
    """

    __slots__ = ("entry_id", "entry", "bufs", "anchors", "anchor_base", "anchor_values", "deref", "deref_base",
                 "scalar_of", "scalar_values", "value_ptr", "data_of", "fires", "single", "checked")

    def __init__(self, entry_id: int, entry: FfiEntry, bufs: tuple[int, ...], argv: int, retv: int, atypes: int,
                 attrv: int, atype: int, scalar: int, value_ptr: int):
        self.entry_id, self.entry, self.bufs, self.value_ptr = entry_id, entry, bufs, value_ptr
        self.fires: dict[tuple, Fire] = {}
        self.single, self.checked = entry.single is not None, entry.expected is not None
        items = ([(argv + 8 * i, "Q") for i in range(entry.num_args)]
                 + [(retv + 8 * i, "Q") for i in range(entry.num_rets)] + [(attrv, "Q"), (atypes, "i")])
        anchors, self.anchor_base, positions = _gather(items)
        self.anchors = anchors.unpack_from  # bound once: a method lookup per call costs more than the read
        values = [0] * (max(positions) + 1)
        for p, v in zip(positions, bufs + (scalar, atype)):
            values[p] = v
        self.anchor_values = tuple(values)
        deref, self.deref_base, positions = _gather(
            [(scalar, "i"), (scalar + 8, "Q")] + [(b + _BUF_DATA, "Q") for b in bufs])
        self.deref = deref.unpack_from
        self.scalar_of, self.data_of = _getter(positions[:2]), _getter(positions[2:])
        self.scalar_values = (_S64, value_ptr)


class _Unkept:
    """A frame parsed for one call, its layout not kept (:meth:`FfiHandler._resolve`): what a call reads of a
    :class:`_Site`."""

    __slots__ = ("entry_id", "entry", "bufs", "checked")

    def __init__(self, entry_id: int, entry: FfiEntry, bufs: tuple[int, ...]):
        self.entry_id, self.entry, self.bufs, self.checked = entry_id, entry, bufs, entry.expected is not None

    @staticmethod
    def data_of(ptrs: tuple[int, ...]) -> tuple[int, ...]:
        return ptrs


def _keep_thread_state() -> None:
    """Keep the calling thread's Python thread state after this callback returns.

    A ctypes callback entered on a thread Python did not start (XLA runs executables on its own thread pools) gets
    a new thread state from ``PyGILState_Ensure`` and drops it in the matching ``PyGILState_Release``, every call,
    and the thread-local state with it: a no-op callback took 4.7-5.2 us a call there against 0.1 where the state
    is kept (benchmarks/probes/ffi_handler_probe.py, on the developer machine). One more ``PyGILState_Ensure``,
    never released, keeps the state as long as the thread lives (the interpreter frees it at exit); the next
    callbacks on that thread only take the GIL.
    """
    ctypes.pythonapi.PyGILState_Ensure()


class FfiHandler:
    """An XLA FFI handler (``ctypes`` callback) dispatching execute calls to :class:`FfiEntry` launches.

    Args:
        name: used in error messages (the FFI target name).
        api_version: ``(major, minor)`` written in the metadata handshake: the framework's own version
            (see :func:`header_api_version`); a major version other than :data:`KNOWN_API_MAJOR` is refused.
        use_stream: ask XLA for the stream (GPU platforms); False passes stream 0 (CPU, tests).
        keep_thread_states: keep the Python thread state of each thread that calls the handler
            (:func:`_keep_thread_state`); False is for measuring what that saves.

    ``address`` is the C function pointer to register (``jax.ffi.pycapsule(handler.address)``). Keep the handler
    object alive as long as XLA may call it (a module-level registry does).

    XLA calls the handler cold (its own work between two calls evicts the CPU caches), where a call costs about
    what it touches: every distinct piece of interpreter machinery (a ctypes call, a struct unpack, a Python frame)
    costs microseconds the first time in a call and little after (benchmarks/NOTES.md, "JAX and XLA command
    buffers"). So one Python function does an execute call: four ``struct`` unpacks of raw memory (the frame, then
    the call site's layout confirmed, :class:`_Site`), ``Stream_Get`` with this thread's preallocated arguments
    written and read by ``struct`` too, and the entry's fire for the call's pointers (:meth:`FfiEntry.make_fire`
    the first time it sees them): the launch, its parameters packed long before.
    """

    def __init__(self, name: str, api_version: tuple[int, int], use_stream: bool = True,
                 keep_thread_states: bool = True):
        check_api_major(api_version[0], api_version[1], "the installed jaxlib")
        self.name = name
        self.api_version = (int(api_version[0]), int(api_version[1]))
        self.use_stream = use_stream
        self.keep_thread_states = keep_thread_states
        self._entries: list[FfiEntry] = []
        self._lock = threading.Lock()
        self._apis: dict[int, _BoundApi] = {}
        self._sites: dict[bytes, _Site] = {}
        self._sites_made = self._executes_at_clear = 0
        self._unkept = False  # frames parsed every call, their layouts not kept (see _new_site)
        # by threading.get_ident(): the address of the thread's StreamGetArgs and a writable view of it
        self._stream_args: dict[int, tuple[int, memoryview]] = {}
        self._keep: list[object] = []  # the threads' argument structs
        self.handshakes = 0
        self.executes = 0  # execute calls that reached a launch (approximate under threads): shows graph replay
        self.profile: list[int] | None = None  # set to [] to collect each call's host time in ns (benchmarks)
        self.trace: list[tuple[int, tuple[int, ...]]] | None = None  # set to [] to collect (entry id, pointers)
        # set to [] to collect, per call, the ns from entry to: frame read, stream known, launch queued
        self.profile_parts: list[tuple[int, int, int]] | None = None
        self._call = self._entry_point()
        self._cfunc = HANDLER_FN(self._call)  # the ctypes callback object must outlive every XLA call
        self.address: int = ctypes.cast(self._cfunc, ctypes.c_void_p).value

    def add(self, entry: FfiEntry) -> int:
        """Register an entry; returns its id (the ``entry_id`` attribute of the FFI call). Ids are never reused,
        so executables compiled earlier keep finding theirs."""
        with self._lock:
            self._entries.append(entry)
            return len(self._entries) - 1

    def entry(self, entry_id: int) -> FfiEntry:
        return self._entries[entry_id]

    @property
    def threads(self) -> list[int]:
        """The ``threading.get_ident()`` of every thread that has asked XLA for a stream through this handler
        (diagnostics: which threads XLA runs executables on)."""
        return list(self._stream_args)

    # -- the C entry point ---------------------------------------------------------------------------------

    def _entry_point(self) -> Callable[[int | None], int | None]:
        """The callback's Python body: one function, whose state is in closure cells and locals."""
        handler, apis, sites, stream_args = self, self._apis, self._sites, self._stream_args
        mem, unpack_frame, unpack_i64, unpack_u64 = _MEM, _FRAME.unpack_from, _I64.unpack_from, _U64.unpack_from
        pack_ctx = _CTX_STREAM.pack_into
        perf, ident, check = time.perf_counter_ns, get_ident, _check_buffers

        def call(frame: int | None) -> int | None:
            profile, parts = handler.profile, handler.profile_parts
            if profile is not None or parts is not None:
                t0 = perf()
            api = 0
            try:
                if not frame:
                    raise ValueError("XLA passed a NULL call frame")
                ext, api, ctx, stage, key = unpack_frame(mem, frame)
                if ext and handler._handshake(ext):
                    return None
                bound = apis.get(api) or handler._bind(api)
                if stage != EXECUTE:
                    return None  # a single-function handler has no work in other stages
                site, fire = sites.get(key), None
                if site is not None and site.anchors(mem, site.anchor_base) == site.anchor_values:
                    found = site.deref(mem, site.deref_base)
                    fire = site.fires.get(found if site.single else (handler._device_ordinal(bound, ctx), found))
                if fire is None or unpack_i64(mem, site.value_ptr)[0] != site.entry_id:
                    site, found, fire = handler._resolve(key, site, bound, ctx)
                if site.checked:
                    check(site.entry, site.bufs)
                if parts is not None:
                    t_read = perf()
                stream = 0
                if bound.stream_get is not None:
                    args, view = stream_args.get(ident()) or handler._new_thread()
                    pack_ctx(view, 16, ctx, 0)  # ctx, and a NULL stream until XLA writes one
                    err = bound.stream_get(args)
                    if err:
                        return err  # XLA's own error: ownership passes back to XLA
                    stream = unpack_u64(view, 24)[0]
                handler.executes += 1
                if handler.trace is not None:
                    handler.trace.append((site.entry_id, site.data_of(found)))
                if parts is None:
                    fire(stream)
                    return None
                t_stream = perf()
                fire(stream)
                parts.append((t_read - t0, t_stream - t0, perf() - t0))
                return None
            except BaseException as e:  # noqa: BLE001 - nothing may propagate through the C boundary
                return handler._error(api, e)
            finally:
                if profile is not None:
                    profile.append(perf() - t0)
        return call

    def _handshake(self, ext: int) -> bool:
        """Fill in the metadata extension if the chain holds one; True when this frame was the handshake."""
        while ext:
            if _i32(ext + _EXT_TYPE).value == EXTENSION_METADATA:
                md = _u64(ext + _MDEXT_METADATA).value
                if not md:
                    raise ValueError("XLA's metadata extension carries no metadata struct")
                _i32(md + _MD_MAJOR).value, _i32(md + _MD_MINOR).value = self.api_version
                _u32(md + _MD_TRAITS).value = TRAIT_COMMAND_BUFFER_COMPATIBLE
                self.handshakes += 1
                return True
            ext = _u64(ext + _EXT_NEXT).value
        return False

    def _bind(self, api: int) -> _BoundApi:
        bound = self._apis.get(api)
        if bound is None:
            if not api:
                raise ValueError("the call frame has no FFI API table")
            bound = _BoundApi(api, self.use_stream)
            self._apis[api] = bound
        return bound

    def _resolve(self, key: bytes, site: _Site | None, bound: _BoundApi,
                 ctx: int) -> tuple[_Site | _Unkept, tuple, Fire]:
        """A call the fast path could not serve: a new frame layout or a stale one (parsed in full), or new
        pointers on a known layout (a new fire). Returns the site, its deref values and the fire."""
        if site is not None and site.anchors(_MEM, site.anchor_base) == site.anchor_values:
            found = site.deref(_MEM, site.deref_base)
            if (site.scalar_of(found) != site.scalar_values
                    or _I64.unpack_from(_MEM, site.value_ptr)[0] != site.entry_id):
                site = None
        else:
            site = None
        if site is None and self._unkept:
            unkept = _Unkept(*self._parse(key)[:3])
            if unkept.checked:
                _check_buffers(unkept.entry, unkept.bufs)
            ptrs = tuple(_U64.unpack_from(_MEM, b + _BUF_DATA)[0] for b in unkept.bufs)
            return unkept, ptrs, self._fire(unkept.entry, ptrs, bound, ctx)[0]
        if site is None:
            site = self._new_site(key)
            found = site.deref(_MEM, site.deref_base)
            if site.scalar_of(found) != site.scalar_values:
                raise RuntimeError(f"{self.name}: the call frame changed while it was read")
        if site.checked:  # before binding: a frame the entry was not made for is refused, not packed
            _check_buffers(site.entry, site.bufs)
        fire, ordinal = self._fire(site.entry, site.data_of(found), bound, ctx)
        keep_newest(site.fires, found if ordinal is None else (ordinal, found), fire, _FIRE_LIMIT)
        return site, found, fire

    def _fire(self, entry: FfiEntry, ptrs: tuple[int, ...], bound: _BoundApi,
              ctx: int) -> tuple[Fire, int | None]:
        """The entry's fire for ``ptrs`` (made if new) and the device ordinal it is for (None: the only one)."""
        if entry.single is not None:
            return entry.fires.get(ptrs) or entry.make_fire(None, ptrs), None
        ordinal = self._device_ordinal(bound, ctx)
        return entry.fires.get((ordinal, ptrs)) or entry.make_fire(ordinal, ptrs), ordinal

    def _parse(self, key: bytes) -> tuple:
        """Read a frame whose static bytes are ``key`` in full, with every check: ``(entry_id, entry, bufs, argv,
        retv, atypes, attrv, atype, scalar, value_ptr)``, :class:`_Site`'s arguments."""
        nargs, argv, nrets, retv, nattrs, atypes, attrv = _STATIC.unpack(key)
        if nattrs != 1:
            raise ValueError(f"{self.name}: expected one attribute (entry_id), got {nattrs}")
        if not (atypes and attrv):
            raise ValueError(f"{self.name}: the call frame's attribute arrays are NULL")
        atype, scalar = _I32.unpack_from(_MEM, atypes)[0], _U64.unpack_from(_MEM, attrv)[0]
        sdtype, value_ptr = _SCALAR.unpack_from(_MEM, scalar) if scalar else (0, 0)
        if atype != ATTR_SCALAR or sdtype != _S64 or not value_ptr:
            raise ValueError(f"{self.name}: the entry_id attribute must be an int64 scalar")
        entry_id = _I64.unpack_from(_MEM, value_ptr)[0]
        if not 0 <= entry_id < len(self._entries):
            raise ValueError(f"{self.name}: unknown entry_id {entry_id} ({len(self._entries)} registered)")
        entry = self._entries[entry_id]
        if nargs != entry.num_args or nrets != entry.num_rets:
            raise ValueError(f"{entry.name}: expected {entry.num_args} operands and {entry.num_rets} results, "
                             f"XLA passed {nargs} and {nrets}")
        if (nargs and not argv) or (nrets and not retv):
            raise ValueError(f"{entry.name}: the call frame's buffer arrays are NULL")
        bufs = ((struct.unpack_from(f"<{nargs}Q", _MEM, argv) if nargs else ())
                + (struct.unpack_from(f"<{nrets}Q", _MEM, retv) if nrets else ()))
        if not all(bufs):
            raise ValueError(f"{entry.name}: the call frame holds a NULL buffer")
        return entry_id, entry, bufs, argv, retv, atypes, attrv, atype, scalar, value_ptr

    def _new_site(self, key: bytes) -> _Site:
        """Parse a frame whose static bytes are ``key`` in full, with every check, and keep its layout."""
        site = _Site(*self._parse(key))
        with self._lock:
            if len(self._sites) >= _SITE_LIMIT:
                # Layouts pile up as executables are made and dropped: forget them. Where most calls since the last
                # time made one, XLA builds a new frame per call (XLA keeps its frames since 2024, but a layout
                # costs about fifteen calls to make): parse every frame from now on instead, keeping none.
                self._unkept = self._sites_made > (self.executes - self._executes_at_clear) // 2
                self._sites.clear()
                self._sites_made, self._executes_at_clear = 0, self.executes
            if not self._unkept:
                self._sites[key] = site
            self._sites_made += 1
        return site

    def _new_thread(self) -> tuple[int, memoryview]:
        """The calling thread's StreamGetArgs, made on its first execute call (its Python thread state kept, see
        :func:`_keep_thread_state`, unless ``keep_thread_states`` is off): its address and a writable view."""
        args = StreamGetArgs(STREAM_GET_ARGS_SIZE, None, None, None)
        got = (ctypes.addressof(args), memoryview(args).cast("B"))
        if self.keep_thread_states:
            _keep_thread_state()
        with self._lock:
            self._keep.append(args)
            self._stream_args[get_ident()] = got
        return got

    def _device_ordinal(self, bound: _BoundApi, ctx: int) -> int:
        if bound.device_ordinal_get is None:
            raise RuntimeError(f"{self.name}: XLA's FFI API table has no DeviceOrdinal_Get; plan for one device")
        args = DeviceOrdinalGetArgs(DEVICE_ORDINAL_GET_ARGS_SIZE, None, ctx, -1)
        err = bound.device_ordinal_get(ctypes.addressof(args))
        if err:
            raise RuntimeError(f"{self.name}: XLA's DeviceOrdinal_Get failed")
        return args.device_ordinal

    def _error(self, api: int, exc: BaseException) -> int | None:
        code = INVALID_ARGUMENT if isinstance(exc, (ValueError, TypeError, IndexError, KeyError)) else INTERNAL
        message = f"cupygemm ({self.name}): {type(exc).__name__}: {exc}"
        try:
            if not api:
                raise RuntimeError("no FFI API table to create an error with")
            # Read from the table each time (errors are rare): Error_Create sits at the same offset in every 0.x
            # table, so even a table refused for its version can carry the refusal.
            error_create = API_FN(_u64(api + Api.Error_Create.offset).value)
            args = ErrorCreateArgs(ERROR_CREATE_ARGS_SIZE, None, message.encode("utf-8", "replace"), code)
            return error_create(ctypes.addressof(args))  # XLA copies the message
        except BaseException as e2:  # noqa: BLE001
            # Only the handshake frame lacks an API table; XLA then sees an unset version and refuses the
            # registration with its own message. Say why here.
            print(f"{message}\n(and no FFI error could be returned: {e2})", file=sys.stderr)
            return None


def _check_buffers(entry: FfiEntry, bufs: Sequence[int]) -> None:
    names = [f"operand {i}" for i in range(entry.num_args)] + [f"result {i}" for i in range(entry.num_rets)]
    for name, buf, (dtype, dims) in zip(names, bufs, entry.expected):
        got_dtype = _i32(buf + _BUF_DTYPE).value
        rank = _i64(buf + _BUF_RANK).value
        dims_ptr = _u64(buf + _BUF_DIMS).value
        got = tuple(_i64(dims_ptr + 8 * d).value for d in range(rank)) if rank > 0 else ()
        if got_dtype != dtype or got != tuple(dims):
            raise ValueError(f"{entry.name}: {name}: expected dtype {dtype} with shape {tuple(dims)}, XLA passed "
                             f"dtype {got_dtype} with shape {got}")
