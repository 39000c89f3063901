"""Plot the FP8-vs-BF16 loss curves of the training examples' JSON files (``--out`` of
examples/train_fp8_mlp_torch.py and examples/train_fp8_mlp_jax.py) side by side into one PNG.

    python scripts/plot_loss_curves.py TORCH.json JAX.json -o benchmarks/results/train-loss-h100.png
"""
from __future__ import annotations

import argparse
import json

import numpy as np


def _curve(losses: list[float], steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(step numbers, losses): every step's loss, or the logged points spread over the run."""
    y = np.asarray(losses, dtype=np.float64)
    x = np.arange(1, len(y) + 1) * (steps // len(y))
    return x, y


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="the examples' JSON files")
    p.add_argument("-o", "--out", required=True, help="the PNG to write")
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.runs), figsize=(6 * len(args.runs), 4), squeeze=False)
    for ax, path in zip(axes[0], args.runs):
        run = json.load(open(path))
        framework = "JAX" if "jax" in run["command"] else "torch"
        for key, label, style in (("losses_bf16", "BF16", "-"), ("losses_fp8", "FP8 (cupygemm)", "--")):
            x, y = _curve(run[key], run["steps"])
            if len(y) > 200:  # every step logged: a running mean of 50 steps shows the trend
                y = np.convolve(y, np.ones(50) / 50, mode="valid")
                x = x[len(x) - len(y):]
            ax.plot(x, y, style, label=label)
        ms8, ms16 = (float(np.median(run[k])) for k in ("step_ms_fp8", "step_ms_bf16"))
        ax.set_title(f"{framework}: {run['device']}, step {ms8:.2f} ms FP8 / {ms16:.2f} ms BF16", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
