#!/usr/bin/env bash
# One device run for the tensor-core paths written in session 11, without a GPU:
# the conv tiles (conv_gemm_relu_tc: t128x128, t64x128, t64x128b3, 3xTF32) and
# batched kernel version 2 (3xTF32 for float32 where K >= 128, DMMA for float64).
# GPU tests (every conv configuration forced; every batched version), memcheck and
# racecheck on their sanitizer cases, then the benches with the tensor-core paths
# as candidates and without them, in the same run, and a float64 DMMA probe.
#   bash benchmarks/tc_check.sh [OUTDIR] [inception|batched|all]
# Prints a short summary last; logs and the benches' JSON go to OUTDIR.
set -u
out=${1:-${OUT:-/tmp}}
what=${2:-all}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if [ "$what" != batched ]; then
  timeout 400 python3 -m pytest -m gpu -q tests/test_inception_gpu.py tests/test_inception.py \
    > "$out/gpu_tests_inception.log" 2>&1
  echo "inception gpu tests rc=$?: $(tail -1 "$out/gpu_tests_inception.log")"
fi
if [ "$what" != inception ]; then
  timeout 300 python3 -m pytest -m gpu -q tests/test_batched.py > "$out/gpu_tests_batched.log" 2>&1
  echo "batched gpu tests rc=$?: $(tail -1 "$out/gpu_tests_batched.log")"
fi
for tool in memcheck racecheck; do
  for part in inception batched; do
    [ "$what" != all ] && [ "$what" != $part ] && continue
    timeout 400 compute-sanitizer --tool $tool --error-exitcode 3 \
      python3 benchmarks/sanitize_apps.py --only $part > "$out/sanitize_${part}_$tool.log" 2>&1
    echo "compute-sanitizer $tool $part rc=$?: $(grep -a -E 'ERROR SUMMARY|RACECHECK SUMMARY' \
      "$out/sanitize_${part}_$tool.log" | tail -1) $(grep -a -c '^ok' "$out/sanitize_${part}_$tool.log") ok"
  done
done
if [ "$what" != batched ]; then
  TSM_CONV_TC=1 timeout 300 python3 -m tsm_apps.inception.bench --out "$out/inception_tc" \
    > "$out/inception_bench_tc.log" 2>&1
  echo "inception bench with TC tiles rc=$?"
  TSM_CONV_TC=0 timeout 300 python3 -m tsm_apps.inception.bench --out "$out/inception_fma" \
    > "$out/inception_bench_fma.log" 2>&1
  echo "inception bench without rc=$?"
fi
if [ "$what" != inception ]; then
  # ours_v2_prepared in every cell; TSM_BATCHED_TC=1 also makes batched_matmul pick it.
  TSM_BATCHED_TC=1 timeout 540 python3 -m tsm_core.bench batched --out "$out/batched_tc" \
    > "$out/batched_bench_tc.log" 2>&1
  echo "batched bench rc=$?"
  timeout 200 python3 benchmarks/batched_f64_probe.py --out "$out" > "$out/batched_f64_probe.log" 2>&1
  echo "float64 DMMA probe rc=$?: $(tail -1 "$out/batched_f64_probe.log")"
fi
if [ "$what" != batched ]; then
  echo "--- inception, TC tiles as candidates"; tail -19 "$out/inception_bench_tc.log"
  echo "--- inception, without"; tail -6 "$out/inception_bench_fma.log"
fi
if [ "$what" != inception ]; then
  echo "--- batched (version 2 chosen where tc_share >= 0.5)"; tail -8 "$out/batched_bench_tc.log"
  python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['summary']; print({k: s[k] for k in s if 'v2' in k})" \
    "$out/batched_tc/batched.json" 2>/dev/null
fi
