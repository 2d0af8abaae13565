#!/usr/bin/env bash
# Issue 26: Experiment 2 only, N rounds per arm, protect (as shipped), the agent's entry rounds off vs on (50 ms for
# 2 s after an entry at the top); weight timeline polled every 20 ms.   run.sh ARM...   (off | on | tsN: on, and
# BFQ's timeout_sync=N ms on the device in every variant)
set -uo pipefail
cd /work/main
B=target/release/ddiskqos-bench
N=${N:-20}
for arm in "$@"; do
  extra=()
  python3 scripts/diag/weight-timeline.py any /tmp/e27/$arm-timeline.txt 0.02 &
  tl=$!
  date -u +"%F %T start $arm"
  case $arm in
    off) iv=off ;;
    on) iv=50ms ;;
    ts*) iv=50ms; extra=(--bfq-set timeout_sync=${arm#ts}) ;;
    *) echo "unknown $arm"; exit 2 ;;
  esac
  RUST_LOG=info $B run --no-exp1 --exp2-reps "$N" --modes protect --entry-sample-interval $iv "${extra[@]}" --out /tmp/e27/$arm \
    2> /tmp/e27/$arm-stderr.txt > /tmp/e27/$arm-stdout.txt
  echo "rc $? "; date -u +"%F %T end $arm"
  kill $tl
  python3 scripts/diag/starved-reads.py $(ls /tmp/e27/$arm/*.json | head -1) /tmp/e27/$arm-timeline.txt /tmp/e27/$arm-stderr.txt --slowest 4 > /tmp/e27/$arm-starved.txt 2>&1
done
