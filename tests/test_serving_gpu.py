"""Warm-up on the GPU: once `cupygemm.warmup` has built a shape's kernels for this device's SM count, calls of that
shape compile no GEMM kernel, on plain weights and on weights from `pack_weights` (`packed=True`)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

import cupygemm  # noqa: E402
from cupygemm import contract  # noqa: E402
from cupygemm import plan as gemm_plan  # noqa: E402
from cupygemm.device import get_num_sms  # noqa: E402
from cupygemm.jit import build, cache  # noqa: E402

from gpu_helpers import randn_bf16  # noqa: E402

N, K = 1536, 2048  # a pair no other test plans, so that no kernel of it is already loaded in this process
ROWS = (48, 128)  # a decode row count (packed: the weights fetched before the PDL wait) and one above it


@pytest.mark.parametrize("packed", [False, True])
def test_warmed_up_calls_compile_no_gemm_kernel(tmp_path, monkeypatch, packed):
    monkeypatch.setenv("CUPYGEMM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CUPYGEMM_L2_SIDES", "1")  # pack wherever two L2 sides are measured (auto: H100s only)
    cache.clear_memory()
    gemm_plan.clear()
    report = cupygemm.warmup([(N, K)], [(m, m) for m in ROWS], num_sms=get_num_sms(), jobs=2, packed=packed)
    assert report.built == report.kernels > 0

    rng = cp.random.default_rng(0)
    b, sfb = cupygemm.per_block_cast_to_fp8(randn_bf16((N, K), rng))
    rhs = cupygemm.pack_weights(b, sfb) if packed else (b, sfb)  # its own kernels compile here, before the check
    assert not packed or rhs.side_aware
    lhs = []
    for m in ROWS:
        a, sfa = cupygemm.per_token_cast_to_fp8(randn_bf16((m, K), rng))
        lhs.append((a, cupygemm.get_col_major_tma_aligned_tensor(sfa)))
    compiled = []
    real = build.compile_cubin
    monkeypatch.setattr(build, "compile_cubin", lambda src, *a, **kw: compiled.append(src.entry) or real(src, *a, **kw))
    for (a, sfa), m in zip(lhs, ROWS):
        out = cp.zeros((m, N), cp.uint16)
        cupygemm.gemm_fp8_fp8_bf16_nt((a, sfa), rhs, out)
        assert int(cp.count_nonzero(out)) > 0
    cp.cuda.Device().synchronize()
    assert contract.GEMM_ENTRY not in compiled, compiled
