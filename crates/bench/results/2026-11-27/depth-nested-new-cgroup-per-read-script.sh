#!/bin/bash
# Docker's default layout by hand on the bench's throttled disk (ddiskqos-bench hold-disk --disk throttled: 150 MiB/s,
# 1500 IOPS): a parent group, the background in one child (fio seq 1 MiB QD32 O_DIRECT, weight 10; 100 with `eq`),
# each small read from a NEW child cgroup (weight 1000; 100 with `eq`): one 1 MiB O_DIRECT pread at a random offset,
# timed in the reader (python), 30 reads 150 ms apart per mode. `alone`: no background.
# Mode tokens joined by +: found, nrN (queue/nr_requests), msN (queue/max_sectors_kb), sidN (slice_idle), strict,
# slots (max_budget=256 timeout_sync=8), eq, alone.
set -u
OUT=${OUT:?}; mkdir -p $OUT
BENCH=${BENCH:-/work/main/target/release/ddiskqos-bench}
CG=/sys/fs/cgroup/blkio; P=$CG/ddq-nest
FIFO=$(mktemp -u); mkfifo $FIFO
$BENCH hold-disk --disk throttled --size-mib ${SIZE_MIB:-2048} < $FIFO > $OUT/held.json &
HOLD=$!
exec 7>$FIFO
for i in $(seq 60); do [ -s $OUT/held.json ] && break; sleep 1; done
DEV=$(python3 -c "import json; print(json.load(open('$OUT/held.json'))['disk']['dev'])")
N=$(basename $DEV); Q=/sys/block/$N/queue
NR0=$(cat $Q/nr_requests); MS0=$(cat $Q/max_sectors_kb)
echo "device $DEV nr_requests $NR0 max_sectors_kb $MS0"
cleanup() { pkill -f "name=bg --filename=$DEV"; sleep 0.5; echo $NR0 > $Q/nr_requests; echo $MS0 > $Q/max_sectors_kb; for d in $P/*/; do rmdir $d 2>/dev/null; done; rmdir $P 2>/dev/null; exec 7>&-; wait $HOLD; rm -f $FIFO; }
trap cleanup EXIT
mkdir -p $P/bg
mode() {
  echo none > $Q/scheduler; echo bfq > $Q/scheduler; echo $NR0 > $Q/nr_requests; echo $MS0 > $Q/max_sectors_kb
  for part in ${1//+/ }; do
    case $part in
      found|eq|alone) ;;
      strict) echo 1 > $Q/iosched/strict_guarantees ;;
      slots) echo 256 > $Q/iosched/max_budget; echo 8 > $Q/iosched/timeout_sync ;;
      ts*) echo ${part#ts} > $Q/iosched/timeout_sync ;;
      mb*) echo ${part#mb} > $Q/iosched/max_budget ;;
      nr*) echo ${part#nr} > $Q/nr_requests ;;
      ms*) echo ${part#ms} > $Q/max_sectors_kb ;;
      sid*) echo ${part#sid} > $Q/iosched/slice_idle ;;
      *) echo "unknown part $part" >&2; exit 2 ;;
    esac
  done
  case $1 in *eq*) W=100; echo 100 > $P/bg/blkio.bfq.weight ;; *) W=1000; echo 10 > $P/bg/blkio.bfq.weight ;; esac
}
incg() { local cg=$1; shift; sh -c "echo \$\$ > $cg/cgroup.procs; exec \"\$@\"" sh "$@"; }
SIZE=$(blockdev --getsize64 $DEV)
for rep in $(seq 1 ${REPS:-1}); do
for m in ${MODES:?}; do
  mode $m
  BGP=
  case $m in *alone*) : > $OUT/nest-bg.tmp ;; *)
  incg $P/bg fio --name=bg --filename=$DEV --readonly --direct=1 --ioengine=libaio --rw=read --bs=1M --iodepth=32 --time_based --runtime=60 --minimal > $OUT/nest-bg.tmp &
  BGP=$!; sleep 2 ;; esac
  ts=()
  for i in $(seq 1 30); do
    mkdir $P/r$i; echo $W > $P/r$i/blkio.bfq.weight
    off=$(( (RANDOM * 32768 + RANDOM) % (SIZE / 1048576 - 1) ))
    t=$( incg $P/r$i python3 -c "
import os,time,mmap
fd=os.open('$DEV', os.O_RDONLY|os.O_DIRECT); m=mmap.mmap(-1, 1<<20)
t=time.perf_counter(); os.preadv(fd,[m],$off*(1<<20)); print('%.2f'%((time.perf_counter()-t)*1e3))" )
    ts+=($t); rmdir $P/r$i 2>/dev/null; sleep 0.15
  done
  if [ -n "$BGP" ]; then pkill -INT -f "name=bg --filename=$DEV"; wait $BGP; fi; sleep 0.3
  bg=$(grep -m1 ';' $OUT/nest-bg.tmp | awk -F';' '{print $7}')
  echo "rep $rep $m: nr=$(cat $Q/nr_requests) ms=$(cat $Q/max_sectors_kb) sg=$(cat $Q/iosched/strict_guarantees) mb=$(cat $Q/iosched/max_budget) ts=$(cat $Q/iosched/timeout_sync) si=$(cat $Q/iosched/slice_idle) w=$W/$(cat $P/bg/blkio.bfq.weight) | bg KiB/s ${bg:--} | 1MiB reads ms: $(printf '%s\n' "${ts[@]}" | sort -n | awk '{a[NR]=$1; s+=$1} END {printf "mean %.2f p50 %.2f p90 %.2f max %.2f n %d", s/NR, a[int(NR/2)+1], a[int(NR*0.9)], a[NR], NR}')"
done
done
rm -f $OUT/nest-bg.tmp
