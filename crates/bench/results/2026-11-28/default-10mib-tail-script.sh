set -u
cd /work/main
B=target/release/ddiskqos-bench
A="run --modes default --sizes 10 --reps 30 --exp2-reps 0 --static-best"
$B $A --out /tmp/tail-paper > /tmp/tail-paper.log 2>&1; echo "paper rc=$?"
$B $A --thresholds 12MiB,16MiB,32MiB,128MiB --out /tmp/tail-nodemote > /tmp/tail-nodemote.log 2>&1; echo "nodemote rc=$?"
