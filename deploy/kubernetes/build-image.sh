#!/usr/bin/env bash
# Builds the agent's container image locally: a statically linked release build of ddiskqos-agent (glibc,
# `-C target-feature=+crt-static`: no registry and no musl toolchain needed) alone in an otherwise empty image,
# made with `docker import` (no base image to pull). Usage: deploy/kubernetes/build-image.sh [TAG]
# (default ddiskqos-agent:latest). To run it on a node without a registry, load it into the node's containerd:
#   docker save ddiskqos-agent:latest | ctr -n k8s.io images import -
set -euo pipefail
cd "$(dirname "$0")/../.."
tag=${1:-ddiskqos-agent:latest}
target=x86_64-unknown-linux-gnu
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
  cargo build --release --locked -p qos-agent --bin ddiskqos-agent --target "$target"
bin=target/$target/release/ddiskqos-agent
# Static: no interpreter, no shared libraries.
if file "$bin" 2>/dev/null | grep -q 'dynamically linked'; then
  echo "build-image: $bin is not static" >&2
  exit 1
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
install -m 0755 "$bin" "$root/ddiskqos-agent"
strip "$root/ddiskqos-agent" 2>/dev/null || true
# Mount points of the DaemonSet's volumes, and /tmp for nothing in particular: the root fs is read-only.
mkdir -p "$root/etc/ddiskqos" "$root/host/sys/fs/cgroup" "$root/run/containerd" "$root/run/ddiskqos" "$root/tmp"
DOCKER=${DOCKER:-/usr/bin/docker}
[ -x "$DOCKER" ] || DOCKER=$(command -v docker)
tar -C "$root" --owner=0 --group=0 -c . |
  "$DOCKER" import \
    -c 'ENTRYPOINT ["/ddiskqos-agent"]' \
    -c 'CMD ["--config", "/etc/ddiskqos/agent.toml"]' \
    -c 'EXPOSE 9477' \
    - "$tag" >/dev/null
echo "built $tag ($(du -h "$root/ddiskqos-agent" | cut -f1) agent binary)"
