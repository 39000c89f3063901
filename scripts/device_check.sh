#!/usr/bin/env bash
# One device call: install, run the gpu tests, run the benchmark; everything lands under $OUT.
# Usage (from the repo root on the GPU machine):
#   bash scripts/device_check.sh [tests] [bench] [peers] [decode] [masked-full] [overhead] [chain] [casts] [jax] [timers] [sanitize] [pytest args...]
# peers: set up DeepGEMM and DeeperGEMM from a carried .peers/ folder (benchmarks/README.md, Peers); decode: the
# M = 64 and 128 seed shapes against every peer, cupygemm with packed (L2-side-aware) weights too.
set -uo pipefail
OUT=${OUT:-/tmp/cupygemm-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export CUPYGEMM_CACHE_DIR=${CUPYGEMM_CACHE_DIR:-/tmp/cupygemm-cache}
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX shares the GPU with CuPy and torch in the tests
# Leading words are steps; everything from the first option on goes to pytest (e.g. tests -k two_acc).
steps=(); pytest_args=()
for a in "$@"; do
  if [ ${#pytest_args[@]} -eq 0 ] && [[ "$a" != -* ]]; then steps+=("$a"); else pytest_args+=("$a"); fi
done
[ ${#steps[@]} -eq 0 ] && steps=(tests bench)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/device.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -n 2
python3 -m cupygemm info | tee -a "$OUT/device.txt"
for s in "${steps[@]}"; do
  case "$s" in
    tests)  # in parallel processes where pytest-xdist is installed: kernel builds dominate, and they run on the CPU
      xdist=(); python3 -c "import xdist" 2>/dev/null && xdist=(-n 12)
      python3 -m pytest -q -m gpu -rs ${xdist[@]+"${xdist[@]}"} tests ${pytest_args[@]+"${pytest_args[@]}"} 2>&1 \
        | tee "$OUT/gpu_tests.log" | tail -n 40 ;;
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
    overhead) python3 -m cupygemm overhead --markdown --json "$OUT/overhead.json" 2>&1 | tee "$OUT/overhead.log" ;;
    chain) python3 -m cupygemm chain --json "$OUT/chain.json" 2>&1 | tee "$OUT/chain.log" ;;
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
