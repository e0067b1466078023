#!/bin/bash
# The classifier recipe as shipped and with its cosine schedule ended after 100 or 130 updates, seeds 1
# and 2, at the first-token change (ed9efe1), scored on the validation split only. Run from the
# repository root with its venv installed; the runs and logs land in $OUT.
set -u
ROOT=$(pwd); PY=$ROOT/.venv/bin/python; OUT=${OUT:-/tmp/retune}; mkdir -p "$OUT"
run() { # name, seed, overrides...
  name=$1; seed=$2; shift 2; dir=$OUT/$name-s$seed; rm -rf "$dir"
  echo "## $name seed $seed $(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg) overrides: $*"
  s=$(date +%s)
  PYTHONPATH=src $PY -m attn.app.cli train --config configs/quickstart-classification.toml run_dir="$dir" \
    train.seed="$seed" "$@" > "$dir.log" 2>&1
  echo "rc=$? seconds=$(( $(date +%s) - s ))"
  grep -o "finished at step [0-9]* ([0-9]* updates in this run at [0-9,]* tokens/s" "$dir.log"
  grep val_accuracy "$dir/metrics.jsonl" | python3 -c "import sys,json; [print(' step', d['step'], 'val_loss %.4f' % d['val_loss'], 'val_acc %.2f' % (100*d['val_accuracy'])) for d in map(json.loads, sys.stdin)]"
}
for seed in 1 2; do
  run shipped "$seed"
  run steps100 "$seed" train.max_steps=100 train.eval_interval=50
  run steps130 "$seed" train.max_steps=130 train.eval_interval=65
done
echo DONE
