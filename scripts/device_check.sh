#!/usr/bin/env bash
# One device call: install, run the gpu tests, run the benchmark; everything lands under $OUT.
# Usage (from the repo root on the GPU machine):
#   bash scripts/device_check.sh [tests] [tests-under-load] [tests-repeat N] [capture-probe] [bench] [peers] [decode]
#                                [masked-full] [train-bench] [train-step] [train-examples] [multigpu] [overhead] [chain]
#                                [chain-prefetch] [pdl-lone] [side-tickets] [casts] [jax] [timers] [sanitize]
#                                [pytest args...]
# tests: the gpu tests (log: gpu_tests.log). tests-under-load: the same beside another process running GEMMs
# (scripts/gpu_load.py, for LOAD_SECONDS, default 600, and stopped when the tests end; log:
# gpu_tests_under_load.log, the load's own lines at its end). tests-repeat N: the gpu tests N times in a row (default
# 3), each run's summary line and failures in gpu_tests_repeat.txt; with LOAD=1 all N runs beside one load process.
# Pytest args apply to every test step (e.g. tests-repeat 10 -k "pdl or capture"). capture-probe: which calls
# elsewhere in a process invalidate a torch.cuda.graph capture (scripts/capture_probe.py; capture_probe.txt).
# peers: set up DeepGEMM and DeeperGEMM from a carried .peers/ folder (benchmarks/README.md, Peers); decode: the
# M = 64 and 128 seed shapes against every peer, cupygemm with packed (L2-side-aware) weights too. train-bench: the
# weight-gradient kinds (wgrad, k_grouped_wgrad; DeepGEMM 03d0be3 test_core's 18 shapes) against DeepGEMM's wgrad
# functions in the same run (after peers; cupygemm alone when deep_gemm does not import; log: train_bench.log).
# train-step: `cupygemm train-step --jax` (train_step.json, train_step.log). train-examples: the two FP8 training
# examples (train_torch.json, train_jax.json). multigpu (two GPUs): `-m multigpu` tests, the expert-parallel examples,
# `cupygemm multigpu` and the JAX example's --bench (multigpu_*.json, multigpu_*.log).
set -uo pipefail
OUT=${OUT:-/tmp/cupygemm-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export CUPYGEMM_CACHE_DIR=${CUPYGEMM_CACHE_DIR:-/tmp/cupygemm-cache}
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX shares the GPU with CuPy and torch in the tests
# Leading words are steps; everything from the first option on goes to pytest (e.g. tests -k two_acc).
# A number after tests-repeat is its count.
steps=(); pytest_args=()
for a in "$@"; do
  if [ ${#pytest_args[@]} -gt 0 ] || [[ "$a" == -* ]]; then
    pytest_args+=("$a")
  elif [[ "$a" =~ ^[0-9]+$ ]] && [ "${steps[*]: -1}" = tests-repeat ]; then
    steps[-1]="tests-repeat:$a"
  else
    steps+=("$a")
  fi
done
[ ${#steps[@]} -eq 0 ] && steps=(tests bench)

# The gpu tests, in parallel processes where pytest-xdist is installed (kernel builds dominate, and they run on the
# CPU). Writes the whole output to $1, shows its tail; returns pytest's status.
gpu_tests() {
  local xdist=()
  python3 -c "import xdist" 2>/dev/null && xdist=(-n 12 --dist loadgroup)  # xdist_group marks share a worker
  python3 -m pytest -q -m gpu -rfEs ${xdist[@]+"${xdist[@]}"} tests ${pytest_args[@]+"${pytest_args[@]}"} 2>&1 \
    | tee "$1" | tail -n 40
  return "${PIPESTATUS[0]}"
}

# Another process keeping the GPU busy (scripts/gpu_load.py) until stop_load or LOAD_SECONDS; output to $1.
load_pid=""
start_load() {
  python3 scripts/gpu_load.py --seconds "${LOAD_SECONDS:-600}" > "$1" 2>&1 &
  load_pid=$!
  for _ in $(seq 300); do  # until its loop runs (the first GEMM may compile)
    grep -q '^running' "$1" 2>/dev/null && break
    kill -0 "$load_pid" 2>/dev/null || break
    sleep 1
  done
  head -n 1 "$1"
}
stop_load() {
  [ -n "$load_pid" ] || return 0
  kill "$load_pid" 2>/dev/null; wait "$load_pid" 2>/dev/null; load_pid=""
  { echo "--- scripts/gpu_load.py ---"; cat "$1"; } >> "$2"
}
trap 'if [ -n "$load_pid" ]; then kill "$load_pid" 2>/dev/null; fi' EXIT

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/device.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -n 2
python3 -m cupygemm info | tee -a "$OUT/device.txt"
for s in "${steps[@]}"; do
  case "$s" in
    tests) gpu_tests "$OUT/gpu_tests.log" ;;
    tests-under-load)
      start_load /tmp/cupygemm-load.log
      gpu_tests "$OUT/gpu_tests_under_load.log"
      stop_load /tmp/cupygemm-load.log "$OUT/gpu_tests_under_load.log" ;;
    tests-repeat|tests-repeat:*)
      n=${s#tests-repeat}; n=${n#:}; n=${n:-3}; summary="$OUT/gpu_tests_repeat.txt"
      echo "tests-repeat $n${pytest_args[*]:+ ${pytest_args[*]}}${LOAD:+ (beside scripts/gpu_load.py)}" > "$summary"
      if [ -n "${LOAD:-}" ]; then start_load /tmp/cupygemm-load.log; fi
      for i in $(seq "$n"); do
        gpu_tests /tmp/cupygemm-repeat.log > /dev/null; rc=$?
        line=$(grep -E '[0-9]+ (passed|failed|errors?|skipped)' /tmp/cupygemm-repeat.log | tail -n 1)
        { echo "run $i/$n (rc $rc): ${line:-no summary line}"; grep -E '^(FAILED|ERROR) ' /tmp/cupygemm-repeat.log; } \
          | tee -a "$summary"
      done
      if [ -n "${LOAD:-}" ]; then stop_load /tmp/cupygemm-load.log "$summary"; fi ;;
    capture-probe) python3 scripts/capture_probe.py 2>&1 | tee "$OUT/capture_probe.txt" ;;
    bench)
      # Grouped shapes run the valid-row totals the peer table measured on this kind of GPU (--match-rows).
      gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
      case "$gpu" in *H100*) peers=benchmarks/peers/h100-2026-11-21.json ;; *) peers=benchmarks/peers/h200-2026-11-21.json ;; esac
      python3 -m cupygemm bench --match-rows "$peers" --json "$OUT/bench.json" --markdown --plot "$OUT/bench.png" 2>&1 \
        | tee "$OUT/bench.log" ;;
    peers)
      if [ -f .peers/setup.sh ]; then eval "$(bash .peers/setup.sh)"; else echo "peers: no .peers/ carried"; fi ;;
    decode)
      python3 -m cupygemm bench --kinds normal --shapes 64x2112x7168 64x24576x1536 64x32768x512 64x7168x16384 \
        64x4096x7168 64x7168x2048 128x2112x7168 128x24576x1536 128x32768x512 128x7168x16384 128x4096x7168 \
        128x7168x2048 --peers packed,cublas,deepgemm,deepergemm,deepergemm_s128 \
        ${DEEPERGEMM_SIDEAWARE:+--deepergemm-sideaware "$DEEPERGEMM_SIDEAWARE"} --json "$OUT/decode.json" --markdown \
        2>&1 | tee "$OUT/decode.log" ;;
    masked-full)  # masked groups with every row valid (max_m = expected_m), DeepGEMM in the same run
      python3 -m cupygemm bench --kinds masked --full-groups --peers deepgemm --json "$OUT/masked_full.json" --markdown \
        2>&1 | tee "$OUT/masked_full.log" ;;
    train-bench)  # wgrad and k-grouped wgrad, DeepGEMM timed in the same run (run the peers step first)
      tpeers=deepgemm
      if ! python3 -c "import deep_gemm" >/dev/null 2>&1; then
        echo "train-bench: deep_gemm does not import (peers step run? .peers/ carried?): cupygemm alone"; tpeers=none
      fi
      python3 -m cupygemm bench --kinds wgrad,k_grouped_wgrad --peers "$tpeers" --json "$OUT/train_bench.json" \
        --markdown 2>&1 | tee "$OUT/train_bench.log" ;;
    overhead) python3 -m cupygemm overhead --markdown --json "$OUT/overhead.json" 2>&1 | tee "$OUT/overhead.log" ;;
    chain) python3 -m cupygemm chain --json "$OUT/chain.json" 2>&1 | tee "$OUT/chain.log" ;;
    chain-prefetch)  # packed weights' L2 prefetch before the PDL wait: the chain at other budgets (KiB)
      i=0
      for kib in ${PREFETCH_KIB:-0 8192 0 8192}; do  # alternating, so that drift shows as such
        i=$((i + 1))
        CUPYGEMM_B_PREFETCH_KIB=$kib python3 -m cupygemm chain --weights packed \
          --json "$OUT/chain_prefetch_${i}_$kib.json" 2>&1 | tee "$OUT/chain_prefetch_${i}_$kib.log"
      done ;;
    pdl-lone)  # where a lone PDL call's cost comes from: the launch attribute or the kernel variant
      python3 benchmarks/probes/pdl_lone_probe.py "$OUT/pdl_lone.json" 2>&1 | tee "$OUT/pdl_lone.log" ;;
    side-tickets)  # packed PDL launches drawing their side ticket before the wait against after it, one process
      python3 benchmarks/probes/side_ticket_ab.py "$OUT/side_tickets.json" 2>&1 | tee "$OUT/side_tickets.log" ;;
    train-step)  # forward + backward of one FP8 linear layer against BF16 and torch._scaled_mm (torch and JAX)
      python3 -m cupygemm train-step --jax --json "$OUT/train_step.json" 2>&1 | tee "$OUT/train_step.log" ;;
    train-examples)  # the FP8-vs-BF16 training examples, their loss curves and step times as JSON
      python3 examples/train_fp8_mlp_torch.py --out "$OUT/train_torch.json" 2>&1 | tee "$OUT/train_examples.log"
      python3 examples/train_fp8_mlp_jax.py --out "$OUT/train_jax.json" 2>&1 | tee -a "$OUT/train_examples.log" ;;
    multigpu)  # two or more GPUs: the multigpu tests, both expert-parallel examples, both multi-GPU benchmarks
      python3 -m pytest -q -m multigpu -rfEs tests 2>&1 | tee "$OUT/multigpu_tests.log" | tail -n 30
      torchrun --nproc-per-node 2 examples/torch_expert_parallel_moe.py 2>&1 | tee "$OUT/multigpu_examples.log"
      python3 examples/jax_expert_parallel_moe.py 2>&1 | tee -a "$OUT/multigpu_examples.log"
      python3 -m cupygemm multigpu --out "$OUT/multigpu_torch.json" 2>&1 | tee "$OUT/multigpu_bench.log"
      python3 examples/jax_expert_parallel_moe.py --bench --out "$OUT/multigpu_jax.json" 2>&1 \
        | tee -a "$OUT/multigpu_bench.log" ;;
    casts)  # the FP8 casts (fused transpose casts too) at DeepSeek-V3 training sizes, against a D2D copy
      python3 -m cupygemm cast-bench --json "$OUT/casts.json" 2>&1 | tee "$OUT/casts.log" ;;
    jax)  # cupygemm.jax in a lax.scan, with and without XLA command buffers; the FP8 MLP example
      XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m cupygemm jax-scan --json "$OUT/jax_scan.json" 2>&1 \
        | tee "$OUT/jax_scan.log"
      XLA_PYTHON_CLIENT_PREALLOCATE=false python3 examples/jax_fp8_mlp.py 2>&1 | tee -a "$OUT/jax_scan.log" ;;
    timers)  # CUPTI through ctypes vs cupti-python vs CUDA events (carry cupti-python's wheel in .whl/)
      if ls .whl/cupti_python-*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
      fi
      python3 scripts/compare_timers.py --out "$OUT/timers" --shapes 64x2112x7168 128x7168x2048 4096x7168x2048 \
        2>&1 | tee "$OUT/timers.log" ;;
    sanitize) bash scripts/sanitize.sh 2>&1 | tee "$OUT/sanitize.log" | tail -n 40 ;;
    *) echo "unknown step $s" ;;
  esac
done
