#!/usr/bin/env bash
# Measures the agent's cost against the number of containers (CPU per sampling round and per container, memory,
# Docker API calls) and prints a table: crates/qos-agent/examples/scale.rs, run on the release binary.
# As root on a cgroup v1 host with dockerd installed (scripts/setup-host.sh). Arguments go to the example, e.g.
#   scripts/scale.sh --cgroups 64,256,1024 --docker 64,256 --seconds 30
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p qos-agent --bin ddiskqos-agent --example scale
target="${CARGO_TARGET_DIR:-target}"
exec "$target/release/examples/scale" --agent "$target/release/ddiskqos-agent" "$@"
