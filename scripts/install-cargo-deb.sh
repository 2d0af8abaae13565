#!/usr/bin/env bash
# Installs cargo-deb (scripts/build-deb.sh's packager) from crates.io when it is not on PATH. A debug build: 1 min
# (90 s of CPU) on this machine kind where the release build took about 10 min at idle priority beside CI's build,
# and its speed does not matter (it packs the agent's 13 MB binary and runs lintian in about 25 s either way; the
# package is byte-for-byte the same size, measured 2026-11-27). scripts/test.sh starts it early, at idle priority.
set -euo pipefail
CARGO_DEB_VERSION=3.8.0
# One install at a time (test.sh's early one and build-deb.sh's may meet): a second waits, then finds it there.
exec 9>/tmp/ddiskqos-install-cargo-deb.lock
flock 9
if command -v cargo-deb >/dev/null 2>&1; then
  echo "install-cargo-deb: $(command -v cargo-deb) is there: $(cargo-deb --version 2>/dev/null)"
  exit 0
fi
start=$(date +%s)
cargo install cargo-deb --debug --locked --version "$CARGO_DEB_VERSION"
echo "install-cargo-deb: cargo-deb $CARGO_DEB_VERSION built in $(( $(date +%s) - start )) s"
