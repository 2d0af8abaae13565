#!/bin/bash
# Cost of the agent's default device settings ([devices] protect = "auto" on a BFQ device: strict_guarantees=1,
# max_budget=256, timeout_sync=8) for other workloads, on a loop device of its own with BFQ, against the device as
# found (BFQ's defaults). Run as root, under flock /tmp/ddiskqos-real.lock; writes protect-default-cost-<mode>-rep<N>.txt
# here and removes its loop device, file and cgroups. The slots-no-strict file came from this script with the mode
# list set to "slots-no-strict" (max_budget=256 and timeout_sync=8 only) and one repetition.
set -u
OUT=crates/bench/results/2026-11-26; mkdir -p /work/cost
CG=/sys/fs/cgroup/blkio
F=/var/tmp/ddq-cost-disk.img
rm -f $F; fallocate -l 4G $F
dd if=/dev/urandom of=$F bs=1M count=4096 oflag=direct status=none conv=notrunc
DEV=$(losetup --find --show --direct-io=on $F); N=$(basename $DEV)
echo "device $DEV" ; Q=/sys/block/$N/queue
cleanup() { echo none > $Q/scheduler; losetup -d $DEV; rm -f $F; for c in a b; do rmdir $CG/ddq-cost-$c 2>/dev/null; done; }
trap cleanup EXIT
echo none > $Q/scheduler; echo bfq > $Q/scheduler
mkdir -p $CG/ddq-cost-a $CG/ddq-cost-b
mode() {
  echo none > $Q/scheduler; echo bfq > $Q/scheduler
  case $1 in nr*) echo ${1#nr} > $Q/nr_requests ;; esac; if [ "$1" = agent-default ]; then
    echo 1 > $Q/iosched/strict_guarantees; echo 256 > $Q/iosched/max_budget; echo 8 > $Q/iosched/timeout_sync
  fi
  echo "# mode $1: $(cat $Q/scheduler) strict_guarantees=$(cat $Q/iosched/strict_guarantees) max_budget=$(cat $Q/iosched/max_budget) nr_requests=$(cat $Q/nr_requests) timeout_sync=$(cat $Q/iosched/timeout_sync) low_latency=$(cat $Q/iosched/low_latency)"
}
COMMON="--filename=$DEV --direct=1 --ioengine=libaio --time_based --runtime=20 --size=4g --group_reporting=0"
incg() { local cg=$1; shift; sh -c "echo \$\$ > $CG/$cg/cgroup.procs; exec \"\$@\"" sh "$@"; }
for rep in 1; do
 for m in ${MODES:-as-found nr4 nr16}; do
  f=$OUT/protect-default-cost-$m-rep$rep.txt
  { mode $m; date -u;
    echo "## seq-read alone: 1 MiB, QD32"; incg ddq-cost-a fio --name=seq $COMMON --rw=read --bs=1M --iodepth=32
    echo "## seq-write alone: 1 MiB, QD32"; incg ddq-cost-a fio --name=seqw $COMMON --rw=write --bs=1M --iodepth=32
    echo "## rand-read alone: 4 KiB, QD32"; incg ddq-cost-a fio --name=rand32 $COMMON --rw=randread --bs=4k --iodepth=32
    echo "## rand-read alone: 4 KiB, QD1"; incg ddq-cost-a fio --name=rand1 $COMMON --rw=randread --bs=4k --iodepth=1
    echo "## neighbours, separate cgroups, equal weights (100/100): seq 1 MiB QD32 in A, rand 4 KiB QD4 in B"
    incg ddq-cost-a fio --name=seq-bg $COMMON --rw=read --bs=1M --iodepth=32 --output=/work/cost/bg.txt & p=$!
    sleep 0.2; incg ddq-cost-b fio --name=rand-nb $COMMON --rw=randread --bs=4k --iodepth=4; wait $p; cat /work/cost/bg.txt
    echo "## neighbours, same cgroup: seq 1 MiB QD32 + rand 4 KiB QD4"
    incg ddq-cost-a fio --name=seq-bg $COMMON --rw=read --bs=1M --iodepth=32 --output=/work/cost/bg.txt & p=$!
    sleep 0.2; incg ddq-cost-a fio --name=rand-nb $COMMON --rw=randread --bs=4k --iodepth=4; wait $p; cat /work/cost/bg.txt
  } > $f 2>&1
  echo "done $f"
 done
done
