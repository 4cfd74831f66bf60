#!/usr/bin/env bash
# One device run for the C++ fast path of torch calls (tsm_core/_native.py):
# build it, the batched GPU tests (both paths), the host-time probe, and
# compute-sanitizer memcheck / racecheck on the torch cases of sanitize_apps.py.
#   bash benchmarks/native_check.sh [OUTDIR]
set -u
out=${1:-${OUT:-/tmp}}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export TSM_CACHE_DIR=${TSM_CACHE_DIR:-/tmp/tsm-cache}
which c++ g++ ninja 2>&1 | head -3
/usr/bin/time -f "build %e s" python3 -c "
from tsm_core import _native; m = _native.get(); print('native:', m, _native.status())" 2>&1
timeout 420 python3 -m pytest -q -m gpu tests/test_batched.py tests/test_native.py \
  > "$out/gpu_tests.log" 2>&1
echo "gpu tests rc=$?: $(tail -1 "$out/gpu_tests.log")"
timeout 120 python3 -m pytest -q tests/test_native.py > "$out/native_tests.log" 2>&1
echo "native tests rc=$?: $(tail -1 "$out/native_tests.log")"
timeout 300 python3 benchmarks/batched_host_probe.py 2>&1 | tee "$out/host_probe.log"
for tool in memcheck racecheck; do
  timeout 240 compute-sanitizer --tool $tool --error-exitcode 3 python3 benchmarks/sanitize_apps.py \
    --only "batched torch" > "$out/sanitize_torch_$tool.log" 2>&1
  echo "compute-sanitizer $tool rc=$?: $(grep -a -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize_torch_$tool.log" | tail -1)"
  grep -a -E "^(ok|FAIL)" "$out/sanitize_torch_$tool.log"
done
