"""Host cost of cupygemm's XLA FFI handler per call, on the CPU, with a synthetic call frame and no GPU.

A small C helper (built here with gcc) plays XLA: it holds an FFI API table whose Stream_Get, DeviceOrdinal_Get and
Error_Create are C stubs, and calls the handler's C function pointer N times on a call frame laid out as XLA's,
timing each call with clock_gettime. So a time includes what XLA pays around the Python code: the ctypes callback's
entry and exit (taking the GIL, and on a thread Python did not start, making and dropping a Python thread state).

Variants:
- ``callback``: a ctypes callback of the handler's type that does nothing (the floor of any ctypes handler);
- ``noop``: an entry whose launch does nothing (the frame read, XLA's stream and the dispatch alone);
- ``gemm`` (needs JAX, CPU is enough): the entry :func:`cupygemm.jax.calls.entry` makes for the 64x2112x7168 GEMM of
  issue 49, whose plan is a real :class:`cupygemm.plan.GemmPlan` and :class:`cupygemm.launch.PackedLauncher` with the
  driver stubbed (``cuLaunchKernel`` a Python no-op, ``cuMemsetD32Async`` a C stub; ``--scratch`` gives the plan
  split-K scratch, so every call also queues the counters' memset; ``--pdl`` launches it with programmatic dependent
  launch, as the GEMMs are by default: ``cuLaunchKernelEx`` a C stub).

Calls come from this Python thread (XLA's CPU client runs executables on the caller's thread), then from a native
thread that outlives each measurement (XLA's TFRT GPU client runs executables on its own pool's threads), each with
hot caches and cold ones (``--evict-mib`` of memory written between calls, not timed: L1 and L2 are evicted, a large
L3 is not). The handler's ``keep_thread_states`` (where it has it) is also measured off, on a second native thread.
"median us" is a call as XLA times it; "inside us" is the handler's own ``profile`` (from its Python body's start,
what ``cupygemm jax-scan`` reports as ``handler_host_us``). The same command on main's tree
(``PYTHONPATH=<main checkout>``) gives the old handler's numbers.

Usage: python benchmarks/probes/ffi_handler_probe.py [--calls N] [--evict-mib M] [--scratch] [--pdl] [--json FILE]
"""
import argparse
import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

from cupygemm import xla_ffi as ffi

C_SOURCE = r"""
#include <pthread.h>
#include <stdint.h>
#include <stddef.h>
#include <time.h>

typedef void *(*handler_t)(void *);
typedef struct { size_t struct_size; void *ext; void *ctx; void *stream; } stream_get_args;
typedef struct { size_t struct_size; void *ext; void *ctx; int32_t ordinal; } ordinal_get_args;
static char error_object[16];

void *stream_get(stream_get_args *a) { a->stream = (void *)0xABC0; return 0; }
void *device_ordinal_get(ordinal_get_args *a) { a->ordinal = 0; return 0; }
void *error_create(void *a) { (void)a; return error_object; }
int cuMemsetD32Async(uint64_t p, unsigned v, size_t n, void *s) { (void)p; (void)v; (void)n; (void)s; return 0; }
int cuLaunchKernelEx(void *c, void *f, void **p, void **e) { (void)c; (void)f; (void)p; (void)e; return 0; }

typedef struct { handler_t h; void *frame; int n; int64_t *ns; volatile char *evict; size_t evict_bytes; int errors; } job_t;

static int64_t now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }

static void run(job_t *j) {
  for (int i = 0; i < j->n; i++) {
    for (size_t k = 0; k < j->evict_bytes; k += 64) j->evict[k]++;
    int64_t t = now();
    if (j->h(j->frame)) j->errors++;
    j->ns[i] = now() - t;
  }
}

/* Native threads that live across drive() calls, as XLA's pool threads do. */
typedef struct { pthread_t thread; pthread_mutex_t mu; pthread_cond_t cv; job_t *job; int started; } worker_t;
static worker_t workers[2] = {{.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER},
                              {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER}};

static void *worker_main(void *p) {
  worker_t *w = p;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (!w->job) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    run(w->job);
    pthread_mutex_lock(&w->mu);
    w->job = 0;
    pthread_cond_broadcast(&w->cv);
  }
  return 0;
}

/* Call h(frame) n times from this thread (worker < 0) or from native worker 0 or 1; ns[i]: call i's time. */
int drive(handler_t h, void *frame, int n, int64_t *ns, char *evict, size_t evict_bytes, int worker) {
  job_t j = {h, frame, n, ns, evict, evict_bytes, 0};
  if (worker < 0) { run(&j); return j.errors; }
  worker_t *w = &workers[worker];
  pthread_mutex_lock(&w->mu);
  if (!w->started) {
    if (pthread_create(&w->thread, 0, worker_main, w)) { pthread_mutex_unlock(&w->mu); return -1; }
    w->started = 1;
  }
  w->job = &j;
  pthread_cond_broadcast(&w->cv);
  while (w->job) pthread_cond_wait(&w->cv, &w->mu);
  pthread_mutex_unlock(&w->mu);
  return j.errors;
}
"""


