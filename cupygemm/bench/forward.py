"""The bench's code for the forward kernel's kinds (normal, contiguous, masked): A scaled 1x128, B 128x128, BF16 out.

Group sizes are drawn like the peers' tests do (uniform in 0.7-1.3 x the expected rows, seeded per shape) or, with
``--match-rows``, rescaled to the valid-row totals a peer table measured so that both runs do the same work. What
differs between the three kinds is read from their descriptors: no layout operand (dense), ``m_indices`` (rows
carry their group, padded per group to 128 rows) or ``masked_m`` (a [G, max_m] batch whose groups use their first
rows, with ``expected_m`` as the static argument). Results are checked on sampled rows
(:mod:`cupygemm.bench.checks`). Registered in :mod:`cupygemm.bench.kinds` for the family ``forward``.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..config import choose_config, model_rows, side_aware_config
from ..kinds import FORWARD, GemmKind, kind_named
from ..layout import M_ALIGNMENT_FOR_CONTIGUOUS_LAYOUT as M_ALIGNMENT
from . import providers
from .cases import (GROUP_SPREAD, BenchUsageError, Shape, Sizes, contiguous_m_indices, masked_max_m, match_total,
                    round_up, shape_seed)
from .checks import CHECK_ROWS, compare, output_rows, reference_rows
from .inputs import Inputs, bf16_bits, rows2d
from .kinds import BenchKind, register

#: The layout operands of the forward kinds the bench knows (``GemmKind.layout``): None (dense), the row-indexed
#: contiguous layout and the masked batch.
DENSE, ROW_GROUPS, MASKED = None, "m_indices", "masked_m"


def _layout(kind: GemmKind) -> str | None:
    if kind.layout not in (DENSE, ROW_GROUPS, MASKED):
        raise ValueError(f"kind {kind.name!r}: the forward bench has no code for its layout operand {kind.layout!r}")
    return kind.layout


def make_sizes(shape: Shape, seed: int, valid_rows: int | None = None, full_groups: bool = False) -> Sizes:
    """Group sizes like the peers' tests: int(expected x U(0.7, 1.3)) (at least 1); contiguous groups are padded
    to 128 rows; masked ones are clamped to max_m. Deterministic in (shape, seed). ``valid_rows``: make the
    sizes sum to it instead (see :func:`~cupygemm.bench.cases.match_total`), to run the very row count a peer table
    measured. ``full_groups`` (masked): every group holds expected rows, all valid, and max_m = expected (a batch of
    equal full groups, the case DeepGEMM's own tests time)."""
    layout = _layout(shape.descriptor)
    if layout is DENSE:
        return Sizes((shape.m,), shape.m)
    if full_groups and layout == MASKED:
        return Sizes((shape.m,) * shape.groups, shape.m)
    rng = np.random.default_rng(shape_seed(shape, seed))
    factors = rng.uniform(GROUP_SPREAD[0], GROUP_SPREAD[1], size=shape.groups)
    rows = [max(1, int(shape.m * f)) for f in factors]
    if valid_rows is not None:
        rows = match_total(rows, valid_rows, shape.m)
    if layout == ROW_GROUPS:
        return Sizes(tuple(rows), sum(round_up(r, M_ALIGNMENT) for r in rows))
    max_m = masked_max_m(shape.m)
    return Sizes(tuple(min(r, max_m) for r in rows), max_m)


def config_m_rows(shape: Shape, sizes: Sizes) -> int:
    """The ``m_rows`` the API passes to choose_config: M, the contiguous total rows, or masked expected_m."""
    kind = shape.descriptor
    layout = _layout(kind)
    if layout is DENSE:
        return model_rows(kind.kid, shape.m)
    if layout == ROW_GROUPS:
        return model_rows(kind.kid, sizes.a_rows)
    return model_rows(kind.kid, sizes.a_rows, shape.m)


def shape_config(shape: Shape, sizes: Sizes, num_sms: int, smem_limit: int | None = None, sides: bool = False):
    """The GemmConfig the library picks for this shape (same arguments as cupygemm.gemm); ``sides``: on weights
    packed by cupygemm.pack_weights (the side-aware kernel's config)."""
    kind = shape.descriptor
    kwargs = {} if smem_limit is None else {"smem_limit": smem_limit}
    if _layout(kind) == MASKED:
        kwargs["max_m"] = sizes.a_rows
    cfg = choose_config(kind.kid, config_m_rows(shape, sizes), shape.n, shape.k, shape.groups, num_sms, sides=sides,
                        **kwargs)
    return side_aware_config(cfg, num_sms, *([] if smem_limit is None else [smem_limit])) if sides else cfg


def check_rows(shape: Shape, sizes: Sizes, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows to verify, as (flat row indices into the output viewed as 2-D [rows, N], their groups).

    Only valid rows: not contiguous padding, not masked rows past masked_m. Sorted, at most ``count``.
    """
    layout = _layout(shape.descriptor)
    if layout is DENSE:
        flat = np.arange(shape.m)
        groups = np.zeros(shape.m, dtype=np.int64)
    else:
        flat_parts, group_parts, offset = [], [], 0
        for g, rows in enumerate(sizes.group_rows):
            start = offset if layout == ROW_GROUPS else g * sizes.a_rows
            flat_parts.append(start + np.arange(rows))
            group_parts.append(np.full(rows, g, dtype=np.int64))
            offset += round_up(rows, M_ALIGNMENT)
        flat = np.concatenate(flat_parts)
        groups = np.concatenate(group_parts)
    if len(flat) > count:
        rng = np.random.default_rng(shape_seed(shape, seed) + [1])
        pick = np.sort(rng.choice(len(flat), size=count, replace=False))
        flat, groups = flat[pick], groups[pick]
    return flat.astype(np.int64), groups.astype(np.int64)


def work(shape: Shape, sizes: Sizes) -> tuple[int, int]:
    """(FLOPs, bytes) of one call, the peers' formulas: 2*valid_m*N*K and valid_m*K + G*N*K + 2*valid_m*N
    (FP8 A and B, BF16 D; scales not counted; grouped shapes count valid rows only)."""
    vm, n, k, g = sizes.valid_m, shape.n, shape.k, shape.groups
    return 2 * vm * n * k, vm * k + g * n * k + 2 * vm * n


def _operand_shapes(shape: Shape, sizes: Sizes) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A's and B's shapes from the descriptor's dimension names: M is A's rows (the padded total, or max_m)."""
    kind = shape.descriptor
    dims = {"G": shape.groups, "M": sizes.a_rows, "N": shape.n, "K": shape.k}
    try:
        return tuple(dims[d] for d in kind.a_dims), tuple(dims[d] for d in kind.b_dims)
    except KeyError:
        raise ValueError(f"kind {kind.name!r}: the forward bench has no code for operands {kind.a_dims}, "
                         f"{kind.b_dims}") from None


def make_inputs(shape: Shape, sizes: Sizes, seed: int) -> Inputs:
    """randn BF16 A and B on the GPU (seeded per shape), quantized 1x128 (A) and 128x128 (B, per group)."""
    import cupy

    from ..layout import get_col_major_tma_aligned_tensor
    from ..quantization import per_block_cast_to_fp8, per_token_cast_to_fp8
    from ..tensors import BF16

    g, k = shape.groups, shape.k
    kb = (k + 127) // 128
    a_shape, b_shape = _operand_shapes(shape, sizes)
    rng = cupy.random.default_rng(shape_seed(shape, seed))
    x = bf16_bits(rng.standard_normal(a_shape, dtype=cupy.float32))
    y = bf16_bits(rng.standard_normal(b_shape, dtype=cupy.float32))
    a2, sfa2 = per_token_cast_to_fp8(x.reshape(-1, k).view(BF16))
    a, sfa = a2.reshape(a_shape), sfa2.reshape(a_shape[:-1] + (kb,))
    if len(b_shape) == 2:
        b, sfb = per_block_cast_to_fp8(y.view(BF16))
    else:
        parts = [per_block_cast_to_fp8(y[i].view(BF16)) for i in range(g)]
        b = cupy.stack([p[0] for p in parts])
        sfb = cupy.stack([p[1] for p in parts])
        del parts
    inp = Inputs(shape, sizes, a, sfa, get_col_major_tma_aligned_tensor(sfa), b, sfb, x, y)
    layout = _layout(shape.descriptor)
    if layout == ROW_GROUPS:
        inp.m_indices = cupy.asarray(contiguous_m_indices(sizes.group_rows))
    elif layout == MASKED:
        inp.masked_m = cupy.asarray(np.asarray(sizes.group_rows, dtype=np.int32))
    return inp


def _out_shape(inp: Inputs) -> tuple[int, ...]:
    return tuple(inp.a.shape[:-1]) + (inp.shape.n,)


def _extra_args(kind: GemmKind, inp: Any, convert: Callable[[Any], Any] = lambda x: x) -> tuple[Any, ...]:
    """The arguments after ``out``: the layout operand (the Inputs field of the descriptor's layout name, through
    ``convert``) and the static argument (``expected_m``: the shape's M)."""
    args: tuple[Any, ...] = ()
    if kind.layout:
        args += (convert(getattr(inp, kind.layout)),)
    if kind.static:
        if kind.static != "expected_m":
            raise ValueError(f"kind {kind.name!r}: the forward bench has no value for its argument {kind.static!r}")
        args += (inp.shape.m,)
    return args


class ForwardBench(BenchKind):
    title = "forward kinds"
    default = True
    match_rows = True
    peers = ("cupygemm_packed", "cublas_block", "deepgemm", "deepergemm", "deepergemm_s128")

    def supports(self, peer: str, kind: GemmKind) -> bool:
        if peer == "cublas_block":  # cuBLASLt's block-scaled FP8 has no grouped API
            return kind.layout is DENSE
        return peer in self.peers

    def check_shape(self, shape: Shape) -> None:
        if shape.k % 16:
            raise BenchUsageError(f"shape {shape.label}: K must be a multiple of 16 (got {shape.k})")
        if shape.n % 8:
            raise BenchUsageError(f"shape {shape.label}: N must be a multiple of 8 (got {shape.n})")

    def make_sizes(self, shape: Shape, seed: int, valid_rows: int | None = None, full_groups: bool = False) -> Sizes:
        return make_sizes(shape, seed, valid_rows, full_groups)

    def config(self, shape: Shape, sizes: Sizes, num_sms: int, smem_limit: int | None = None, sides: bool = False):
        return shape_config(shape, sizes, num_sms, smem_limit, sides)

    def work(self, shape: Shape, sizes: Sizes) -> tuple[int, int]:
        return work(shape, sizes)

    def make_inputs(self, shape: Shape, sizes: Sizes, seed: int) -> Inputs:
        return make_inputs(shape, sizes, seed)

    def prepare_cupygemm(self, inp: Inputs, rhs: Any = None) -> providers.Prepared:
        import cupygemm

        from ..tensors import BF16

        kind = kind_named(inp.shape.kind)
        fn = getattr(cupygemm, kind.api)
        bits = providers._poisoned(_out_shape(inp))
        out = bits.view(BF16)
        lhs, rhs = (inp.a, inp.sfa_mn), rhs if rhs is not None else (inp.b, inp.sfb)
        args = (lhs, rhs, out) + _extra_args(kind, inp)

        def call():
            fn(*args)

        return providers.Prepared(call, lambda: rows2d(bits))

    def prepare_deepgemm(self, peer: Any, inp: Inputs) -> providers.Prepared:
        import cupy

        torch = peer.torch
        kind = kind_named(inp.shape.kind)
        fn = getattr(peer.module, kind.api)
        lhs = (providers.torch_fp8(torch, inp.a), torch.from_dlpack(inp.sfa_mn))
        rhs = (peer.weights(inp), torch.from_dlpack(inp.sfb))
        bits = providers._poisoned(_out_shape(inp))
        out = torch.from_dlpack(bits.view(cupy.int16)).view(torch.bfloat16)
        args = (lhs, rhs, out) + _extra_args(kind, inp, torch.from_dlpack)

        def call():
            fn(*args)

        return providers.Prepared(call, lambda: rows2d(bits))

    def checker(self, inp: Inputs, seed: int) -> Callable[[str, providers.Prepared], dict[str, Any]]:
        """Sampled valid rows against the float64 reference of the quantized inputs and the BF16 product (made on
        the first call, for every provider of the shape)."""
        sel_rows, sel_groups = check_rows(inp.shape, inp.sizes, CHECK_ROWS, seed)
        ref: list[Any] = []

        def check(name: str, prep: providers.Prepared) -> dict[str, Any]:
            if not ref:
                ref.append(reference_rows(inp, sel_rows, sel_groups))
            return compare(output_rows(prep.output(), sel_rows), *ref[0])

        return check


FORWARD_BENCH = register(FORWARD, ForwardBench())
