"""``cupygemm chain``: decode sequences of GEMMs back to back on one stream, with and without programmatic dependent
launch (PDL, ``CUPYGEMM_PDL``), on plain and on packed weights, eager and replayed from a CUDA graph, against the sum
of the shapes' floors.

The chains (each GEMM its own operands; a timing repeats the chain ``--chains`` times):

* DeepSeek-V3's per-layer dense decode GEMMs at M tokens (``--m``, default 64 and 128): Mx2112x7168 ->
  Mx24576x1536 -> Mx32768x512 -> Mx7168x16384. Positional MxNxK shapes replace them with one custom chain.
* A masked-MoE decode step (left out with ``--no-moe``): 8 groups at expected_m 32, the expert GEMMs gate/up
  (N=4096, K=7168) then down (N=7168, K=2048) through ``m_grouped_gemm_fp8_fp8_bf16_nt_masked``. masked_m is drawn as
  ``cupygemm bench`` draws it (uniform in 0.7-1.3 x 32, seed 0), once for both GEMMs; max_m is the bench's 4096.

Inputs are the bench's (randn, quantized with the recipe, seed 0). ``--weights``: plain ``(B, SFB)`` and/or
``cupygemm.pack_weights(B, SFB)`` (G x N x K weights pack too). Where packing does not pay (an H200, no side info),
``pack_weights`` keeps B itself: the row's ``side_aware`` is then false and it runs the plain kernels.

Per (chain, weights, PDL): ``eager_us``, CUDA events around ``--chains`` chains launched from Python (host and GPU
both count), and ``graph_us``, the same chains captured once into a CUDA graph, one replay timed right behind another
(replays back to back, as a decode loop runs them: the host submits one while the GPU runs the one before);
``graph_idle_us``, one replay timed from an idle GPU (it also counts the graph launch's host submission, tens of
microseconds for hundreds of kernels, which the GPU waits out after the start event); all per chain, median of
``--rounds``. ``x floor``: each over the sum of the shapes' floors, the floor ``cupygemm bench`` prints:
max(bytes / copy bandwidth, FLOPs / FP8 dense peak), bytes = A + B + D (valid rows), the device-to-device copy
bandwidth measured once. With CUPTI (``cupygemm bench``'s timer; without it the kernel columns are left out):
``kernel_us``, the sum of the chain's kernel durations from GPU timestamps (graph replay), and each shape's kernel
duration with PDL off and on. With PDL a kernel starts before the one ahead of it has ended (after that one's last
tile's math) and waits for it: its duration takes in the end of the one ahead (``overlap_us``), and the per-shape
durations with PDL off and on show what each kernel gains or loses by it.

Check: every mode's outputs (the last chain's, every GEMM of it) equal, bit for bit, those of the chain run eager on
plain weights with PDL off; the exit status is 1 where any differs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..env import PDL
from .cases import BenchUsageError, Shape, Sizes, make_sizes, select_shapes
from .metrics import FP8_DENSE_FLOPS, floor_us, work
from .options import _positive_int, help_text
from .overhead import shape_arg

#: DeepSeek-V3's dense decode GEMMs of one layer, (N, K) in order: q and kv down-projection, q up, kv up, output.
DECODE_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384))
DECODE_M = (64, 128)
#: The masked-MoE step: groups, expected rows per group, and the expert GEMMs' (N, K): gate/up, then down.
MOE_GROUPS, MOE_EXPECTED_M = 8, 32
MOE_NK = ((4096, 7168), (7168, 2048))
WEIGHTS = ("plain", "packed")
SEED = 0
WARMUP_CHAINS = 3


@dataclass(frozen=True)
class Chain:
    """One sequence: its name, its shapes (as ``cupygemm bench`` names cases) and each shape's sizes."""

    name: str
    shapes: tuple[Shape, ...]
    sizes: tuple[Sizes, ...]

    @property
    def label(self) -> str:
        return " -> ".join(s.label for s in self.shapes)


