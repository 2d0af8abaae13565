#!/usr/bin/env bash
# The test command: on a fresh machine of this kind, as root, installs what the tests need (Debian packages,
# dockerd, the local test image) and runs every test of the workspace: unit, simulator, property, fixture,
# real-cgroup and real-Docker. Real tests are #[ignore]d for a plain `cargo test` (they need root, cgroup v1
# blkio, loop devices or Docker); here they run (--include-ignored), and DDISKQOS_REQUIRE_REAL=1 makes a missing
# prerequisite a failure, never a skip (testbed::require).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-host.sh
export DDISKQOS_REQUIRE_REAL=1
export PATH="/usr/bin:$PATH"   # Debian's docker CLI, matching the daemon
# Every target (benches run once in test mode); --no-fail-fast: one run reports every failing binary.
cargo test --workspace --all-targets --locked --no-fail-fast -- --include-ignored
cargo test --workspace --doc --locked