def build_helper() -> ctypes.CDLL:
    d = tempfile.mkdtemp(prefix="ffi_probe_")
    src, lib = os.path.join(d, "xla_stub.c"), os.path.join(d, "xla_stub.so")
    with open(src, "w") as f:
        f.write(C_SOURCE)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", lib, src, "-lpthread"], check=True)
    helper = ctypes.CDLL(lib)  # drive() runs without the GIL, as XLA does
    helper.drive.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_size_t, ctypes.c_int]
    helper.drive.restype = ctypes.c_int
    return helper


class FakeXla:
    """An XLA_FFI_Api table (API 0.4) whose functions are the helper's C stubs, and an execution context."""

    def __init__(self, helper: ctypes.CDLL):
        self.raw = (ctypes.c_char * 200)()
        api = ffi.Api.from_buffer(self.raw)
        api.struct_size = 200
        api.api_version = ffi.ApiVersion(ffi.API_VERSION_SIZE, None, 0, 4)
        for name, fn in (("Error_Create", "error_create"), ("Stream_Get", "stream_get"),
                         ("DeviceOrdinal_Get", "device_ordinal_get")):
            setattr(api, name, ctypes.cast(getattr(helper, fn), ctypes.c_void_p).value)
        self.api = ctypes.addressof(self.raw)
        self.ctx = ctypes.create_string_buffer(16)


class Frame:
    """An execute call frame as XLA lays one out: buffers (dtype, dims, data) for args and rets, the entry_id."""

    def __init__(self, xla: FakeXla, args, rets, entry_id: int):
        self.keep = []
        f = self.frame = ffi.CallFrame()
        f.struct_size, f.api, f.ctx, f.stage = ffi.CALL_FRAME_SIZE, xla.api, ctypes.addressof(xla.ctx), ffi.EXECUTE
        for part, field, bufs in ((f.args, "args", args), (f.rets, "rets", rets)):
            part.struct_size, part.size = ctypes.sizeof(type(part)), len(bufs)
            ptrs = (ctypes.c_void_p * len(bufs))(*[self.buffer(*b) for b in bufs])
            types = (ctypes.c_int * len(bufs))(*([1] * len(bufs)))
            self.keep += [ptrs, types]
            setattr(part, field, ctypes.cast(ptrs, ctypes.POINTER(ctypes.c_void_p)))
            part.types = ctypes.cast(types, ctypes.POINTER(ctypes.c_int))
        value = ctypes.c_int64(entry_id)
        scalar = ffi.Scalar(5, ctypes.addressof(value))
        attrs = (ctypes.c_void_p * 1)(ctypes.addressof(scalar))
        attr_types = (ctypes.c_int * 1)(ffi.ATTR_SCALAR)
        self.keep += [value, scalar, attrs, attr_types]
        f.attrs.size = 1
        f.attrs.attrs = ctypes.cast(attrs, ctypes.POINTER(ctypes.c_void_p))
        f.attrs.types = ctypes.cast(attr_types, ctypes.POINTER(ctypes.c_int))
        self.address = ctypes.addressof(f)

    def buffer(self, dtype: int, dims: tuple, data: int) -> int:
        d = (ctypes.c_int64 * max(len(dims), 1))(*dims)
        b = ffi.Buffer(ctypes.sizeof(ffi.Buffer), None, dtype, data, len(dims),
                       ctypes.cast(d, ctypes.POINTER(ctypes.c_int64)))
        self.keep += [d, b]
        return ctypes.addressof(b)


