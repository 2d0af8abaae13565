#!/usr/bin/env bash
# Installs cargo-deb (scripts/build-deb.sh's packager) from crates.io when it is not on PATH: a release build of
# about 2 minutes of CPU on this machine kind, so scripts/test.sh starts it early, at idle CPU priority.
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
cargo install cargo-deb --locked --version "$CARGO_DEB_VERSION"
echo "install-cargo-deb: cargo-deb $CARGO_DEB_VERSION built in $(( $(date +%s) - start )) s"
