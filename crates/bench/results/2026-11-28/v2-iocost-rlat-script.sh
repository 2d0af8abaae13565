#!/bin/bash
# io.cost's read-latency target (rlat) as the agent sets it (2 ms on the guest's disk: 5x the lone 4 KiB read, at
# least 2 ms) against looser ones: what a small read and a deep reader get under each. Run from the checkout's root
# on the host, as root:
#
#   DDISKQOS_GUEST_SUITE=trixie DDISKQOS_GUEST_DISK_MODEL=ssd DDISKQOS_GUEST_DISK_SIZE=4G \
#     bash scripts/guest.sh run --timeout 1800 -- bash crates/bench/results/2026-11-28/v2-iocost-rlat-script.sh
#
# In the Debian 13 guest (qemu TCG; vdb throttled by qemu to 150 MiB/s and 1500 IOPS), scheduler none, for each
# target: `ddiskqos-agent iocost /dev/vdb --seconds 1 --jobs 4 --rlat T --apply` (the agent's own calibration), then
# fio, 20 s each, O_DIRECT libaio on /dev/vdb:
#   weighted: a sequential 1 MiB QD32 reader in cgroup A at io.weight 10 (the agent's bottom) and a 1 MiB random
#             read QD1 probe, 10 a second, in cgroup B at io.weight 1000 (the agent's top)
#   equal:    a sequential 1 MiB QD32 reader in A and a random 4 KiB QD4 reader in B, both at io.weight 100
# and io.stat's cost.vrate of vdb after each. Writes ddq-v2-rlat-<target>.txt next to this script; io.cost off and
# its lines the kernel's again at the end, cgroups removed.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
[ "${DDISKQOS_GUEST:-}" = 1 ] || { echo "run me in the guest (see the header)" >&2; exit 2; }
DEV=/dev/vdb; N=vdb; Q=/sys/block/$N/queue; CG=/sys/fs/cgroup
MAJMIN=$(cat /sys/block/$N/dev)
AGENT=$PWD/target/release/ddiskqos-agent
[ -x "$AGENT" ] || { echo "no release agent at $AGENT" >&2; exit 2; }
RUN=/run/ddq-v2-rlat; mkdir -p $RUN
cleanup() {
  echo "$MAJMIN enable=0 ctrl=auto" > $CG/io.cost.qos; echo "$MAJMIN ctrl=auto" > $CG/io.cost.model
  for c in a b; do rmdir $CG/ddq-rlat-$c 2>/dev/null; done; rm -rf $RUN
}
trap cleanup EXIT
echo +io > $CG/cgroup.subtree_control
for c in a b; do mkdir -p $CG/ddq-rlat-$c; done
echo none > $Q/scheduler
COMMON="--filename=$DEV --direct=1 --ioengine=libaio --time_based --runtime=20 --size=3g --group_reporting=0"
incg() { local cg=$1; shift; sh -c "echo \$\$ > $CG/$cg/cgroup.procs; exec \"\$@\"" sh "$@"; }
vrate() { grep "^$MAJMIN " $CG/io.stat | tr ' ' '\n' | grep '^cost.vrate=' || echo "cost.vrate=?"; }
for t in ${TARGETS:-2ms 10ms 50ms 250ms}; do
  f=$HERE/ddq-v2-rlat-$t.txt
  { date -u; uname -r; echo "# the Debian 13 guest under qemu TCG; vdb throttled by qemu: throttling.bps-total=157286400, throttling.iops-total=1500"
    "$AGENT" iocost $DEV --seconds 1 --jobs 4 --rlat $t --apply
    echo "# io.cost.qos: $(grep "^$MAJMIN " $CG/io.cost.qos)"
    echo "## weighted: seq 1 MiB QD32 in A (io.weight 10), 1 MiB random QD1 probe 10/s in B (io.weight 1000)"
    echo "default 10" > $CG/ddq-rlat-a/io.weight; echo "default 1000" > $CG/ddq-rlat-b/io.weight
    echo "# io.weight A: $(cat $CG/ddq-rlat-a/io.weight | tr '\n' ' ') B: $(cat $CG/ddq-rlat-b/io.weight | tr '\n' ' ')"
    incg ddq-rlat-a fio --name=seq-bg $COMMON --rw=read --bs=1M --iodepth=32 --output=$RUN/bg.txt & p=$!
    sleep 0.2; incg ddq-rlat-b fio --name=probe $COMMON --rw=randread --bs=1M --iodepth=1 --rate_iops=10 --percentile_list=50:99:100
    echo "# $(vrate) (at the end)"; wait $p; cat $RUN/bg.txt
    echo "## equal: seq 1 MiB QD32 in A, rand 4 KiB QD4 in B, both io.weight 100"
    echo "default 100" > $CG/ddq-rlat-a/io.weight; echo "default 100" > $CG/ddq-rlat-b/io.weight
    incg ddq-rlat-a fio --name=seq-bg $COMMON --rw=read --bs=1M --iodepth=32 --output=$RUN/bg.txt & p=$!
    sleep 0.2; incg ddq-rlat-b fio --name=rand-nb $COMMON --rw=randread --bs=4k --iodepth=4
    echo "# $(vrate) (at the end)"; wait $p; cat $RUN/bg.txt
  } > $f 2>&1
  echo "done $f"
done
