#!/usr/bin/env bash
# One device run: the GPU test suite, then compute-sanitizer over both sweeps
# (dev/sanitize.py: TSM2R / TSM2L / matmul; dev/sanitize_apps.py: the other
# families). What it measures: correctness and memory safety, no timings.
#   bash dev/device_check.sh [OUTDIR] [PYTEST_ARGS...]
# e.g. bash dev/device_check.sh /tmp/check tests/test_batched.py
# Prints one summary line per step; full logs go to OUTDIR (default $OUT or /tmp).
set -u
out=${1:-${OUT:-/tmp}}
shift || true
tests=${*:-tests/}
export PYTHONUNBUFFERED=1
export TSM_CACHE_DIR=${TSM_CACHE_DIR:-/tmp/tsm-cache}
timeout 540 python3 -m pytest -m gpu -q $tests > "$out/gpu_tests.log" 2>&1
echo "gpu tests rc=$?: $(tail -1 "$out/gpu_tests.log")"
for tool in memcheck racecheck initcheck synccheck; do
  timeout 240 compute-sanitizer --tool $tool --error-exitcode 3 python3 dev/sanitize.py \
    > "$out/sanitize_$tool.log" 2>&1
  echo "sanitize.py $tool rc=$?: $(grep -a -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize_$tool.log" | tail -1)"
done
for tool in memcheck racecheck; do
  timeout 480 compute-sanitizer --tool $tool --error-exitcode 3 python3 dev/sanitize_apps.py \
    > "$out/sanitize_apps_$tool.log" 2>&1
  echo "sanitize_apps.py $tool rc=$?: $(grep -a -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize_apps_$tool.log" | tail -1)"
done
