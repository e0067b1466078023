#!/bin/bash
# The quickstart classifier recipe (2.5-minute budget) at the reference commit (base, 744f044)
# and at the first-token change (head, ed9efe1), in the order base, head, head, base, twice; each run
# then scores its checkpoint on the test split as the quickstart does. Run from the repository root
# with its venv installed; each commit gets a git worktree under $OUT, where the logs land too.
set -u
ROOT=$(pwd); PY=$ROOT/.venv/bin/python; OUT=${OUT:-/tmp/classifier-abba}
mkdir -p "$OUT"
git worktree add -f "$OUT/base" 744f044 >/dev/null && git worktree add -f "$OUT/head" ed9efe1 >/dev/null
run() {  # label, CLI module of that commit (the layout changed between them), run number
  label=$1; mod=$2; n=$3; tree=$OUT/$label; log=$OUT/$label-$n.log
  cd "$tree" && rm -rf runs/quickstart/classifier
  echo "## $label run $n $(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg)"
  PYTHONPATH=$tree/src $PY -m "$mod" train --config configs/quickstart-classification.toml > "$log" 2>&1
  echo "train rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg)"
  grep val_accuracy runs/quickstart/classifier/metrics.jsonl | python3 -c "import sys,json; [print(' step', d['step'], 'val_loss %.4f' % d['val_loss'], 'val_acc %.2f' % (100*d['val_accuracy'])) for d in map(json.loads, sys.stdin)]"
  grep -E "finished at|valid accuracy" "$log" | sed "s/.*finished at/finished at/"
  PYTHONPATH=$tree/src $PY -m "$mod" evaluate --model runs/quickstart/classifier data/fortunes-topics/test.tsv --json | python3 -c "import sys,json; d=json.load(sys.stdin); print('test accuracy', d['accuracy'], 'macro_f1', d['macro_f1'])"
  cp runs/quickstart/classifier/metrics.jsonl "$OUT/metrics-$label-$n.jsonl"
  cd "$ROOT"
}
for round in 1 2; do
  run base attn.cli $((2 * round - 1)); run head attn.app.cli $((2 * round - 1))
  run head attn.app.cli $((2 * round)); run base attn.cli $((2 * round))
done
echo DONE
