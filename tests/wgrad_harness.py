"""The wgrad kernels launched on CuPy arrays with a chosen or forced config, through the package's own plans
(:func:`cupygemm.plan_wgrad.plan_config`): what the kernel tests use to reach configs the chooser would not pick.
The public entry points (``cupygemm.wgrad_gemm_fp8_fp8_fp32_nt``, ``k_grouped_wgrad_gemm_fp8_fp8_fp32_nt``) take
the same path with the chooser's config.

* :func:`wgrad_fp8_fp8_fp32_nt`: ``d[M, N] += A . B^T`` (one launch);
* :func:`k_grouped_wgrad_fp8_fp8_fp32_nt`: ``d[g] += A_g . B_g^T`` for the group sizes in ``batch_sizes`` on the
  device (the prep kernel, then the GEMM, both on the stream).
"""
from __future__ import annotations

from typing import Any

from cupygemm import contract_wgrad as cw
from cupygemm.jit.build import build_cubin
from cupygemm.kinds.training import K_GROUPED_WGRAD, WGRAD
from cupygemm.plan_wgrad import plan_config, prep_source, wgrad_source

__all__ = ["compile_wgrad", "compile_prep", "wgrad_source", "prep_source", "wgrad_fp8_fp8_fp32_nt",
           "k_grouped_wgrad_fp8_fp8_fp32_nt", "workspace_header"]


def compile_wgrad(cfg: cw.WgradConfig) -> bytes:
    """The sm_90a cubin of ``cfg``'s GEMM kernel (cache or NVRTC; no GPU needed)."""
    return build_cubin(wgrad_source(cfg), config=cfg)[1]


def compile_prep() -> bytes:
    return build_cubin(prep_source(), post_process=False)[1]


def _stream(stream: Any) -> int:
    import cupy

    return cupy.cuda.get_current_stream().ptr if stream is None else int(getattr(stream, "ptr", stream))


def _num_sms() -> int:
    from cupygemm.device import get_num_sms

    return get_num_sms()


def _check(x: Any, name: str, dtype: str, ndim: int) -> None:
    if str(x.dtype) != dtype or x.ndim != ndim:
        raise TypeError(f"{name}: expected a {ndim}-D {dtype} array, got {x.dtype} {x.shape}")
    if x.strides[-1] != x.itemsize or any(s % 16 for s in x.strides[:-1]) or x.data.ptr % 16:
        raise ValueError(f"{name}: unit inner stride, 16-byte aligned base and outer strides (TMA), got strides "
                         f"{x.strides}")


def wgrad_fp8_fp8_fp32_nt(a: Any, sfa: Any, b: Any, sfb: Any, d: Any, *, cfg: cw.WgradConfig | None = None,
                          stream: Any = None) -> cw.WgradConfig | None:
    """``d += A . B^T``: ``a`` uint8 (e4m3 bits) [M, K], ``b`` [N, K]; ``sfa`` float32 [ceil(K/128), >= M] and ``sfb``
    [ceil(K/128), >= N] (M-/N-major); ``d`` float32 [M, N]. Returns the config launched (None: nothing to do)."""
    import cupy

    _check(a, "a", "uint8", 2), _check(b, "b", "uint8", 2), _check(sfa, "sfa", "float32", 2)
    _check(sfb, "sfb", "float32", 2), _check(d, "d", "float32", 2)
    m, k = a.shape
    n = b.shape[0]
    kb = -(-k // cw.BLOCK_K)
    if b.shape[1] != k or d.shape != (m, n) or sfa.shape[0] != kb or sfa.shape[1] < m or sfb.shape[0] != kb or \
            sfb.shape[1] < n:
        raise ValueError(f"shapes: a {a.shape}, sfa {sfa.shape}, b {b.shape}, sfb {sfb.shape}, d {d.shape}")
    if m == 0 or n == 0 or k == 0:
        return None
    cfg = cfg or cw.choose_wgrad_config(cw.KIND_WGRAD, m, n, k, 1, _num_sms())
    if cfg.kind != cw.KIND_WGRAD or cfg.shape_n != n or cfg.shape_k != k:
        raise ValueError(f"config {cfg.describe()} is not for N={n}, K={k}")
    dev = cupy.cuda.runtime.getDevice()
    plan = plan_config(WGRAD, cfg, m, n, k, 1, dev, a.strides[0], b.strides[0], d.strides, sfa.strides[0] // 4,
                       sfb.strides[0] // 4, kb)
    plan.launch(_stream(stream), a.data.ptr, sfa.data.ptr, b.data.ptr, sfb.data.ptr, d.data.ptr)
    return cfg


def k_grouped_wgrad_fp8_fp8_fp32_nt(a: Any, sfa: Any, b: Any, sfb: Any, d: Any, batch_sizes: Any, *,
                                    workspace: Any = None, expected_k: int = 4096,
                                    cfg: cw.WgradConfig | None = None, stream: Any = None) -> Any:
    """``d[g] += A_g . B_g^T`` for the G groups whose K ``batch_sizes`` (int32 [G], on the GPU) holds; ``a``/``b``
    flat uint8, ``sfa`` float32 [rows, >= M], ``sfb`` [rows, >= N] (stacked), ``d`` float32 [G, M, N] (strided rows
    and groups allowed). ``workspace``: uint8 of at least ``contract_wgrad.workspace_bytes(G)`` (allocated when
    None). ``expected_k`` only picks the config. Returns the workspace."""
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
    if sfa.shape[0] != sfb.shape[0]:
        raise ValueError(f"sfa and sfb: the same stacked rows, got {sfa.shape[0]} and {sfb.shape[0]}")
    k_capacity = min(a.nbytes // m, b.nbytes // n)
    dev = cupy.cuda.runtime.getDevice()
    plan = plan_config(K_GROUPED_WGRAD, cfg, m, n, k_capacity, g, dev, 0, 0, d.strides, sfa.strides[0] // 4,
                       sfb.strides[0] // 4, min(sfa.shape[0], sfb.shape[0]))
    plan.launch(_stream(stream), a.data.ptr, sfa.data.ptr, b.data.ptr, sfb.data.ptr, d.data.ptr,
                batch_sizes.data.ptr, workspace.data.ptr)
    return workspace


def workspace_header(workspace: Any) -> tuple[int, int]:
    """(groups with work, groups skipped as invalid) of the last prep kernel that wrote ``workspace`` (synchronizes
    with the device)."""
    head = workspace[:8].view("uint32").get()
    return int(head[0]), int(head[1])
