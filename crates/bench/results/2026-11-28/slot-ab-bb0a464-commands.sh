#!/bin/sh
# Slot A/B on the v1 host (protect, the throttled disk, Docker's default layout): 1 MiB x12 and Experiment 2 x12
# per run, arms alternating 16, 32, 16, 32, run twice (runs 1-4, then 5-8 with i=4), 16:19-16:44 UTC. Arm 16: the release build of bb0a464's code; arm 32: the same code
# with qos_agent::blockdev::protect::SLOT_MS = 32 (a throw-away worktree, not committed).
set -e
i=0
for arm in 16 32 16 32; do
  i=$((i+1))
  echo "== run $i arm $arm: $(date -u +%H:%M:%S)"
  /tmp/bench-slot$arm run --modes protect --sizes 1 --reps 12 --exp2-reps 12 --out /tmp/ab-$i-slot$arm
done
echo "== done $(date -u +%H:%M:%S)"
