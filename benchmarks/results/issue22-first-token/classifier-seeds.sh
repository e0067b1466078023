#!/bin/bash
# The shipped classifier recipe at the reference commit (744f044) with seeds 1 and 2, then the test split
# scored for these and for the shipped runs of classifier-schedules.sh (same $OUT, same seeds). Run from
# the repository root with its venv installed, after classifier-abba.sh (its worktree of 744f044 in
# $ABBA/base) and classifier-schedules.sh.
set -u
ROOT=$(pwd); PY=$ROOT/.venv/bin/python; OUT=${OUT:-/tmp/retune}; BASE=${ABBA:-/tmp/classifier-abba}/base
cd "$BASE"
for seed in 1 2; do
  dir=$OUT/base-s$seed; rm -rf "$dir"
  echo "## base seed $seed $(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg)"
  PYTHONPATH=src $PY -m attn.cli train --config configs/quickstart-classification.toml run_dir="$dir" \
    train.seed="$seed" > "$dir.log" 2>&1
  echo "rc=$?"; grep -o "finished at step [0-9]* ([0-9]* updates in this run at [0-9,]* tokens/s" "$dir.log"
  grep val_accuracy "$dir/metrics.jsonl" | python3 -c "import sys,json; [print(' step', d['step'], 'val_loss %.4f' % d['val_loss'], 'val_acc %.2f' % (100*d['val_accuracy'])) for d in map(json.loads, sys.stdin)]"
done
for run in base-s1 base-s2 shipped-s1 shipped-s2; do
  if [[ $run == base* ]]; then tree=$BASE; mod=attn.cli; else tree=$ROOT; mod=attn.app.cli; fi
  cd "$tree"
  echo "## test $run: $(PYTHONPATH=src $PY -m $mod evaluate --model "$OUT/$run" data/fortunes-topics/test.tsv --json \
    | python3 -c "import sys,json; d=json.load(sys.stdin); print('accuracy', d['accuracy'], 'macro_f1', d['macro_f1'])")"
done
echo DONE
