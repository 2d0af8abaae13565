#!/bin/bash
# Headroom A/B on the v1 bench disk (loop0 over qemu-storage-daemon's throttle, 150 MiB/s, 1500 IOPS):
# a QD32 sequential reader (bg, weight 10) and a 1 MiB random reader at QD1 every 60 ms (fg, weight 1000),
# with the bg's read_bps capped at a fraction of its own uncapped rate measured in the same repetition.
set -u
B=loop0; Q=/sys/block/$B/queue
setq() { echo $1 > $Q/nr_requests; echo $2 > $Q/max_sectors_kb; echo $3 > $Q/iosched/timeout_sync; }
out=/tmp/capx/ab; mkdir -p $out
for rep in 1 2 3; do
  setq 4 128 32
  bash arm.sh ab/r$rep-protect-none 10 1000 0
  R=$(python3 -c "import json;print(int(json.load(open('$out/r$rep-protect-none-bg.json'))['jobs'][0]['read']['bw_bytes']))")
  for f in 95 90 85; do bash arm.sh ab/r$rep-protect-cap$f 10 1000 $((R*f/100)); done
  bash arm.sh ab/r$rep-alone 10 1000 0 0
  setq 64 1280 125
  bash arm.sh ab/r$rep-host-none 100 100 0
  R=$(python3 -c "import json;print(int(json.load(open('$out/r$rep-host-none-bg.json'))['jobs'][0]['read']['bw_bytes']))")
  bash arm.sh ab/r$rep-host-cap90 10 1000 $((R*90/100))
done
setq 4 128 32
