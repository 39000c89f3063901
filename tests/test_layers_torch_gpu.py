"""The torch FP8 layers on the GPU (cupygemm.torch.layers): gradients against an unquantized float64 reference at
DeepSeek-V3 shapes, bitwise repeatability, accumulation into weight.grad, torch.compile and a CUDA-graph-captured
training step (forward, backward, SGD) replayed with new inputs."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

# Training-size steps hold GBs in the frameworks' pools: one xdist worker runs both layer files, one test at a
# time (scripts/device_check.sh passes --dist loadgroup), or twelve workers' pools exhaust the GPU.
pytestmark = [pytest.mark.gpu, pytest.mark.xdist_group("training-sizes")]

import cupygemm  # noqa: E402

TOL = 2e-3  # calc_diff against the unquantized float64 product (the gate)
DENSE_SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536)]  # (N, K) of DeepSeek-V3 layers
GROUPED_SHAPES = [(4096, 7168), (7168, 2048)]
GROUP_SIZES = [1024, 384, 0, 2560]  # G = 4, uneven, one empty; 128 padding rows follow them in T = 4096


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    import cupygemm.torch  # noqa: F401


def _diff(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    den = (a * a + b * b).sum()
    return 0.0 if den == 0 else float(1 - 2 * (a * b).sum() / den)


def _dense_inputs(t, n, k, seed, w_dtype=torch.float32):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(t, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).to(w_dtype)
    dy = torch.randn(t, n, device="cuda", generator=g).to(torch.bfloat16)
    return x, w, dy


def _run_dense(x, w, dy, **kw):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = cupygemm.torch.fp8_linear(x, w, **kw)
    y.backward(dy)
    return y, x.grad, w.grad


@pytest.mark.parametrize("n,k", DENSE_SHAPES)
def test_dense_gradients_match_float64(n, k):
    x, w, dy = _dense_inputs(4096, n, k, 0)
    y, dx, dw = _run_dense(x, w, dy)
    xr, wr = x.double(), w.double()
    assert _diff(y, xr @ wr.T) < TOL
    assert _diff(dx, dy.double() @ wr) < TOL
    assert _diff(dw, dy.double().T @ xr) < TOL


def test_dense_pads_tokens_and_bf16_weights():
    """T = 2 x 500 (padded to 1008 for the weight gradient) and a bfloat16 weight, whose dW autograd receives."""
    x, w, dy = _dense_inputs(1000, 2112, 7168, 1, torch.bfloat16)
    y, dx, dw = _run_dense(x.view(2, 500, 7168), w, dy.view(2, 500, 2112))
    assert y.shape == (2, 500, 2112) and dx.shape == (2, 500, 7168) and dw.dtype == torch.bfloat16
    xr, wr = x.double(), w.double()
    assert _diff(y.view(1000, 2112), xr @ wr.T) < TOL
    assert _diff(dx.view(1000, 7168), dy.double() @ wr) < TOL
    assert _diff(dw, dy.double().T @ xr) < TOL


def test_dense_is_bitwise_repeatable_and_recompute_matches():
    x, w, dy = _dense_inputs(4096, 2112, 7168, 2)
    first = _run_dense(x, w, dy)
    for kw in ({}, {"recompute_casts": True}):
        again = _run_dense(x, w, dy, **kw)
        assert all(torch.equal(a, b) for a, b in zip(first, again)), kw


def test_accumulation_over_micro_batches_is_the_sum_in_place():
    """Two micro-batches into one FP32 weight.grad: the same storage throughout, exactly the sum of the separate
    gradients (the kernel's one FP32 add per element), and autograd received no dW (no add kernel of its own)."""
    x1, w, dy1 = _dense_inputs(4096, 7168, 2048, 3)
    x2, _, dy2 = _dense_inputs(4096, 7168, 2048, 4)
    singles = [_run_dense(x, w, dy)[2] for x, dy in ((x1, dy1), (x2, dy2))]
    p = w.clone().requires_grad_()
    seen = []
    p.register_hook(lambda g: seen.append(g))
    cupygemm.torch.fp8_linear(x1, p).backward(dy1)
    ptr = p.grad.data_ptr()
    cupygemm.torch.fp8_linear(x2, p).backward(dy2)
    assert p.grad.data_ptr() == ptr and seen == [None, None]
    assert torch.equal(p.grad, singles[0] + singles[1])


def _grouped_inputs(n, k, seed, sizes=GROUP_SIZES, t=4096):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(t, k, device="cuda", generator=g).to(torch.bfloat16)
    x[sum(sizes):] = 0  # padding rows are zero rows
    w = torch.randn(len(sizes), n, k, device="cuda", generator=g) / k ** 0.5
    dy = torch.randn(t, n, device="cuda", generator=g).to(torch.bfloat16)
    return x, w, dy, torch.tensor(sizes, dtype=torch.int32, device="cuda")


def _run_grouped(x, w, dy, sizes, **kw):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = cupygemm.torch.fp8_grouped_linear(x, w, sizes, **kw)
    y.backward(dy)
    return y, x.grad, w.grad


@pytest.mark.parametrize("n,k", GROUPED_SHAPES)
def test_grouped_gradients_match_float64(n, k):
    x, w, dy, sizes = _grouped_inputs(n, k, 5)
    y, dx, dw = _run_grouped(x, w, dy, sizes)
    ry, rdx, rdw = torch.zeros_like(y, dtype=torch.float64), torch.zeros_like(x, dtype=torch.float64), []
    start = 0
    for gi, s in enumerate(GROUP_SIZES):
        xs, dys, wg = x[start:start + s].double(), dy[start:start + s].double(), w[gi].double()
        ry[start:start + s], rdx[start:start + s] = xs @ wg.T, dys @ wg
        rdw.append(dys.T @ xs)
        start += s
    assert torch.all(y[start:] == 0) and torch.all(dx[start:] == 0)
    assert _diff(y, ry) < TOL and _diff(dx, rdx) < TOL
    for gi, s in enumerate(GROUP_SIZES):
        if s:
            assert _diff(dw[gi], rdw[gi]) < TOL, gi
        else:
            assert torch.all(dw[gi] == 0)
    again = _run_grouped(x, w, dy, sizes)
    assert all(torch.equal(a, b) for a, b in zip((y, dx, dw), again))
    host = _run_grouped(x, w, dy, GROUP_SIZES, recompute_casts=True)
    assert all(torch.equal(a, b) for a, b in zip((y, dx, dw), host))


def test_opcheck_columns_wgrad_operator_with_layer_operands():
    """The operator the grouped layer's weight gradient calls, on the transposed casts' outputs (uint8 bits:
    opcheck compares inputs with ops torch lacks for float8)."""
    from cupygemm.torch.layers import COLUMNS_WGRAD_OP

    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(512, 128, device="cuda", dtype=torch.bfloat16)
    aq, sa = cupygemm.per_token_cast_to_fp8_transposed(dy)
    bq, sb = cupygemm.per_token_cast_to_fp8_transposed(x)
    sizes = torch.tensor([128, 256, 0], dtype=torch.int32, device="cuda")
    out = torch.zeros(3, 128, 256, device="cuda")
    torch.library.opcheck(getattr(torch.ops.cupygemm, COLUMNS_WGRAD_OP).default,
                          (aq.view(torch.uint8), sa, bq.view(torch.uint8), sb, sizes, out, -1))


class _Block(torch.nn.Module):
    def __init__(self, d=2048, f=4096):
        super().__init__()
        self.up, self.down = cupygemm.torch.FP8Linear(d, f), cupygemm.torch.FP8Linear(f, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))  # relu: exact in eager and compiled code alike


