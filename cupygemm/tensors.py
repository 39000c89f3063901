"""Reading the caller's tensors: pointer, shape, strides, dtype and device, straight from the object.

CuPy arrays and torch tensors are read through their own attributes (no DLPack export, no CuPy array made:
each read costs well under a microsecond). Any other ``__dlpack__`` producer (JAX, ...) is read from its
DLPack capsule, which is kept alive with the view for the duration of the call.

FP8 operands may be ``float8_e4m3fn`` (torch, JAX, NumPy's ml_dtypes) or ``uint8`` holding e4m3 bits (CuPy has
no FP8 dtype). Results are made by the caller's framework (:func:`empty`), so torch callers get torch tensors
(allocated by torch's caching allocator) and CuPy callers CuPy arrays; other DLPack callers get CuPy-allocated
arrays handed back through DLPack (:func:`export_like`). JAX callers go through :mod:`cupygemm.jax`.
"""
from __future__ import annotations

import ctypes
import enum
import sys
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

try:  # CuPy is an extra; the CPU-only parts of the package import without it.
    import cupy
except ImportError:  # pragma: no cover
    cupy = None  # type: ignore[assignment]

FP8_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
U8, I32, F32, F16 = np.dtype(np.uint8), np.dtype(np.int32), np.dtype(np.float32), np.dtype(np.float16)

# DLPack type codes (dlpack.h 1.1).
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT = 0, 1, 2, 4
_DL_FP8_CODES = {7: "float8_e3m4", 8: "float8_e4m3", 9: "float8_e4m3b11fnuz", 10: "float8_e4m3fn",
                 11: "float8_e4m3fnuz", 12: "float8_e5m2", 13: "float8_e5m2fnuz", 14: "float8_e8m0fnu"}
_DL_DTYPES = {(_DL_UINT, 8): U8, (_DL_INT, 32): I32, (_DL_FLOAT, 32): F32, (_DL_FLOAT, 16): F16,
              (_DL_BFLOAT, 16): BF16, (10, 8): FP8_E4M3}
_DL_CUDA, _DL_CUDA_MANAGED = 2, 13


class Framework(enum.Enum):
    """Which library an input came from: results are made by, or handed back to, the same one."""

    CUPY = "cupy"
    TORCH = "torch"
    JAX = "jax"
    OTHER = "dlpack"


_FRAMEWORKS = {"cupy": Framework.CUPY, "torch": Framework.TORCH, "jax": Framework.JAX, "jaxlib": Framework.JAX}
_framework_by_type: dict[type, Framework] = {}


def framework_of(x: Any) -> Framework:
    t = type(x)
    fw = _framework_by_type.get(t)
    if fw is None:
        fw = _framework_by_type[t] = _FRAMEWORKS.get(t.__module__.split(".")[0], Framework.OTHER)
    return fw


def is_torch_tensor(x: Any) -> bool:
    """True for a torch.Tensor, without importing torch (a caller holding one has imported it)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def require_cupy():
    if cupy is None:
        raise ImportError(
            "cupygemm needs CuPy for GPU work: pip install 'cupygemm[cuda12]' (or '[cuda13]')"
        )
    return cupy


class View(NamedTuple):
    """What a kernel launch needs to know of one tensor. ``strides`` are in bytes."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype
    device: int
    obj: Any = None  # the caller's object (or the DLPack capsule that keeps the memory alive)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def c_contiguous(self) -> bool:
        acc = self.itemsize
        for d, s in zip(reversed(self.shape), reversed(self.strides)):
            if d > 1 and s != acc:
                return False
            acc *= d
        return True


# ---- torch ------------------------------------------------------------------------------------

_torch_dtypes: dict[Any, np.dtype] = {}


def _torch_dtype_map(torch: Any) -> dict[Any, np.dtype]:
    if not _torch_dtypes:
        _torch_dtypes.update({torch.uint8: U8, torch.int32: I32, torch.float32: F32, torch.float16: F16,
                              torch.bfloat16: BF16, torch.float8_e4m3fn: FP8_E4M3})
    return _torch_dtypes


def read_torch(t: Any, name: str) -> View:
    device = t.get_device()  # -1: not a CUDA tensor
    dtype = _torch_dtypes.get(t.dtype) if _torch_dtypes else _torch_dtype_map(sys.modules["torch"]).get(t.dtype)
    if device < 0 or dtype is None:
        if device < 0:
            raise TypeError(f"{name}: expected a CUDA tensor, got a torch tensor on {t.device}; move it to the GPU "
                            "first")
        raise TypeError(f"{name}: unsupported dtype {t.dtype}")
    item = dtype.itemsize
    st = t.stride()
    if len(st) == 2:
        strides = (st[0] * item, st[1] * item)
    else:
        strides = tuple([s * item for s in st])
    return _new_view(View, (t.data_ptr(), t.shape, strides, dtype, device, t))


