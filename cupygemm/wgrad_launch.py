"""A minimal way to build, load and launch the wgrad kernels on CuPy arrays (the GPU tests use it).

The kernels' contract is :mod:`cupygemm.contract_wgrad`; this module only checks the arrays, encodes the TMA maps
(:mod:`cupygemm.tma`), loads the kernels (:func:`cupygemm.jit.build.load_kernel`) and launches them with packed
parameters (:func:`cupygemm.launch.make_launcher`) on the given (or CuPy's current) stream. It is not the package's
API: no torch/JAX, no launch-plan cache, no validation beyond what would make a launch unsafe.

* :func:`wgrad_fp8_fp8_fp32_nt`: ``d[M, N] += A . B^T`` (one launch);
* :func:`k_grouped_wgrad_fp8_fp8_fp32_nt`: ``d[g] += A_g . B_g^T`` for the group sizes in ``batch_sizes`` on the
  device (the prep kernel, then the GEMM, both on the stream; capturable in a CUDA graph, with the sizes read at
  replay time).
"""
from __future__ import annotations

import threading
from typing import Any

from . import contract_wgrad as cw
from .jit.build import LoadedKernel, build_cubin, load_kernel
from .jit.source import KernelSource, render
from .launch import Launcher, make_launcher

_lock = threading.Lock()
_loaded: dict[tuple, tuple[LoadedKernel, Launcher]] = {}


def wgrad_source(cfg: cw.WgradConfig) -> KernelSource:
    return render(cw.WGRAD_FILE, cw.WGRAD_ENTRY, cw.defines(cfg))


def prep_source() -> KernelSource:
    return render(cw.PREP_FILE, cw.PREP_ENTRY, {})


def compile_wgrad(cfg: cw.WgradConfig) -> bytes:
    """The sm_90a cubin of ``cfg``'s GEMM kernel (cache or NVRTC; no GPU needed)."""
    return build_cubin(wgrad_source(cfg), config=cfg)[1]


def compile_prep() -> bytes:
    return build_cubin(prep_source(), post_process=False)[1]


def _kernel(src: KernelSource, kinds: tuple[str, ...], smem: int = 0, cfg: cw.WgradConfig | None = None,
            post_process: bool = True) -> tuple[LoadedKernel, Launcher]:
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    key = (dev, src.digest)
    hit = _loaded.get(key)
    if hit is not None:
        return hit
    k = load_kernel(src, post_process=post_process, config=cfg)
    k.ensure_dynamic_smem(smem)
    if cfg is not None and cfg.cluster_size > 1 and not k.max_clusters:
        from .kernels import max_active_clusters

        k.max_clusters = max_active_clusters(k, cfg) or cfg.num_sms // cfg.cluster_size
    made = (k, make_launcher(k.function, kinds))
    with _lock:
        return _loaded.setdefault(key, made)


def gemm_kernel(cfg: cw.WgradConfig) -> tuple[LoadedKernel, Launcher]:
    return _kernel(wgrad_source(cfg), cw.WGRAD_PARAMS, cfg.smem_bytes, cfg)


def prep_kernel() -> tuple[LoadedKernel, Launcher]:
    return _kernel(prep_source(), cw.PREP_PARAMS, post_process=False)


def _stream(stream: Any) -> int:
    if stream is None:
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return int(getattr(stream, "ptr", stream))


def _num_sms() -> int:
    from .device import get_num_sms

    return get_num_sms()


def _check(x: Any, name: str, dtype: str, ndim: int) -> None:
    if str(x.dtype) != dtype or x.ndim != ndim:
        raise TypeError(f"{name}: expected a {ndim}-D {dtype} array, got {x.dtype} {x.shape}")
    if x.strides[-1] != x.itemsize or any(s % 16 for s in x.strides[:-1]) or x.data.ptr % 16:
        raise ValueError(f"{name}: unit inner stride, 16-byte aligned base and outer strides (TMA), got strides "
                         f"{x.strides}")


