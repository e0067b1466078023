#!/bin/bash
# The quickstart at the reference commit (base, 744f044) and at the measured head (221e2a5),
# back to back in the order base, head, head, base. Run from the repository root with its venv
# installed; each commit gets a git worktree, and everything the runs print lands in $OUT.
set -u
ROOT=$(pwd); PY=$ROOT/.venv/bin/python; OUT=${OUT:-/tmp/quickstart-abba}
mkdir -p "$OUT"
git worktree add -f "$OUT/base" 744f044 >/dev/null && git worktree add -f "$OUT/head" 221e2a5 >/dev/null
run() {  # label, CLI module of that commit (the layout changed between them), run number
  label=$1; mod=$2; n=$3; tree=$OUT/$label; log=$OUT/$label-$n.log
  cd "$tree" && rm -rf runs/quickstart
  echo "## $label run $n $(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg)"
  s=$(date +%s)
  PYTHONPATH=$tree/src $PY -m "$mod" quickstart > "$log" 2>&1
  echo "rc=$? seconds=$(( $(date +%s) - s )) load=$(cut -d' ' -f1-3 /proc/loadavg)"
  grep -E "updates|test " "$log" | tail -12
  mkdir -p "$OUT/metrics-$label-$n"
  for d in translation shakespeare classifier; do
    f=$tree/runs/quickstart/$d/metrics.jsonl
    [ -f "$f" ] && { echo "# $d"; grep threads "$f" | grep -v precision | head -12; cp "$f" "$OUT/metrics-$label-$n/$d.jsonl"; }
  done
  cd "$ROOT"
}
run base attn.cli 1
run head attn.app.cli 1
run head attn.app.cli 2
run base attn.cli 2
echo DONE
