#!/bin/bash
# 2026-11-28 08:21-08:41 UTC, session 25: BFQ's slot (timeout_sync) and protect's 1 MiB tail, host v1, the bench's throttled disk.
# The first three ran the release build of e48429c (protection without a slot setting; --bfq-set sets BFQ's
# timeout_sync for the whole run, Alone, Original and dDiskQoS alike); the fourth the build of the commit that adds
# these files (the agent's protection sets timeout_sync=16 itself on a device that does not rotate).
B=./target/release/ddiskqos-bench
$B run --modes protect --sizes 1 --reps 150 --exp2-reps 0 --out /tmp/ab/a-asfound               # slot-124ms-*
$B run --modes protect --sizes 1 --reps 150 --exp2-reps 0 --bfq-set timeout_sync=32 --out /tmp/ab/ts32  # slot-32ms-*
$B run --modes protect --sizes 1 --reps 150 --exp2-reps 0 --bfq-set timeout_sync=16 --out /tmp/ab/ts16  # slot-16ms-*
$B run --modes protect --reps 20 --out /tmp/ab/slot16-protect-r20                                # slot-16ms-by-agent-*
$B run --modes protect --sizes 1 --reps 150 --exp2-reps 0 --bfq-set timeout_sync=8 --out /tmp/ab/ts8   # slot-8ms-* (10:16 UTC, build of d83b5aa: same protect code; the agent leaves 8 as it is)
OUT=/tmp/ab/cost bash crates/bench/results/2026-11-28/slot-cost-script.sh                        # slot-cost-output.txt
