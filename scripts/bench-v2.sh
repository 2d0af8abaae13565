#!/usr/bin/env bash
# The v2 main job: the paper's experiments with the shipped agent where users run it now, a systemd host on
# cgroup v2, on a disk that is the bottleneck. One command, as root, on this machine kind (`./scripts/bench.sh --v2`
# runs it too):
#
#   scripts/bench-v2.sh [--suite trixie|bookworm] [--out DIR] [--modes M,M...|none] [--cri-modes M,M...|none]
#                       [--timeout SECS] [BENCH-RUN-ARGS...]
#
# It builds the release bench here, boots the systemd guest (scripts/guest.sh: Debian 13, or 12 with --suite bookworm;
# systemd as PID 1, pure cgroup v2) with its experiment disk vdb throttled by qemu to the `ssd` device model
# (150 MiB/s, 1500 IOPS; why those values: scripts/guest.sh), starts the guest's own docker.service (Docker's
# systemd cgroup driver: every container is system.slice/docker-<id>.scope, and the agent's `auto` actuator sends
# its weights through systemd), and runs `ddiskqos-bench run --runtime docker --device /dev/vdb --format` there,
# one run per mode users meet on v2 (default: BFQ default, protect (the agent's shipped device set-up), BFQ strict,
# strict with the agent's BFQ tunables, io.cost with the kernel's model, io.cost with the agent's calibrated model,
# and io.cost as the shipped agent's protection enables it by itself on a device without BFQ, scheduler none as on
# most v2 hosts: `iocost-protect`),
# on the v2 plan (PLAN below; bench arguments given replace it): Alone / Original / dDiskQoS interleaved per
# repetition, and in the BFQ modes a fourth variant, static best (the background at the engine's bottom weight and
# readers at its top, set at creation with Docker's --blkio-weight, which Docker 26 puts into io.bfq.weight as given,
# 1-3 s after the scope appears under emulation; crates/bench/src/static_best.rs). JSON, report and chart land in
# DIR/<mode> on the
# host (default ./bench-out-v2; the checkout is shared with the guest over 9p, so DIR must be inside it). Every report says that it ran under emulation on a
# throttled disk: figures are only comparable within one run. Prints how long everything took. Nothing is left
# behind (scripts/guest.sh kills qemu and removes its run directory and disk images whatever happens).
#
# Then pods (`--cri-modes`, default `protect,iocost-protect`, the agent's shipped device set-up on a BFQ device and on
# one without BFQ; `none` skips them): the same bench
# with `--runtime cri` against a throw-away containerd whose runc uses the systemd cgroup driver
# (`ddiskqos-containerd --systemd`), every reader and the background a Burstable pod under kubepods.slice as the
# kubelet's systemd driver makes them, found by the agent through CRI; results in DIR/cri-<mode>.
set -euo pipefail
cd "$(dirname "$0")/.."
CHECKOUT=$(pwd)

log() { printf '[bench-v2] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The device model of the experiment disk, for the note in every report (scripts/guest.sh's `ssd`).
MODEL_NOTE="qemu throttling.bps-total=157286400 (150 MiB/s), throttling.iops-total=1500"

# The plan when no bench arguments are given: Experiment 1 at 1 and 10 MiB, 5 repetitions each, and 2 rounds of
# Experiment 2, so that every mode fits in about 10 min under emulation (quick mode's 100 MiB reads and 10
# repetitions take 28-30 min a mode); the static-best arm in the BFQ modes (static_plan).
PLAN=(--sizes 1,10 --reps 5 --exp2-reps 2)

# The static-best arm where Docker's --blkio-weight lands in the file that governs the device as the agent's
# weights do: the BFQ modes (io.bfq.weight, 10 and 1000 as given). Not in the io.cost modes: runc turns 10..1000 into
# IOWeight 1..10000 through systemd (a 10000:1 ratio, not the agent's 1000:10), and not for pods (no
# --blkio-weight; a pod slice's file written by hand is systemd's to put back).
static_plan() {
  case $1 in iocost-*) ;; *) printf '%s\n' --static-best ;; esac
}

