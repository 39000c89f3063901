"""Train a small character-level language model twice, its MLP blocks in FP8 (``cupygemm.torch.FP8Linear``) and in
BF16, from the same initial weights on the same batches, and compare the loss curves. Hopper GPU and torch.

The text is generated here (sentences from a small random grammar), so the run needs no download. The model reads
the last 32 characters (embedded, concatenated: 1024 features) and predicts the next one through three residual
MLP blocks (1024 -> 4096 -> 1024). Only the blocks' linear layers differ between the two runs: ``FP8Linear``
(x 1x128, W 128x128 scaled FP8 in all three GEMMs, dW accumulated straight into the FP32 weight.grad) against
``nn.Linear`` computing in BF16 from the same FP32 master weights. Embedding, norms and the output head are the
same FP32/BF16 code in both; AdamW on FP32 weights in both.

    python examples/train_fp8_mlp_torch.py [--steps 2000] [--out run.json]

Prints the loss curve side by side, the median step times and the final losses (the mean of the last 100
steps), which must agree within 1 %; ``--out`` writes {device, command, steps, losses_fp8, losses_bf16,
step_ms_fp8, step_ms_bf16} (per-step losses and milliseconds).
"""
import cupygemm

cupygemm.device.require_hopper_or_exit()  # one clear line, not CuPy's driver error, where there is no Hopper GPU

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402

try:
    import torch  # noqa: E402
except ImportError:
    sys.exit("this example needs PyTorch with CUDA: pip install torch")

import cupygemm.torch  # noqa: E402

CONTEXT, EMBED, HIDDEN, FFN, BLOCKS, VOCAB_PAD = 32, 32, 1024, 4096, 3, 64


def make_text(chars: int, seed: int = 0) -> str:
    """Sentences from a small grammar: enough structure to learn, enough randomness to keep a loss floor."""
    rng = np.random.default_rng(seed)
    subjects = ["the cat", "a dog", "my old friend", "the teacher", "a small bird", "the farmer", "her brother",
                "the captain", "a quiet child", "the baker"]
    verbs = ["sees", "likes", "follows", "paints", "carries", "finds", "remembers", "builds", "watches", "feeds"]
    objects = ["the red ball", "a long letter", "the river", "an apple", "the blue house", "a wooden boat",
               "the garden", "some bread", "the mountain", "a lantern"]
    tails = ["today", "at night", "in the morning", "again", "slowly", "with care", "near the sea", "every day"]
    out, size = [], 0
    while size < chars:
        s = f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}"
        if rng.random() < 0.6:
            s += f" {rng.choice(tails)}"
        s += ". " if rng.random() < 0.8 else "! "
        out.append(s)
        size += len(s)
    return "".join(out)[:chars]


class BF16Linear(torch.nn.Linear):
    """nn.Linear computing in BF16 from its FP32 master weight (the baseline's GEMMs)."""

    def forward(self, x):
        return torch.nn.functional.linear(x.to(torch.bfloat16), self.weight.to(torch.bfloat16))


class CharMLP(torch.nn.Module):
    def __init__(self, vocab: int, fp8: bool):
        super().__init__()
        linear = (lambda i, o: cupygemm.torch.FP8Linear(i, o)) if fp8 else (lambda i, o: BF16Linear(i, o, False))
        self.embed = torch.nn.Embedding(vocab, EMBED)
        self.norms = torch.nn.ModuleList(torch.nn.RMSNorm(HIDDEN) for _ in range(BLOCKS))
        self.ups = torch.nn.ModuleList(linear(HIDDEN, FFN) for _ in range(BLOCKS))
        self.downs = torch.nn.ModuleList(linear(FFN, HIDDEN) for _ in range(BLOCKS))
        self.head_norm = torch.nn.RMSNorm(HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, VOCAB_PAD, bias=False)

    def forward(self, ctx):
        h = self.embed(ctx).flatten(1)  # [B, CONTEXT * EMBED] = [B, HIDDEN], FP32 residual stream
        for norm, up, down in zip(self.norms, self.ups, self.downs):
            u = up(norm(h).to(torch.bfloat16))
            h = h + down(torch.nn.functional.gelu(u)).float()
        return self.head(self.head_norm(h))


def train(model, data, starts, steps, lr):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / steps))))
    offsets = torch.arange(CONTEXT + 1, device="cuda")
    losses, times = [], []
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
    for step in range(steps):
        window = data[starts[step][:, None] + offsets]  # [B, CONTEXT + 1]
        events[step][0].record()
        logits = model(window[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits, window[:, -1])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)  # keeps each weight.grad: FP8Linear accumulates into it in place
        sched.step()
        events[step][1].record()
        losses.append(loss.detach())
    torch.cuda.synchronize()
    times = [a.elapsed_time(b) for a, b in events]
    return [float(x) for x in torch.stack(losses).cpu()], times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=4096, help="sequences (tokens predicted) per step")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--out", help="write the run as JSON here")
    args = parser.parse_args()

    text = make_text(2_000_000)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    starts = torch.randint(0, len(text) - CONTEXT - 1, (args.steps, args.batch), device="cuda", generator=gen)

    torch.manual_seed(0)
    fp8 = CharMLP(len(chars), fp8=True).cuda()
    bf16 = CharMLP(len(chars), fp8=False).cuda()
    bf16.load_state_dict(fp8.state_dict())  # same initial weights (the parameter names match)

    runs = {}
    for name, model in (("fp8", fp8), ("bf16", bf16)):
        runs[name] = train(model, data, starts, args.steps, args.lr)
    (l8, t8), (l16, t16) = runs["fp8"], runs["bf16"]

    print(f"{len(chars)} characters, {args.batch} tokens a step, {BLOCKS} MLP blocks {HIDDEN} -> {FFN} -> {HIDDEN}")
    print(f"{'step':>6} {'loss fp8':>9} {'loss bf16':>9}")
    for s in sorted(set(list(range(0, args.steps, max(1, args.steps // 20))) + [args.steps - 1])):
        print(f"{s:>6} {l8[s]:9.4f} {l16[s]:9.4f}")
    tail = min(100, args.steps)
    f8, f16 = float(np.mean(l8[-tail:])), float(np.mean(l16[-tail:]))
    m8, m16 = float(np.median(t8[1:] or t8)), float(np.median(t16[1:] or t16))
    print(f"median step: fp8 {m8:.3f} ms, bf16 {m16:.3f} ms ({m16 / m8:.2f}x)")
    rel = abs(f8 - f16) / f16
    curve = cupygemm.calc_diff(np.array(l8[-tail:]), np.array(l16[-tail:]))
    print(f"final loss (mean of the last {tail} steps): fp8 {f8:.4f}, bf16 {f16:.4f}, relative difference "
          f"{rel:.2%}; calc_diff of the last {tail} losses {curve:.2e}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "command": " ".join(sys.argv), "steps": args.steps,
                       "losses_fp8": l8, "losses_bf16": l16, "step_ms_fp8": t8, "step_ms_bf16": t16}, f)
    if rel > 0.01:
        sys.exit(f"FP8 final loss {f8:.4f} is not within 1 % of BF16's {f16:.4f}")


if __name__ == "__main__":
    main()
