#!/usr/bin/env bash
# One device run: the GPU test suite and compute-sanitizer over both sweeps
# (dev/sanitize.py: TSM2R / TSM2L / matmul; dev/sanitize_apps.py: the other
# families). What it measures: correctness and memory safety, no timings.
#   bash dev/device_check.sh [OUTDIR] [PYTEST_ARGS...]
# e.g. bash dev/device_check.sh /tmp/check tests/test_batched.py
# The tests run in JOBS pytest-xdist workers (default 4; 0: one process) while
# memcheck runs beside them; FULL=1 adds racecheck, initcheck and synccheck after.
# TIMEOUT (seconds) bounds each step (default 420-480).
# Prints one summary line per step; full logs go to OUTDIR (default $OUT or /tmp).
set -u
out=${1:-${OUT:-/tmp}}
shift || true
tests=${*:-tests/}
export PYTHONUNBUFFERED=1
export TSM_CACHE_DIR=${TSM_CACHE_DIR:-/tmp/tsm-cache}
# A checkout that is not installed: the apps and datasets under their installed names.
mkdir -p /tmp/tsm-names && ln -sfn "$PWD/apps" /tmp/tsm-names/tsm_apps \
  && ln -sfn "$PWD/datasets" /tmp/tsm-names/tsm_datasets
export PYTHONPATH=$PWD:/tmp/tsm-names
jobs=${JOBS:-4}
xdist=""; [ "$jobs" -gt 0 ] && xdist="-n $jobs --dist loadfile"
sanitize() {  # tool script timeout
  timeout "$3" compute-sanitizer --tool "$1" --error-exitcode 3 python3 "dev/$2.py" \
    > "$out/$2_$1.log" 2>&1
  echo "$2.py $1 rc=$?: $(grep -a -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$2_$1.log" | tail -1)"
}
sanitize memcheck sanitize ${TIMEOUT:-420} > "$out/s1" &
sanitize memcheck sanitize_apps ${TIMEOUT:-480} > "$out/s2" &
timeout ${TIMEOUT:-480} python3 -m pytest -m gpu -q -p no:cacheprovider $xdist $tests > "$out/gpu_tests.log" 2>&1
echo "gpu tests rc=$?: $(tail -1 "$out/gpu_tests.log")"
wait
cat "$out/s1" "$out/s2"; rm -f "$out/s1" "$out/s2"
if [ "${FULL:-0}" = 1 ]; then
  for tool in racecheck initcheck synccheck; do sanitize $tool sanitize 240; done
  sanitize racecheck sanitize_apps 480
fi
