"""Differentiable FP8 layers for torch: the DeepSeek-V3 recipe's three GEMMs behind ``torch.autograd.Function``.

``y = x @ W^T`` (x [..., K], W [N, K]) runs, per step (``/shared/docs/training-notes.md``):

* forward: one pass over x casts it row-wise (1x128 along K, the forward GEMM's A) and transposed (1x128 along the
  tokens, the weight gradient's B); one pass over W casts it 128x128 with its transpose (W for the forward, W^T for
  the data gradient); ``y = gemm_fp8_fp8_bf16_nt(x, W)`` in BF16.
* backward: one pass over dy casts it both ways; ``dX = dY @ W`` (the NT kernel on W^T) and
  ``dW += dY^T @ X`` (:func:`cupygemm.wgrad_gemm_fp8_fp8_fp32_nt`, FP32, accumulated in place).

Only the FP8 copies the backward reads (x^T and W^T, about half of x's and W's BF16 bytes) are saved;
``recompute_casts=True`` saves x and W instead and casts them again in the backward (bit for bit the same copies).
The token count is padded with zero rows to a multiple of 16 where the weight gradient needs it (its K), and y and
dX are sliced back.

**Gradient accumulation without an add.** With an FP32 (master) weight that is a leaf, the weight-gradient kernel
adds straight into ``weight.grad`` (or, where it is None, stores dW as it: no zeros written first) and the Function
returns no gradient for the weight, as Megatron's gradient-accumulation fusion does: micro-batches accumulate with no extra kernel and no dW
temporary. ``accumulate_into_grad`` states it: None (default) means "when the weight is an FP32 leaf", False returns
dW to autograd (which adds it with its own kernel), True demands it (ValueError for other weights). What follows
from it, like Megatron's:

* autograd receives no gradient for the weight: tensor hooks (``weight.register_hook``) are called with None;
  ``register_post_accumulate_grad_hook`` hooks still run, after the kernel's add, and see the accumulated
  ``weight.grad``. DistributedDataParallel's reducer has not been tried with it: pass
  ``accumulate_into_grad=False`` there, or reduce ``weight.grad`` yourself after the backward. ``weight.grad``
  should be a dense, contiguous FP32 tensor when it exists (otherwise the layer adds a temporary into it).
* CUDA graphs: if ``weight.grad`` exists at capture, every replay adds into that tensor (zero it where you want,
  e.g. ``optimizer.zero_grad(set_to_none=False)`` inside or outside the graph); if it is None at capture (torch's
  whole-network recipe sets grads to None before capture), it is allocated from the graph's pool and stored by
  the graph itself, so each replay leaves that step's gradient there, which is what torch's own
  ``AccumulateGrad`` does in that recipe. Either way, do not set the grads to None between replays: the graph keeps
  writing the captured tensor.
* ``torch.compile``: :func:`fp8_linear` and :func:`fp8_grouped_linear` are opaque to Dynamo (a graph break around
  each call: the layer runs eagerly, its operators and Python included, and the rest of the model is compiled
  around it), because a compiled backward cannot write into ``weight.grad``. ``fullgraph=True`` therefore fails on
  a model containing them; the operators themselves (``torch.ops.cupygemm.*``) trace under fullgraph.

**MoE** (:func:`fp8_grouped_linear`): x [T, K] holds each expert's tokens as consecutive rows, the m-grouped
contiguous layout: group g's ``group_sizes[g]`` rows (a multiple of 128: pad each expert with zero rows) follow
group g-1's; rows past the sum are padding (y and dX zero there). Weights [G, N, K]. Forward and data gradient run
the m-grouped contiguous GEMM (row group ids derived on the device from ``group_sizes``); the weight gradient is one
launch of :func:`cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns` on the transposed casts of dy and x, whose
groups are consecutive column ranges. ``group_sizes`` as an int32 CUDA tensor never reaches the host: the step is
capturable in a CUDA graph with sizes that change between replays (a host list is checked and copied each call).

Double backward is not supported (the backward is ``once_differentiable``).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from .. import layer_shapes

_ops = torch.ops.cupygemm
#: The grouped weight gradient over column ranges (the kind ``k_grouped_wgrad_columns``).
COLUMNS_WGRAD_OP = "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns_out"
_IN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_dtype(t: torch.Tensor, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _IN_DTYPES:
        raise TypeError(f"{name}: expected bfloat16, float16 or float32, got {t.dtype}")


def _accumulates(weight: torch.Tensor, accumulate_into_grad: bool | None) -> bool:
    """Whether the weight gradient goes straight into ``weight.grad`` (see the module's docstring)."""
    fits = weight.dtype == torch.float32 and weight.is_leaf and weight.requires_grad
    if accumulate_into_grad is None:
        return fits
    if accumulate_into_grad and not fits:
        raise ValueError("accumulate_into_grad=True: the weight must be a float32 leaf tensor that requires grad "
                         f"(the master weight whose .grad receives dW), got dtype {weight.dtype}, "
                         f"is_leaf={weight.is_leaf}, requires_grad={weight.requires_grad}")
    return bool(accumulate_into_grad)


def _rows(x2d: torch.Tensor, rows: int) -> torch.Tensor:
    """x2d with unit inner stride (what the casts read), padded with zero rows to ``rows``."""
    if x2d.stride(-1) != 1 or x2d.stride(0) < x2d.shape[1]:
        x2d = x2d.contiguous()
    if rows == x2d.shape[0]:
        return x2d
    return torch.nn.functional.pad(x2d, (0, 0, 0, rows - x2d.shape[0]))


def _cast_tokens(t: torch.Tensor, rowwise: bool, columns: bool) -> tuple[Any, ...]:
    """(q_t, s_t, q, s) of t [T, d]: the 1x128 cast of t^T (along tokens) and/or of t; the ones not asked for are
    None. Both come from one pass. s_t comes in the M-major layout the weight-gradient kernels read in place."""
    if rowwise and columns:
        return _ops.per_token_cast_to_fp8_transposed_rowwise.default(t, True)
    if columns:
        return (*_ops.per_token_cast_to_fp8_transposed.default(t, True), None, None)
    return (None, None, *_ops.per_token_cast_to_fp8.default(t))


def _usable_grad(g: torch.Tensor) -> bool:
    """Whether the kernel can add into ``weight.grad`` in place: dense, contiguous, FP32, 16-byte aligned."""
    return g.dtype == torch.float32 and g.layout == torch.strided and g.is_contiguous() and g.data_ptr() % 16 == 0


def _weight_grad(weight: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                 accumulate: bool, add: Any, store: Any = None) -> torch.Tensor | None:
    """The weight gradient: ``add(out)`` runs the GEMM adding into ``out``; ``store()`` (where the kind has one)
    returns it in a new FP32 array, with no zeros written first. Accumulating: added into ``weight.grad`` (or stored
    as it, when there is none yet) and None returned; else returned as ``dtype``."""
    def fresh() -> torch.Tensor:
        if store is not None:
            return store()
        out = torch.zeros(shape, dtype=torch.float32, device=device)
        add(out)
        return out

    if accumulate:
        g = weight.grad
        if g is None:
            weight.grad = fresh()
        elif _usable_grad(g):
            add(g)
        else:
            g.add_(fresh())
        return None
    out = fresh()
    return out if dtype == torch.float32 else out.to(dtype)


# ---- dense ------------------------------------------------------------------------------------------------------

class _FP8LinearFunction(torch.autograd.Function):
    """y = x @ W^T; see :func:`fp8_linear`."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, accumulate: bool, recompute: bool) -> torch.Tensor:
        tokens, k, n = layer_shapes.linear_dims(x.shape, weight.shape)
        rows = layer_shapes.padded_tokens(tokens)
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        x2d = _rows(x if x.dim() == 2 else x.reshape(tokens, k), rows)
        xq_t, xs_t, xq, xs = _cast_tokens(x2d, True, need_dw and not recompute)
        w = weight if weight.is_contiguous() else weight.contiguous()
        if need_dx and not recompute:
            wq, ws, wq_t, ws_t = _ops.per_block_cast_to_fp8_with_transpose.default(w)
        else:
            (wq, ws), wq_t, ws_t = _ops.per_block_cast_to_fp8.default(w), None, None
        y = _ops.gemm_fp8_fp8_bf16_nt.default(xq, xs, wq, ws)
        ctx.dims = (tokens, rows, k, n)
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x.shape, x.dtype, weight.dtype
        ctx.accumulate, ctx.recompute = accumulate, recompute
        if recompute:
            ctx.save_for_backward(x2d if need_dw else None, weight)
        else:
            ctx.save_for_backward(xq_t, xs_t, wq_t, ws_t, weight if accumulate else None)
        y = y if rows == tokens else y[:tokens]
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], n)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        tokens, rows, k, n = ctx.dims
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if ctx.recompute:
            x2d, weight = ctx.saved_tensors
            xq_t = xs_t = wq_t = ws_t = None
            if need_dw:
                xq_t, xs_t = _ops.per_token_cast_to_fp8_transposed.default(x2d, True)
            if need_dx:
                w = weight if weight.is_contiguous() else weight.contiguous()
                _, _, wq_t, ws_t = _ops.per_block_cast_to_fp8_with_transpose.default(w)
        else:
            xq_t, xs_t, wq_t, ws_t, weight = ctx.saved_tensors
        dyq_t, dys_t, dyq, dys = _cast_tokens(_rows(dy if dy.dim() == 2 else dy.reshape(tokens, n), rows), need_dx,
                                              need_dw)
        dx = dw = None
        if need_dx:
            dx = _ops.gemm_fp8_fp8_bf16_nt.default(dyq, dys, wq_t, ws_t)
            dx = dx if rows == tokens else dx[:tokens]
            dx = dx if len(ctx.x_shape) == 2 else dx.reshape(ctx.x_shape)
            dx = dx if ctx.x_dtype == torch.bfloat16 else dx.to(ctx.x_dtype)
        if need_dw:
            def add(out: torch.Tensor) -> None:
                _ops.wgrad_gemm_fp8_fp8_fp32_nt_out.default(dyq_t, dys_t, xq_t, xs_t, out)

            def store() -> torch.Tensor:
                return _ops.wgrad_gemm_fp8_fp8_fp32_nt_store.default(dyq_t, dys_t, xq_t, xs_t)

            dw = _weight_grad(weight, (n, k), ctx.w_dtype, dy.device, ctx.accumulate, add, store)
        return dx, dw, None, None


# Opaque to Dynamo (see the module docstring) without importing it with this module: torch.compiler.disable imports
# torch._dynamo (with DTensor and FSDP), which took `import cupygemm.torch` from 0.4 to 2.0 s on the developer
# machine and to 5.5 s on an H200 host; torch's lazy form imports it at the first call.
_opaque_to_dynamo = getattr(torch, "_disable_dynamo", None) or torch.compiler.disable


@_opaque_to_dynamo
def fp8_linear(x: torch.Tensor, weight: torch.Tensor, *, accumulate_into_grad: bool | None = None,
               recompute_casts: bool = False) -> torch.Tensor:
    """``y = x @ weight.T`` in FP8 with DeepSeek-V3 scaling (x 1x128, W 128x128), BF16 result, differentiable.

    Args:
        x: [..., K] bfloat16 (float16 and float32 are cast the same way), CUDA. dX comes back in x's dtype.
        weight: [N, K] float32 (a master weight) or bfloat16, same device. K and N multiples of 16.
        accumulate_into_grad: add dW straight into ``weight.grad`` and give autograd none (None: when ``weight`` is
            a float32 leaf). See :mod:`cupygemm.torch.layers` for what that implies (hooks, DDP, CUDA graphs).
        recompute_casts: save x and W for the backward and cast them again there, instead of saving their FP8
            transposed copies.

    Returns y [..., N] bfloat16. The backward computes dX = dY @ W and dW = dY^T @ X in FP8 (dy cast 1x128 both
    ways in one pass), FP32 accumulation; results are bitwise repeatable.
    """
    _check_dtype(x, "x")
    _check_dtype(weight, "weight")
    layer_shapes.linear_dims(x.shape, weight.shape)
    accumulate = _accumulates(weight, accumulate_into_grad)
    return _FP8LinearFunction.apply(x, weight, accumulate, bool(recompute_casts))


# ---- grouped (MoE) ----------------------------------------------------------------------------------------------

def m_indices_from_group_sizes(group_sizes: torch.Tensor, rows: int) -> torch.Tensor:
    """The m-grouped contiguous layout's row -> group map (int32 [rows], -1 past the groups) from the groups' row
    counts, on the device without a host synchronization (so a CUDA graph may replay it with new sizes)."""
    ends = torch.cumsum(group_sizes, 0, dtype=torch.int32)
    row = torch.arange(rows, dtype=torch.int32, device=group_sizes.device)
    idx = torch.searchsorted(ends, row, right=True, out_int32=True)
    return idx.masked_fill_(idx >= group_sizes.shape[0], -1)


def _expert_weights(weight: torch.Tensor, need_t: bool) -> tuple[Any, ...]:
    """[G, N, K] cast 128x128 per expert (as one [G*N, K] matrix: N % 128 == 0 keeps blocks inside an expert):
    (wq [G, N, K], ws [G, N/128, kb], and when ``need_t`` wq_t [G, K, N], ws_t [G, kb, N/128], else None)."""
    g, n, k = weight.shape
    w = weight.reshape(g * n, k)
    w = w if w.is_contiguous() else w.contiguous()
    if not need_t:
        wq, ws = _ops.per_block_cast_to_fp8.default(w)
        return wq.view(g, n, k), ws.view(g, n // 128, -1), None, None
    wq, ws, wq_t, _ = _ops.per_block_cast_to_fp8_with_transpose.default(w)
    ws = ws.view(g, n // 128, -1)
    # The cast's W^T is [K, G*N]: expert g's W_g^T is its column range; the GEMM reads [G, K, N] groups.
    wq_t = wq_t.view(k, g, n).permute(1, 0, 2).contiguous()
    return wq.view(g, n, k), ws, wq_t, ws.transpose(1, 2).contiguous()


class _FP8GroupedLinearFunction(torch.autograd.Function):
    """y[rows of group g] = x[rows of g] @ W[g]^T; see :func:`fp8_grouped_linear`."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, group_sizes: torch.Tensor, accumulate: bool,
                recompute: bool) -> torch.Tensor:
        tokens, g, k, n = layer_shapes.grouped_linear_dims(x.shape, weight.shape, group_sizes.shape[0])
        rows = layer_shapes.padded_tokens(tokens)
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        x2d = _rows(x, rows)
        m_indices = m_indices_from_group_sizes(group_sizes, rows)
        xq_t, xs_t, xq, xs = _cast_tokens(x2d, True, need_dw and not recompute)
        wq, ws, wq_t, ws_t = _expert_weights(weight, need_dx and not recompute)
        y = _ops.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous.default(xq, xs, wq, ws, m_indices)
        ctx.dims = (tokens, rows, g, k, n)
        ctx.x_dtype, ctx.w_dtype = x.dtype, weight.dtype
        ctx.accumulate, ctx.recompute = accumulate, recompute
        if recompute:
            ctx.save_for_backward(group_sizes, m_indices, x2d if need_dw else None, weight)
        else:
            ctx.save_for_backward(group_sizes, m_indices, xq_t, xs_t, wq_t, ws_t, weight if accumulate else None)
        return y[:tokens]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        tokens, rows, g, k, n = ctx.dims
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if ctx.recompute:
            group_sizes, m_indices, x2d, weight = ctx.saved_tensors
            xq_t = xs_t = wq_t = ws_t = None
            if need_dw:
                xq_t, xs_t = _ops.per_token_cast_to_fp8_transposed.default(x2d, True)
            if need_dx:
                _, _, wq_t, ws_t = _expert_weights(weight, True)
        else:
            group_sizes, m_indices, xq_t, xs_t, wq_t, ws_t, weight = ctx.saved_tensors
        dyq_t, dys_t, dyq, dys = _cast_tokens(_rows(dy, rows), need_dx, need_dw)
        dx = dw = None
        if need_dx:
            dx = _ops.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous.default(dyq, dys, wq_t, ws_t, m_indices)[:tokens]
            dx = dx if ctx.x_dtype == torch.bfloat16 else dx.to(ctx.x_dtype)
        if need_dw:
            columns = getattr(_ops, COLUMNS_WGRAD_OP).default

            def run(out: torch.Tensor) -> None:
                columns(dyq_t, dys_t, xq_t, xs_t, group_sizes, out)

            dw = _weight_grad(weight, (g, n, k), ctx.w_dtype, dy.device, ctx.accumulate, run)
        return dx, dw, None, None, None


