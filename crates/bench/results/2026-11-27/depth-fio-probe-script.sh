#!/bin/bash
# Which queue set-up protects a sporadic small reader (1 MiB O_DIRECT random reads, QD1, one every 50 ms, weight
# 1000) beside a sequential QD32 1 MiB reader (weight 10) in a sibling v1 cgroup, on the bench's throttled disk
# (150 MiB/s, 1500 IOPS; ddiskqos-bench hold-disk --disk throttled), and what it costs the big reader.
# Each mode: bg alone 6 s, then bg + probe 12 s. Writes depth-<mode>-rep<N>.txt to $OUT.
set -u
OUT=${OUT:?}; mkdir -p $OUT
BENCH=${BENCH:-/work/main/target/release/ddiskqos-bench}
CG=/sys/fs/cgroup/blkio
FIFO=$(mktemp -u); mkfifo $FIFO
$BENCH hold-disk --disk throttled --size-mib ${SIZE_MIB:-2048} < $FIFO > $OUT/held.json &
HOLD=$!
exec 7>$FIFO
for i in $(seq 60); do [ -s $OUT/held.json ] && break; sleep 1; done
DEV=$(python3 -c "import json; print(json.load(open('$OUT/held.json'))['disk']['dev'])")
N=$(basename $DEV); Q=/sys/block/$N/queue
NR0=$(cat $Q/nr_requests); MS0=$(cat $Q/max_sectors_kb)
echo "device $DEV nr_requests $NR0 max_sectors_kb $MS0 max_hw $(cat $Q/max_hw_sectors_kb) sched $(cat $Q/scheduler)"
cleanup() { echo $NR0 > $Q/nr_requests; echo $MS0 > $Q/max_sectors_kb; for c in bg probe; do rmdir $CG/ddq-depth-$c 2>/dev/null; done; exec 7>&-; wait $HOLD; rm -f $FIFO; }
trap cleanup EXIT
mkdir -p $CG/ddq-depth-bg $CG/ddq-depth-probe
mode() {
  echo none > $Q/scheduler; echo bfq > $Q/scheduler; echo $NR0 > $Q/nr_requests; echo $MS0 > $Q/max_sectors_kb
  local m=$1
  for part in ${m//+/ }; do
    case $part in
      found) ;;
      strict) echo 1 > $Q/iosched/strict_guarantees ;;
      slots) echo 256 > $Q/iosched/max_budget; echo 8 > $Q/iosched/timeout_sync ;;
      nr*) echo ${part#nr} > $Q/nr_requests ;;
      ms*) echo ${part#ms} > $Q/max_sectors_kb ;;
      eq|alone) ;;
      sid*) echo ${part#sid} > $Q/iosched/slice_idle ;;
      *) echo "unknown part $part" >&2; exit 2 ;;
    esac
  done
  case $m in *eq*) echo 100 > $CG/ddq-depth-bg/blkio.bfq.weight; echo 100 > $CG/ddq-depth-probe/blkio.bfq.weight ;; *) echo 10 > $CG/ddq-depth-bg/blkio.bfq.weight; echo 1000 > $CG/ddq-depth-probe/blkio.bfq.weight ;; esac
  echo "# mode $m: strict_guarantees=$(cat $Q/iosched/strict_guarantees) max_budget=$(cat $Q/iosched/max_budget) timeout_sync=$(cat $Q/iosched/timeout_sync) slice_idle=$(cat $Q/iosched/slice_idle) nr_requests=$(cat $Q/nr_requests) max_sectors_kb=$(cat $Q/max_sectors_kb) weights bg=$(cat $CG/ddq-depth-bg/blkio.bfq.weight) probe=$(cat $CG/ddq-depth-probe/blkio.bfq.weight)"
}
COMMON="--filename=$DEV --direct=1 --ioengine=libaio --readonly --size=1900m"
incg() { local cg=$1; shift; sh -c "echo \$\$ > $CG/$cg/cgroup.procs; exec \"\$@\"" sh "$@"; }
for rep in ${REPS:-1}; do
 for m in ${MODES:?}; do
  f=$OUT/depth-$m-rep$rep.txt
  { mode $m; date -u
    case $m in *alone*) BGRT=0 ;; *) BGRT=14 ;; esac
    if [ $BGRT != 0 ]; then
    incg ddq-depth-bg fio --name=bgalone $COMMON --rw=read --bs=1M --iodepth=32 --time_based --runtime=6 --minimal | awk -F';' '{print "bg-alone KiB/s", $7}'
    incg ddq-depth-bg fio --name=bg $COMMON --rw=read --bs=1M --iodepth=32 --time_based --runtime=$BGRT --minimal > $OUT/bg.tmp & p=$!
    sleep 1
    else : > $OUT/bg.tmp; p=; fi
    incg ddq-depth-probe fio --name=probe $COMMON --rw=randread --bs=1M --iodepth=1 --thinktime=50ms --time_based --runtime=12 --percentile_list=50:99:100 --lat_percentiles=1 --output-format=json > $OUT/probe.tmp
    [ -z "$p" ] || wait $p
    awk -F';' '{print "bg-with-probe KiB/s", $7}' $OUT/bg.tmp
    python3 -c "import json,sys; j=json.load(open('$OUT/probe.tmp'))['jobs'][0]['read']; c=j['lat_ns']; print('probe n', j['total_ios'], 'total-lat mean ms %.2f'%(c['mean']/1e6), 'clat mean %.2f'%(j['clat_ns']['mean']/1e6), 'p50 %.2f p99 %.2f max %.2f'%tuple(v/1e6 for v in c['percentile'].values()))"
  } > $f 2>&1
  echo "done $m: $(grep -E 'KiB/s|probe n' $f | tr '\n' ' ')"
 done
done
rm -f $OUT/bg.tmp $OUT/probe.tmp