def decode_chains(ms: Sequence[int] | None, custom: Sequence[tuple[int, int, int]] | None,
                  moe: bool) -> list[Chain]:
    """The chains to run: the dense DeepSeek-V3 chain at each of ``ms`` (None: 64 and 128) or one ``custom`` chain
    of MxNxK shapes, then the masked-MoE step if ``moe``. BenchUsageError for a bad combination or shape."""
    if custom and ms:
        raise BenchUsageError("give --m or MxNxK shapes, not both (--m sets M of the default DeepSeek-V3 chain)")
    if custom:
        dense = [("custom", select_shapes(["normal"], [tuple(s) for s in custom]))]
    else:
        dense = [(f"dense M={m}", select_shapes(["normal"], [(m, n, k) for n, k in DECODE_NK]))
                 for m in dict.fromkeys(ms or DECODE_M)]
    chains = [Chain(name, tuple(shapes), tuple(make_sizes(s, SEED) for s in shapes)) for name, shapes in dense]
    if moe:
        shapes = select_shapes(["masked"], [(MOE_GROUPS, MOE_EXPECTED_M, n, k) for n, k in MOE_NK])
        sizes = make_sizes(shapes[0], SEED)  # one draw: the step's tokens pass through both expert GEMMs
        chains.append(Chain(f"moe {MOE_GROUPS}x{MOE_EXPECTED_M}", tuple(shapes), (sizes,) * len(shapes)))
    return chains


def shape_floors(chain: Chain, copy_bytes_per_s: float) -> list[dict[str, Any]]:
    """Each shape's FLOPs, bytes and floor in microseconds, as ``cupygemm bench`` counts them."""
    out = []
    for shape, sizes in zip(chain.shapes, chain.sizes):
        flops, nbytes = work(shape, sizes)
        out.append({"kind": shape.kind, "shape": shape.label, "valid_rows": sizes.valid_m, "flops": flops,
                    "bytes": nbytes, "floor_us": floor_us(flops, nbytes, copy_bytes_per_s)})
    return out


def kernel_stats(records: Sequence[tuple[int, int, str]], per_chain: int, chains: int) -> dict[str, Any]:
    """CUPTI kernel records (start ns, end ns, name; by start) of ``chains`` chains of ``per_chain`` GEMMs, per
    chain: ``kernel_us``, the kernels' durations summed; ``span_us``, first start to last end; ``overlap_us``, the
    time each kernel ran beside the one before it (PDL). ``shape_us``: each GEMM's median duration, in chain order
    (None unless the records are one kernel per GEMM)."""
    durations = [(end - start) / 1e3 for start, end, _ in records]
    overlap = sum(max(0, min(prev[1], cur[1]) - cur[0]) for prev, cur in zip(records, records[1:])) / 1e3
    stats: dict[str, Any] = {"kernels": len(records), "kernel_us": sum(durations) / chains,
                             "span_us": None, "overlap_us": overlap / chains, "shape_us": None}
    if records:
        stats["span_us"] = (max(end for _, end, _ in records) - records[0][0]) / 1e3 / chains
    if len(records) == per_chain * chains:
        stats["shape_us"] = [statistics.median(durations[i::per_chain]) for i in range(per_chain)]
    return stats


# ---- on the GPU ------------------------------------------------------------------------------------------------

@dataclass
class Gemm:
    """One GEMM of a chain: the entry point, A and its scales, the weights both ways and the arguments after
    ``out`` (masked: masked_m, expected_m)."""

    fn: Callable[..., Any]
    lhs: tuple[Any, Any]
    plain: tuple[Any, Any]
    packed: Any  # PackedWeights, or None when --weights leaves them out
    extra: tuple[Any, ...]
    out_shape: tuple[int, ...]


def build_operands(chain: Chain, weights: Sequence[str], stream: Any) -> list[Gemm]:
    """The chain's operands, made as ``cupygemm bench`` makes its inputs (seeded per shape), on ``stream``, and
    packed weights where ``weights`` asks for them."""
    import cupygemm

    from .forward import _extra_args, _out_shape
    from .inputs import make_inputs

    gemms = []
    with stream:
        for shape, sizes in zip(chain.shapes, chain.sizes):
            inp = make_inputs(shape, sizes, SEED)
            inp.x = inp.y = None  # the unquantized inputs serve the bench's accuracy checks, not these
            packed = cupygemm.pack_weights(inp.b, inp.sfb, stream=stream) if "packed" in weights else None
            gemms.append(Gemm(getattr(cupygemm, shape.descriptor.api), (inp.a, inp.sfa_mn), (inp.b, inp.sfb),
                              packed, _extra_args(shape.descriptor, inp), _out_shape(inp)))
    stream.synchronize()
    return gemms


def _outputs(gemms: Sequence[Gemm], stream: Any) -> list[Any]:
    """Zeroed BF16 outputs (as uint16 bits): rows a masked GEMM skips stay zero in every mode, so whole outputs
    compare."""
    import cupy as cp

    with stream:
        return [cp.zeros(g.out_shape, cp.uint16) for g in gemms]


