"""Work, the physical floor and statistics of ``cupygemm bench``: the peer tables' formulas, so numbers compare."""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

from .cases import Shape, Sizes

#: H100/H200 SXM dense FP8 tensor-core peak (datasheet), the compute half of the floor.
FP8_DENSE_FLOPS = 1979e12


def work(shape: Shape, sizes: Sizes) -> tuple[int, int]:
    """(FLOPs, bytes) of one call, as the shape's kind's bench code counts them: the forward kinds use the peers'
    formulas (:func:`cupygemm.bench.forward.work`), the weight-gradient ones
    :func:`cupygemm.bench.training.work`."""
    from .kinds import bench_kind

    return bench_kind(shape.kind).work(shape, sizes)


def floor_us(flops: float, nbytes: float, copy_bytes_per_s: float, peak_flops: float = FP8_DENSE_FLOPS) -> float:
    """The physical floor in microseconds: max(bytes / copy bandwidth, FLOPs / FP8 dense peak)."""
    return max(nbytes / copy_bytes_per_s, flops / peak_flops) * 1e6


def throughput(us: float, flops: float, nbytes: float, floor: float) -> dict[str, float]:
    """TFLOPS, GB/s and the % of the floor achieved by a call of ``us`` microseconds."""
    s = us * 1e-6
    return {"tflops": flops / s / 1e12, "gbs": nbytes / s / 1e9, "pct_floor": 100.0 * floor / us}


def summarize_times(times_us: Sequence[float]) -> dict[str, float]:
    """Median, p10, p90, min and max of per-call times (microseconds)."""
    t = np.asarray(times_us, dtype=np.float64)
    p10, med, p90 = np.percentile(t, [10, 50, 90])
    return {"us": float(med), "p10": float(p10), "p90": float(p90), "min": float(t.min()), "max": float(t.max())}


def geomean(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return float(math.exp(sum(math.log(v) for v in vals) / len(vals)))
