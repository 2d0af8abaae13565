#!/bin/bash
# As run in session 29 (2026-11-28 22:36 UTC, REPS=10). Its fourth CSV column (the background's MiB/s from fio's terse
# output) came out malformed (fio wrote several terse lines) and was dropped from the committed reads.csv.
# Does BFQ's default mode share a device differently at equal weights of different size?
# A 100 MiB O_DIRECT reader (dd, 1 MiB, QD1) in one v1 blkio cgroup beside fio's sequential QD32 reader in a sibling,
# both under one parent (Docker's default layout: docker/<id>), both cgroups at the same weight W; W in 10, 100, 1000,
# interleaved per repetition. The disk: the bench's throttled disk (150 MiB/s, 1500 IOPS), BFQ as found (default mode).
set -euo pipefail
REPS=${REPS:-8}
OUT=${1:?out dir}
mkdir -p "$OUT"
BENCH=/work/main/target/release/ddiskqos-bench
P=/sys/fs/cgroup/blkio/ddq-eqw
coproc HOLD { "$BENCH" hold-disk --disk throttled --size-mib 800; }
read -r line <&"${HOLD[0]}"
echo "$line" > "$OUT/disk.json"
DEV=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["disk"]["dev"])' "$line")
FILES=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["disk"]["files_dir"])' "$line")
NAME=$(basename "$DEV")
echo "disk $DEV"
Q=/sys/block/$NAME/queue
echo bfq > $Q/scheduler
for f in scheduler nr_requests max_sectors_kb iosched/low_latency iosched/strict_guarantees iosched/timeout_sync iosched/slice_idle; do
  printf '%s=%s\n' "$f" "$(cat $Q/$f 2>/dev/null)"; done | tee "$OUT/queue.txt"
# raw reads of the read-only device: the reader its first 100 MiB, fio 400-1100 MiB (all through the throttle)
mkdir -p $P/r $P/b
cleanup() { pkill -f "fio --name=eqwbg" || true; sleep 0.5; rmdir $P/r $P/b $P 2>/dev/null || true; exec {HOLD[1]}>&- || true; wait || true; }
trap cleanup EXIT
echo "rep,weight,read_ms,bg_mib_s" > "$OUT/reads.csv"
for rep in $(seq 1 $REPS); do
  for w in 10 100 1000; do
    echo $w > $P/r/blkio.bfq.weight; echo $w > $P/b/blkio.bfq.weight
    [ "$(cat $P/r/blkio.bfq.weight)" = "$w" ] && [ "$(cat $P/b/blkio.bfq.weight)" = "$w" ] || { echo "weight $w not read back"; exit 1; }
    bash -c "echo \$\$ > $P/b/cgroup.procs; exec fio --name=eqwbg --filename=$DEV --rw=read --offset=400M --size=700M --bs=1M --iodepth=32 --ioengine=libaio --direct=1 --time_based --runtime=60 --output-format=terse" > "$OUT/fio-$rep-$w.txt" &
    fpid=$!
    sleep 1.5
    t=$(bash -c "echo \$\$ > $P/r/cgroup.procs; s=\$(date +%s%N); dd if=$DEV of=/dev/null bs=1M count=100 iflag=direct status=none; e=\$(date +%s%N); echo \$(( (e-s)/1000 ))")
    kill -INT $fpid; wait $fpid || true
    bg=$(awk -F';' '{printf "%.1f", $7/1024}' "$OUT/fio-$rep-$w.txt")
    echo "$rep,$w,$(awk -v u=$t 'BEGIN{printf "%.1f", u/1000}'),$bg" | tee -a "$OUT/reads.csv"
    sleep 1
  done
done