def _chain_call(gemms: Sequence[Gemm], weights: str, outs: Sequence[Any], stream: Any) -> Callable[[], None]:
    from ..tensors import BF16

    calls = [(g.fn, (g.lhs, g.plain if weights == "plain" else g.packed, o.view(BF16)) + g.extra)
             for g, o in zip(gemms, outs)]

    def chain() -> None:
        for fn, args in calls:
            fn(*args, stream=stream)

    return chain


def _differing(outs: Sequence[Any], want: Sequence[Any], stream: Any) -> list[int]:
    """Indices of the outputs that are not bit for bit ``want``'s (compared on ``stream``, after the chain)."""
    import cupy as cp

    with stream:
        same = [cp.array_equal(o, w) for o, w in zip(outs, want)]
    stream.synchronize()
    return [i for i, s in enumerate(same) if not bool(s)]


def reference_outputs(gemms: Sequence[Gemm], stream: Any) -> list[Any]:
    """The outputs of one chain run eager on plain weights with PDL off: what every mode must give."""
    os.environ[PDL] = "0"
    outs = _outputs(gemms, stream)
    _chain_call(gemms, "plain", outs, stream)()
    stream.synchronize()
    return outs


def measure_case(chain: Chain, gemms: Sequence[Gemm], weights: str, pdl: bool, chains: int, rounds: int,
                 stream: Any, want: Sequence[Any], kernel_timer: Any) -> dict[str, Any]:
    """One (chain, weights, PDL) case: eager and graph microseconds per chain, the plans it ran, which outputs
    differ from ``want`` (shape labels) and, with a CUPTI ``kernel_timer``, kernel durations."""
    from .. import gemm as call_path
    from .timing import back_to_back_us, capture_graph, stream_event_us

    os.environ[PDL] = "1" if pdl else "0"  # read on every call (part of the plan's key)
    outs = _outputs(gemms, stream)
    chain_call = _chain_call(gemms, weights, outs, stream)

    def eager() -> None:
        for _ in range(chains):
            chain_call()

    call_path._calls.clear()  # the call memo then holds this case's plans only, in chain order
    for _ in range(WARMUP_CHAINS):
        chain_call()  # plans, kernels and scratch before timing and capture
    stream.synchronize()
    plans = [p for _, p in call_path._calls.values() if p is not None]
    eager_us = statistics.median(stream_event_us(stream, eager, chains) for _ in range(rounds))
    eager_bad = _differing(outs, want, stream)
    with stream:
        for o in outs:
            o.fill(0)  # what the graph does not write reads as a difference
    graph = capture_graph(stream, chain_call, chains)
    replay = lambda: graph.launch(stream)  # noqa: E731
    graph_us = statistics.median(back_to_back_us(stream, replay, chains) for _ in range(rounds))
    graph_idle_us = statistics.median(stream_event_us(stream, replay, chains) for _ in range(rounds))
    graph_bad = _differing(outs, want, stream)
    labels = [s.label for s in chain.shapes]
    row: dict[str, Any] = {
        "chain": chain.name, "weights": weights, "pdl": pdl,
        "side_aware": bool(plans) and all(p.cfg.sides for p in plans), "plans_pdl": sorted({p.pdl for p in plans}),
        "configs": [p.cfg.describe() for p in plans], "eager_us": eager_us, "graph_us": graph_us,
        "graph_idle_us": graph_idle_us,
        "eager_differs": [labels[i] for i in eager_bad], "graph_differs": [labels[i] for i in graph_bad]}
    if kernel_timer is not None:
        row["cupti_eager"] = kernel_stats(kernel_timer.records(eager, stream.synchronize), len(gemms), chains)
        row["cupti_graph"] = kernel_stats(kernel_timer.records(lambda: graph.launch(stream), stream.synchronize),
                                          len(gemms), chains)
    return row


def precompile(chains: Sequence[Chain], sides: Sequence[bool], num_sms: int, smem_limit: int) -> None:
    """Compile every kernel the chains will launch, both PDL variants, in parallel worker processes (as ``cupygemm
    bench`` does) instead of one at a time at the first calls."""
    from .cases import shape_config
    from .run import _err, _progress, compile_configs

    cfgs = [shape_config(s, z, num_sms, smem_limit, side) for c in chains for s, z in zip(c.shapes, c.sizes)
            for side in sides]
    for pdl in ("0", "1"):
        os.environ[PDL] = pdl  # the PDL variant is another kernel source; the workers inherit the environment
        try:
            compile_configs(cfgs, os.cpu_count() or 1)
        except Exception as e:  # a kernel that fails fails again at its first call, which reports it
            _progress(f"pre-compilation failed: {_err(e)}")


