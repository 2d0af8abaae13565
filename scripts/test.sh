#!/usr/bin/env bash
# The test command: on a fresh machine of this kind, as root, installs what the tests need (Debian packages,
# dockerd, the local test image) and runs every test: unit, simulator, property, fixture, real-cgroup and
# real-Docker. Real tests fail (never skip) here: DDISKQOS_REQUIRE_REAL=1.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-host.sh
export DDISKQOS_REQUIRE_REAL=1
export PATH="/usr/bin:$PATH"   # Debian's docker CLI, matching the daemon
cargo test --workspace --all-targets --locked
cargo test --workspace --doc --locked
