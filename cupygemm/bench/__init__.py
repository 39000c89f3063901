"""Benchmarks of cupygemm: ``cupygemm bench`` (kernel time against the peers) and ``cupygemm overhead`` (host time
per call). Not imported by ``import cupygemm``; the CLI imports it only for these two commands.

What ``cupygemm bench`` does, in order:

1. Builds the case list from the kind descriptors (:mod:`cupygemm.kinds`): by default the 28 forward seed shapes
   (``GemmKind.seed_shapes``: 18 normal, 4 contiguous, 6 masked), or the seed shapes of ``--kinds`` (the
   weight-gradient kinds wgrad and k_grouped_wgrad run only when named), and per case its sizes (seeded: forward
   group sizes uniform in 0.7-1.3 x the expected rows; k-grouped K per group as DeepGEMM's test_core draws them).
2. Compiles every kernel the library will pick for those shapes, in parallel, before anything is timed (kinds
   whose configs the bench cannot name compile at their first, untimed, call).
3. Measures the device-to-device copy bandwidth once (it defines the "floor", the physical limit of a shape).
4. Per shape: makes ``randn`` BF16 inputs on the GPU, quantizes them with the kind's recipe
   (:mod:`cupygemm.quantization`), runs every provider once untimed, then ``--iters`` timed calls, each preceded
   by an untimed 1 GiB memset that flushes L2. Everything runs on the legacy default stream, CuPy's and torch's
   alike, so the providers are ordered with the events.
5. Checks each provider's result: forward kinds on sampled rows against a float64 host reference built from the
   quantized inputs (relative Frobenius error) and against the product of the unquantized BF16 inputs
   (``calc_diff``); weight gradients on the whole output (FP32 products, on the GPU) and for bitwise repeatability.
6. Prints a table per family of kinds (and optionally markdown), writes JSON and a bar chart on request.

Modules, in that order: :mod:`~cupygemm.bench.cases` (kinds, shapes, sizes), :mod:`~cupygemm.bench.kinds` (the
one registry of the bench's code per kind family: :mod:`~cupygemm.bench.forward` for normal, contiguous and masked,
:mod:`~cupygemm.bench.training` for wgrad and k_grouped_wgrad), :mod:`~cupygemm.bench.inputs`,
:mod:`~cupygemm.bench.providers` (cupygemm, cuBLAS block-scaled through torch, DeepGEMM),
:mod:`~cupygemm.bench.timing` (flush, events or :mod:`~cupygemm.bench.cupti` kernel time),
:mod:`~cupygemm.bench.metrics` (work, floor, statistics), :mod:`~cupygemm.bench.checks`,
:mod:`~cupygemm.bench.report` (rows, tables, JSON), :mod:`~cupygemm.bench.plot`,
:mod:`~cupygemm.bench.environment` (versions and command recorded with a run), :mod:`~cupygemm.bench.run` (the
loop) and :mod:`~cupygemm.bench.options` (its command line). :mod:`~cupygemm.bench.overhead` is ``cupygemm
overhead``.

The pure parts (cases, formulas, statistics, checks, writers) run without a GPU and are tested on CPU.
"""
