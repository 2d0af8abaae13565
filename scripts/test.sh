#!/usr/bin/env bash
# The test command: on a fresh machine of this kind, as root, installs what the tests need (Debian packages,
# dockerd, the local test image) and runs every test of the workspace: unit, simulator, property, fixture,
# real-cgroup and real-Docker. Real tests are #[ignore]d for a plain `cargo test` (they need root, cgroup v1
# blkio, loop devices or Docker); here they run (--include-ignored), and DDISKQOS_REQUIRE_REAL=1 makes a missing
# prerequisite a failure, never a skip (testbed::require).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-host.sh
# The DaemonSet's image (a static agent alone in an image), as an operator builds it: deploy_real runs it as a pod.
bash deploy/kubernetes/build-image.sh
export DDISKQOS_REQUIRE_REAL=1
export PATH="/usr/bin:$PATH"   # Debian's docker CLI, matching the daemon
# Every target; --no-fail-fast: one run reports every failing binary. The cgroup-v2 module needs the v2 test bed
# and runs below, in it. The criterion benches (their own harness, which takes no --skip) run once in test mode.
cargo test --workspace --lib --bins --tests --examples --locked --no-fail-fast -- --include-ignored --skip v2_real::
cargo test --workspace --benches --locked --no-fail-fast
cargo test --workspace --doc --locked

# cgroup v2 for real (crates/qos-agent/tests/all/v2_real.rs): the agent against a dockerd on v2 with a BFQ and an
# io.cost loop device, and its CRI runtime against the tests' containerd on v2. scripts/cgroup-v2.sh moves the io
# and cpu controllers to v2 (runc needs cpu for a pod sandbox's CPU shares), runs the test binary in a private mount
# namespace with a throw-away dockerd, and puts the machine back on v1. (Whoever shares the machine with other
# real-test runs wraps this whole script in `flock /tmp/ddiskqos-real.lock`; the lock is not taken again here,
# as a nested flock on the same file would wait for itself.)
V2_TEST=$(cargo test -p qos-agent --test all --no-run --locked --message-format=json \
  | grep -o '"executable":"[^"]*/all-[^"]*"' | cut -d'"' -f4 | tail -1)
[ -x "$V2_TEST" ] || { echo "scripts/test.sh: cannot find qos-agent's test binary" >&2; exit 1; }
# The bench on v2 (crates/bench/tests/real_run.rs, module v2_real): a tiny io.cost run in the same test bed.
BENCH_V2_TEST=$(cargo test -p bench --test real_run --no-run --locked --message-format=json \
  | grep -o '"executable":"[^"]*/real_run-[^"]*"' | cut -d'"' -f4 | tail -1)
[ -x "$BENCH_V2_TEST" ] || { echo "scripts/test.sh: cannot find the bench's real_run test binary" >&2; exit 1; }
HAD_DOCKER0=$([ -e /sys/class/net/docker0 ] && echo yes || echo no)
# Both run (one test bed entry, about a minute each way), and either failing fails the pass.
bash scripts/cgroup-v2.sh run --dockerd --cpu -- sh -c '"$1" --include-ignored --test-threads=1 v2_real::; a=$?
  "$2" --include-ignored --test-threads=1 v2_real::; b=$?; [ "$a" = 0 ] && [ "$b" = 0 ]' sh "$V2_TEST" "$BENCH_V2_TEST"
if [ "$HAD_DOCKER0" = yes ] && [ ! -e /sys/class/net/docker0 ]; then
  echo "scripts/test.sh: the v2 test bed removed the host's docker0 bridge" >&2
  exit 1
fi
# Captured first: `status | grep -q` would end status with SIGPIPE, which pipefail counts as a failure.
V2_STATUS=$(bash scripts/cgroup-v2.sh status)
case $V2_STATUS in
  "io controller: cgroup v1"*"cpu controller: cgroup v1"*) ;;
  *) printf 'scripts/test.sh: the machine is not back on cgroup v1:\n%s\n' "$V2_STATUS" >&2; exit 1 ;;
esac
