#!/usr/bin/env bash
# GPU tests of the named files and the named benches in one device call; logs and
# results under $OUT; a summary line per step, printed last.
#   TESTS="tests/a.py tests/b.py" BENCH="random-products strassen-acceptance" bash dev/gpu_checks.sh
#   TESTS=tests/a.py TK="screen or persistent" bash dev/gpu_checks.sh     (a -k expression)
# BENCH items: random-products, strassen-acceptance, abft-overhead, kmeans-cpu,
# kmeans-precision (SHAPES=... for a subset, MARGINAL=1), kmeans-fit, kmeans-lanes, kmeans-split, kmeans-ws,
# kmeans-packed (PRECS=float32,bfloat16 for a subset), kmeans-packed-parts,
# kmeans-sums-parts, kmeans-init-parts, kmeans-screen,
# sanitize-kmeans, batched-accuracy, batched-speed, kmeans-persist,
# tsm2l-quick. Only a few files come back from the device: the results are
# packed into $OUT/res.tar at the end (TAR_LOGS=1: the logs into $OUT/logs.tar).
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out/res"
export PYTHONUNBUFFERED=1 TSM_CACHE_DIR=${TSM_CACHE_DIR:-/tmp/tsm-cache}
mkdir -p /tmp/p && ln -sfn "$PWD/apps" /tmp/p/tsm_apps && ln -sfn "$PWD/datasets" /tmp/p/tsm_datasets
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD:/tmp/p
sum=$out/summary.txt; : > "$sum"
step() {  # name timeout command...
  local name=$1 t=$2; shift 2; local s=$(date +%s)
  timeout "$t" "$@" > "$out/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - s )) s: $(grep -a -E 'passed|failed|error' "$out/$name.log" | tail -1 | cut -c1-160)" >> "$sum"
}
if [ -n "${TESTS:-}" ]; then
  # -rf names the failures at the end; -v names each as it ends (a time limit
  # that stops pytest early still leaves the names in the log)
  # TK="a or b": a -k expression with spaces (TESTS is split into words)
  step tests ${TTEST:-240} python3 -m pytest -v -rf --tb=line -p no:cacheprovider -n ${JOBS:-8} --dist ${DIST:-loadfile} \
    ${TK:+-k "$TK"} $TESTS
  grep -a " FAILED" "$out/tests.log" | head -40 >> "$sum"
fi
for b in ${BENCH:-}; do
  case $b in
    random-products) step $b ${TRP:-240} python3 -m tsm_core.bench random-products --count 500 --seed 0 --out "$out/res" ;;
    strassen-acceptance) step $b ${TSA:-200} python3 -m tsm_core.bench strassen --acceptance --dtypes ${SDT:-float32} --out "$out/res" ;;
    abft-overhead) step $b ${TAB:-120} python3 -m tsm_apps.abft.bench --out "$out/res/abft" --skip encode,campaign --rounds=21 --call-rounds=21 ;;
    kmeans-cpu) step $b ${TKC:-150} python3 -m tsm_apps.kmeans.bench --cpu-vs-sklearn --out "$out/res" ;;
    kmeans-precision) step $b ${TKP:-300} python3 -m tsm_core.bench kmeans --precision-sweep --iters 5 ${SHAPES:+--shapes $SHAPES} ${MARGINAL:+--marginal} --out "$out/res" ;;
    kmeans-fit) step $b ${TKF:-200} python3 -m tsm_core.bench kmeans --fit-vs-flash --out "$out/res" ;;
    kmeans-lanes) step $b ${TKL:-120} python3 dev/kmeans_direct_lanes_probe.py ;;
    kmeans-ws) step $b ${TKW:-200} python3 dev/kmeans_ws_probe.py ;;
    kmeans-packed-parts) step $b ${TKPP:-120} python3 dev/kmeans_packed_parts.py ;;
    kmeans-sums-parts) step $b ${TKSP:-120} python3 dev/kmeans_sums_parts.py ;;
    kmeans-init-parts) step $b ${TKIP:-120} python3 dev/kmeans_init_parts.py ;;
    kmeans-screen) step $b ${TKSC:-200} python3 dev/kmeans_screen_probe.py ;;
    kmeans-packed) step $b ${TKPK:-200} python3 dev/kmeans_packed_probe.py ${PRECS:-} ;;
    sanitize-kmeans)  # memcheck and racecheck; the summary keeps their last lines
      for tool in memcheck racecheck; do
        step san-$tool ${TSK:-150} compute-sanitizer --tool $tool --error-exitcode 2 python3 dev/sanitize_kmeans.py
        grep -a -E "ERROR SUMMARY|RACECHECK SUMMARY|^FAIL" "$out/san-$tool.log" | tail -3 >> "$sum"
      done ;;
    kmeans-split) step $b ${TKS:-240} python3 dev/kmeans_split_probe.py ;;
    kmeans-persist) step $b ${TKP2:-240} python3 dev/kmeans_persist_probe.py ;;
    batched-accuracy) step $b ${TBA:-90} python3 -m tsm_core.bench batched --accuracy --out "$out/res" ;;
    batched-speed) step $b ${TBS:-240} python3 -m tsm_core.bench batched --reps 10 --out "$out/res" ;;
    tsm2l-quick) step $b ${TTL:-120} python3 -m tsm_core.bench tsm2l --quick --dtype float32 --autotune --out "$out/res" ;;
  esac
done
(cd "$out" && tar cf res.tar res && rm -rf res)
[ -n "${TAR_LOGS:-}" ] && (cd "$out" && tar cf logs.tar --exclude=summary.txt --exclude=res.tar *.log 2>/dev/null && rm -f *.log)
cat "$sum"
