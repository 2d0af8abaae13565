#!/usr/bin/env bash
# The main job: replays the dDiskQoS paper's experiments (Tables 3-5) on this machine in quick mode, both BFQ
# modes, Alone vs Original vs dDiskQoS, and writes the table, JSON and charts to ./bench-out. Root needed (loop
# device, cgroups, dockerd). Extra arguments go to `ddiskqos-bench run` (e.g. --full, --runtime cgroup-dir,
# --static-best: the static-best weights as a fourth variant, off by default to keep the main job's time).
# The disk under test is by default `--disk throttled`: an image in a private tmpfs behind qemu-storage-daemon's
# throttle (150 MiB/s, 1500 IOPS, the v2 guest disk's model) over FUSE, attached as a loop device, so nothing reaches
# the root disk that carries Docker's data (issue 26); it takes RAM for the files (about 2.5 GiB in quick mode).
# `--disk loop` is the old sparse file on the root file system.
#
# `scripts/bench.sh --v2 [...]`: the v2 main job instead (cgroup v2 + systemd in the guest, on a throttled disk):
# scripts/bench-v2.sh, which takes the remaining arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --v2 ]; then
  shift
  exec bash scripts/bench-v2.sh "$@"
fi
bash scripts/setup-host.sh
export PATH="/usr/bin:$PATH"
cargo build --release --locked -p bench
exec "${CARGO_TARGET_DIR:-target}/release/ddiskqos-bench" run "$@"