M, N, K = 64, 2112, 7168
BASE = 0x7F0000000000  # device addresses of the buffers, far apart


def buffers(n_rets: int):
    kb = -(-K // 128)
    args = [(20, (M, K), BASE), (11, (kb, M), BASE + (1 << 30)), (20, (N, K), BASE + (2 << 30)),
            (11, (-(-N // 128), kb), BASE + (3 << 30))]
    rets = [(16, (M, N), BASE + (4 << 30)), (11, (1024,), BASE + (5 << 30)), (8, (64,), BASE + (6 << 30))][:n_rets]
    return args, rets


def noop_entry(handler: ffi.FfiHandler) -> tuple[int, int]:
    return handler.add(ffi.FfiEntry("noop", 4, 1, {0: lambda stream, a, r: None})), 1


def gemm_entry(helper: ctypes.CDLL, xla: FakeXla, scratch: bool, pdl: bool):
    """The handler and entry cupygemm.jax makes for the GEMM, on a GemmPlan whose driver calls are stubs."""
    import jax  # noqa: F401 - cupygemm.jax needs it
    import ml_dtypes

    from cupygemm import launch as launch_mod
    from cupygemm import tma
    from cupygemm.jax import backend, calls, checks
    from cupygemm.kinds.forward import NORMAL
    from cupygemm.plan import GemmPlan

    tma.driver = launch_mod.driver = lambda: helper  # cuMemsetD32Async, cuLaunchKernelEx: the C stubs
    launch_mod._launch_ex_fn = None

    class Spec:  # a TMA map layout whose "encoding" is the pointer's bytes (no driver)
        dims, strides = (16, 1, 1), (16, 16)

        def encode(self, ptr):
            return ptr.to_bytes(8, "little") * 16

    launcher = launch_mod.PackedLauncher.__new__(launch_mod.PackedLauncher)
    launcher._struct = struct.Struct("<" + "128s" * 5 + "Q" * 5 + "I" * 4)
    launcher._func, launcher._launch_kernel, launcher._error = 0xF00, lambda *a: None, RuntimeError
    launcher._pdl_configs, launcher._device = {}, 0
    import cupy  # a thread's first launch binds the device's context (cupygemm.device.ensure_context): no GPU here
    cupy.cuda.runtime.memGetInfo = lambda: (0, 0)
    floats, counters = (1024, 64) if scratch else (0, 0)
    plan = GemmPlan(NORMAL, M, N, K, 1, 0, None, None, launcher, 66, 384, 200_000, M, floats, counters,
                    (Spec(),) * 5, (M, 1, N, 0), pdl=pdl)
    kb = -(-K // 128)
    f8 = ml_dtypes.float8_e4m3fn
    ops = (np.zeros((M, K), f8), np.zeros((M, kb), np.float32), np.zeros((N, K), f8),
           np.zeros((-(-N // 128), kb), np.float32))
    be = backend.use_backend("cpu", lambda *a, **k: {0: plan}, use_stream=True).__enter__()
    p = checks.problem(NORMAL, *ops, None, None, None, None)
    eid, _, _, f, c = calls.entry(NORMAL, None, None, p, ops)
    return backend.handler(be), eid, 1 + bool(f) + bool(c)


class Callback:
    """The floor: a ctypes callback of the handler's type that does nothing."""

    def __init__(self):
        self.cfunc = ffi.HANDLER_FN(lambda frame: None)
        self.address = ctypes.cast(self.cfunc, ctypes.c_void_p).value
        self.profile = None


def measure(helper, handler, frame, calls, evict, worker) -> dict:
    ns = (ctypes.c_int64 * calls)()
    inside = handler.profile = [] if isinstance(handler, ffi.FfiHandler) else None
    errors = helper.drive(handler.address, frame.address, calls, ns, evict, len(evict) if evict else 0, worker)
    handler.profile = None
    if errors:
        raise RuntimeError(f"{errors} handler calls returned an error")
    per = sorted(ns[calls // 10:])  # the first calls bind the pointers: left out
    inside = sorted(inside[calls // 10:]) if inside else None
    return {"median_us": per[len(per) // 2] / 1e3, "p90_us": per[int(len(per) * 0.9)] / 1e3,
            "inside_median_us": inside[len(inside) // 2] / 1e3 if inside else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--evict-mib", type=int, default=16)
    ap.add_argument("--scratch", action="store_true", help="the plan needs split-K scratch (a memset per call)")
    ap.add_argument("--pdl", action="store_true", help="launched with programmatic dependent launch")
    ap.add_argument("--json")
    args = ap.parse_args()
    helper = build_helper()
    xla = FakeXla(helper)
    evict = (ctypes.c_char * (args.evict_mib << 20))()
    h = ffi.FfiHandler("probe", (0, 4))
    eid, nrets = noop_entry(h)
    variants = [("callback", Callback(), eid, nrets), ("noop", h, eid, nrets)]
    try:
        gh, geid, gnrets = gemm_entry(helper, xla, args.scratch, args.pdl)
        variants.append(("gemm", gh, geid, gnrets))
    except ImportError as e:
        print(f"(gemm variant skipped: {e})", file=sys.stderr)
    new_handler = hasattr(h, "keep_thread_states")
    rows = []
    print(f"{'variant':<8} {'thread':<22} {'cache':<5} {'median us':>10} {'p90 us':>8} {'inside us':>10}")
    for name, handler, entry_id, nrets in variants:
        a, r = buffers(nrets)
        frame = Frame(xla, a, r, entry_id)
        # (row name, driving thread: -1 this one, else a native worker, keep_thread_states). Worker 1 only ever
        # runs with no thread state kept: the bare callback, and the handler with keep_thread_states off.
        if name == "callback":
            threads = [("python", -1, None), ("native, state not kept", 1, None)]
        else:
            threads = [("python", -1, None), ("native", 0, None)]
            if new_handler:
                threads.append(("native, state not kept", 1, False))
        for thread, worker, keep in threads:
            if keep is not None:
                handler.keep_thread_states = keep
            for cache, ev in (("hot", None), ("cold", evict)):
                res = measure(helper, handler, frame, args.calls, ev, worker)
                rows.append({"variant": name, "thread": thread, "cache": cache, **res})
                inside = "" if res["inside_median_us"] is None else f"{res['inside_median_us']:>10.2f}"
                print(f"{name:<8} {thread:<22} {cache:<5} {res['median_us']:>10.2f} {res['p90_us']:>8.2f} {inside}",
                      flush=True)
            if keep is not None:
                handler.keep_thread_states = True
    tree = os.path.dirname(os.path.dirname(ffi.__file__))
    out = {"command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]), "python": sys.version.split()[0],
           "cpu": _cpu(), "calls": args.calls, "evict_mib": args.evict_mib, "scratch": args.scratch, "pdl": args.pdl,
           "cupygemm": tree, "measured_tree": _tree(tree), "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def _tree(path: str) -> str:
    """The commit of the cupygemm tree measured, "+changes" when it has uncommitted ones."""
    try:
        head = subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", path, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + (" +changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "?"


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "?"


if __name__ == "__main__":
    main()
