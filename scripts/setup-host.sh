#!/usr/bin/env bash
# Prepares a fresh Debian 12 machine (as root) for the real tests and the bench: installs the Debian packages the
# project needs, starts dockerd if none answers, and builds the local test image (no registry is reachable).
# Idempotent: does only what is missing.
set -euo pipefail

log() { printf '[setup-host] %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
  log "must run as root (cgroups, loop devices and dockerd need it)"
  exit 1
fi

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
# `grep -x` without -q reads the whole list: with -q it may exit early, busybox then dies of SIGPIPE and pipefail
# counted the check as failed (the package was reinstalled on every run).
[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -x dd >/dev/null || need+=(busybox-static)
command -v fio >/dev/null 2>&1 || need+=(fio)
command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
command -v losetup >/dev/null 2>&1 || need+=(mount)
# The bench's default disk (`--disk throttled`): an image in tmpfs behind qemu-storage-daemon's throttle over FUSE.
command -v qemu-storage-daemon >/dev/null 2>&1 || need+=(qemu-system-common)
# The CRI bindings (k8s-cri) compile their .proto files at build time; the CRI tests run Debian's containerd.
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
command -v containerd >/dev/null 2>&1 && command -v ctr >/dev/null 2>&1 || need+=(containerd)
# The Debian package's check (scripts/build-deb.sh, run by scripts/test.sh).
command -v lintian >/dev/null 2>&1 || need+=(lintian)
# The manifests' schema test (tests/all/k8s_manifests.rs) runs kubernetes-validate from a virtualenv (below).
command -v kubernetes-validate >/dev/null 2>&1 || python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  log "installing: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The Kubernetes schema validator for deploy/kubernetes (PyPI's kubernetes-validate, pinned; offline once
# installed: it carries the schemas), in its own virtualenv, linked into /usr/local/bin.
KV_VERSION=1.37.0
if ! command -v kubernetes-validate >/dev/null 2>&1; then
  log "installing kubernetes-validate $KV_VERSION (PyPI) into /opt/ddiskqos-tools/kubernetes-validate"
  python3 -m venv /opt/ddiskqos-tools/kubernetes-validate
  /opt/ddiskqos-tools/kubernetes-validate/bin/pip install -q "kubernetes-validate==$KV_VERSION"
  ln -sf /opt/ddiskqos-tools/kubernetes-validate/bin/kubernetes-validate /usr/local/bin/kubernetes-validate
fi
# kustomize renders the kustomization and its overlays: kubectl's built-in `kubectl kustomize` if there is a
# kubectl, else kustomize itself through the Go module proxy (needs a Go toolchain >= 1.22 on PATH).
if ! command -v kustomize >/dev/null 2>&1 && ! kubectl kustomize --help >/dev/null 2>&1; then
  if command -v go >/dev/null 2>&1; then
    log "installing kustomize v5.5.0 (go install)"
    GOBIN=/usr/local/bin go install sigs.k8s.io/kustomize/kustomize/v5@v5.5.0
  else
    log "no kustomize, no kubectl and no Go toolchain: install one of them for the manifests' schema test"
    exit 1
  fi
fi

# Debian's docker CLI may be shadowed by another client on PATH; use the one matching the daemon.
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER=$(command -v docker)

if ! "$DOCKER" version >/dev/null 2>&1; then
  log "starting dockerd"
  mkdir -p /var/log
  # setsid: the daemon must outlive the shell (and its process group) that started it. It must not inherit the
  # caller's other descriptors either: a `flock LOCK ./scripts/...` caller's lock would be held by dockerd for good.
  (
    for fd in /proc/$BASHPID/fd/*; do
      n=${fd##*/}
      if [ "$n" -gt 2 ]; then eval "exec $n>&-" 2>/dev/null || true; fi
    done
    exec setsid nohup /usr/sbin/dockerd --host unix:///var/run/docker.sock >/var/log/ddiskqos-dockerd.log 2>&1 </dev/null
  ) &
  for _ in $(seq 1 60); do
    "$DOCKER" version >/dev/null 2>&1 && break
    sleep 0.5
  done
  "$DOCKER" version >/dev/null 2>&1 || { log "dockerd did not come up; see /var/log/ddiskqos-dockerd.log"; tail -20 /var/log/ddiskqos-dockerd.log >&2; exit 1; }
fi

if ! "$DOCKER" image inspect ddiskqos-test:latest >/dev/null 2>&1; then
  log "building image ddiskqos-test:latest from busybox-static"
  bash "$(dirname "$0")/test-image.sh"
fi
log "ready: dockerd $("$DOCKER" version --format '{{.Server.Version}}'), image ddiskqos-test:latest"
