"""Expert-parallel MoE and tensor-parallel MLP in JAX on two GPUs with cupygemm's FP8 kernels.

* EP: tokens quantized per device and sent with ``lax.all_to_all`` inside ``shard_map`` once to each device that
  holds any of their experts, each device's experts run as masked grouped GEMMs (DeepSeek-V3 shapes: hidden 7168,
  expert intermediate 2048, 4096 tokens and 8 experts a GPU), each token's outputs summed on the expert device and
  sent back once, the devices' sums added up;
* TP: an MLP under plain ``jit`` with NamedShardings: column-parallel up-projection, row-parallel down-projection
  (cupygemm.jax's partitioning rules: the down GEMM's K-sharded partial products summed by one all-reduce).

Both are checked against float32 on one device. ``--small`` shrinks the shapes; ``--bench`` times both layers on 1
and 2 GPUs (weak and strong scaling, :mod:`cupygemm.jax.parallel_bench`) and writes JSON to ``--out``.
``--chunks`` splits the EP layer's tokens into chunks whose all_to_alls XLA may overlap with the other chunks' GEMMs
(default 1: on 2x H200 2 and 4 chunks ran slower, benchmarks/NOTES.md, "Multi-GPU");
for that the example turns on XLA's latency-hiding scheduler (and lets two async collectives be in flight: chunk
i+1's dispatch and chunk i-1's combine under chunk i's GEMMs) in ``XLA_FLAGS``, each flag only where ``XLA_FLAGS``
does not set it already.
"""
import argparse
import json
import os
import sys

import cupygemm

cupygemm.device.require_hopper_or_exit()  # one clear line, not CuPy's driver error, where there is no Hopper GPU

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--small", action="store_true", help="hidden 1024, intermediate 256, 512 tokens a GPU")
parser.add_argument("--bench", action="store_true", help="time the layers on 1 and 2 GPUs")
parser.add_argument("--out", default=None, help="JSON file for --bench")
parser.add_argument("--topk", type=int, default=8)
parser.add_argument("--slot-factor", type=float, default=1.125,
                    help="EP rows per expert in the small layout, x the average count (>= 2: the exact layout only)")
parser.add_argument("--chunks", type=int, default=1,
                    help="EP token chunks a device (1: one dispatch, FFN and combine; more: their all_to_alls overlap "
                         "the other chunks' GEMMs)")
args = parser.parse_args()

# Read when JAX starts its GPU backend, so set before the import. XLA runs all_to_all asynchronously by default
# (--xla_gpu_disable_async_collectives empty), but only the latency-hiding scheduler moves its start above and its
# wait below independent work (the other chunks' GEMMs); the overlap limit (default 1) lets a dispatch and a combine
# be in flight together.
OVERLAP_FLAGS = {"--xla_gpu_enable_latency_hiding_scheduler": "true",
                 "--xla_gpu_experimental_parallel_collective_overlap_limit": "2"}
user_flags = os.environ.get("XLA_FLAGS", "")
added = [f"{k}={v}" for k, v in OVERLAP_FLAGS.items() if k not in user_flags]
os.environ["XLA_FLAGS"] = " ".join([user_flags, *added]).strip()
print(f"XLA_FLAGS added: {' '.join(added) or '(none: XLA_FLAGS sets them)'}; XLA_FLAGS={os.environ['XLA_FLAGS']!r}")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from cupygemm import reference as ref  # noqa: E402
from cupygemm.jax import parallel_bench as mg  # noqa: E402

gpus = jax.devices("gpu")
if len(gpus) < 2:
    print(f"jax_expert_parallel_moe: needs 2 GPUs, found {len(gpus)}; nothing to do")
    sys.exit(0)
gpus = gpus[:2]
hidden, inter, tokens, ffn = (1024, 256, 512, 2048) if args.small else (7168, 2048, 4096, 18432)

f, inputs, info = mg.moe_setup(gpus, tokens, hidden, inter, experts_per_device=8, topk=args.topk,
                               slot_factor=args.slot_factor, chunks=args.chunks)
y = np.asarray(f(*inputs))
want = mg.moe_reference(info["x"], info["routing"], info["params"])
print(f"EP MoE on 2 GPUs ({tokens} tokens a GPU in {args.chunks} chunks, each sent once per device; "
      f"{info['slots']} slots an expert a chunk, largest count {info['max_count']}, "
      f"{info['dropped']} choices dropped): "
      f"calc_diff vs float32 = {ref.calc_diff(y, want):.3e}")

f, inputs, info = mg.mlp_setup(gpus, 2 * tokens, hidden, ffn)
y = f(*inputs)
want = mg.mlp_reference(info["x"], info["params"])
print(f"TP MLP on 2 GPUs ({2 * tokens} tokens, output {y.sharding.spec}): "
      f"calc_diff vs float32 = {ref.calc_diff(np.asarray(y).astype(np.float64), want):.3e}")

if args.bench:
    result = mg.bench(gpus, tokens, hidden, inter, 8, args.topk, ffn, slot_factor=args.slot_factor,
                      chunks=args.chunks)
    for row in result["rows"]:
        print(row)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
