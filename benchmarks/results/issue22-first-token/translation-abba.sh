#!/bin/bash
# The quickstart translator recipe (7-minute budget, training only) at the reference commit
# (base, 744f044) and with this session's changes (head, 08f7fee), in the order base, head, head, base.
# Run from the repository root with its venv installed; worktrees and logs go to $OUT.
set -u
ROOT=$(pwd); PY=$ROOT/.venv/bin/python; OUT=${OUT:-/tmp/translation-abba}
mkdir -p "$OUT"
git worktree add -f "$OUT/base" 744f044 >/dev/null && git worktree add -f "$OUT/head" 08f7fee >/dev/null
run() {  # label, CLI module of that commit, run number
  label=$1; mod=$2; n=$3; tree=$OUT/$label; log=$OUT/$label-$n.log
  cd "$tree" && rm -rf runs/quickstart/translation
  echo "## $label run $n $(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg)"
  PYTHONPATH=$tree/src $PY -m "$mod" train --config configs/quickstart-translation.toml > "$log" 2>&1
  echo "rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg)"
  grep -o "finished at step [0-9]* ([0-9,]* updates in this run at [0-9,]* tokens/s[^;]*; val_loss [0-9.]*" "$log"
  cd "$ROOT"
}
run base attn.cli 1; run head attn.app.cli 1; run head attn.app.cli 2; run base attn.cli 2
git worktree remove --force "$OUT/base"; git worktree remove --force "$OUT/head"
echo DONE
