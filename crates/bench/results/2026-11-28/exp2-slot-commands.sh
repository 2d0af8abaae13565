#!/bin/sh
# Experiment 2 only, protect, 15 rounds per arm, one run each, 2026-11-28 14:11-14:18 UTC (v1 host, the throttled
# disk, Docker's default layout). Arm 16: the release build of dead999 (protect sets timeout_sync 16). Arm 32: the
# same tree with qos_agent::blockdev::protect::SLOT_MS = 32 (a throw-away worktree, not committed), so the agent and
# the bench's expected settings both use 32 (results.json's iosched shows timeout_sync 32).
for arm in 16 32; do
  /tmp/bench-slot$arm run --modes protect --no-exp1 --exp2-reps 15 --out /tmp/exp2-slot$arm
done
