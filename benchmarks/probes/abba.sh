#!/bin/bash
# README command 1 (without the install), or one recipe's training, at two commits back to back in the
# order BASE, HEAD, HEAD, BASE (or $ORDER) on the same machine, so that a drift of the host touches both alike.
#
#     benchmarks/probes/abba.sh BASE HEAD                                    # the quickstart
#     benchmarks/probes/abba.sh BASE HEAD configs/quickstart-translation.toml  # one recipe, training only
#     ORDER="base head head base base head" benchmarks/probes/abba.sh BASE HEAD  # three runs each
#
# Run from the repository root with its venv installed; each commit gets a git worktree under $OUT,
# where every log and each run's metrics.jsonl land too.
set -u
BASE=$1; HEAD=$2; CONFIG=${3:-}
ROOT=$(pwd); PY=$ROOT/.venv/bin/python; OUT=${OUT:-/tmp/abba}
mkdir -p "$OUT"
git worktree add -f "$OUT/base" "$BASE" >/dev/null && git worktree add -f "$OUT/head" "$HEAD" >/dev/null
run() {  # label, run number
  label=$1; n=$2; tree=$OUT/$label; log=$OUT/$label-$n.log
  cd "$tree" && rm -rf runs/quickstart
  mod=attn.app.cli; [ -f src/attn/app/cli.py ] || mod=attn.cli  # the CLI's module moved once
  echo "## $label run $n $(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg)"
  s=$(date +%s)
  if [ -n "$CONFIG" ]; then
    PYTHONPATH=$tree/src $PY -m "$mod" train --config "$CONFIG" > "$log" 2>&1
  else
    PYTHONPATH=$tree/src $PY -m "$mod" quickstart > "$log" 2>&1
  fi
  echo "rc=$? seconds=$(( $(date +%s) - s )) load=$(cut -d' ' -f1-3 /proc/loadavg)"
  grep -E "updates|test |finished at" "$log" | tail -12
  mkdir -p "$OUT/metrics-$label-$n"
  for f in runs/quickstart/*/metrics.jsonl; do
    [ -f "$f" ] && cp "$f" "$OUT/metrics-$label-$n/$(basename "$(dirname "$f")").jsonl"
  done
  cd "$ROOT"
}
declare -A runs=([base]=0 [head]=0)
for label in ${ORDER:-base head head base}; do
  runs[$label]=$(( ${runs[$label]} + 1 ))
  run "$label" "${runs[$label]}"
done
echo DONE