def _device_group_sizes(group_sizes: Any, x: torch.Tensor, tokens: int) -> torch.Tensor:
    if isinstance(group_sizes, torch.Tensor):
        if group_sizes.dtype != torch.int32 or group_sizes.ndim != 1:
            raise TypeError(f"group_sizes: expected an int32 [G] tensor, got {group_sizes.dtype} of shape "
                            f"{tuple(group_sizes.shape)}")
        if group_sizes.device != x.device:
            raise ValueError(f"group_sizes: expected a tensor on {x.device} (x's device), got {group_sizes.device}")
        return group_sizes if group_sizes.is_contiguous() else group_sizes.contiguous()
    if isinstance(group_sizes, (list, tuple)):
        sizes = layer_shapes.check_group_sizes(group_sizes, tokens)
        return torch.tensor(sizes, dtype=torch.int32, device=x.device)
    raise TypeError(f"group_sizes: expected an int32 tensor or a list of ints, got {type(group_sizes).__name__}")


@_opaque_to_dynamo
def fp8_grouped_linear(x: torch.Tensor, weight: torch.Tensor, group_sizes: torch.Tensor | Sequence[int], *,
                       accumulate_into_grad: bool | None = None, recompute_casts: bool = False) -> torch.Tensor:
    """The MoE experts' ``y_g = x_g @ weight[g].T`` in FP8, one launch per GEMM, differentiable.

    Args:
        x: [T, K] bfloat16 (float16, float32 also cast), CUDA: group g's rows follow group g-1's (the m-grouped
            contiguous layout); rows past ``sum(group_sizes)`` are padding.
        weight: [G, N, K] float32 (master) or bfloat16. K a multiple of 16, N of 128.
        group_sizes: each group's row count, a non-negative multiple of 128 (pad each expert with zero rows),
            summing to at most T: an int32 [G] CUDA tensor (read on the device only: capturable, no host
            synchronization; values are not checked, see :func:`cupygemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_columns`
            and ``CUPYGEMM_CHECK_INPUTS=1``), or a host list (checked, copied to the device).
        accumulate_into_grad, recompute_casts: as for :func:`fp8_linear`.

    Returns y [T, N] bfloat16 (zero in padding rows; dX is zero there too).
    """
    _check_dtype(x, "x")
    _check_dtype(weight, "weight")
    n_sizes = group_sizes.shape[0] if isinstance(group_sizes, torch.Tensor) and group_sizes.ndim == 1 else (
        len(group_sizes) if isinstance(group_sizes, (list, tuple)) else -1)
    layer_shapes.grouped_linear_dims(x.shape, weight.shape, n_sizes)
    sizes = _device_group_sizes(group_sizes, x, x.shape[0])
    accumulate = _accumulates(weight, accumulate_into_grad)
    return _FP8GroupedLinearFunction.apply(x, weight, sizes, accumulate, bool(recompute_casts))


