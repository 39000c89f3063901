"""The FP8 layers' autograd plumbing on the CPU (cupygemm.torch.layers over tests/torch_cpu_ops.py's CPU kernels of
the operators): shapes, padding, transposed operands, gradient accumulation into weight.grad, recomputed casts,
torch.compile. Needs torch (skipped where it is not installed); the GPU kernels are tests/test_layers_torch_gpu.py's.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cupygemm import calc_diff  # noqa: E402
from cupygemm.torch import FP8GroupedLinear, FP8Linear, fp8_grouped_linear, fp8_linear  # noqa: E402
from cupygemm.torch.layers import m_indices_from_group_sizes  # noqa: E402

import torch_cpu_ops as cpu_kernels  # noqa: E402
from torch_cpu_ops import cpu_ops  # noqa: E402

TOL = 2e-3  # calc_diff against the unquantized float64 product: three FP8 operands per GEMM


@pytest.fixture(autouse=True)
def _cpu_kernels():
    with cpu_ops():
        yield


def _diff(a, b) -> float:
    return calc_diff(a.detach().double().numpy(), b.detach().double().numpy())


def _reference(x, w, dy):
    """(y, dX, dW) in float64 of the unquantized operands."""
    xr = x.detach().double().requires_grad_()
    wr = w.detach().double().requires_grad_()
    y = xr @ wr.T
    y.backward(dy.double())
    return y, xr.grad, wr.grad


@pytest.mark.parametrize("x_shape", [(2, 37, 256), (64, 256), (16, 256)])
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16])
def test_dense_matches_float64(x_shape, w_dtype):
    torch.manual_seed(0)
    x = torch.randn(x_shape, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(384, 256, dtype=w_dtype, requires_grad=True)
    y = fp8_linear(x, w)
    assert y.dtype == torch.bfloat16 and y.shape == (*x_shape[:-1], 384)
    dy = torch.randn(y.shape, dtype=torch.bfloat16)
    y.backward(dy)
    ry, rdx, rdw = _reference(x, w, dy)
    assert x.grad.dtype == torch.bfloat16 and w.grad.dtype == w_dtype
    for got, want in ((y, ry), (x.grad, rdx), (w.grad, rdw)):
        assert _diff(got, want) < TOL


def test_fp32_weight_accumulates_into_grad_with_no_autograd_add():
    """Two micro-batches: weight.grad is the one tensor allocated by the first, holds exactly the sum of the
    micro-batches' dW (as autograd's own accumulation of returned dWs gives it), and autograd received no gradient
    for the weight (a tensor hook sees every gradient autograd would accumulate; here it sees None): the kernel's
    in-place add was the only one."""
    torch.manual_seed(1)
    xs = [torch.randn(48, 256, dtype=torch.bfloat16) for _ in range(2)]
    dys = [torch.randn(48, 128, dtype=torch.bfloat16) for _ in range(2)]
    w0 = torch.randn(128, 256)
    fused, plain = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    hooks = {"fused": 0, "plain": 0}
    fused.register_hook(lambda g: hooks.__setitem__("fused", hooks["fused"] + (g is not None)))
    plain.register_hook(lambda g: hooks.__setitem__("plain", hooks["plain"] + (g is not None)))
    ptrs = []
    for x, dy in zip(xs, dys):
        fp8_linear(x, fused).backward(dy)
        fp8_linear(x, plain, accumulate_into_grad=False).backward(dy)
        ptrs.append(fused.grad.data_ptr())
    assert hooks == {"fused": 0, "plain": 2}
    assert ptrs[0] == ptrs[1] and fused.grad.dtype == torch.float32
    assert torch.equal(fused.grad, plain.grad)
    singles = []
    for x, dy in zip(xs, dys):
        w = w0.clone().requires_grad_()
        fp8_linear(x, w).backward(dy)
        singles.append(w.grad)
    assert torch.equal(fused.grad, singles[0] + singles[1])


def test_accumulation_adds_into_an_existing_grad_and_falls_back_for_a_strided_one():
    torch.manual_seed(2)
    x, dy = torch.randn(32, 256, dtype=torch.bfloat16), torch.randn(32, 128, dtype=torch.bfloat16)
    ref = torch.randn(128, 256, requires_grad=True)
    fp8_linear(x, ref).backward(dy)
    for grad in (torch.ones(128, 256), torch.ones(256, 128).T):  # the second: not contiguous
        w = ref.detach().clone().requires_grad_()
        w.grad = grad
        fp8_linear(x, w).backward(dy)
        assert w.grad is grad
        assert torch.equal(w.grad, 1 + ref.grad)


def test_accumulate_flag_is_checked():
    x = torch.randn(16, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"accumulate_into_grad=True: the weight must be a float32 leaf.*bfloat16"):
        fp8_linear(x, torch.randn(128, 256, dtype=torch.bfloat16, requires_grad=True), accumulate_into_grad=True)
    leaf = torch.randn(128, 256, requires_grad=True)
    with pytest.raises(ValueError, match=r"is_leaf=False"):
        fp8_linear(x, leaf * 2, accumulate_into_grad=True)
    w = leaf * 2  # not a leaf: the default returns dW to autograd, which takes it to the leaf
    fp8_linear(x, w).backward(torch.ones(16, 128, dtype=torch.bfloat16))
    assert leaf.grad is not None and leaf.grad.abs().sum() > 0


@pytest.mark.parametrize("grouped", [False, True])
def test_recomputed_casts_give_the_same_bits(grouped):
    torch.manual_seed(3)
    x0 = torch.randn(272, 256, dtype=torch.bfloat16)
    w0 = torch.randn(2, 128, 256) if grouped else torch.randn(128, 256)
    dy = torch.randn(272, 128, dtype=torch.bfloat16)
    results = []
    for recompute in (False, True):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        if grouped:
            y = fp8_grouped_linear(x, w, [128, 128], recompute_casts=recompute)
        else:
            y = fp8_linear(x, w, recompute_casts=recompute)
        y.backward(dy)
        results.append((y, x.grad, w.grad))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_only_the_gradients_asked_for():
    torch.manual_seed(4)
    x = torch.randn(32, 256, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(128, 256)
    fp8_linear(x, w).sum().backward()  # a frozen weight: dX only
    assert x.grad is not None and w.grad is None
    x2 = x.detach()
    w.requires_grad_()
    fp8_linear(x2, w).sum().backward()  # dW only (dy = ones: an expanded, zero-stride gradient)
    _, _, rdw = _reference(x2, w, torch.ones(32, 128))
    assert _diff(w.grad, rdw) < TOL


def test_input_dtypes_and_dx_dtype():
    torch.manual_seed(5)
    w = torch.randn(128, 256, requires_grad=True)
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(16, 256, dtype=dtype, requires_grad=True)
        y = fp8_linear(x, w)
        y.backward(torch.ones_like(y))
        assert y.dtype == torch.bfloat16 and x.grad.dtype == dtype
    with pytest.raises(TypeError, match=r"x: expected bfloat16, float16 or float32, got torch.int32"):
        fp8_linear(torch.zeros(16, 256, dtype=torch.int32), w)
    with pytest.raises(ValueError, match=r"x: expected \[\.\.\., in_features = 256\]"):
        fp8_linear(torch.zeros(16, 128, dtype=torch.bfloat16), w)


def test_fp8_linear_module():
    torch.manual_seed(6)
    layer = FP8Linear(256, 128, bias=True)
    assert layer.weight.dtype == torch.float32 and layer.bias.shape == (128,)
    assert "in_features=256, out_features=128, bias=True" in repr(layer)
    x = torch.randn(4, 8, 256, dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    assert y.shape == (4, 8, 128) and y.dtype == torch.bfloat16
    y.float().square().mean().backward()
    assert layer.weight.grad.dtype == torch.float32 and layer.bias.grad is not None and x.grad is not None
    ref = torch.nn.functional.linear(x.detach().double(), layer.weight.detach().double(),
                                     layer.bias.detach().double())
    assert _diff(y, ref) < TOL
    with pytest.raises(ValueError, match=r"FP8Linear: out_features \(N\) must be a multiple of 16"):
        FP8Linear(256, 100)


def _step(model, x, dy):
    y = model(x)
    y.backward(dy)
    return y


def test_torch_compile_runs_the_layers_opaquely_and_matches_eager():
    """Dynamo graph-breaks around each layer call (compiling the rest); results are the eager ones bit for bit."""
    torch.manual_seed(7)
    torch._dynamo.reset()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = FP8Linear(256, 512), FP8Linear(512, 256)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(x)))

    eager, compiled = Block(), Block()
    compiled.load_state_dict(eager.state_dict())
    step = torch.compile(compiled, backend="aot_eager")
    for _ in range(2):
        x = torch.randn(64, 256, dtype=torch.bfloat16)
        dy = torch.randn(64, 256, dtype=torch.bfloat16)
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        ye, yc = _step(eager, xe, dy), _step(step, xc, dy)
        assert torch.equal(ye, yc) and torch.equal(xe.grad, xc.grad)
    for pe, pc in zip(eager.parameters(), compiled.parameters()):
        assert torch.equal(pe.grad, pc.grad)
    explained = torch._dynamo.explain(Block())(torch.randn(64, 256, dtype=torch.bfloat16))
    assert explained.graph_break_count >= 1
    assert all("fp8_linear" in r.reason for r in explained.break_reasons)  # the layer call, not marked traceable
    assert any("gelu" in g.code for g in explained.graphs)  # the model around the layers is compiled


def test_compiled_call_traces_with_dtensor_loaded_and_its_rules_not_registered(monkeypatch):
    """DTensor imported after ``cupygemm.torch`` (the rules then register at the first call that may see one), and
    that first call compiled with ``fullgraph=True``: it traces, and matches eager. Registering the rules was traced
    too and failed the compile (Dynamo cannot trace ``register_sharding``)."""
    pytest.importorskip("torch.distributed.tensor")
    import cupygemm
    from cupygemm.torch import sharding

    monkeypatch.setattr(sharding, "_registered", False)
    torch._dynamo.reset()

    def layer(x, b, sfb):
        a, sfa = cupygemm.per_token_cast_to_fp8(x)
        return torch.relu(cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), (b, sfb))) * 2

    x = torch.randn(64, 256, dtype=torch.bfloat16)
    b, sfb = cpu_kernels.per_block_cast_to_fp8(torch.randn(128, 256, dtype=torch.bfloat16))
    got = torch.compile(layer, fullgraph=True, backend="aot_eager")(x, b, sfb)
    assert not sharding._registered  # not under the trace
    want = cpu_kernels.gemm_fp8_fp8_bf16_nt(*cpu_kernels.per_token_cast_to_fp8(x), b, sfb)
    assert torch.equal(got, torch.relu(want) * 2)


# ---- grouped ----------------------------------------------------------------------------------------------------

def test_m_indices_from_group_sizes():
    sizes = [128, 0, 256, 128]
    got = m_indices_from_group_sizes(torch.tensor(sizes, dtype=torch.int32), 544)
    want = torch.full((544,), -1, dtype=torch.int32)
    start = 0
    for g, s in enumerate(sizes):
        want[start:start + s] = g
        start += s
    assert got.dtype == torch.int32 and torch.equal(got, want)


def _grouped_reference(x, w, sizes, dy):
    xr = x.detach().double().requires_grad_()
    wr = w.detach().double().requires_grad_()
    parts, start = [], 0
    for g, s in enumerate(sizes):
        parts.append(xr[start:start + s] @ wr[g].T)
        start += s
    parts.append(xr[start:] @ torch.zeros_like(wr[0]).T)  # padding rows: y = 0, dX = 0
    y = torch.cat(parts)
    y.backward(dy.double())
    return y, xr.grad, wr.grad


@pytest.mark.parametrize("device_sizes", [False, True])
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16])
def test_grouped_matches_float64(device_sizes, w_dtype):
    """G = 4 uneven groups (one empty), 18 padding rows past them (T = 530: padded to 544 for the weight
    gradient)."""
    torch.manual_seed(8)
    sizes = [128, 0, 256, 128]
    x = torch.randn(530, 256, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(4, 128, 256, dtype=w_dtype, requires_grad=True)
    gs = torch.tensor(sizes, dtype=torch.int32) if device_sizes else sizes
    y = fp8_grouped_linear(x, w, gs)
    assert y.shape == (530, 128) and y.dtype == torch.bfloat16
    dy = torch.randn(530, 128, dtype=torch.bfloat16)
    y.backward(dy)
    ry, rdx, rdw = _grouped_reference(x, w, sizes, dy)
    assert torch.all(y[512:] == 0) and torch.all(x.grad[512:] == 0)
    assert w.grad.dtype == w_dtype and torch.all(w.grad[1] == 0)
    for got, want in ((y, ry), (x.grad, rdx), (w.grad, rdw)):
        assert _diff(got, want) < TOL


def test_grouped_module_accumulates_and_checks_its_inputs():
    torch.manual_seed(9)
    layer = FP8GroupedLinear(2, 256, 128)
    assert layer.weight.shape == (2, 128, 256)
    x = torch.randn(256, 256, dtype=torch.bfloat16)
    dy = torch.randn(256, 128, dtype=torch.bfloat16)
    layer(x, [128, 128]).backward(dy)
    first = layer.weight.grad.clone()
    ptr = layer.weight.grad.data_ptr()
    layer(x, [128, 128]).backward(dy)
    assert layer.weight.grad.data_ptr() == ptr and torch.equal(layer.weight.grad, first + first)
    with pytest.raises(ValueError, match=r"group_sizes\[0\] = 100: expected a non-negative multiple of 128"):
        layer(x, [100, 128])
    with pytest.raises(TypeError, match=r"group_sizes: expected an int32 \[G\] tensor, got torch.int64"):
        layer(x, torch.tensor([128, 128]))
    with pytest.raises(ValueError, match=r"group_sizes: expected 2 sizes"):
        layer(x, [128])
    with pytest.raises(ValueError, match=r"FP8GroupedLinear: out_features \(N\) must be a multiple of 128"):
        FP8GroupedLinear(2, 256, 64)


def test_importing_the_torch_module_leaves_dynamo_unloaded():
    """``import cupygemm.torch`` does not import torch._dynamo (seconds: 5.5 s on an H200 host with it, the layers'
    compile opacity taking it lazily at their first call)."""
    import subprocess
    import sys

    code = "import sys, torch, cupygemm.torch; print('torch._dynamo' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr
