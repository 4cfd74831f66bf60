#!/usr/bin/env bash
# One device run: GPU tests, compute-sanitizer, and the dev config sweep.
#   bash benchmarks/device_check.sh [OUTDIR]
# Prints a short summary last; full logs go to OUTDIR (default $OUT or /tmp).
set -u
out=${1:-${OUT:-/tmp}}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export TSM_CACHE_DIR=${TSM_CACHE_DIR:-/tmp/tsm-cache}
timeout 300 python3 -m pytest -m gpu -q -x tests/test_gpu_tsm2.py > "$out/gpu_tests.log" 2>&1
echo "gpu tests rc=$?: $(tail -1 "$out/gpu_tests.log")"
for tool in memcheck racecheck initcheck synccheck; do
  timeout 240 compute-sanitizer --tool $tool --error-exitcode 3 python3 benchmarks/sanitize.py \
    > "$out/sanitize_$tool.log" 2>&1
  echo "compute-sanitizer $tool rc=$?: $(grep -a -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize_$tool.log" | tail -1)"
done
