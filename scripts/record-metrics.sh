#!/usr/bin/env bash
# Records a real run's metrics for the Grafana dashboard's rendering (deploy/grafana/README.md): the agent with its
# plain cgroup-dir runtime (cgroup v1 blkio) on a BFQ loop device of its own, managing three cgroups (a big
# sequential reader, a small periodic reader, and from a third of the run on a medium reader that reads a burst
# every 20 s), its /metrics scraped every second into OUT ("# SCRAPE unix_ms=... instance=..." before each scrape).
# Everything it creates (loop device, backing file, cgroups, processes) is removed at exit.
# Usage (as root; others measuring latency share this lock):
#   flock /tmp/ddiskqos-real.lock scripts/record-metrics.sh AGENT_BINARY OUT [SECONDS]
set -euo pipefail
AGENT=${1:?usage: record-metrics.sh AGENT_BINARY OUT [SECONDS]}
OUT=${2:?usage: record-metrics.sh AGENT_BINARY OUT [SECONDS]}
SECS=${3:-180}
BLKIO=/sys/fs/cgroup/blkio
[ "$(id -u)" = 0 ] || { echo "record-metrics: must run as root" >&2; exit 1; }
[ -e "$BLKIO/cgroup.procs" ] || { echo "record-metrics: no cgroup v1 blkio hierarchy at $BLKIO" >&2; exit 1; }

work=$(mktemp -d /var/tmp/ddiskqos-record.XXXXXX)
parent=ddiskqos-record-$$
loop=""
pids=()
agent_pid=""
# Every process in the child cgroups (the workloads and their dd children: all started here), killed and reaped.
kill_workloads() {
  local d t
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    local left=0
    for d in "$BLKIO/$parent"/*/; do
      [ -f "$d/cgroup.procs" ] || continue
      while read -r t; do kill -KILL "$t" 2>/dev/null || true; left=1; done < "$d/cgroup.procs"
    done
    [ "$left" = 0 ] && break
    sleep 0.3
  done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
cleanup() {
  set +e
  kill_workloads
  [ -n "$agent_pid" ] && kill -TERM "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
  for d in "$BLKIO/$parent"/*/; do
    [ -d "$d" ] && rmdir "$d"
  done
  [ -d "$BLKIO/$parent" ] && rmdir "$BLKIO/$parent"
  [ -n "$loop" ] && losetup -d "$loop"
  rm -rf "$work"
}
trap cleanup EXIT

# The disk: a 2 GiB file, written through (real blocks, not holes), as a direct-I/O loop device under BFQ.
truncate -s 2G "$work/disk.img"
loop=$(losetup --find --show --direct-io=on "$work/disk.img")
dev=${loop#/dev/}
echo bfq > "/sys/block/$dev/queue/scheduler"
dd if=/dev/zero of="$loop" bs=4M count=512 oflag=direct status=none

mkdir "$BLKIO/$parent"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$work/agent.toml" <<EOF
runtime = "cgroup-dir"
sample_interval = "500ms"
state_file = "$work/state.json"
control_socket = "$work/agent.sock"

[cgroup]
root = "$BLKIO"
parent = "$parent"

[devices]
check = ["$dev"]

[metrics]
enabled = true
listen = "127.0.0.1:$port"
EOF
# Runs "$@" in the child cgroup $1 of the parent (created here; the agent finds it through inotify).
in_cgroup() {
  local name=$1; shift
  mkdir -p "$BLKIO/$parent/$name"
  sh -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$BLKIO/$parent/$name" "$@" &
  pids+=($!)
}
in_cgroup idle sleep infinity
"$AGENT" --config "$work/agent.toml" 2> "$work/agent.log" &
agent_pid=$!
for _ in $(seq 1 50); do curl -sf "http://127.0.0.1:$port/metrics" >/dev/null && break; sleep 0.2; done
# The big reader: the whole device, again and again; the small one: 1 MiB every 3 s at another offset.
in_cgroup big sh -c "while :; do dd if=$loop of=/dev/null bs=1M iflag=direct status=none; done"
in_cgroup small sh -c "i=0; while :; do dd if=$loop of=/dev/null bs=1M count=1 skip=\$(( (i * 37) % 2000 )) iflag=direct status=none; i=\$((i+1)); sleep 3; done"

: > "$OUT"
start=$(date +%s)
medium_started=""
while [ $(( $(date +%s) - start )) -lt "$SECS" ]; do
  if [ -z "$medium_started" ] && [ $(( $(date +%s) - start )) -ge $(( SECS / 3 )) ]; then
    # 48 MiB every 20 s: demoted level by level, back at the top after boost_after.
    in_cgroup medium sh -c "while :; do dd if=$loop of=/dev/null bs=1M count=48 skip=1000 iflag=direct status=none; sleep 20; done"
    medium_started=yes
  fi
  echo "# SCRAPE unix_ms=$(date +%s%3N) instance=127.0.0.1:$port" >> "$OUT"
  curl -sf --max-time 1 "http://127.0.0.1:$port/metrics" >> "$OUT" || echo "# SCRAPE-FAILED" >> "$OUT"
  sleep 1
done
kill_workloads
kill -TERM "$agent_pid"
rc=0
wait "$agent_pid" || rc=$?
agent_pid=""
echo "record-metrics: agent exited $rc; $(grep -c '^# SCRAPE unix_ms' "$OUT") scrapes in $OUT" >&2
tail -n 5 "$work/agent.log" >&2
[ "$rc" = 0 ]
