#!/usr/bin/env bash
# Builds the tests' image ddiskqos-test:latest (no registry is reachable): busybox-static and a few applets,
# imported into the dockerd the arguments name (e.g. `-H unix:///var/run/docker.sock`; none: $DOCKER_HOST or the
# default socket). Used by setup-host.sh, guest.sh, cgroup-v2.sh and the tests that start a dockerd of their own.
set -euo pipefail
DOCKER_CLI=/usr/bin/docker
[ -x "$DOCKER_CLI" ] || DOCKER_CLI=$(command -v docker)
[ -x /bin/busybox ] || { echo "test-image.sh: busybox-static is missing (/bin/busybox)" >&2; exit 1; }
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/bin" "$root/tmp" "$root/dev" "$root/proc" "$root/sys"
cp /bin/busybox "$root/bin/busybox"
for applet in sh dd cat sleep echo seq true ls head; do ln -s busybox "$root/bin/$applet"; done
tar -C "$root" -c . | "$DOCKER_CLI" "$@" import -c 'ENV PATH=/bin' -c 'CMD ["/bin/sh"]' - ddiskqos-test:latest >/dev/null
