#!/usr/bin/env bash
# Nsight Compute counters of plain against packed (L2-side-aware) GEMMs: DRAM bytes, L2 hit rates, L2 fabric traffic.
# The fabric counters are the traffic between the two L2 halves; one CSV per shape and variant under $1 (default $OUT).
# Usage (on a Hopper machine, from the repo root): bash benchmarks/probes/ncu_sides.sh OUTDIR [MxNxK ...]
set -uo pipefail
out=${1:-$OUT}; shift || true
mkdir -p "$out"
shapes=("$@"); [ ${#shapes[@]} -eq 0 ] && shapes=(64x4096x7168 64x24576x1536 128x7168x16384)
ncu --query-metrics --chip gh100 > "$out/ncu-metrics.txt" 2>&1 || true
fabric=$(grep -o '^lts__[a-z0-9_]*fabric[a-z0-9_]*' "$out/ncu-metrics.txt" | sort -u | head -n 24)
base=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_op_read_hit_rate.pct,lts__throughput.avg.pct_of_peak_sustained_elapsed,\
lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum
prof() { ncu --clock-control none -k regex:cupygemm_fp8_gemm -s 2 -c 1 --csv --metrics "$1" python3 benchmarks/probes/profile_one.py $2 packed=$3; }
# The fabric counters' names vary between ncu versions: keep those that take .sum, tried one by one once.
valid=""
for m in $fabric; do
  prof "$m.sum" "${shapes[0]//x/ }" 0 2>&1 | grep -q "\"$m" && valid="$valid,$m.sum"
done
echo "fabric counters: ${valid#,}" | tee "$out/ncu-fabric-names.txt"
for s in "${shapes[@]}"; do
  for p in 0 1; do
    prof "$base$valid" "${s//x/ }" "$p" > "$out/ncu-$s-packed$p.csv" 2>&1
  done
done
