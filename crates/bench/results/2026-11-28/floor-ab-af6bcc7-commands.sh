# The fair-share floor A/B (2026-11-28 18:59-19:24 UTC, v1 host, BFQ's default mode, throttled loop disk).
# Release build of af6bcc7 plus the bench's --share-floor-percent flag (the commit that adds it). Arms alternate.
# A/B of the fair-share floor in BFQ's default mode (v1 host, throttled loop disk): arms alternate.
cd /work/main
for i in 1 2 3 4; do
  for arm in 10 25; do
    echo "$(date -u +%T) run $i arm $arm"
    ./target/release/ddiskqos-bench run --modes default --sizes 10,100 --reps 8 --exp2-reps 0 \
      --share-floor-percent $arm --out /tmp/floor-ab/run$i-floor$arm > /tmp/floor-ab/run$i-floor$arm.log 2>&1
    echo "$(date -u +%T) rc=$?"
  done
done
cd /work/main
while [ "$(grep -c 'rc=' /tmp/floor-ab/main.log)" -lt 8 ]; do sleep 5; done
for i in 5 6 7; do
  for arm in 10 25; do
    echo "$(date -u +%T) run $i arm $arm"
    ./target/release/ddiskqos-bench run --modes default --sizes 10,100 --reps 12 --exp2-reps 3 \
      --share-floor-percent $arm --out /tmp/floor-ab/run$i-floor$arm > /tmp/floor-ab/run$i-floor$arm.log 2>&1
    echo "$(date -u +%T) rc=$?"
  done
done
