#!/usr/bin/env bash
# Headline benchmarks on the device, in one call, then the comparison with the
# committed results.
#   bash dev/h100_headline.sh FAMILY [FAMILY ...]    (FAMILY as in `python -m tsm_core.bench`)
# Writes $OUT/<group>.tgz (JSON + PNG of every family run) and $OUT/<group>.log;
# prints the comparison table last.
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out/res"
export PYTHONUNBUFFERED=1 TSM_CACHE_DIR=${TSM_CACHE_DIR:-/tmp/tsm-cache}
# A checkout that is not installed: the apps and datasets under their installed names.
mkdir -p /tmp/p && ln -sfn "$PWD/apps" /tmp/p/tsm_apps && ln -sfn "$PWD/datasets" /tmp/p/tsm_datasets
export PYTHONPATH=$PWD:/tmp/p
group=$(IFS=_; echo "$*")
declare -A ARGS=([tsm2r]="--autotune" [tsm2l]="--autotune" [batched]="--reps 10")
for fam in "$@"; do
  s=$(date +%s)
  python3 -m tsm_core.bench "$fam" ${ARGS[$fam]:-} --out "$out/res" >> "$out/$group.log" 2>&1
  echo "$fam rc=$? $(( $(date +%s) - s )) s"
done
(cd "$out/res" && tar czf "$out/$group.tgz" .)
python3 dev/compare_headlines.py benchmarks/results/h100 "$out/res"
