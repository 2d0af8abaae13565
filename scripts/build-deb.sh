#!/usr/bin/env bash
# Builds the Debian package of the agent: target/packages/ddiskqos-agent_<version>-<revision>_amd64.deb.
#   scripts/build-deb.sh [--revision N] [--no-build] [--lintian]
# The binary is the `ship` build (release without debug info, stripped, statically linked: the one the
# DaemonSet's image carries, deploy/kubernetes/build-image.sh), so the package depends on no shared library.
# Needs cargo-deb (scripts/install-cargo-deb.sh installs it here when missing). --no-build packages a
# binary built before (CI builds it once for the image and the package). Also written beside the package: the
# unit with the package's paths, the shell completions and the man pages, generated from the binary.
# --lintian: check the package with Debian's lintian (must be installed) and fail on any error or warning that
# deploy/debian/lintian-overrides does not explain.
set -euo pipefail
cd "$(dirname "$0")/.."
revision=1
build=yes
lint=no
while [ $# -gt 0 ]; do
  case $1 in
    --revision) revision=${2:?--revision needs a number}; shift 2 ;;
    --no-build) build=no; shift ;;
    --lintian) lint=yes; shift ;;
    *) echo "build-deb: unknown argument '$1' (usage: scripts/build-deb.sh [--revision N] [--no-build] [--lintian])" >&2; exit 2 ;;
  esac
done
case $revision in '' | *[!0-9]*) echo "build-deb: --revision '$revision' is not a number" >&2; exit 2 ;; esac
target=x86_64-unknown-linux-gnu
# The static ship build (scripts/build-ship.sh, the DaemonSet image's binary too).
bin=$(bash scripts/build-ship.sh $([ "$build" = yes ] || echo --no-build))
out=$(dirname "$bin")
bash scripts/install-cargo-deb.sh >&2
# The generated assets (Cargo.toml's [package.metadata.deb] names them under target/release/deb/, which
# cargo-deb maps to this build's directory).
gen=$out/deb
rm -rf "$gen"
mkdir -p "$gen"
# The unit as shipped in deploy/, with the package's binary path and without the install-by-hand comment.
sed -e 's#/usr/local/bin/ddiskqos-agent#/usr/bin/ddiskqos-agent#g' \
  -e '/^# dDiskQoS agent as a systemd service\. Install/,/^#   systemctl daemon-reload/c\
# dDiskQoS agent as a systemd service, installed by the ddiskqos-agent package. The configuration is\
# /etc/ddiskqos/agent.toml (a conffile: an edited one is kept across upgrades).' \
  deploy/ddiskqos-agent.service > "$gen/ddiskqos-agent.service"
if grep -q /usr/local "$gen/ddiskqos-agent.service"; then
  echo "build-deb: the unit still names /usr/local after rewriting its paths" >&2
  exit 1
fi
# Completions and man pages where the package installs them, under $gen/root.
bash scripts/gen-completions.sh "$gen/root" "$bin"
# Into a directory of its own, then beside the other revisions (cargo-deb replaces an earlier package of the same
# name in its output directory).
built=$(cargo deb -p qos-agent --no-build --no-strip --profile ship --target "$target" --deb-revision "$revision" \
  --output "$gen/out/" | tail -n 1)
[ -f "$built" ] || { echo "build-deb: cargo deb printed no package file (got '$built')" >&2; exit 1; }
mkdir -p target/packages
deb=target/packages/$(basename "$built")
mv "$built" "$deb"
echo "build-deb: $deb ($(du -k "$deb" | cut -f1) KiB; the binary $(du -k "$bin" | cut -f1) KiB)"
if [ "$lint" = yes ]; then
  command -v lintian >/dev/null 2>&1 || { echo "build-deb: --lintian, but lintian is not installed" >&2; exit 1; }
  lintian --fail-on error,warning --info "$deb"
  echo "build-deb: lintian: no error or warning that deploy/debian/lintian-overrides does not explain"
fi
