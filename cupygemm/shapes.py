"""The seed shapes: DeepSeek-V3's (and R1's) FP8 GEMMs as the published peer tables measure them.

One list for everything that needs them: the serving warm-up preset, ``cupygemm bench``'s default cases, the
tests and the tuning scripts. Normal GEMMs are (M, N, K); grouped ones are (G, M, N, K) where M is the expected
rows per group (contiguous) or ``expected_m`` (masked).
"""
from __future__ import annotations

#: M of the normal shapes: two decode batches and a prefill chunk.
NORMAL_MS = (64, 128, 4096)
#: (N, K) of the dense projections.
NORMAL_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
#: (N, K) of the MoE experts' projections (both grouped layouts).
GROUPED_NK = ((4096, 7168), (7168, 2048))
#: (groups, expected rows per group) of the contiguous layout.
CONTIGUOUS_GM = ((4, 8192), (8, 4096))
#: (groups, expected_m) of the masked layout.
MASKED_GM = ((1, 1024), (2, 512), (4, 256))

NORMAL: tuple[tuple[int, int, int], ...] = tuple((m, n, k) for m in NORMAL_MS for n, k in NORMAL_NK)
CONTIGUOUS: tuple[tuple[int, int, int, int], ...] = tuple(
    (g, m, n, k) for g, m in CONTIGUOUS_GM for n, k in GROUPED_NK)
MASKED: tuple[tuple[int, int, int, int], ...] = tuple((g, m, n, k) for g, m in MASKED_GM for n, k in GROUPED_NK)
#: A normal shape whose K (576) ends in a partial 128-wide block: the tests and the config sweep add it to the seed
#: shapes so a K tail is covered too (the benchmark's default list, like the peer tables, has none).
K_TAIL_SHAPE = (4096, 7168, 576)


def parse_shape(text: str) -> tuple[int, ...]:
    """``'MxNxK'`` (normal) or ``'GxMxNxK'`` (grouped) -> a tuple of non-negative ints; ValueError otherwise."""
    try:
        dims = tuple(int(t) for t in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"shape {text!r}: expected MxNxK or GxMxNxK") from None
    if len(dims) not in (3, 4) or min(dims) < 0:
        raise ValueError(f"shape {text!r}: expected MxNxK or GxMxNxK")
    return dims
