#!/usr/bin/env bash
# compute-sanitizer over every kernel kind (scripts/sanitize_cases.py): memcheck, racecheck, synccheck, initcheck.
set -uo pipefail
export PYTHONPATH=${PYTHONPATH:-$PWD} CUPYGEMM_CACHE_DIR=${CUPYGEMM_CACHE_DIR:-/tmp/cupygemm-cache}
python3 scripts/sanitize_cases.py > /dev/null  # compile outside the sanitizer
for tool in memcheck racecheck synccheck initcheck; do
  echo "== $tool"
  compute-sanitizer --tool "$tool" --target-processes all --print-limit 20 python3 scripts/sanitize_cases.py 2>&1 \
    | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|error|sanitize cases done" | head -30
done