# ---- CuPy -------------------------------------------------------------------------------------

_new_view = tuple.__new__  # View(...) without NamedTuple's Python-level __new__: reads are on every call's path


def read_cupy(x: Any) -> View:
    mem = x.data
    return _new_view(View, (mem.ptr, x.shape, x.strides, x.dtype, mem.device_id, x))


# ---- any DLPack producer ----------------------------------------------------------------------

class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


# DLManagedTensorVersioned = {u32 major, u32 minor; void* ctx; deleter; u64 flags; DLTensor}
_VERSIONED_TENSOR_OFFSET = 8 + 8 + 8 + 8

_PyCapsule_GetName = ctypes.pythonapi.PyCapsule_GetName
_PyCapsule_GetName.restype = ctypes.c_char_p
_PyCapsule_GetName.argtypes = [ctypes.py_object]
_PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_PyCapsule_GetPointer.restype = ctypes.c_void_p
_PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _capsule_tensor(capsule: Any) -> _DLTensor:
    name = _PyCapsule_GetName(capsule)
    if name not in (b"dltensor", b"dltensor_versioned"):
        raise TypeError(f"not an unconsumed DLPack capsule (name {name!r})")
    ptr = _PyCapsule_GetPointer(capsule, name)
    offset = _VERSIONED_TENSOR_OFFSET if name == b"dltensor_versioned" else 0
    return _DLTensor.from_address(ptr + offset)


def _dlpack_capsule(x: Any, stream: int | None) -> Any:
    try:
        return x.__dlpack__(stream=stream, max_version=(1, 0))
    except TypeError:  # producers predating DLPack 1.0 take no max_version
        return x.__dlpack__(stream=stream)


def gpu_device_of(x: Any, name: str) -> int:
    """The CUDA device a DLPack producer's memory is on; TypeError for host memory and non-tensors."""
    if isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a GPU array, got a NumPy (host) array; use cupy.asarray() first")
    if not hasattr(x, "__dlpack__") or not hasattr(x, "__dlpack_device__"):
        raise TypeError(f"{name}: expected a CuPy array or a DLPack-capable GPU tensor, got {type(x).__name__} "
                        "(CuPy arrays, torch CUDA tensors and JAX arrays are accepted)")
    dev_type, dev_id = x.__dlpack_device__()
    if int(dev_type) not in (_DL_CUDA, _DL_CUDA_MANAGED):
        raise TypeError(
            f"{name}: expected a CUDA GPU array, got a {type(x).__name__} on DLPack device type {int(dev_type)} "
            "(host memory?); move it to the GPU first"
        )
    return int(dev_id)


def _read_dlpack(x: Any, name: str, stream: int) -> View:
    """Read a DLPack producer. ``stream``: the stream we will launch on; the producer orders its pending writes
    before it (DLPack's contract: 1 means the legacy default stream, 0 is not allowed)."""
    gpu_device_of(x, name)
    capsule = _dlpack_capsule(x, stream or 1)
    t = _capsule_tensor(capsule)
    code, bits = int(t.dtype.code), int(t.dtype.bits)
    dtype = _DL_DTYPES.get((code, bits))
    if dtype is None or t.dtype.lanes != 1:
        what = _DL_FP8_CODES.get(code, f"DLPack type code {code}, {bits} bits")
        raise TypeError(f"{name}: unsupported dtype {what}")
    ndim = int(t.ndim)
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    if t.strides:
        strides = tuple(int(t.strides[i]) * dtype.itemsize for i in range(ndim))
    else:  # NULL strides: C-contiguous
        strides, acc = [], dtype.itemsize
        for d in reversed(shape):
            strides.insert(0, acc)
            acc *= max(d, 1)
        strides = tuple(strides)
    return View(int(t.data or 0) + int(t.byte_offset), shape, strides, dtype, int(t.device_id), capsule)


def read(x: Any, name: str, stream: int = 0) -> View:
    """The :class:`View` of a caller's GPU tensor. ``name`` is used in error messages; ``stream`` is the stream
    a DLPack producer must order its pending writes before.

    Raises TypeError for host arrays, CPU tensors and objects that are not GPU tensors.
    """
    if cupy is not None and isinstance(x, cupy.ndarray):
        return read_cupy(x)
    if is_torch_tensor(x):
        return read_torch(x, name)
    return _read_dlpack(x, name, stream)


