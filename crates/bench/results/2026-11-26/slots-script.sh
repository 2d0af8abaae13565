#!/bin/bash
# Which BFQ set-up protects a sporadic small reader (1 MiB O_DIRECT reads, QD1, one every 50 ms, weight 1000) beside
# a sequential QD32 reader (weight 10) in a sibling v1 cgroup, and what it costs the big reader. Loop device of its
# own (4 GiB, direct-io), BFQ; each mode 15 s; writes slots-<mode>-rep<N>.txt to $OUT.
set -u
OUT=${OUT:-crates/bench/results/2026-11-26}; mkdir -p $OUT
CG=/sys/fs/cgroup/blkio
F=/var/tmp/ddq-slots-disk.img
rm -f $F; fallocate -l 4G $F
dd if=/dev/urandom of=$F bs=1M count=4096 oflag=direct status=none conv=notrunc
DEV=$(losetup --find --show --direct-io=on $F); N=$(basename $DEV)
Q=/sys/block/$N/queue
NR0=$(cat $Q/nr_requests)
echo "device $DEV nr_requests as found $NR0"
cleanup() { echo none > $Q/scheduler; losetup -d $DEV; rm -f $F; for c in bg probe; do rmdir $CG/ddq-slots-$c 2>/dev/null; done; }
trap cleanup EXIT
mkdir -p $CG/ddq-slots-bg $CG/ddq-slots-probe
echo 10 > $CG/ddq-slots-bg/blkio.bfq.weight 2>/dev/null
mode() {
  echo none > $Q/scheduler; echo bfq > $Q/scheduler; echo $NR0 > $Q/nr_requests
  local m=$1
  case $m in
    as-found) ;;
    strict-tuned) echo 1 > $Q/iosched/strict_guarantees; echo 256 > $Q/iosched/max_budget; echo 8 > $Q/iosched/timeout_sync ;;
    strict) echo 1 > $Q/iosched/strict_guarantees ;;
    slots) echo 256 > $Q/iosched/max_budget; echo 8 > $Q/iosched/timeout_sync ;;
    slots-nr*) echo 256 > $Q/iosched/max_budget; echo 8 > $Q/iosched/timeout_sync; echo ${m#slots-nr} > $Q/nr_requests ;;
    nr*) echo ${m#nr} > $Q/nr_requests ;;
    eq-nr*) echo ${m#eq-nr} > $Q/nr_requests ;;
  esac
  case $m in eq-*) echo 100 > $CG/ddq-slots-bg/blkio.bfq.weight; echo 100 > $CG/ddq-slots-probe/blkio.bfq.weight ;; *) echo 10 > $CG/ddq-slots-bg/blkio.bfq.weight; echo 1000 > $CG/ddq-slots-probe/blkio.bfq.weight ;; esac
  echo "# mode $m: strict_guarantees=$(cat $Q/iosched/strict_guarantees) max_budget=$(cat $Q/iosched/max_budget) timeout_sync=$(cat $Q/iosched/timeout_sync) nr_requests=$(cat $Q/nr_requests) weights bg=$(cat $CG/ddq-slots-bg/blkio.bfq.weight) probe=$(cat $CG/ddq-slots-probe/blkio.bfq.weight)"
}
COMMON="--filename=$DEV --direct=1 --ioengine=libaio --size=4g"
incg() { local cg=$1; shift; sh -c "echo \$\$ > $CG/$cg/cgroup.procs; exec \"\$@\"" sh "$@"; }
for rep in ${REPS:-1 2}; do
 for m in ${MODES:-as-found strict-tuned slots slots-nr8 slots-nr4 nr4}; do
  f=$OUT/slots-$m-rep$rep.txt
  { mode $m; date -u
    echo "## bg alone 8 s"; incg ddq-slots-bg fio --name=bgalone $COMMON --rw=read --bs=1M --iodepth=32 --time_based --runtime=8 --minimal | awk -F';' '{print "bg-alone KiB/s", $7}'
    incg ddq-slots-bg fio --name=bg $COMMON --rw=read --bs=1M --iodepth=32 --time_based --runtime=17 --minimal > $OUT/bg.tmp & p=$!
    sleep 1
    incg ddq-slots-probe fio --name=probe $COMMON --rw=randread --bs=1M --iodepth=1 --thinktime=50ms --time_based --runtime=15 --offset_increment=0 --percentile_list=50:99:100 --output-format=json > $OUT/probe.tmp
    wait $p
    awk -F';' '{print "bg-with-probe KiB/s", $7}' $OUT/bg.tmp
    python3 -c "import json,sys; j=json.load(open('$OUT/probe.tmp'))['jobs'][0]['read']; c=j['clat_ns']; print('probe n', j['total_ios'], 'mean ms %.2f'%(c['mean']/1e6), 'p50 %.2f p99 %.2f max %.2f'%tuple(v/1e6 for v in c['percentile'].values()))"
  } > $f 2>&1
  echo "done $f: $(grep -E 'KiB/s|probe n' $f | tr '\n' ' ')"
 done
done
