#!/bin/bash
# Cost of BFQ slots of 16 ms (protection since 2026-11-28 on a device that does not rotate) for other workloads on
# the bench's throttled disk (150 MiB/s, 1500 IOPS; ddiskqos-bench hold-disk --disk throttled), read-only, 12 s a line:
# protection as it was (nr4+ms128: nr_requests=4, max_sectors_kb=128, BFQ's timeout_sync as found, 124 ms) and as
# it is now (nr4+ms128+ts16). Derived from 2026-11-27/depth-cost-script.sh, plus two sequential readers side by side
# (the workload a short slot could cost most: BFQ switches between them every slot).
set -u
OUT=${OUT:?}; mkdir -p $OUT
BENCH=${BENCH:-/work/main/target/release/ddiskqos-bench}
CG=/sys/fs/cgroup/blkio
FIFO=$(mktemp -u); mkfifo $FIFO
$BENCH hold-disk --disk throttled --size-mib 2048 < $FIFO > $OUT/held.json &
HOLD=$!
exec 7>$FIFO
for i in $(seq 60); do [ -s $OUT/held.json ] && break; sleep 1; done
DEV=$(python3 -c "import json; print(json.load(open('$OUT/held.json'))['disk']['dev'])")
N=$(basename $DEV); Q=/sys/block/$N/queue
NR0=$(cat $Q/nr_requests); MS0=$(cat $Q/max_sectors_kb)
cleanup() { echo $NR0 > $Q/nr_requests; echo $MS0 > $Q/max_sectors_kb; for c in a b; do rmdir $CG/ddq-cost-$c 2>/dev/null; done; exec 7>&-; wait $HOLD; rm -f $FIFO; }
trap cleanup EXIT
mkdir -p $CG/ddq-cost-a $CG/ddq-cost-b
COMMON="--filename=$DEV --readonly --direct=1 --ioengine=libaio --time_based --runtime=12 --size=1900m"
incg() { local cg=$1; shift; sh -c "echo \$\$ > $CG/$cg/cgroup.procs; exec \"\$@\"" sh "$@"; }
res() { awk -F';' '{printf "%s KiB/s %s IOPS %s", $3, $7, $8}'; }
for m in ${MODES:-nr4+ms128 nr4+ms128+ts16}; do
  echo none > $Q/scheduler; echo bfq > $Q/scheduler; echo $NR0 > $Q/nr_requests; echo $MS0 > $Q/max_sectors_kb
  case $m in
    nr4) echo 4 > $Q/nr_requests ;;
    nr4+ms128) echo 4 > $Q/nr_requests; echo 128 > $Q/max_sectors_kb ;;
    strict+slots) echo 1 > $Q/iosched/strict_guarantees; echo 256 > $Q/iosched/max_budget; echo 8 > $Q/iosched/timeout_sync ;;
    nr4+ms128+ts*) echo 4 > $Q/nr_requests; echo 128 > $Q/max_sectors_kb; echo ${m#nr4+ms128+ts} > $Q/iosched/timeout_sync ;;
    nr4+ms128+strict+slots) echo 4 > $Q/nr_requests; echo 128 > $Q/max_sectors_kb
      echo 1 > $Q/iosched/strict_guarantees; echo 256 > $Q/iosched/max_budget; echo 8 > $Q/iosched/timeout_sync ;;
  esac
  echo 100 > $CG/ddq-cost-a/blkio.bfq.weight; echo 100 > $CG/ddq-cost-b/blkio.bfq.weight
  echo "# mode $m: nr_requests=$(cat $Q/nr_requests) max_sectors_kb=$(cat $Q/max_sectors_kb) strict_guarantees=$(cat $Q/iosched/strict_guarantees) max_budget=$(cat $Q/iosched/max_budget) timeout_sync=$(cat $Q/iosched/timeout_sync)"
  echo "seq-read alone 1M QD32: $(incg ddq-cost-a fio --name=s $COMMON --rw=read --bs=1M --iodepth=32 --minimal | res)"
  echo "rand-read alone 4K QD32: $(incg ddq-cost-a fio --name=r $COMMON --rw=randread --bs=4k --iodepth=32 --minimal | res)"
  echo "rand-read alone 64K QD8: $(incg ddq-cost-a fio --name=r64 $COMMON --rw=randread --bs=64k --iodepth=8 --minimal | res)"
  incg ddq-cost-a fio --name=bg $COMMON --rw=read --bs=1M --iodepth=32 --minimal > $OUT/bg.tmp & p=$!
  sleep 0.2; nb=$(incg ddq-cost-b fio --name=nb $COMMON --rw=randread --bs=4k --iodepth=4 --minimal | res); wait $p
  echo "neighbours equal weights 100/100: rand 4K QD4 $nb | seq 1M QD32 $(res < $OUT/bg.tmp)"
  incg ddq-cost-a fio --name=bg $COMMON --rw=read --bs=1M --iodepth=32 --offset=0 --size=900m --minimal > $OUT/bg.tmp & p=$!
  sleep 0.2; nb=$(incg ddq-cost-b fio --name=s2 $COMMON --rw=read --bs=1M --iodepth=32 --offset=1000m --size=900m --minimal | res); wait $p
  echo "two sequential readers 1M QD32, equal weights 100/100: one $(res < $OUT/bg.tmp) | the other $nb"
  echo 1000 > $CG/ddq-cost-b/blkio.bfq.weight; echo 10 > $CG/ddq-cost-a/blkio.bfq.weight
  incg ddq-cost-a fio --name=bg $COMMON --rw=read --bs=1M --iodepth=32 --minimal > $OUT/bg.tmp & p=$!
  sleep 0.2; nb=$(incg ddq-cost-b fio --name=nb $COMMON --rw=randread --bs=4k --iodepth=4 --minimal | res); wait $p
  echo "neighbours as the agent weights them (seq 10, rand 1000): rand 4K QD4 $nb | seq 1M QD32 $(res < $OUT/bg.tmp)"
done
rm -f $OUT/bg.tmp
