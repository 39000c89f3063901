"""Benchmarks of cupygemm: ``cupygemm bench`` (kernel time against the peers) and ``cupygemm overhead`` (host time
per call). Not imported by ``import cupygemm``; the CLI imports it only for these two commands.

What ``cupygemm bench`` does, in order:

1. Builds the case list (the 28 seed shapes of :mod:`cupygemm.shapes` by default: 18 normal, 4 contiguous,
   6 masked) and, per case, the row layout of the grouped kinds (seeded: group sizes uniform in 0.7-1.3 x the
   expected rows).
2. Compiles every kernel the library will pick for those shapes, in parallel, before anything is timed.
3. Measures the device-to-device copy bandwidth once (it defines the "floor", the physical limit of a shape).
4. Per shape: makes ``randn`` BF16 inputs on the GPU, quantizes them with the 1x128 / 128x128 recipe
   (:mod:`cupygemm.quantization`), runs every provider once untimed, then ``--iters`` timed calls, each preceded
   by an untimed 1 GiB memset that flushes L2. Everything runs on the legacy default stream, CuPy's and torch's
   alike, so the providers are ordered with the events.
5. Checks each provider's result on sampled rows against a float64 host reference built from the quantized inputs
   (relative Frobenius error) and against the product of the unquantized BF16 inputs (``calc_diff``).
6. Prints a table (and optionally markdown), writes JSON and a bar chart on request.

Modules, in that order: :mod:`~cupygemm.bench.cases` (shapes, group sizes, sampled rows),
:mod:`~cupygemm.bench.inputs`, :mod:`~cupygemm.bench.providers` (cupygemm, cuBLAS block-scaled through torch,
DeepGEMM), :mod:`~cupygemm.bench.timing` (flush, events or :mod:`~cupygemm.bench.cupti` kernel time),
:mod:`~cupygemm.bench.metrics` (work, floor, statistics), :mod:`~cupygemm.bench.checks`,
:mod:`~cupygemm.bench.report` (rows, tables, JSON), :mod:`~cupygemm.bench.plot`,
:mod:`~cupygemm.bench.environment` (versions and command recorded with a run), :mod:`~cupygemm.bench.run` (the
loop) and :mod:`~cupygemm.bench.options` (its command line). :mod:`~cupygemm.bench.overhead` is ``cupygemm
overhead``.

The pure parts (cases, formulas, statistics, checks, writers) run without a GPU and are tested on CPU.
"""
