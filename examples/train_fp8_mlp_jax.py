"""Train a tiny character-level language model in JAX twice, with the same init and data: once with cupygemm's FP8
layers (:func:`cupygemm.jax.fp8_linear`: forward, dgrad and wgrad GEMMs in FP8, DeepSeek-V3 scaling) and once in
BF16 (``jnp.dot``), and compare the loss curves and step times. Hopper GPU and JAX with CUDA.

The text is generated here (sentences from a small grammar, so there is something to learn). The model reads the
last 8 characters (embeddings of 128, concatenated: d = 1024), then an input projection and residual MLP blocks
(1024 -> 4096 -> 1024, in ``lax.scan``) whose linear layers are the FP8 ones; the output head stays in BF16 in both
runs, as DeepSeek-V3 keeps it in higher precision. Adam on FP32 master weights.

    python examples/train_fp8_mlp_jax.py --steps 2000 --out fp8_vs_bf16.json

Prints the loss every ``--log-every`` steps and the mean step time; with ``--out`` writes
``{device, command, steps, log_steps, losses_fp8, losses_bf16, eval_loss_fp8, eval_loss_bf16, step_ms_fp8,
step_ms_bf16}``. Exits with status 1 if the final FP8 loss is not within 1 % of the BF16 one.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time

import numpy as np

CONTEXT, EMBED, D, FFN, BLOCKS, VOCAB_PAD = 8, 128, 1024, 4096, 2, 128


def make_text(chars: int, seed: int = 0) -> str:
    """Sentences from a small grammar: subject, verb, object, sometimes an adverb; words are fixed strings, choices
    random (seeded)."""
    rng = np.random.default_rng(seed)
    nouns = ["cat", "dog", "bird", "fox", "mouse", "horse", "farmer", "child", "river", "stone", "tree", "cloud"]
    adjs = ["small", "quick", "lazy", "old", "bright", "quiet", "brown", "green"]
    verbs = ["sees", "follows", "likes", "finds", "watches", "chases", "hears", "helps"]
    advs = ["today", "again", "slowly", "at night", "in the rain", "near the barn"]
    out, size = [], 0
    while size < chars:
        words = ["the"]
        if rng.random() < 0.5:
            words.append(adjs[rng.integers(len(adjs))])
        words += [nouns[rng.integers(len(nouns))], verbs[rng.integers(len(verbs))], "the"]
        if rng.random() < 0.5:
            words.append(adjs[rng.integers(len(adjs))])
        words.append(nouns[rng.integers(len(nouns))])
        if rng.random() < 0.3:
            words.append(advs[rng.integers(len(advs))])
        s = " ".join(words) + ". "
        out.append(s[0].upper() + s[1:])
        size += len(s)
    return "".join(out)[:chars]


def init_params(key, vocab: int):
    import jax
    import jax.numpy as jnp

    ks = jax.random.split(key, 5)
    normal = lambda k, shape, fan_in: jax.random.normal(k, shape, jnp.float32) / np.sqrt(fan_in)  # noqa: E731
    return {
        "embed": normal(ks[0], (vocab, EMBED), 1.0) * 0.5,
        "proj": normal(ks[1], (D, CONTEXT * EMBED), CONTEXT * EMBED),
        "up": normal(ks[2], (BLOCKS, FFN, D), D),
        "down": normal(ks[3], (BLOCKS, D, FFN), FFN) * 0.5,
        "head": normal(ks[4], (VOCAB_PAD, D), D),
    }


def bf16_linear(x, w):
    """The BF16 baseline: x @ w.T with BF16 operands and a BF16 result (as fp8_linear's)."""
    import jax.numpy as jnp

    return jnp.dot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16).T)


def rms_norm(h):
    import jax
    import jax.numpy as jnp

    return h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6)


def forward(params, ctx, linear):
    """Logits [B, VOCAB_PAD] (float32) of the next character after each context ``ctx`` [B, CONTEXT]."""
    import jax
    import jax.numpy as jnp

    e = params["embed"][ctx].reshape(ctx.shape[0], CONTEXT * EMBED)
    h = linear(e.astype(jnp.bfloat16), params["proj"]).astype(jnp.float32)

    def block(h, w):
        up, down = w
        u = jax.nn.gelu(linear(rms_norm(h).astype(jnp.bfloat16), up).astype(jnp.float32))
        return h + linear(u.astype(jnp.bfloat16), down).astype(jnp.float32), None

    h = jax.lax.scan(block, h, (params["up"], params["down"]))[0]
    return bf16_linear(rms_norm(h), params["head"]).astype(jnp.float32)


def loss_fn(params, batch, linear, vocab):
    import jax
    import jax.numpy as jnp

    logits = forward(params, batch[:, :CONTEXT], linear)
    logits = jnp.where(jnp.arange(VOCAB_PAD) < vocab, logits, -1e9)  # padded vocabulary entries never occur
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, batch[:, CONTEXT:], axis=1))


