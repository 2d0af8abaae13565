#!/bin/sh
# One lock: the agent's real test; then the default layout without tunables, then with the agent setting them.
cd /work/wt-default-layout-v1
date -u; uptime
DDISKQOS_REQUIRE_REAL=1 target/debug/deps/all-e127353f1f6c969a --include-ignored --nocapture tunables_real:: > /tmp/dl1-realtest2.log 2>&1
echo "real test exit $?"
date -u; uptime
/tmp/dl1-bench3 run --runtime docker --cgroup-layout nested --modes strict,strict-nolowlat --sizes 1,10 --reps 10 --no-exp2 --out /tmp/dl1-out/e2e3-none > /tmp/dl1-e2e3-none.log 2>&1
date -u; uptime
/tmp/dl1-bench3 run --runtime docker --cgroup-layout nested --modes strict,strict-nolowlat --sizes 1,10 --reps 10 --no-exp2 --agent-bfq-tunable max_budget=256 --agent-bfq-tunable timeout_sync=8 --out /tmp/dl1-out/e2e3-agent > /tmp/dl1-e2e3-agent.log 2>&1
date -u; uptime
for d in /sys/block/loop*; do [ -f $d/queue/iosched/max_budget ] && echo "$d $(cat $d/queue/scheduler) max_budget=$(cat $d/queue/iosched/max_budget) timeout_sync=$(cat $d/queue/iosched/timeout_sync)"; done
losetup -a
