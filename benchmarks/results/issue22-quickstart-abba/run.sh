#!/bin/bash
# ABBA: base (744f044) and head (221e2a5) quickstarts back to back
PY=.venv/bin/python
run() {
  label=$1; tree=$2; mod=$3; n=$4
  cd $tree && rm -rf runs/quickstart
  echo "## $label run $n $(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg)"
  s=$(date +%s)
  PYTHONPATH=$tree/src $PY -m $mod quickstart > /tmp/p/qs-$label-$n.log 2>&1
  rc=$?
  echo "rc=$rc seconds=$(( $(date +%s) - s )) load=$(cut -d' ' -f1-3 /proc/loadavg)"
  grep -E "updates|test " /tmp/p/qs-$label-$n.log | grep -v "^\s*$" | tail -12
  for d in translation shakespeare classifier; do
    f=$(ls $tree/runs/quickstart/$d/metrics.jsonl 2>/dev/null) && { echo "# $d"; grep threads $f | grep -v precision | head -12; }
  done
  mkdir -p /tmp/p/metrics-$label-$n && cp -r $tree/runs/quickstart/*/metrics.jsonl /tmp/p/metrics-$label-$n/ 2>/dev/null
  for d in translation shakespeare classifier; do cp $tree/runs/quickstart/$d/metrics.jsonl /tmp/p/metrics-$label-$n/$d.jsonl 2>/dev/null; done
}
run base /tmp/wt-base attn.cli 1
run head /tmp/wt-head attn.app.cli 1
run head /tmp/wt-head attn.app.cli 2
run base /tmp/wt-base attn.cli 2
echo DONE