def make_step(linear, data, batch_size: int, vocab: int, lr: float, steps: int):
    """One jitted Adam step: sample ``batch_size`` windows of the text on the device, loss and gradients, update."""
    import jax
    import jax.numpy as jnp

    window = jnp.arange(CONTEXT + 1)

    @jax.jit
    def step(params, m, v, t, key):
        starts = jax.random.randint(key, (batch_size,), 0, data.shape[0] - CONTEXT - 1)
        batch = data[starts[:, None] + window]
        loss, g = jax.value_and_grad(loss_fn)(params, batch, linear, vocab)
        rate = lr * jnp.minimum(1.0, t / 100.0) * 0.5 * (1 + jnp.cos(jnp.pi * jnp.minimum(t / steps, 1.0)))
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree.map(lambda v, g: 0.95 * v + 0.05 * g * g, v, g)
        params = jax.tree.map(lambda p, m, v: p - rate * (m / (1 - 0.9 ** t)) / (jnp.sqrt(v / (1 - 0.95 ** t)) + 1e-8),
                              params, m, v)
        return params, m, v, loss

    return step


def train(name, linear, params, data, args, vocab, eval_batch):
    import jax
    import jax.numpy as jnp

    step = make_step(linear, data, args.batch, vocab, args.lr, args.steps)
    m = v = jax.tree.map(jnp.zeros_like, params)
    key = jax.random.key(1)  # the same batches for both runs
    losses, times, mark = [], [], None
    for t in range(1, args.steps + 1):
        key, sub = jax.random.split(key)
        params, m, v, loss = step(params, m, v, jnp.float32(t), sub)
        if t == 10:  # compilation and warm-up are behind us
            jax.block_until_ready(loss)
            mark = time.perf_counter()
        if t % args.log_every == 0 or t == args.steps:
            losses.append(float(loss))
            print(f"  {name} step {t:5d}  loss {losses[-1]:.4f}", flush=True)
    jax.block_until_ready(params)
    step_ms = (time.perf_counter() - mark) * 1e3 / max(args.steps - 10, 1) if mark else float("nan")
    eval_loss = float(jax.jit(lambda p: loss_fn(p, eval_batch, linear, vocab))(params))
    return losses, step_ms, eval_loss


def layer_check():
    """One FP8 layer's gradients against float32 at a training size: the recipe's accuracy on this GPU."""
    import jax
    import jax.numpy as jnp

    import cupygemm
    import cupygemm.jax as cj

    k1, k2, k3 = jax.random.split(jax.random.key(2), 3)
    x = jax.random.normal(k1, (4096, D), jnp.float32).astype(jnp.bfloat16)
    w = jax.random.normal(k2, (FFN, D), jnp.float32) / np.sqrt(D)
    c = jax.random.normal(k3, (4096, FFN), jnp.float32).astype(jnp.bfloat16).astype(jnp.float32)
    dx, dw = jax.jit(jax.grad(lambda x, w: jnp.sum(cj.fp8_linear(x, w).astype(jnp.float32) * c), (0, 1)))(x, w)
    x64, w64, c64 = (np.asarray(a, np.float64) for a in (x.astype(jnp.float32), w, c))
    for what, got, want in (("dx", dx, c64 @ w64), ("dW", dw, c64.T @ x64)):
        diff = cupygemm.calc_diff(np.asarray(got.astype(jnp.float32), np.float64), want)
        print(f"layer check: fp8_linear {what} [{FFN}x{D}, 4096 tokens] vs float64: calc_diff {diff:.2e}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=4096, help="contexts (tokens) per step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args(argv)

    import cupygemm

    info = cupygemm.device.require_hopper_or_exit()  # one clear line where there is no Hopper GPU
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp

    import cupygemm.jax as cj

    layer_check()
    text = make_text(2_000_000)
    chars = sorted(set(text))
    vocab = len(chars)
    codes = np.frombuffer(text.encode(), np.uint8)
    lut = np.zeros(256, np.int32)
    lut[np.frombuffer("".join(chars).encode(), np.uint8)] = np.arange(vocab)
    ids = lut[codes]
    split = int(0.95 * ids.size)
    data = jnp.asarray(ids[:split])
    held = ids[split:]
    rng = np.random.default_rng(3)
    starts = rng.integers(0, held.size - CONTEXT - 1, 8192)
    eval_batch = jnp.asarray(held[starts[:, None] + np.arange(CONTEXT + 1)])
    print(f"{len(text)} characters, vocabulary {vocab}; model d={D}, ffn={FFN}, {BLOCKS} blocks, "
          f"{args.batch} tokens a step, {args.steps} steps")

    params = init_params(jax.random.key(0), vocab)
    results = {}
    for name, linear in (("fp8", cj.fp8_linear), ("bf16", bf16_linear)):
        print(f"{name}:")
        results[name] = train(name, linear, params, data, args, vocab, eval_batch)
    (l8, ms8, e8), (l16, ms16, e16) = results["fp8"], results["bf16"]
    rel = abs(e8 - e16) / e16
    print(f"held-out loss: fp8 {e8:.4f}, bf16 {e16:.4f} ({100 * rel:.2f} % apart); "
          f"step time: fp8 {ms8:.2f} ms, bf16 {ms16:.2f} ms")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": info.name, "command": shlex.join([sys.executable, *sys.argv]),
                       "steps": args.steps, "log_steps": [min(i * args.log_every, args.steps)
                                                          for i in range(1, len(l8) + 1)],
                       "losses_fp8": l8, "losses_bf16": l16, "eval_loss_fp8": e8, "eval_loss_bf16": e16,
                       "step_ms_fp8": ms8, "step_ms_bf16": ms16}, f, indent=1)
        print(f"wrote {args.out}")
    if rel > 0.01:
        print(f"FAIL: the FP8 loss is {100 * rel:.2f} % from the BF16 loss (more than 1 %)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