def test_torch_compile_of_a_training_step_matches_eager():
    torch.manual_seed(0)
    eager = _Block().cuda()
    compiled = _Block().cuda()
    compiled.load_state_dict(eager.state_dict())
    step = torch.compile(compiled)
    x = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)
    for model in (eager, step):
        xi = x.clone().requires_grad_()
        y = model(xi)
        y.backward(dy)
        model.result = (y, xi.grad)
    assert torch.equal(eager.result[0], step.result[0]) and torch.equal(eager.result[1], step.result[1])
    for pe, pc in zip(eager.parameters(), compiled.parameters()):
        assert torch.equal(pe.grad, pc.grad)


def _graph_step(model, params, static, lr):
    """Capture forward + backward + SGD of ``model(*static[:-1])`` against the upstream gradient ``static[-1]``,
    after torch's recipe: warm-up on a side stream, grads set to None before capture (so the layers allocate
    weight.grad from the graph's pool and each replay leaves that step's gradient there)."""
    opt = torch.optim.SGD(params, lr=lr)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            opt.zero_grad(set_to_none=True)
            model(*static[:-1]).backward(static[-1])
    torch.cuda.current_stream().wait_stream(side)
    opt.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(*static[:-1]).backward(static[-1])
        opt.step()
    return graph


def _check_replays(graph, params, static, new_inputs, eager_grads, lr):
    for inputs in new_inputs:
        before = [p.detach().clone() for p in params]
        for s, v in zip(static, inputs):
            s.copy_(v)
        graph.replay()
        torch.cuda.synchronize()
        want = eager_grads(before, inputs)
        for p, p0, g in zip(params, before, want):
            assert torch.equal(p.grad, g)
            assert torch.equal(p.detach(), p0.add(g, alpha=-lr))


def test_cuda_graph_training_step_dense():
    torch.manual_seed(1)
    model = _Block().cuda()
    params, lr = list(model.parameters()), 1e-2
    static = [torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16),
              torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)]
    graph = _graph_step(model, params, static, lr)

    def eager_grads(weights, inputs):
        ref = _Block().cuda()
        for p, w in zip(ref.parameters(), weights):
            p.data.copy_(w)
        ref(inputs[0]).backward(inputs[1])
        return [p.grad for p in ref.parameters()]

    new = [[torch.randn_like(s) for s in static] for _ in range(3)]
    _check_replays(graph, params, static, new, eager_grads, lr)


def test_cuda_graph_training_step_grouped_with_new_group_sizes():
    """The MoE layer in a captured step: group sizes live on the device, so each replay takes new ones."""
    torch.manual_seed(2)
    layer = cupygemm.torch.FP8GroupedLinear(4, 2048, 1024).cuda()
    lr = 1e-2
    x, _, dy, sizes = _grouped_inputs(1024, 2048, 6, [256, 512, 0, 1024], 2048)
    static = [x, sizes, dy]
    graph = _graph_step(layer, [layer.weight], static, lr)

    def eager_grads(weights, inputs):
        w = weights[0].clone().requires_grad_()
        cupygemm.torch.fp8_grouped_linear(inputs[0], w, inputs[1]).backward(inputs[2])
        return [w.grad]

    new = []
    for seed, sz in ((7, [1024, 0, 128, 768]), (8, [128, 128, 128, 128]), (9, [0, 0, 2048, 0])):
        xi, _, dyi, si = _grouped_inputs(1024, 2048, seed, sz, 2048)
        new.append([xi, si, dyi])
    _check_replays(graph, [layer.weight], static, new, eager_grads, lr)