# ---- modules ----------------------------------------------------------------------------------------------------

class FP8Linear(torch.nn.Module):
    """``nn.Linear`` whose three GEMMs run in FP8 (:func:`fp8_linear`), with an FP32 master weight by default.

    Args:
        in_features, out_features: K and N, multiples of 16.
        bias: add a bias (kept in ``dtype``, added to the BF16 result in BF16).
        device, dtype: of the parameters (float32 master weights by default; bfloat16 also works).
        accumulate_into_grad, recompute_casts: as for :func:`fp8_linear`.

    Initialized like ``nn.Linear``. The output is bfloat16.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, *, device: Any = None,
                 dtype: torch.dtype = torch.float32, accumulate_into_grad: bool | None = None,
                 recompute_casts: bool = False) -> None:
        super().__init__()
        layer_shapes.linear_dims((in_features,), (out_features, in_features), "in_features", "FP8Linear")
        self.in_features, self.out_features = in_features, out_features
        self.accumulate_into_grad, self.recompute_casts = accumulate_into_grad, recompute_casts
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = fp8_linear(x, self.weight, accumulate_into_grad=self.accumulate_into_grad,
                       recompute_casts=self.recompute_casts)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class FP8GroupedLinear(torch.nn.Module):
    """The experts of an MoE layer: ``num_groups`` weights [N, K] in one parameter [G, N, K], applied to the
    m-grouped contiguous layout (:func:`fp8_grouped_linear`). ``forward(x, group_sizes)``.

    Args:
        num_groups, in_features, out_features: G, K (a multiple of 16) and N (a multiple of 128).
        device, dtype: of the weight (float32 master by default).
        accumulate_into_grad, recompute_casts: as for :func:`fp8_linear`.

    Each expert is initialized like ``nn.Linear``. The output is bfloat16.
    """

    def __init__(self, num_groups: int, in_features: int, out_features: int, *, device: Any = None,
                 dtype: torch.dtype = torch.float32, accumulate_into_grad: bool | None = None,
                 recompute_casts: bool = False) -> None:
        super().__init__()
        layer_shapes.grouped_linear_dims((0, in_features), (num_groups, out_features, in_features), num_groups,
                                         "in_features", "FP8GroupedLinear")
        self.num_groups, self.in_features, self.out_features = num_groups, in_features, out_features
        self.accumulate_into_grad, self.recompute_casts = accumulate_into_grad, recompute_casts
        self.weight = torch.nn.Parameter(torch.empty(num_groups, out_features, in_features, device=device,
                                                     dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w in self.weight.data:
            torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))

    def forward(self, x: torch.Tensor, group_sizes: torch.Tensor | Sequence[int]) -> torch.Tensor:
        return fp8_grouped_linear(x, self.weight, group_sizes, accumulate_into_grad=self.accumulate_into_grad,
                                  recompute_casts=self.recompute_casts)

    def extra_repr(self) -> str:
        return f"num_groups={self.num_groups}, in_features={self.in_features}, out_features={self.out_features}"


__all__ = ["fp8_linear", "fp8_grouped_linear", "FP8Linear", "FP8GroupedLinear", "m_indices_from_group_sizes"]
