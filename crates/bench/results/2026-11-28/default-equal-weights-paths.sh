#!/bin/bash
# As run in session 29 (2026-11-28 22:41 UTC, REPS=8). In repetitions 5-8 the stepped variant never saw its first
# step: the reader cgroup's BFQ byte counter stayed under 2 MiB until the read ended, so it read at 1000 throughout
# (its weights_seen column is empty there).
# BFQ's default mode, the bench's throttled disk (150 MiB/s, 1500 IOPS), v1 blkio, both cgroups under one parent.
# A 100 MiB O_DIRECT dd (1 MiB, QD1) beside fio's sequential QD32 reader; per repetition, interleaved:
#   eq100   reader 100, background 100 (Original's weights)
#   eq10    reader 10, background 10
#   demoted reader 1000 for its first DEMOTE_AFTER s, then 10; background 10 throughout (the agent's path, in one step)
#   stepped reader 1000 -> 200 -> 40 -> 10 at 2, 8, 32 MiB read (timed from the device rate), background 10
#   best    reader 1000, background 10 throughout (static best)
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
NAME=$(basename "$DEV")
Q=/sys/block/$NAME/queue
for f in scheduler nr_requests max_sectors_kb iosched/low_latency iosched/strict_guarantees iosched/timeout_sync iosched/slice_idle; do
  printf '%s=%s\n' "$f" "$(cat $Q/$f 2>/dev/null)"; done | tee "$OUT/queue.txt"
mkdir -p $P/r $P/b
cleanup() { pkill -f "fio --name=eqwbg" || true; sleep 0.5; rmdir $P/r $P/b $P 2>/dev/null || true; exec {HOLD[1]}>&- || true; wait || true; }
trap cleanup EXIT
setw() { echo $1 > $P/$2/blkio.bfq.weight; [ "$(cat $P/$2/blkio.bfq.weight)" = "$1" ] || { echo "weight $1 not read back in $2"; exit 1; }; }
# reader bytes so far, from the reader cgroup's own counter (blkio.bfq.io_service_bytes_recursive, Read)
rbytes() { awk '$2 == "Read" { s += $3 } END { printf "%d\n", s }' $P/r/blkio.bfq.io_service_bytes_recursive; }
echo "rep,variant,read_ms,weights_seen" > "$OUT/reads.csv"
for rep in $(seq 1 $REPS); do
  for v in eq100 eq10 demoted stepped best; do
    case $v in eq100) setw 100 r; setw 100 b;; eq10) setw 10 r; setw 10 b;; *) setw 1000 r; setw 10 b;; esac
    bash -c "echo \$\$ > $P/b/cgroup.procs; exec fio --name=eqwbg --filename=$DEV --readonly --rw=read --bs=1M --iodepth=32 --ioengine=libaio --direct=1 --offset=400M --size=700M --time_based --runtime=60 --output-format=terse" > /dev/null &
    fpid=$!
    sleep 1.5
    base=$(rbytes)
    bash -c "echo \$\$ > $P/r/cgroup.procs; s=\$(date +%s%N); dd if=$DEV of=/dev/null bs=1M count=100 iflag=direct status=none; e=\$(date +%s%N); echo \$(( (e-s)/1000 )) > $OUT/t" &
    dpid=$!
    seen=""
    case $v in
      demoted) sleep 0.3; setw 10 r; seen="1000>10@0.3s";;
      stepped)
        for step in "2 200" "8 40" "32 10"; do
          set -- $step
          while kill -0 $dpid 2>/dev/null && [ $(( $(rbytes) - base )) -lt $(( $1 * 1048576 )) ]; do sleep 0.01; done
          kill -0 $dpid 2>/dev/null || break
          setw $2 r; seen="$seen>$2@${1}MiB"
        done;;
    esac
    wait $dpid
    kill -INT $fpid; wait $fpid || true
    echo "$rep,$v,$(awk -v u=$(cat $OUT/t) 'BEGIN{printf "%.1f", u/1000}'),$seen" | tee -a "$OUT/reads.csv"
    sleep 1
  done
done
