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
does not set it already (``--no-lhs``: neither).

Overlap and layout choice (issue 47; :mod:`cupygemm.jax.parallel_bench`, "Overlap"): ``--overlap local|split`` runs
a device's own tokens on its experts while the other tokens' all_to_alls are in flight, ``--decide`` picks when the
layout is chosen (``after``: a cond per expert step; ``before``: one at the start; ``never``: the exact layout),
``--transport ppermute`` sends with collective-permutes. ``--bench --variants base,split,...`` times such variants
(``+``-joined words, :func:`~cupygemm.jax.parallel_bench.parse_variant`) against the first on 1 and 2 GPUs in one
process, each checked against float32, instead of the full weak/strong bench; ``--dump DIR`` writes their compiled
HLO (where the async collectives land). Process-wide settings, read when JAX starts: ``--command-buffers on|cond``
(XLA command buffers for fusions and custom calls; ``cond`` adds conditionals, run on the device),
``--memcpy-p2p`` (XLA's all_to_all and collective-permute between local GPUs as copy-engine memcpys, no SMs),
``--nccl-channels N`` (NCCL_MAX_NCHANNELS: NCCL's kernels on at most N SMs; pair with ``sms=`` in a variant).
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
parser.add_argument("--overlap", default="none", choices=("none", "local", "split"),
                    help="EP: the own tokens' experts under the all_to_alls (split: half under each)")
parser.add_argument("--decide", default=None, choices=("after", "before", "never"),
                    help="EP: when the layout is chosen (default: after unchunked, before chunked)")
parser.add_argument("--transport", default="all_to_all", choices=("all_to_all", "ppermute"),
                    help="EP with --overlap: one all_to_all each way or D-1 collective-permutes")
parser.add_argument("--variants", default=None,
                    help="with --bench: comma-separated EP variants to time against the first (e.g. "
                         "base,local,split,split+pp,split+before,none+never,split+sms=124) instead of the full bench")
parser.add_argument("--repeats", type=int, default=20, help="--bench: calls a timing (--variants: a round)")
parser.add_argument("--rounds", type=int, default=3, help="--bench --variants: rounds, the variants in turn")
parser.add_argument("--dump", default=None, help="--bench --variants: folder for the compiled HLO of each variant")
parser.add_argument("--skip-check", action="store_true",
                    help="with --bench --variants: no separate check first (every variant is checked against float32)")
parser.add_argument("--no-lhs", action="store_true", help="leave XLA's latency-hiding scheduler at its default")
parser.add_argument("--command-buffers", default="off", choices=("off", "on", "cond"),
                    help="XLA command buffers for fusions and custom calls (cond: and conditionals)")
parser.add_argument("--memcpy-p2p", action="store_true",
                    help="XLA's collectives between this process's GPUs as memcpys (--xla_gpu_use_memcpy_local_p2p)")
parser.add_argument("--nccl-channels", type=int, default=None, help="NCCL_MAX_NCHANNELS for XLA's communicators")
args = parser.parse_args()

# Read when JAX starts its GPU backend, so set before the import. XLA runs all_to_all asynchronously by default
# (--xla_gpu_disable_async_collectives empty), but only the latency-hiding scheduler moves its start above and its
# wait below independent work (the other chunks' GEMMs); the overlap limit (default 1) lets a dispatch and a combine
# be in flight together.
OVERLAP_FLAGS = {"--xla_gpu_enable_latency_hiding_scheduler": "true",
                 "--xla_gpu_experimental_parallel_collective_overlap_limit": "2"}
if args.no_lhs:
    OVERLAP_FLAGS = {}
if args.memcpy_p2p:  # copy engines instead of NCCL's kernels: the transfer takes no SM from the GEMMs beside it
    OVERLAP_FLAGS["--xla_gpu_use_memcpy_local_p2p"] = "true"
if args.command_buffers != "off":
    from cupygemm.jax.flags import COMMAND_BUFFER_FLAGS  # no JAX backend starts here

    for flag in COMMAND_BUFFER_FLAGS:
        name, value = flag.split("=", 1)
        OVERLAP_FLAGS[name] = value + (",CONDITIONAL" if args.command_buffers == "cond" and "FUSION" in value else "")
if args.nccl_channels is not None:  # read when XLA makes its NCCL communicators
    os.environ["NCCL_MAX_NCHANNELS"] = str(args.nccl_channels)
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

if not (args.skip_check and args.bench and args.variants):
    f, inputs, info = mg.moe_setup(gpus, tokens, hidden, inter, experts_per_device=8, topk=args.topk,
                                   slot_factor=args.slot_factor, chunks=args.chunks, overlap=args.overlap,
                                   decide=args.decide, transport=args.transport)
    y = np.asarray(f(*inputs))
    want = mg.moe_reference(info["x"], info["routing"], info["params"])
    print(f"EP MoE on 2 GPUs ({tokens} tokens a GPU in {args.chunks} chunks, each sent once per device; overlap "
          f"{args.overlap}, decide {args.decide or 'default'}, transport {args.transport}; "
          f"{info['slots']} slots an expert a chunk, largest count {info['max_count']}, "
          f"{info['dropped']} choices dropped): "
          f"calc_diff vs float32 = {ref.calc_diff(y, want):.3e}")

    f, inputs, info = mg.mlp_setup(gpus, 2 * tokens, hidden, ffn)
    y = f(*inputs)
    want = mg.mlp_reference(info["x"], info["params"])
    print(f"TP MLP on 2 GPUs ({2 * tokens} tokens, output {y.sharding.spec}): "
          f"calc_diff vs float32 = {ref.calc_diff(np.asarray(y).astype(np.float64), want):.3e}")

if args.bench and args.variants:
    result = mg.variant_bench(gpus, args.variants.split(","), tokens, hidden, inter, 8, args.topk,
                              repeats=args.repeats, rounds=args.rounds, slot_factor=args.slot_factor, dump=args.dump)
    for name, s in result["summary"].items():
        print(f"{name:>24}: " + ", ".join(f"{n} GPU {ms:.3f} ms" for n, ms in s["ms"].items()) +
              f"; weak scaling {s['weak_scaling']:.3f} (against the first variant's 1 GPU: "
              f"{s['weak_scaling_vs_base_1']:.3f})")
elif args.bench:
    result = mg.bench(gpus, tokens, hidden, inter, 8, args.topk, ffn, repeats=args.repeats,
                      slot_factor=args.slot_factor, chunks=args.chunks)
    for row in result["rows"]:
        print(row)
if args.bench and args.out:
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