inside() {
  local out=$1 modes=$2 cri_modes=$3 suite_note=$4 planned=$5
  shift 5
  [ "${DDISKQOS_GUEST:-}" = 1 ] || die "_inside runs in the guest only"
  [ "${DDISKQOS_GUEST_DISK_MODEL:-}" = ssd ] || die "the experiment disks are not throttled (model '${DDISKQOS_GUEST_DISK_MODEL:-}')"
  systemctl start docker.service
  local i
  for i in $(seq 1 120); do docker version >/dev/null 2>&1 && break; sleep 1; done
  local driver
  driver=$(docker info --format '{{.CgroupDriver}} {{.CgroupVersion}}') || die "docker.service did not answer"
  [ "$driver" = "systemd 2" ] || die "docker.service runs with cgroup driver and version '$driver', not 'systemd 2'"
  local versions
  versions="Debian $(cat /etc/debian_version), kernel $(uname -r), systemd $(systemctl --version | awk 'NR == 1 { print $2 }'), Docker $(docker version --format '{{.Server.Version}}')"
  log "in the guest: $versions; docker.service cgroup driver $driver; vdb: $(cat /sys/block/vdb/queue/rotational 2>/dev/null) rotational"
  # One bench run per mode, each with its own output directory ($out/<mode>): under emulation a mode takes many
  # minutes, and the modes already measured stay if a later one fails or the guest's time runs out.
  local rc=0 mode
  [ "$modes" = none ] || for mode in ${modes//,/ }; do
    log "mode $mode: $(date -u +%H:%M:%S) UTC"
    local args=("$@")
    [ "$planned" = 0 ] || mapfile -t args < <(printf '%s\n' "${PLAN[@]}"; static_plan "$mode")
    target/release/ddiskqos-bench run --runtime docker --device /dev/vdb --format --modes "$mode" \
      --out "$out/$mode" --note "TEST BED: the systemd guest (scripts/guest.sh, $suite_note: $versions) under qemu's SOFTWARE EMULATION (TCG, 2 vCPUs), on a virtio disk THROTTLED by qemu ($MODEL_NOTE); Docker's systemd cgroup driver (system.slice/docker-<id>.scope, weights through systemd). Ratios within this run only; figures are not comparable with the host's" \
      "${args[@]}" || { rc=$?; log "mode $mode failed (exit status $rc)"; }
  done
  [ "$cri_modes" = none ] || for mode in ${cri_modes//,/ }; do
    log "pods through CRI (containerd, systemd cgroup driver), mode $mode: $(date -u +%H:%M:%S) UTC"
    local args=("$@")
    [ "$planned" = 0 ] || args=("${PLAN[@]}")
    target/release/ddiskqos-containerd --systemd -- target/release/ddiskqos-bench run --runtime cri --device /dev/vdb \
      --format --modes "$mode" --out "$out/cri-$mode" \
      --note "TEST BED: the systemd guest (scripts/guest.sh, $suite_note: $versions) under qemu's SOFTWARE EMULATION (TCG, 2 vCPUs), on a virtio disk THROTTLED by qemu ($MODEL_NOTE); pods through CRI (a throw-away containerd $(containerd --version | awk '{print $3}'), runc's systemd cgroup driver: kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice). Ratios within this run only; figures are not comparable with the host's" \
      "${args[@]}" || { rc=$?; log "CRI mode $mode failed (exit status $rc)"; }
  done
  local ids; ids=$(docker ps -aq || true)
  [ -z "$ids" ] || docker rm -f $ids >/dev/null 2>&1 || true
  systemctl stop docker.service docker.socket || true
  return $rc
}

if [ "${1:-}" = _inside ]; then
  shift
  inside "$@"
  exit
fi

[ "$(id -u)" = 0 ] || die "must run as root (the guest's image is built with mmdebstrap's root mode)"
SUITE=${DDISKQOS_GUEST_SUITE:-trixie}
OUT=bench-out-v2
MODES=default,protect,strict,strict-tuned,iocost-kernel,iocost-calibrated,iocost-protect
CRI_MODES=protect,iocost-protect
# The guest is killed after this. In the first run (2026-11-26, a busy host) a quick-mode mode ran 10-15 min before
# failing, and a Debian 12 boot took 2-2.5 min: five modes need well over an hour.
TIMEOUT=10800
while [ $# -gt 0 ]; do
  case $1 in
    --suite) [ $# -ge 2 ] || die "--suite needs bookworm or trixie"; SUITE=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a directory"; OUT=$2; shift 2 ;;
    --modes) [ $# -ge 2 ] || die "--modes needs a list"; MODES=$2; shift 2 ;;
    --cri-modes) [ $# -ge 2 ] || die "--cri-modes needs a list or none"; CRI_MODES=$2; shift 2 ;;
    --timeout) [ $# -ge 2 ] && [[ $2 =~ ^[0-9]+$ ]] || die "--timeout needs seconds"; TIMEOUT=$2; shift 2 ;;
    *) break ;;
  esac
done
case $SUITE in
  bookworm) SUITE_NOTE="Debian 12 bookworm" ;;
  trixie) SUITE_NOTE="Debian 13 trixie" ;;
  *) die "--suite must be bookworm or trixie, got '$SUITE'" ;;
esac
T0=$SECONDS
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
case $OUT/ in
  "$CHECKOUT"/*) ;;
  *) die "--out must be inside the checkout ($CHECKOUT), which the guest sees over 9p; got $OUT" ;;
esac
command -v protoc >/dev/null 2>&1 || { log "installing protobuf-compiler (the CRI bindings need protoc)";
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler >/dev/null; }
cargo build --release --locked -p bench -p testbed --bin ddiskqos-bench --bin ddiskqos-containerd
T_BUILD=$((SECONDS - T0))
log "release build: ${T_BUILD} s; booting the $SUITE_NOTE guest with the ssd disk model"
# vdb holds the bench's files (a 2 GiB background file and the readers' files): 4 GiB, sparse.
rc=0
PLANNED=0
[ $# -gt 0 ] || PLANNED=1
log "bench arguments: $(if [ $PLANNED = 1 ]; then echo "the v2 plan: ${PLAN[*]}, --static-best in the BFQ modes"; else echo "$*"; fi)"
DDISKQOS_GUEST_SUITE=$SUITE DDISKQOS_GUEST_DISK_MODEL=ssd DDISKQOS_GUEST_DISK_SIZE=4G \
  bash scripts/guest.sh run --timeout "$TIMEOUT" -- bash scripts/bench-v2.sh _inside "$OUT" "$MODES" "$CRI_MODES" "$SUITE_NOTE" "$PLANNED" "$@" \
  || rc=$?
T_ALL=$((SECONDS - T0))
log "v2 main job ($SUITE_NOTE, modes $MODES, pods through CRI in $CRI_MODES): exit status $rc; took $((T_ALL / 60)) min $((T_ALL % 60)) s (release build ${T_BUILD} s, guest boot and run $((T_ALL - T_BUILD)) s); results in $OUT"
exit $rc
