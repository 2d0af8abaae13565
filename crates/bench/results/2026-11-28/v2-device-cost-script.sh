#!/bin/bash
# Cost for other workloads of the shipped agent's device set-up on cgroup v2 (issue 26 item 2: "measure and state
# the cost for other workloads (throughput, a random-I/O neighbour)"), the v2 counterpart of
# 2026-11-26/protect-nr4-cost-script.sh. Run from the checkout's root on the host, as root:
#
#   DDISKQOS_GUEST_SUITE=trixie DDISKQOS_GUEST_DISK_MODEL=ssd DDISKQOS_GUEST_DISK_SIZE=4G \
#     bash scripts/guest.sh run --timeout 2400 -- bash crates/bench/results/2026-11-28/v2-device-cost-script.sh
#
# In the Debian 13 guest (qemu TCG; experiment disk vdb throttled by qemu to 150 MiB/s and 1500 IOPS), four device
# set-ups, each measured with the same fio jobs (20 s each, O_DIRECT, libaio, on /dev/vdb):
#   none-as-found   scheduler none, io.cost off (most v2 hosts: NVMe and multi-queue virtio run none)
#   none-agent      the same, then the shipped agent (release build, embedded defaults but for the runtime:
#                   cgroup-dir over an empty cgroup, so it manages no container and only sets the device up;
#                   [devices] protect = "auto", check = ["vdb"]) enables io.cost with the model it measures
#   bfq-as-found    scheduler bfq selected anew (BFQ's defaults)
#   bfq-agent       the same, then the agent's protection (nr_requests = 4, max_sectors_kb <= 128)
# Jobs: sequential read 1 MiB QD32 alone, sequential write 1 MiB QD32 alone, random 4 KiB read QD32 and QD1 alone,
# a random 4 KiB QD4 reader beside a sequential 1 MiB QD32 reader in their own cgroups at equal weights (io.weight /
# io.bfq.weight 100 both), and both in one cgroup. Writes ddq-v2-cost-<mode>.txt next to this script; removes its
# cgroups, stops the agent (which puts the device back; checked) and leaves the scheduler as none.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
[ "${DDISKQOS_GUEST:-}" = 1 ] || { echo "run me in the guest (see the header)" >&2; exit 2; }
DEV=/dev/vdb; N=vdb; Q=/sys/block/$N/queue; CG=/sys/fs/cgroup
MAJMIN=$(cat /sys/block/$N/dev)
AGENT=$PWD/target/release/ddiskqos-agent
[ -x "$AGENT" ] || { echo "no release agent at $AGENT (cargo build --release -p qos-agent)" >&2; exit 2; }
RUN=/run/ddq-v2-cost; mkdir -p $RUN
cat > $RUN/agent.toml <<EOF
runtime = "cgroup-dir"
actuator = "files"
state_file = "$RUN/state.json"
control_socket = "$RUN/agent.sock"
[cgroup]
parent = "ddq-v2-cost-agent"
[devices]
protect = "auto"
check = ["$N"]
EOF
AGENT_PID=
stop_agent() {
  [ -n "$AGENT_PID" ] || return 0
  kill -TERM $AGENT_PID; wait $AGENT_PID; echo "# agent stopped (rc $?): scheduler $(cat $Q/scheduler), nr_requests $(cat $Q/nr_requests), io.cost.qos: $(grep "^$MAJMIN " $CG/io.cost.qos || echo none)"
  AGENT_PID=
}
cleanup() { stop_agent; for c in a b agent; do rmdir $CG/ddq-v2-cost-$c 2>/dev/null; done; echo none > $Q/scheduler; rm -rf $RUN; }
trap cleanup EXIT
echo +io > $CG/cgroup.subtree_control
for c in a b agent; do mkdir -p $CG/ddq-v2-cost-$c; done
iocost_off() { echo "$MAJMIN enable=0" > $CG/io.cost.qos 2>/dev/null || true; }
mode() {
  iocost_off; echo none > $Q/scheduler
  case $1 in bfq-*) echo bfq > $Q/scheduler ;; esac
  case $1 in *-agent)
    "$AGENT" --config $RUN/agent.toml > $RUN/agent-$1.log 2>&1 & AGENT_PID=$!
    for _ in $(seq 1 120); do
      grep -q "$MAJMIN enable=1" $CG/io.cost.qos 2>/dev/null && break
      [ "$(cat $Q/nr_requests)" = 4 ] && break
      sleep 1
    done
    echo "# agent log:"; sed 's/^/#   /' $RUN/agent-$1.log ;;
  esac
  echo "# mode $1: scheduler $(cat $Q/scheduler) nr_requests=$(cat $Q/nr_requests) max_sectors_kb=$(cat $Q/max_sectors_kb)"
  echo "# io.cost.qos: $(grep "^$MAJMIN " $CG/io.cost.qos || echo none)"
  echo "# io.cost.model: $(grep "^$MAJMIN " $CG/io.cost.model || echo none)"
}
COMMON="--filename=$DEV --direct=1 --ioengine=libaio --time_based --runtime=20 --size=3g --group_reporting=0"
incg() { local cg=$1; shift; sh -c "echo \$\$ > $CG/$cg/cgroup.procs; exec \"\$@\"" sh "$@"; }
for m in ${MODES:-none-as-found none-agent bfq-as-found bfq-agent}; do
  f=$HERE/ddq-v2-cost-$m.txt
  { date -u; uname -r; echo "# the Debian 13 guest under qemu TCG; vdb throttled by qemu: throttling.bps-total=157286400, throttling.iops-total=1500"
    mode $m
    echo "## seq-read alone: 1 MiB, QD32"; incg ddq-v2-cost-a fio --name=seq $COMMON --rw=read --bs=1M --iodepth=32
    echo "## seq-write alone: 1 MiB, QD32"; incg ddq-v2-cost-a fio --name=seqw $COMMON --rw=write --bs=1M --iodepth=32
    echo "## rand-read alone: 4 KiB, QD32"; incg ddq-v2-cost-a fio --name=rand32 $COMMON --rw=randread --bs=4k --iodepth=32
    echo "## rand-read alone: 4 KiB, QD1"; incg ddq-v2-cost-a fio --name=rand1 $COMMON --rw=randread --bs=4k --iodepth=1
    echo "## neighbours, separate cgroups, equal weights (100/100): seq 1 MiB QD32 in A, rand 4 KiB QD4 in B"
    incg ddq-v2-cost-a fio --name=seq-bg $COMMON --rw=read --bs=1M --iodepth=32 --output=$RUN/bg.txt & p=$!
    sleep 0.2; incg ddq-v2-cost-b fio --name=rand-nb $COMMON --rw=randread --bs=4k --iodepth=4; wait $p; cat $RUN/bg.txt
    echo "## neighbours, same cgroup: seq 1 MiB QD32 + rand 4 KiB QD4"
    incg ddq-v2-cost-a fio --name=seq-bg $COMMON --rw=read --bs=1M --iodepth=32 --output=$RUN/bg.txt & p=$!
    sleep 0.2; incg ddq-v2-cost-a fio --name=rand-nb $COMMON --rw=randread --bs=4k --iodepth=4; wait $p; cat $RUN/bg.txt
    stop_agent
  } > $f 2>&1
  echo "done $f"
done
