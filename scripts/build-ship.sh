#!/usr/bin/env bash
# The agent as shipped (the DaemonSet's image, deploy/kubernetes/build-image.sh, and the Debian package,
# scripts/build-deb.sh, carry the same binary): the `ship` profile (release without debug info, stripped), statically
# linked against glibc (`-C target-feature=+crt-static`: no registry and no musl toolchain needed). Prints the
# binary's path on stdout. --no-build: only find and check a binary built before.
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-gnu
if [ "${1:-}" != --no-build ]; then
  RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
    cargo build --profile ship --locked -p qos-agent --bin ddiskqos-agent --target "$target" >&2
fi
bin=${CARGO_TARGET_DIR:-target}/$target/ship/ddiskqos-agent
[ -x "$bin" ] || { echo "build-ship: no binary at $bin (build it: drop --no-build)" >&2; exit 1; }
# Static: no interpreter, no shared libraries.
if file "$bin" 2>/dev/null | grep -q 'dynamically linked'; then
  echo "build-ship: $bin is not static" >&2
  exit 1
fi
echo "$bin"
