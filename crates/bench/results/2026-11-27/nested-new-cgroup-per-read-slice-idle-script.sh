#!/bin/bash
# Docker's default layout, as the bench has it: a parent group (docker/), the background in one child at weight 10
# (fio seq 1 MiB QD32), and each small read from a NEW child cgroup at weight 1000 (one 1 MiB O_DIRECT read with
# dd at a random offset), 25 reads 150 ms apart per mode. Loop device of its own, BFQ.
set -u
OUT=${OUT:-crates/bench/results/2026-11-26}; mkdir -p $OUT
CG=/sys/fs/cgroup/blkio; P=$CG/ddq-nest
F=/var/tmp/ddq-nest-disk.img
rm -f $F; fallocate -l 4G $F
dd if=/dev/urandom of=$F bs=1M count=4096 oflag=direct status=none conv=notrunc
DEV=$(losetup --find --show --direct-io=on $F); N=$(basename $DEV); Q=/sys/block/$N/queue
cleanup() { pkill -f "filename=$DEV" ; sleep 0.5; echo none > $Q/scheduler; losetup -d $DEV; rm -f $F; for d in $P/*/; do rmdir $d 2>/dev/null; done; rmdir $P 2>/dev/null; }
trap cleanup EXIT
mkdir -p $P/bg
mode() {
  echo none > $Q/scheduler; echo bfq > $Q/scheduler
  case $1 in
    nr4) echo 4 > $Q/nr_requests ;;
    slots-nr4) echo 4 > $Q/nr_requests; echo 256 > $Q/iosched/max_budget; echo 8 > $Q/iosched/timeout_sync ;;
    strict-tuned) echo 1 > $Q/iosched/strict_guarantees; echo 256 > $Q/iosched/max_budget; echo 8 > $Q/iosched/timeout_sync ;;
    to8-nr4) echo 4 > $Q/nr_requests; echo 8 > $Q/iosched/timeout_sync ;;
    idle0-nr4) echo 4 > $Q/nr_requests; echo 0 > $Q/iosched/slice_idle ;;
    idle0) echo 0 > $Q/iosched/slice_idle ;;
  esac
  echo 10 > $P/bg/blkio.bfq.weight
}
incg() { local cg=$1; shift; sh -c "echo \$\$ > $cg/cgroup.procs; exec \"\$@\"" sh "$@"; }
for rep in $(seq 1 ${REPS:-1}); do
for m in ${MODES:-as-found nr4 slots-nr4 to8-nr4 strict-tuned}; do
  mode $m
  incg $P/bg fio --name=bg --filename=$DEV --direct=1 --ioengine=libaio --rw=read --bs=1M --iodepth=32 --time_based --runtime=60 --minimal > $OUT/nest-bg.tmp &
  sleep 2
  ts=()
  for i in $(seq 1 25); do
    mkdir $P/r$i; echo 1000 > $P/r$i/blkio.bfq.weight
    off=$(( (RANDOM * 32768 + RANDOM) % 4000 ))
    t=$( incg $P/r$i python3 -c "
import os,time,mmap
fd=os.open('$DEV', os.O_RDONLY|os.O_DIRECT); m=mmap.mmap(-1, 1<<20)
t=time.perf_counter(); os.preadv(fd,[m],$off*(1<<20)); print('%.2f'%((time.perf_counter()-t)*1e3))" )
    ts+=($t); rmdir $P/r$i 2>/dev/null; sleep 0.15
  done
  pkill -f "name=bg --filename=$DEV"; wait
  bg=$(grep -m1 ';' $OUT/nest-bg.tmp | awk -F';' '{print $7}')
  echo "rep $rep $m: $(cat $Q/nr_requests) sg=$(cat $Q/iosched/strict_guarantees) mb=$(cat $Q/iosched/max_budget) ts=$(cat $Q/iosched/timeout_sync) si=$(cat $Q/iosched/slice_idle) | bg KiB/s $bg | 1MiB reads ms: $(printf '%s\n' "${ts[@]}" | sort -n | awk '{a[NR]=$1; s+=$1} END {printf "mean %.2f p50 %.2f max %.2f n %d", s/NR, a[int(NR/2)+1], a[NR], NR}')"
done
done
