"""XLA FFI from pure Python: ctypes mirrors of ``xla/ffi/api/c_api.h`` and a handler that launches our kernels.

XLA calls an FFI handler with one pointer, an ``XLA_FFI_CallFrame*``, and takes back an ``XLA_FFI_Error*`` (NULL
= success). :class:`FfiHandler` is such a handler written as a ``ctypes.CFUNCTYPE(c_void_p, c_void_p)``
callback, so no compiled extension is needed. It

* answers XLA's metadata handshake (a frame whose ``extension_start`` chain holds a metadata extension, sent once
  per registration with ``api == NULL``): it writes the FFI API version it speaks and the trait
  COMMAND_BUFFER_COMPATIBLE, so XLA may capture the call into its CUDA graphs, and returns NULL without running;
* on an execute frame, reads the entry id from the call's only attribute (an int64 scalar), the device pointers of
  the argument and result buffers, and XLA's stream (``Stream_Get`` with the frame's context), and calls the
  entry's launch function, which was built at trace time (kernel chosen, compiled and loaded): the per-call
  work is a few memory reads and one launch;
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
import functools
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

__all__ = [
    "KNOWN_API_MAJOR", "EXECUTE", "EXTENSION_METADATA", "TRAIT_COMMAND_BUFFER_COMPATIBLE", "INVALID_ARGUMENT",
    "INTERNAL", "DTYPES", "ffi_dtype", "header_api_version", "FfiEntry", "FfiHandler", "HANDLER_FN",
    "CallFrame", "Args", "Rets", "Attrs", "Buffer", "Scalar", "Api", "ApiVersion", "ExtensionBase", "Metadata",
    "MetadataExtension", "ErrorCreateArgs", "StreamGetArgs", "DeviceOrdinalGetArgs",
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

# The call frame as 64-bit words, read with one copy (every field we read is a pointer, a size or an int padded
# to 8 bytes).
_FRAME_WORDS = ctypes.c_uint64 * (CALL_FRAME_SIZE // 8)
_W_EXT, _W_API, _W_CTX, _W_STAGE = _CF_EXT // 8, _CF_API // 8, _CF_CTX // 8, _CF_STAGE // 8
_W_NARGS, _W_ARGV, _W_NRETS, _W_RETV = _CF_NARGS // 8, _CF_ARGV // 8, _CF_NRETS // 8, _CF_RETV // 8
_W_NATTRS, _W_ATTR_TYPES, _W_ATTRV = _CF_NATTRS // 8, _CF_ATTR_TYPES // 8, _CF_ATTRV // 8
_SCALAR_WORDS = ctypes.c_uint64 * 2  # XLA_FFI_Scalar: int dtype (padded to 8 bytes), value pointer


@functools.lru_cache(maxsize=64)
def _u64_array(n: int) -> type:
    return ctypes.c_uint64 * n


def _signed(word: int) -> int:
    return word - (1 << 64) if word >> 63 else word

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


@dataclass
class FfiEntry:
    """One traced call site's launch, built at trace time for static shapes.

    ``launches`` maps an XLA device ordinal to ``launch(stream, arg_ptrs, ret_ptrs)``; with one device XLA is not
    asked for the ordinal. ``expected`` (optional) holds ``(dtype, dims)`` per argument then per result, checked
    on every call when given (``CUPYGEMM_CHECK_INPUTS=1``): the handler's own guard against a mismatched frame.
    """
    name: str
    num_args: int
    num_rets: int
    launches: dict[int, Callable[[int, Sequence[int], Sequence[int]], None]]
    expected: tuple[tuple[int, tuple[int, ...]], ...] | None = None
    single: Callable[[int, Sequence[int], Sequence[int]], None] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if len(self.launches) == 1:
            self.single = next(iter(self.launches.values()))


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


class FfiHandler:
    """An XLA FFI handler (``ctypes`` callback) dispatching execute calls to :class:`FfiEntry` launches.

    Args:
        name: used in error messages (the FFI target name).
        api_version: ``(major, minor)`` written in the metadata handshake: the framework's own version
            (see :func:`header_api_version`); a major version other than :data:`KNOWN_API_MAJOR` is refused.
        use_stream: ask XLA for the stream (GPU platforms); False passes stream 0 (CPU, tests).

    ``address`` is the C function pointer to register (``jax.ffi.pycapsule(handler.address)``). Keep the handler
    object alive as long as XLA may call it (a module-level registry does).
    """

    def __init__(self, name: str, api_version: tuple[int, int], use_stream: bool = True):
        check_api_major(api_version[0], api_version[1], "the installed jaxlib")
        self.name = name
        self.api_version = (int(api_version[0]), int(api_version[1]))
        self.use_stream = use_stream
        self._entries: list[FfiEntry] = []
        self._lock = threading.Lock()
        self._apis: dict[int, _BoundApi] = {}
        self._tls = threading.local()  # per-thread argument structs: XLA may call from several threads
        self.handshakes = 0
        self.executes = 0  # execute calls that reached a launch (approximate under threads): shows graph replay
        self.profile: list[int] | None = None  # set to [] to collect each call's host time in ns (benchmarks)
        self.trace: list[tuple[int, tuple[int, ...]]] | None = None  # set to [] to collect (entry id, pointers)
        # set to [] to collect, per call, the ns from entry to: frame read, stream known, launch queued
        self.profile_parts: list[tuple[int, int, int]] | None = None
        self._t0 = 0
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

    # -- the C entry point ---------------------------------------------------------------------------------

    def _call(self, frame: int | None) -> int | None:
        if self.profile is not None:
            t0 = self._t0 = time.perf_counter_ns()
            err = self._run(frame)
            self.profile.append(time.perf_counter_ns() - t0)
            return err
        return self._run(frame)

    def _run(self, frame: int | None) -> int | None:
        api = 0
        try:
            if not frame:
                raise ValueError("XLA passed a NULL call frame")
            words = _FRAME_WORDS.from_address(frame)[:]
            if words[_W_EXT] and self._handshake(words[_W_EXT]):
                return None
            api = words[_W_API]
            return self._execute(words, api)
        except BaseException as e:  # noqa: BLE001 - nothing may propagate through the C boundary
            return self._error(api, e)

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

    def _execute(self, words: list[int], api: int) -> int | None:
        bound = self._apis.get(api) or self._bind(api)
        if words[_W_STAGE] & 0xFFFFFFFF != EXECUTE:
            return None  # a single-function handler has no work in other stages
        if words[_W_NATTRS] != 1:
            raise ValueError(f"{self.name}: expected one attribute (entry_id), got "
                             f"{_signed(words[_W_NATTRS])}")
        scalar_dtype, value_ptr = _SCALAR_WORDS.from_address(_u64(words[_W_ATTRV]).value)[:]
        if _i32(words[_W_ATTR_TYPES]).value != ATTR_SCALAR or scalar_dtype & 0xFFFFFFFF != _S64:
            raise ValueError(f"{self.name}: the entry_id attribute must be an int64 scalar")
        entry_id = _i64(value_ptr).value
        if not 0 <= entry_id < len(self._entries):
            raise ValueError(f"{self.name}: unknown entry_id {entry_id} ({len(self._entries)} registered)")
        entry = self._entries[entry_id]
        nargs, nrets = words[_W_NARGS], words[_W_NRETS]
        if nargs != entry.num_args or nrets != entry.num_rets:
            raise ValueError(f"{entry.name}: expected {entry.num_args} operands and {entry.num_rets} results, "
                             f"XLA passed {_signed(nargs)} and {_signed(nrets)}")
        bufs = (_u64_array(nargs).from_address(words[_W_ARGV])[:] if nargs else []) + \
            (_u64_array(nrets).from_address(words[_W_RETV])[:] if nrets else [])
        if entry.expected is not None:
            _check_buffers(entry, bufs)
        ptrs = [_u64(b + _BUF_DATA).value for b in bufs]
        parts = self.profile_parts
        if parts is not None:
            t_read = time.perf_counter_ns()
        stream = 0
        ctx = words[_W_CTX]
        if bound.stream_get is not None:
            stream, err = self._stream(bound, ctx)
            if err:
                return err  # XLA's own error: ownership passes back to XLA
        launch = entry.single
        if launch is None:
            launch = entry.launches.get(self._device_ordinal(bound, ctx))
            if launch is None:
                raise ValueError(f"{entry.name}: no kernel was planned for XLA device "
                                 f"{self._device_ordinal(bound, ctx)} (planned: {sorted(entry.launches)})")
        self.executes += 1
        if self.trace is not None:
            self.trace.append((entry_id, tuple(ptrs)))
        if parts is None:
            launch(stream, ptrs[:nargs], ptrs[nargs:])
            return None
        t_stream = time.perf_counter_ns()
        launch(stream, ptrs[:nargs], ptrs[nargs:])
        parts.append((t_read - self._t0, t_stream - self._t0, time.perf_counter_ns() - self._t0))
        return None

    def _stream(self, bound: _BoundApi, ctx: int) -> tuple[int, int | None]:
        args = getattr(self._tls, "stream_args", None)
        if args is None:
            args = self._tls.stream_args = StreamGetArgs(STREAM_GET_ARGS_SIZE, None, None, None)
            self._tls.stream_args_ptr = ctypes.addressof(args)
        args.ctx = ctx
        args.stream = None
        err = bound.stream_get(self._tls.stream_args_ptr)
        return (args.stream or 0), err

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


def _check_buffers(entry: FfiEntry, bufs: list[int]) -> None:
    names = [f"operand {i}" for i in range(entry.num_args)] + [f"result {i}" for i in range(entry.num_rets)]
    for name, buf, (dtype, dims) in zip(names, bufs, entry.expected):
        got_dtype = _i32(buf + _BUF_DTYPE).value
        rank = _i64(buf + _BUF_RANK).value
        dims_ptr = _u64(buf + _BUF_DIMS).value
        got = tuple(_i64(dims_ptr + 8 * d).value for d in range(rank)) if rank > 0 else ()
        if got_dtype != dtype or got != tuple(dims):
            raise ValueError(f"{entry.name}: {name}: expected dtype {dtype} with shape {tuple(dims)}, XLA passed "
                             f"dtype {got_dtype} with shape {got}")
