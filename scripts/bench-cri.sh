#!/usr/bin/env bash
# The paper's experiments as a Kubernetes node sees them: `ddiskqos-bench run --runtime cri`, every reader and the
# background a pod made through CRI with the kubelet's cgroup parents, against a throw-away containerd with its CRI
# plugin. containerd is started and torn down by the real tests' own harness (testbed::containerd, through its
# `ddiskqos-containerd` binary): own config, root, state and socket, the local sandbox image imported, every pod
# removed and containerd stopped afterwards. Root needed (loop device, cgroups, containerd; the host's dockerd builds
# the sandbox image once). Extra arguments go to `ddiskqos-bench run` (e.g. --modes strict, --sizes 1,10,100).
#
#   scripts/bench-cri.sh [--log FILE] [BENCH-RUN-ARGS...]
#
# The run itself (not the build) holds the machine's real-experiment lock, flock /tmp/ddiskqos-real.lock, so it
# waits for other real experiments and they for it. With --log FILE it goes to the background (setsid nohup,
# output in FILE) and the script returns at once, printing how to follow it.
set -euo pipefail
LOCK=/tmp/ddiskqos-real.lock

if [ "${1:-}" = "--log" ]; then
  [ $# -ge 2 ] || { echo "usage: $0 [--log FILE] [BENCH-RUN-ARGS...]" >&2; exit 2; }
  self=$(realpath "$0")
  log=$(realpath -m "$2")
  shift 2
  setsid nohup "$self" "$@" >"$log" 2>&1 </dev/null &
  echo "bench-cri running in the background (pid $!); follow it with: tail -f $log"
  exit 0
fi
cd "$(dirname "$0")/.."

bash scripts/setup-host.sh
export PATH="/usr/bin:$PATH"
cargo build --release --locked -p bench -p testbed --bin ddiskqos-bench --bin ddiskqos-containerd
echo "[bench-cri] waiting for $LOCK" >&2
exec flock "$LOCK" ./target/release/ddiskqos-containerd -- ./target/release/ddiskqos-bench run --runtime cri "$@"