# ---- the report ---------------------------------------------------------------------------------------------------

def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _pdl(row: dict[str, Any]) -> str:
    """on/off; "on (not launched)" where a plan launched without PDL (a driver older than CUDA 12.4's)."""
    if not row["pdl"]:
        return "off"
    return "on" if row.get("plans_pdl") == [True] else "on (not launched)"


def _weights(row: dict[str, Any]) -> str:
    return row["weights"] + (" (plain here)" if row["weights"] == "packed" and not row["side_aware"] else "")


def _bitwise(row: dict[str, Any]) -> str:
    bad = [f"{mode} {', '.join(row[f'{mode}_differs'])}" for mode in ("eager", "graph") if row[f"{mode}_differs"]]
    return "equal" if not bad else "DIFFERS: " + "; ".join(bad)


def report(sequences: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The printed report: the chains and their floors, one table row per (chain, weights, PDL), PDL's ratios and,
    where CUPTI timed the kernels, each shape's kernel duration with PDL off and on."""
    lines = [f"copy bandwidth {meta['copy_gbs'] / 1e3:.2f} TB/s; floor per shape = max(bytes / copy bandwidth, "
             f"FLOPs / {FP8_DENSE_FLOPS / 1e12:.0f} TFLOPS), as cupygemm bench"]
    for seq in sequences:
        floors = " + ".join(f"{s['floor_us']:.1f}" for s in seq["shapes"])
        rows_note = f" (masked_m {', '.join(map(str, seq['masked_m']))})" if seq.get("masked_m") else ""
        lines.append(f"{seq['name']}: {seq['label']}{rows_note}; floors {floors} = {seq['floor_us']:.1f} us")
    lines.append(f"{meta['chains']} chains per timing, median of {meta['rounds']}; packed weights: "
                 f"{meta['packing']}; kernel durations: {meta['kernel_timer']}")
    cupti = any("cupti_graph" in r for r in rows)
    head = ["chain", "weights", "PDL", "eager us/chain", "x floor", "graph us/chain", "x floor", "graph from idle"]
    head += ["kernels us/chain", "overlap us/chain"] if cupti else []
    head.append("bitwise")
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["chain"], _weights(r), _pdl(r), _fmt(r["eager_us"]), _fmt(r["eager_x_floor"], ".2f"),
                 _fmt(r["graph_us"]), _fmt(r["graph_x_floor"], ".2f"), _fmt(r.get("graph_idle_us"))]
        if cupti:
            g = r.get("cupti_graph") or {}
            cells += [_fmt(g.get("kernel_us")), _fmt(g.get("overlap_us"))]
        cells.append(_bitwise(r))
        lines.append("| " + " | ".join(cells) + " |")
    pairs = _pdl_pairs(rows)
    if pairs:
        lines += ["", "PDL on / off, eager and graph: " + "; ".join(
            f"{off['chain']} {off['weights']} {on['eager_us'] / off['eager_us']:.3f}, "
            f"{on['graph_us'] / off['graph_us']:.3f}" for off, on in pairs)]
    shape_lines = _shape_table(sequences, pairs)
    if shape_lines:
        lines += ["", "Kernel durations per shape (CUPTI, graph replay, median over the chains), us:"] + shape_lines
    lines += ["", "outputs bitwise equal to the plain, PDL off, eager chain's: "
              + ("all" if meta["outputs_equal"] else "NOT ALL (exit status 1)")]
    return "\n".join(lines)


