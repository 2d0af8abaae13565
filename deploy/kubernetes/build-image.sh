#!/usr/bin/env bash
# Builds the agent's container image locally: a statically linked build of ddiskqos-agent (the `ship` profile:
# release without debug info, stripped; glibc,
# `-C target-feature=+crt-static`: no registry and no musl toolchain needed) alone in an otherwise empty image,
# made with `docker import` (no base image to pull). Usage: deploy/kubernetes/build-image.sh [TAG]
# (default ddiskqos-agent:<workspace version>, the tag the DaemonSet names, also tagged ddiskqos-agent:latest for
# older scripts; with TAG only that tag). To run it on a node without a registry, load it into the node's
# containerd:
#   docker save ddiskqos-agent:0.1.0 | ctr -n k8s.io images import -
set -euo pipefail
cd "$(dirname "$0")/../.."
# The workspace's version ([workspace.package] version in Cargo.toml): what 03-daemonset.yaml's image names.
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
[ -n "$version" ] || { echo "build-image: no [workspace.package] version in Cargo.toml" >&2; exit 1; }
tag=${1:-ddiskqos-agent:$version}
alias_latest=$([ $# -eq 0 ] && echo yes || true)
# The static ship build (scripts/build-ship.sh, the package's binary too).
bin=$(bash scripts/build-ship.sh)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
install -m 0755 "$bin" "$root/ddiskqos-agent"
strip "$root/ddiskqos-agent" 2>/dev/null || true
# Mount points of the DaemonSet's volumes, and /tmp for nothing in particular: the root fs is read-only.
mkdir -p "$root/etc/ddiskqos" "$root/host/sys/fs/cgroup" "$root/run/cri" "$root/run/ddiskqos" "$root/tmp"
DOCKER=${DOCKER:-/usr/bin/docker}
[ -x "$DOCKER" ] || DOCKER=$(command -v docker)
# The image this tag named before: removed below once nothing names it (each build would leave one behind).
previous=$("$DOCKER" image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)
tar -C "$root" --owner=0 --group=0 -c . |
  "$DOCKER" import \
    -c 'ENTRYPOINT ["/ddiskqos-agent"]' \
    -c 'CMD ["--config", "/etc/ddiskqos/agent.toml"]' \
    -c 'EXPOSE 9477' \
    - "$tag" >/dev/null
if [ -n "$alias_latest" ]; then
  "$DOCKER" tag "$tag" ddiskqos-agent:latest
fi
if [ -n "$previous" ] && [ "$previous" != "$("$DOCKER" image inspect -f '{{.Id}}' "$tag")" ] &&
  [ -z "$("$DOCKER" image inspect -f '{{join .RepoTags ","}}' "$previous" 2>/dev/null)" ]; then
  # Untagged now; a container still using it keeps it (rmi refuses), which is fine.
  "$DOCKER" rmi "$previous" >/dev/null 2>&1 || true
fi
echo "built $tag ($(du -h "$root/ddiskqos-agent" | cut -f1) agent binary)"
