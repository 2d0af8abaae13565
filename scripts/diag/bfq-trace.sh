#!/bin/bash
# Records BFQ's own log (blk_add_trace messages: queues set in service, expirations and their reasons, wakers,
# request limits) and the block layer's Q/C events of one device while a command runs, with the kernel's `blk`
# tracer, then puts the tracer back.
#
#   bfq-trace.sh DEV OUT -- COMMAND...     (DEV e.g. loop0; OUT the trace text; needs root and tracefs)
#
# With the bench, whose disk appears only once it runs: start the bench first, wait for its "weights act on this
# device" log line, then run `bfq-trace.sh loop0 OUT -- sleep SECONDS` beside it. About 15,000 lines a second at
# 1,500 IOPS (120 MB for a minute); `costart.py` in crates/bench/results/2026-11-29/costart-tail-50650cb/ reads it.
set -euo pipefail
[ $# -ge 4 ] && [ "$3" = "--" ] || { echo "usage: $0 DEV OUT -- COMMAND..." >&2; exit 2; }
dev=$1 out=$2; shift 3
T=/sys/kernel/tracing
mountpoint -q $T || mount -t tracefs nodev $T
[ -e /sys/block/$dev/trace/enable ] || { echo "no block trace for $dev" >&2; exit 1; }
# "1408", "7 (expanded: 1408)" on a tracer never used since boot, or "X" when the CPUs' sizes differ (then left).
old_size=$(awk '{print $1}' $T/buffer_size_kb)
# On any exit (the command's end, a signal): stop tracing, keep what was traced, put the tracer back.
finish() {
    set +e
    echo 0 > $T/tracing_on
    cat $T/trace > "$out"
    echo "$(wc -l < "$out") lines in $out" >&2
    echo 0 > /sys/block/$dev/trace/enable
    echo nop > $T/current_tracer
    [ "$old_size" = X ] || echo "$old_size" > $T/buffer_size_kb
}
trap finish EXIT
trap 'exit 130' INT TERM
echo 0 > $T/tracing_on
echo 150000 > $T/buffer_size_kb
echo blk > $T/current_tracer
echo > $T/trace
echo 1 > /sys/block/$dev/trace/enable
echo 1 > $T/tracing_on
"$@" || echo "command exited with $?" >&2