def _pdl_pairs(rows: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(PDL off row, PDL on row) of each (chain, weights) that ran both."""
    by = {(r["chain"], r["weights"], r["pdl"]): r for r in rows}
    return [(r, by[(r["chain"], r["weights"], True)]) for r in rows
            if not r["pdl"] and (r["chain"], r["weights"], True) in by]


def _shape_table(sequences: Sequence[dict[str, Any]], pairs: Sequence[tuple[dict, dict]]) -> list[str]:
    labels = {s["name"]: [x["shape"] for x in s["shapes"]] for s in sequences}
    out = []
    for off, on in pairs:
        a, b = (r.get("cupti_graph") or {} for r in (off, on))
        if a.get("shape_us") is None or b.get("shape_us") is None:
            continue
        for label, x, y in zip(labels[off["chain"]], a["shape_us"], b["shape_us"]):
            out.append(f"| {off['chain']} | {off['weights']} | {label} | {x:.2f} | {y:.2f} | {y - x:+.2f} |")
    return ["| chain | weights | shape | PDL off | PDL on | on - off |", "|---|---|---|---|---|---|"] + out if out \
        else []


def run(args: argparse.Namespace) -> int:
    try:
        chains = decode_chains(args.m, args.shapes, not args.no_moe)
    except BenchUsageError as e:
        print(f"cupygemm chain: {e}", file=sys.stderr)
        return 2
    from ..device import require_hopper_or_exit

    info = require_hopper_or_exit("cupygemm chain")
    saved = os.environ.get(PDL)
    try:
        return _run(args, chains, info)
    finally:  # the cases set it per case; leave the process's setting as it was
        if saved is None:
            os.environ.pop(PDL, None)
        else:
            os.environ[PDL] = saved


def _run(args: argparse.Namespace, chains: list[Chain], info: Any) -> int:
    import cupy as cp

    from .. import l2
    from ..device import get_num_sms
    from .overhead import environment
    from .timing import measure_copy_bandwidth, open_cupti_timer

    weights = list(dict.fromkeys(args.weights))
    copy_bw = measure_copy_bandwidth()
    kernel_timer, why = open_cupti_timer()
    plain_why = l2.why_plain(cp.cuda.runtime.getDevice()) if "packed" in weights else None
    side_aware = "packed" in weights and plain_why is None
    packing = "not run" if "packed" not in weights else "side-aware" if side_aware else f"kept plain ({plain_why})"
    precompile(chains, (False, True) if side_aware else (False,), get_num_sms(), info.max_smem_per_block)
    meta: dict[str, Any] = {"chains": args.chains, "rounds": args.rounds, "copy_gbs": copy_bw / 1e9,
                            "packing": packing,
                            "kernel_timer": f"CUPTI ({why})" if kernel_timer is not None else f"none ({why})"}
    stream = cp.cuda.Stream(non_blocking=True)
    sequences, rows = [], []
    for chain in chains:
        floors = shape_floors(chain, copy_bw)
        total = sum(s["floor_us"] for s in floors)
        seq = {"name": chain.name, "label": chain.label, "shapes": floors, "floor_us": total}
        if chain.shapes[0].kind == "masked":
            seq["masked_m"] = list(chain.sizes[0].group_rows)
        sequences.append(seq)
        gemms = build_operands(chain, weights, stream)
        want = reference_outputs(gemms, stream)
        for w in weights:
            for pdl in (False, True):
                row = measure_case(chain, gemms, w, pdl, args.chains, args.rounds, stream, want, kernel_timer)
                row.update(floor_us=total, eager_x_floor=row["eager_us"] / total, graph_x_floor=row["graph_us"] / total)
                rows.append(row)
                print(f"[cupygemm] {chain.name}, {w}, PDL {_pdl(row)}: eager {row['eager_us']:.1f}, graph "
                      f"{row['graph_us']:.1f} us/chain; {_bitwise(row)}", file=sys.stderr, flush=True)
        del gemms, want
        cp.get_default_memory_pool().free_all_blocks()
    same = all(not r["eager_differs"] and not r["graph_differs"] for r in rows)
    meta["outputs_equal"] = same
    print(report(sequences, rows, meta))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(["cupygemm chain"] + sys.argv[2:]), **meta, "sequences": sequences,
                       "environment": environment(), "rows": rows}, f, indent=1)
        print(f"wrote {args.json}")
    return 0 if same else 1


def add_parser(sub: Any) -> None:
    sp = sub.add_parser("chain", help="decode sequences of GEMMs back to back (dense and masked MoE), with and "
                        "without programmatic dependent launch, plain and packed weights, eager and in a CUDA graph",
                        description=help_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("shapes", nargs="*", type=shape_arg,
                    help="MxNxK in chain order: one custom dense chain instead of DeepSeek-V3's")
    sp.add_argument("--m", nargs="+", type=_positive_int, default=None, metavar="M",
                    help="M (tokens) of the DeepSeek-V3 dense chain, one chain each (default: 64 128)")
    sp.add_argument("--weights", nargs="+", choices=WEIGHTS, default=list(WEIGHTS),
                    help="plain (B, SFB) and/or cupygemm.pack_weights(B, SFB) (default: both)")
    sp.add_argument("--no-moe", action="store_true", help="leave out the masked-MoE decode step")
    sp.add_argument("--chains", type=_positive_int, default=50, help="chains per timing (default 50)")
    sp.add_argument("--rounds", type=_positive_int, default=7, help="timings; the median is reported (default 7)")
    sp.add_argument("--json", metavar="FILE", help="write the rows, the floors and the environment as JSON")
    sp.set_defaults(func=run)