# ---- results ----------------------------------------------------------------------------------

def cupy_view(v: View) -> "cupy.ndarray":
    """A CuPy array over a View's memory (no copy; the View's object keeps the memory alive)."""
    require_cupy()
    if isinstance(v.obj, cupy.ndarray):
        return v.obj
    dtype = U8 if v.dtype == FP8_E4M3 else v.dtype
    extent = sum((d - 1) * s for d, s in zip(v.shape, v.strides) if d > 0) + dtype.itemsize if v.size else 0
    mem = cupy.cuda.UnownedMemory(v.ptr, extent, v.obj, v.device)
    return cupy.ndarray(v.shape, dtype, cupy.cuda.MemoryPointer(mem, 0), v.strides)


_torch_empty_args: dict[tuple[np.dtype, int], dict[str, Any]] = {}  # (dtype, device) -> torch.empty's keywords


def empty(framework: Framework, shape: tuple[int, ...], dtype: np.dtype, device: int,
          stream: int | None = None) -> Any:
    """A new uninitialized GPU array made by the caller's framework (torch for torch callers, else CuPy).

    torch arrays come from torch's caching allocator, so they are valid inside ``torch.cuda.graph`` capture
    (the graph's pool owns them). ``stream``: the stream that will write it, when it is not the caller's current
    one (``stream=``): the array is allocated in that stream's order, so its memory is not handed to another
    stream's allocation while the kernel still writes it."""
    if stream is not None:
        from .streams import cupy_stream, torch_stream

        with (torch_stream(stream, device) if framework is Framework.TORCH else cupy_stream(stream, device)):
            return empty(framework, shape, dtype, device)
    if framework is Framework.TORCH:
        torch = sys.modules["torch"]
        args = _torch_empty_args.get((dtype, device))
        if args is None:  # made once: a dict reversal and a torch.device per call cost more than the allocation
            tdtype = {v: k for k, v in _torch_dtype_map(torch).items()}[dtype]
            args = _torch_empty_args.setdefault((dtype, device), {"dtype": tdtype,
                                                                  "device": torch.device("cuda", device)})
        return torch.empty(shape, **args)
    cp = require_cupy()
    with cp.cuda.Device(device):
        return cp.empty(shape, dtype=U8 if dtype == FP8_E4M3 else dtype)


def export_like(arr: Any, framework: Framework) -> Any:
    """Hand a result made by :func:`empty` to the caller's framework: torch and CuPy results are already theirs;
    JAX gets a zero-copy JAX array through DLPack.

    The framework is the caller's, already imported (its arrays came in): cupygemm never imports torch or JAX.
    """
    if framework is Framework.JAX:
        return sys.modules["jax"].dlpack.from_dlpack(arr)
    return arr


def device_array(host: np.ndarray, like: Any, stream: Any = None) -> Any:
    """``host``'s values in a new GPU array of ``like``'s framework and device (a JAX array for JAX callers), copied
    in the order of the call's stream (``stream=``, else the caller's current one)."""
    from .streams import cupy_stream, resolve, torch_stream

    framework = framework_of(like)
    if framework is Framework.JAX:
        return sys.modules["jax"].numpy.asarray(host)
    device = read(like, "like").device
    handle = resolve(stream, framework, device)
    if framework is Framework.TORCH:
        torch = sys.modules["torch"]
        with torch_stream(handle, device):
            return torch.as_tensor(host, device=torch.device("cuda", device))
    cp = require_cupy()
    with cp.cuda.Device(device), cupy_stream(handle, device):
        return cp.asarray(host)


def copy_into(dst: Any, src: Any, stream: Any = None) -> None:
    """``dst[...] = src`` (same shape and dtype, one framework) in the order of the call's stream."""
    from .streams import cupy_stream, resolve, torch_stream

    framework = framework_of(dst)
    if framework_of(src) is not framework:
        raise TypeError(f"c: got a {type(src).__module__}.{type(src).__name__} while d is a {framework.value} "
                        "tensor; pass both from one framework")
    view = read(dst, "d")
    handle = resolve(stream, framework, view.device)
    if framework is Framework.TORCH:
        with torch_stream(handle, view.device):
            dst.copy_(src)
        return
    cp = require_cupy()
    with cp.cuda.Device(view.device), cupy_stream(handle, view.device):
        cupy_view(view)[...] = cupy_view(read(src, "c"))
