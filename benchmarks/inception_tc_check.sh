#!/usr/bin/env bash
# One device run for the tensor-core conv tiles (conv_gemm_relu_tc, session 11):
# GPU tests (every configuration forced, the TC ones among them), memcheck and
# racecheck on the Inception cases, then the Inception bench with the TC tiles as
# tuning candidates and without them, in the same run.
#   bash benchmarks/inception_tc_check.sh [OUTDIR]
# Prints a short summary last; logs and both benches' JSON go to OUTDIR.
set -u
out=${1:-${OUT:-/tmp}}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 400 python3 -m pytest -m gpu -q tests/test_inception_gpu.py tests/test_inception.py \
  > "$out/gpu_tests_inception.log" 2>&1
echo "gpu tests rc=$?: $(tail -1 "$out/gpu_tests_inception.log")"
for tool in memcheck racecheck; do
  timeout 400 compute-sanitizer --tool $tool --error-exitcode 3 \
    python3 benchmarks/sanitize_apps.py --only inception > "$out/sanitize_inception_$tool.log" 2>&1
  echo "compute-sanitizer $tool rc=$?: $(grep -a -E 'ERROR SUMMARY|RACECHECK SUMMARY' \
    "$out/sanitize_inception_$tool.log" | tail -1) $(grep -a -c '^ok' "$out/sanitize_inception_$tool.log") ok"
done
TSM_CONV_TC=1 timeout 300 python3 -m apps.inception.bench --out "$out/tc" > "$out/bench_tc.log" 2>&1
echo "bench with TC tiles rc=$?"
TSM_CONV_TC=0 timeout 300 python3 -m apps.inception.bench --out "$out/fma" > "$out/bench_fma.log" 2>&1
echo "bench without rc=$?"
echo "--- with the TC tiles as candidates"; tail -16 "$out/bench_tc.log"
echo "--- without"; tail -6 "$out/bench_fma.log"