def wgrad_fp8_fp8_fp32_nt(a: Any, sfa: Any, b: Any, sfb: Any, d: Any, *, cfg: cw.WgradConfig | None = None,
                          stream: Any = None) -> cw.WgradConfig | None:
    """``d += A . B^T`` with 1x128 scales on both operands (CuPy arrays).

    ``a`` uint8 (e4m3 bits) [M, K], ``b`` [N, K] (K-major); ``sfa`` float32 [ceil(K/128), >= M] and ``sfb``
    [ceil(K/128), >= N] (M-/N-major); ``d`` float32 [M, N] (any row stride that is a multiple of 4 elements),
    accumulated in place. Returns the config launched (None when there is nothing to do)."""
    _check(a, "a", "uint8", 2), _check(b, "b", "uint8", 2), _check(sfa, "sfa", "float32", 2)
    _check(sfb, "sfb", "float32", 2), _check(d, "d", "float32", 2)
    m, k = a.shape
    n = b.shape[0]
    kb = -(-k // cw.BLOCK_K)
    if b.shape[1] != k or d.shape != (m, n) or sfa.shape[0] != kb or sfa.shape[1] < m or sfb.shape[0] != kb or \
            sfb.shape[1] < n:
        raise ValueError(f"shapes: a {a.shape}, sfa {sfa.shape}, b {b.shape}, sfb {sfb.shape}, d {d.shape}")
    if k % 16:
        raise ValueError(f"K must be a multiple of 16, got {k}")
    if m == 0 or n == 0 or k == 0:
        return None
    cfg = cfg or cw.choose_wgrad_config(cw.KIND_WGRAD, m, n, k, 1, _num_sms())
    if cfg.kind != cw.KIND_WGRAD or cfg.shape_n != n or cfg.shape_k != k:
        raise ValueError(f"config {cfg.describe()} is not for N={n}, K={k}")
    specs = cw.tma_specs(cfg, m, lda=a.strides[0], ldb=b.strides[0], sfa_ld=sfa.strides[0] // 4,
                         sfb_ld=sfb.strides[0] // 4, ld_d=d.strides[0] // 4)
    maps = tuple(s.encode(x.data.ptr) for s, x in zip(specs, (a, b, sfa, sfb, d)))
    kernel, launcher = gemm_kernel(cfg)
    params = launcher.pack(maps + (0, m, 1))
    launcher.launch(params, cw.grid(cfg, kernel.max_clusters), cfg.threads, cfg.smem_bytes, _stream(stream))
    return cfg


def k_grouped_wgrad_fp8_fp8_fp32_nt(a: Any, sfa: Any, b: Any, sfb: Any, d: Any, batch_sizes: Any, *,
                                    workspace: Any = None, expected_k: int = 4096,
                                    cfg: cw.WgradConfig | None = None, stream: Any = None) -> Any:
    """``d[g] += A_g . B_g^T`` for the G groups whose K (tokens) ``batch_sizes`` (int32 [G], on the GPU) holds.

    ``a`` flat uint8: group g's [M, k_g] at byte ``M * sum_{h<g} k_h``; ``b`` likewise with N; ``sfa`` float32
    [rows, >= M] and ``sfb`` [rows, >= N] (group g's K blocks from row ``sum_{h<g} ceil(k_h/128)``); ``d`` float32
    [G, M, N] (strided rows and groups allowed, multiples of 4 elements). Groups with k_g = 0 leave d[g] untouched;
    k_g must be multiples of 16 that fit the operands (others are skipped and counted, :func:`workspace_header`).

    ``workspace``: uint8 of at least ``contract_wgrad.workspace_bytes(G)`` (allocated when None; pass one for CUDA
    graph capture, and use one per stream). ``expected_k`` only picks the config. Returns the workspace."""
    import cupy

    _check(sfa, "sfa", "float32", 2), _check(sfb, "sfb", "float32", 2), _check(d, "d", "float32", 3)
    for x, name in ((a, "a"), (b, "b")):
        if str(x.dtype) != "uint8" or not x.flags.c_contiguous or x.data.ptr % 16:
            raise ValueError(f"{name}: a contiguous, 16-byte aligned uint8 buffer")
    if str(batch_sizes.dtype) != "int32" or batch_sizes.ndim != 1:
        raise TypeError(f"batch_sizes: int32 [G], got {batch_sizes.dtype} {batch_sizes.shape}")
    g, m, n = d.shape
    if batch_sizes.shape[0] != g or sfa.shape[1] < m or sfb.shape[1] < n:
        raise ValueError(f"shapes: d {d.shape}, batch_sizes {batch_sizes.shape}, sfa {sfa.shape}, sfb {sfb.shape}")
    if g == 0 or m == 0 or n == 0:
        return workspace
    nbytes = cw.workspace_bytes(g)
    if workspace is None:
        workspace = cupy.empty(nbytes, dtype=cupy.uint8)
    if workspace.nbytes < nbytes or workspace.data.ptr % cw.WORKSPACE_ALIGN:
        raise ValueError(f"workspace: at least {nbytes} bytes, {cw.WORKSPACE_ALIGN}-byte aligned")
    cfg = cfg or cw.choose_wgrad_config(cw.KIND_K_GROUPED, m, n, expected_k, g, _num_sms())
    if cfg.kind != cw.KIND_K_GROUPED or cfg.shape_m != m or cfg.shape_n != n:
        raise ValueError(f"config {cfg.describe()} is not for M={m}, N={n}")
    specs = cw.tma_specs(cfg, m, sfa_ld=sfa.strides[0] // 4, sfb_ld=sfb.strides[0] // 4, ld_d=d.strides[1] // 4,
                         d_group_stride=d.strides[0] // 4, num_groups=g, sfa_rows=sfa.shape[0],
                         sfb_rows=sfb.shape[0])
    maps = tuple(s.encode(x.data.ptr) for s, x in zip(specs, (a, b, sfa, sfb, d)))
    k_capacity = min(a.nbytes // m, b.nbytes // n, 2**32 - 1)
    scale_rows = min(sfa.shape[0], sfb.shape[0])
    s = _stream(stream)
    _, prep = prep_kernel()
    prep.launch(prep.pack((maps[0], maps[1], batch_sizes.data.ptr, a.data.ptr, b.data.ptr, workspace.data.ptr, g, m,
                           n, k_capacity, scale_rows)), cw.prep_grid(g), cw.PREP_THREADS, 0, s)
    kernel, launcher = gemm_kernel(cfg)
    launcher.launch(launcher.pack(maps + (workspace.data.ptr, m, g)), cw.grid(cfg, kernel.max_clusters), cfg.threads,
                    cfg.smem_bytes, s)
    return workspace


def workspace_header(workspace: Any) -> tuple[int, int]:
    """(groups with work, groups skipped as invalid) of the last prep kernel that wrote ``workspace`` (synchronizes
    with the device)."""
    head = workspace[:8].view("uint32").get()
    return int(head[0]), int(head[1])
