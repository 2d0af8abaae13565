#!/usr/bin/env bash
# Issue 26: Experiment 2 only, N rounds per config, weight timeline polled every 20 ms.
#   run.sh CFG...   (A: protect as shipped; B: protect + short slots; C: strict-tuned; D: protect + short slots + strict)
set -uo pipefail
cd /work/exp
B=target/release/ddiskqos-bench
N=${N:-10}
for cfg in "$@"; do
  case $cfg in
    A) extra=(--modes protect) ;;
    B) extra=(--modes protect --bfq-set timeout_sync=8 --bfq-set max_budget=256) ;;
    C) extra=(--modes strict-tuned) ;;
    D) extra=(--modes protect --bfq-set timeout_sync=8 --bfq-set max_budget=256 --bfq-set strict_guarantees=1) ;;
    E) extra=(--modes protect --bfq-set timeout_sync=16) ;;
    F) extra=(--modes protect --sample-interval 50ms) ;;
    *) echo "unknown $cfg"; exit 2 ;;
  esac
  python3 scripts/diag/weight-timeline.py any /tmp/e26/$cfg-timeline.txt 0.02 &
  tl=$!
  date -u +"%F %T start $cfg ${extra[*]}"
  RUST_LOG=info $B run --no-exp1 --exp2-reps "$N" "${extra[@]}" --out /tmp/e26/$cfg ${EXTRA_ARGS:-} 2> /tmp/e26/$cfg-stderr.txt > /tmp/e26/$cfg-stdout.txt
  echo "rc $? "; date -u +"%F %T end $cfg"
  kill $tl
  python3 scripts/diag/starved-reads.py $(ls /tmp/e26/$cfg/*.json | head -1) /tmp/e26/$cfg-timeline.txt /tmp/e26/$cfg-stderr.txt --slowest 2 > /tmp/e26/$cfg-starved.txt 2>&1
done
