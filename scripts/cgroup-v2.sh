#!/usr/bin/env bash
# The cgroup-v2 test bed of this machine kind (see ../shared/TESTBED.md, "cgroup v2 for real"): the machine boots
# cgroup v1 hybrid with `blkio` at /sys/fs/cgroup/blkio; this script moves the io controller (with --cpu the cpu
# controller too) to the v2 tree (/sys/fs/cgroup/unified), runs a command in a private mount namespace whose
# /sys/fs/cgroup is that cgroup2 tree (optionally with a throw-away dockerd running there too), and puts the machine
# back on v1 afterwards, also on failure or Ctrl-C.
#
# An optional tool, no longer used by the tests: on newer machines of this kind the host's v1 hierarchies cannot be
# released (umount answers EBUSY, or the hierarchy lives on), and this script then stops at once saying so. The
# tests' cgroup-v2 pass runs in the systemd guest (scripts/guest.sh) on every machine.
#
#   scripts/cgroup-v2.sh run [--dockerd] [--cpu] -- CMD [ARG...]   # the usual way; exit status is CMD's
#   scripts/cgroup-v2.sh enter [--cpu] | leave | status             # the two halves by hand (leave is idempotent)
#
# --cpu: runc gives every container with CPU shares (every CRI pod sandbox: containerd sets them) a cpu.weight,
# which needs the cpu controller on v2; on this machine kind the v1 `cpu` hierarchy holds only an empty docker/.
#
# Inside CMD (a private mount and network namespace; loopback only): /sys/fs/cgroup is cgroup2 with `io` enabled
# for children; with --dockerd, DOCKER_HOST points at the
# throw-away dockerd (cgroupfs driver, own data/exec roots, no bridge, no iptables) and the local test image
# ddiskqos-test:latest is imported into it. Run other processes in the same namespace with
# `nsenter -t "$DDISKQOS_V2_NS_PID" -m -n`.
#
# Refuses to start when a blkio (or, with --cpu, cpu) v1 cgroup other than the root has processes (stop those
# containers first). Only cgroups this script's run created are removed; the machine's own hierarchies (memory, ...)
# are never touched.
set -euo pipefail

V1=/sys/fs/cgroup/blkio
V2=/sys/fs/cgroup/unified
STATE_DIR=${DDISKQOS_V2_STATE:-/run/ddiskqos-v2}
WAIT_SECS=${DDISKQOS_V2_WAIT:-180}
DOCKER_CLI=/usr/bin/docker
[ -x "$DOCKER_CLI" ] || DOCKER_CLI=$(command -v docker || true)

log() { printf '[cgroup-v2] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# A v1 controller's row in /proc/cgroups: hierarchy id ($2) and cgroups including dying ones ($3).
v1_count() { awk -v c="$1" '$1 == c { print $3 }' /proc/cgroups; }
v1_hierarchy() { awk -v c="$1" '$1 == c { print $2 }' /proc/cgroups; }
# The v2 name of a v1 controller.
v2_name() { case $1 in blkio) echo io ;; *) echo "$1" ;; esac; }
on_v2() { grep -qw "$(v2_name "$1")" "$V2/cgroup.controllers"; }
io_on_v2() { on_v2 blkio; }
# "MOUNTPOINT CONTROLLERS" of the v1 hierarchy holding controller $1 (CONTROLLERS comma-separated, e.g. cpu or
# cpu,cpuacct: the mount options that are controller names), or nothing when it is not mounted.
v1_mount() {
  local names; names=$(awk 'NR > 1 { printf "%s ", $1 }' /proc/cgroups)
  awk -v c="$1" -v names=" $names" '$3 == "cgroup" {
      n = split($4, o, ","); hit = 0; ctl = ""
      for (i = 1; i <= n; i++)
        if (index(names, " " o[i] " ")) { ctl = ctl (ctl ? "," : "") o[i]; if (o[i] == c) hit = 1 }
      if (hit) { print $2, ctl; exit }
    }' /proc/mounts
}
v1_mounted() { mountpoint -q "$V1" && [ -e "$V1/blkio.reset_stats" ]; }
# The v1 hierarchies this run moved to v2, one "CONTROLLER MOUNTPOINT CONTROLLERS" line each.
MOVED="$STATE_DIR/moved"

# Removes empty cgroup directories below $1, deepest first; fails naming a cgroup that still has processes.
remove_children() {
  local root=$1 dir
  while IFS= read -r dir; do
    [ "$dir" = "$root" ] && continue
    # cgroup files report size 0 whatever they hold: read it.
    if [ -n "$(cat "$dir/cgroup.procs" 2>/dev/null)" ]; then
      die "cgroup $dir still has processes ($(tr '\n' ' ' < "$dir/cgroup.procs")); stop them first"
    fi
    rmdir "$dir" 2>/dev/null || sleep 0.2
    # An `if`, not `[ -d ] && ...`: that list's status 1 (already removed) would be the function's status and,
    # under `set -e`, end the caller silently.
    if [ -d "$dir" ]; then rmdir "$dir" || die "cannot remove cgroup $dir"; fi
  done < <(find "$root" -mindepth 1 -type d -printf '%d %p\n' | sort -rn | cut -d' ' -f2-)
}

# A detached loop device still set to BFQ pins dying blkio cgroups (TESTBED.md): set such devices to none.
release_detached_loops() {
  local q name
  for q in /sys/block/loop*/queue/scheduler; do
    [ -e "$q" ] || continue
    name=$(basename "$(dirname "$(dirname "$q")")")
    if [ ! -e "/sys/block/$name/loop/backing_file" ] && grep -q '\[bfq\]' "$q"; then
      echo none > "$q" && log "detached $name: scheduler bfq -> none (it pinned dying cgroups)"
    fi
  done
}

status() {
  if v1_mounted; then echo "io controller: cgroup v1 (blkio at $V1)"; else echo "blkio v1: not mounted"; fi
  if io_on_v2; then echo "io controller: available on cgroup v2 ($V2)"; fi
  echo "blkio cgroups (incl. dying): $(v1_count blkio), hierarchy id $(v1_hierarchy blkio)"
  local cpu; cpu=$(v1_mount cpu)
  if [ -n "$cpu" ]; then echo "cpu controller: cgroup v1 (${cpu#* } at ${cpu%% *})"; fi
  if on_v2 cpu; then echo "cpu controller: available on cgroup v2 ($V2)"; fi
  echo "v2 subtree_control: $(cat "$V2/cgroup.subtree_control")"
}

# Moves v1 controller $1 (blkio or cpu) to the v2 tree: its v1 children removed, its hierarchy unmounted, its dying
# cgroups waited out (TESTBED.md), and the controller enabled for the v2 root's children.
move_to_v2() {
  local ctl=$1 v2; v2=$(v2_name "$ctl")
  local m; m=$(v1_mount "$ctl")
  if [ -z "$m" ]; then
    on_v2 "$ctl" || die "$ctl is neither mounted on v1 nor available on v2: unknown state, see '$0 status'"
    log "$v2 is already on cgroup v2"
  else
    local mp=${m%% *} opts=${m#* }
    remove_children "$mp"
    echo "$ctl $mp $opts" >> "$MOVED"
    # On newer machines of this kind the v1 hierarchies cannot be released (TESTBED.md): say so plainly.
    local err
    if ! err=$(umount "$mp" 2>&1); then
      die "this host cannot move $ctl to cgroup v2: 'umount $mp' failed ($err); something outside the project holds \
the v1 hierarchy. Run cgroup-v2 work in the systemd guest instead: scripts/guest.sh run -- CMD"
    fi
    log "$ctl v1 ($opts at $mp) unmounted; waiting for its dying cgroups to be freed (up to ${WAIT_SECS}s)"
    local deadline=$((SECONDS + WAIT_SECS))
    until on_v2 "$ctl"; do
      if [ $SECONDS -ge $deadline ]; then
        mount -t cgroup -o "$opts" cgroup "$mp" || true
        die "$v2 not on cgroup v2 within ${WAIT_SECS}s ($ctl cgroups: $(v1_count "$ctl")); $ctl v1 mounted again. \
This host cannot move its controllers: use the systemd guest (scripts/guest.sh run -- CMD)"
      fi
      # Once only the root is left, mounting and unmounting the v1 hierarchy again lets the controller go.
      if [ "$(v1_count "$ctl")" = 1 ] && ! mountpoint -q "$mp"; then
        mount -t cgroup -o "$opts" cgroup "$mp" && umount "$mp" || true
      fi
      sleep 1
    done
  fi
  grep -qw "$v2" "$V2/cgroup.subtree_control" || echo "+$v2" > "$V2/cgroup.subtree_control"
}

# enter [--cpu]: io (and with --cpu the cpu controller, which runc needs for a CRI pod sandbox's CPU shares) to v2.
enter() {
  [ "$(id -u)" = 0 ] || die "must run as root"
  [ -d "$V2" ] || die "$V2 (the cgroup2 tree of the hybrid layout) is missing: not this machine kind"
  local ctls="blkio"
  case ${1:-} in --cpu) ctls="blkio cpu" ;; "") ;; *) die "enter: unknown option $1 (usage: $0 enter [--cpu])" ;; esac
  mkdir -p "$STATE_DIR"
  if [ ! -f "$STATE_DIR/entered" ]; then
    cat "$V2/cgroup.subtree_control" > "$STATE_DIR/subtree_control.before"
    find "$V2" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort > "$STATE_DIR/children.before"
    : > "$MOVED"
  fi
  touch "$STATE_DIR/entered"
  release_detached_loops
  local ctl
  for ctl in $ctls; do move_to_v2 "$ctl"; done
  local files="io.weight, io.bfq.weight, io.stat"
  case $ctls in *cpu*) files="$files, cpu.weight" ;; esac
  log "on cgroup v2 ($V2): $(for c in $ctls; do printf '%s ' "$(v2_name "$c")"; done)(children get $files)"
}

leave() {
  [ "$(id -u)" = 0 ] || die "must run as root"
  # What to mount again: the hierarchies `enter` recorded; blkio alone when there is no record (an older run).
  local moved=""
  [ -s "$MOVED" ] && moved=$(cat "$MOVED")
  if [ -z "$moved" ] && ! v1_mounted; then moved="blkio $V1 blkio"; fi
  if [ -z "$moved" ]; then
    log "nothing moved to v2: nothing to put back"
    rm -f "$STATE_DIR/entered" "$MOVED"
    return 0
  fi
  # Remove the v2 cgroups created since `enter` (docker/, test cgroups, kubepods/), deepest first.
  local before="$STATE_DIR/children.before" child
  while IFS= read -r child; do
    [ -n "$child" ] || continue
    if [ ! -f "$before" ] || ! grep -qxF "$child" "$before"; then
      remove_children "$V2/$child"
      rmdir "$V2/$child" || die "cannot remove v2 cgroup $V2/$child"
    fi
  done < <(find "$V2" -mindepth 1 -maxdepth 1 -type d -printf '%f\n')
  # Turn off for children every controller that was not on before (io, cpu; hugetlb, which Docker on v2 enables):
  # first in the cgroups that were there before `enter` and stay (a dockerd on v2 enables its controllers in an
  # existing docker/ too, and the root's cannot be turned off while a child still has them on: EBUSY), deepest
  # first, then in the root.
  local was="" c dir
  [ -f "$STATE_DIR/subtree_control.before" ] && was=$(cat "$STATE_DIR/subtree_control.before")
  while IFS= read -r dir; do
    for c in $(cat "$dir/cgroup.subtree_control"); do
      case " $was " in *" $c "*) ;; *) echo "-$c" > "$dir/cgroup.subtree_control" || die "cannot disable $c in $dir/cgroup.subtree_control";; esac
    done
  done < <(find "$V2" -mindepth 1 -type d -printf '%d %p\n' | sort -rn | cut -d' ' -f2-; echo "$V2")
  release_detached_loops
  local ctl mp opts
  while read -r ctl mp opts; do
    [ -n "$ctl" ] || continue
    if mountpoint -q "$mp"; then log "$ctl v1 is mounted at $mp: nothing to put back"; continue; fi
    log "mounting $ctl v1 ($opts at $mp) again (retrying while dying v2 cgroups hold it, up to ${WAIT_SECS}s)"
    local deadline=$((SECONDS + WAIT_SECS))
    until mount -t cgroup -o "$opts" cgroup "$mp" 2>/dev/null; do
      [ $SECONDS -lt $deadline ] || die "$ctl v1 not mounted at $mp within ${WAIT_SECS}s; run '$0 leave' again later"
      sleep 1
    done
    log "back on cgroup v1: $ctl at $mp"
  done <<< "$moved"
  rm -f "$STATE_DIR/entered" "$STATE_DIR/subtree_control.before" "$STATE_DIR/children.before" "$MOVED"
}

# Runs inside the private mount namespace: cgroup2 at /sys/fs/cgroup, optional dockerd, then the command.
inside() {
  local with_dockerd=$1; shift
  umount -R -l /sys/fs/cgroup
  mount -t cgroup2 none /sys/fs/cgroup
  # A network namespace of its own too: a dockerd with --bridge=none deletes any docker0 it sees, which in the
  # host's namespace is the host dockerd's bridge (every later `docker run` there then fails). Loopback up for the
  # agent's metrics.
  ip link set lo up
  export DDISKQOS_V2_NS_PID=$$
  # Debian's docker CLI (matching the 20.10 daemon) first, as scripts/test.sh does.
  export PATH="/usr/bin:$PATH"
  if [ "$with_dockerd" = 1 ]; then
    local d="$STATE_DIR/dockerd"
    rm -rf "$d"; mkdir -p "$d"
    export DOCKER_HOST="unix://$d/docker.sock"
    /usr/sbin/dockerd --host "$DOCKER_HOST" --data-root "$d/data" --exec-root "$d/exec" --pidfile "$d/dockerd.pid" \
      --bridge=none --iptables=false --ip-masq=false --exec-opt native.cgroupdriver=cgroupfs \
      >"$d/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    DOCKERD_DIR=$d
    trap 'kill "$DOCKERD_PID" 2>/dev/null; wait "$DOCKERD_PID" 2>/dev/null; rm -rf "$DOCKERD_DIR"' EXIT
    for _ in $(seq 1 120); do "$DOCKER_CLI" version >/dev/null 2>&1 && break; sleep 0.5; done
    "$DOCKER_CLI" version >/dev/null 2>&1 || { tail -20 "$d/dockerd.log" >&2; die "the v2 dockerd did not come up"; }
    local ver; ver=$("$DOCKER_CLI" info --format '{{.CgroupVersion}}')
    [ "$ver" = 2 ] || die "the throw-away dockerd reports cgroup version $ver, not 2"
    import_test_image
    log "dockerd on cgroup v2 at $DOCKER_HOST (pid $DOCKERD_PID)"
  fi
  local rc=0
  "$@" || rc=$?
  if [ "$with_dockerd" = 1 ]; then
    local ids; ids=$("$DOCKER_CLI" ps -aq || true)
    [ -z "$ids" ] || "$DOCKER_CLI" rm -f $ids >/dev/null 2>&1 || true
  fi
  return $rc
}

import_test_image() {
  bash "$(dirname "$0")/test-image.sh" || die "building the test image failed"
}

run() {
  local with_dockerd=0 cpu=""
  while [ $# -gt 0 ]; do
    case $1 in
      --dockerd) with_dockerd=1; shift ;;
      --cpu) cpu=--cpu; shift ;;
      --) shift; break ;;
      *) die "run: unknown option $1 (usage: $0 run [--dockerd] [--cpu] -- CMD [ARG...])" ;;
    esac
  done
  [ $# -gt 0 ] || die "run needs a command after --"
  trap 'rc=$?; trap - EXIT INT TERM; leave || rc=1; exit $rc' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  enter $cpu
  local rc=0
  unshare -m -n --propagation private "$0" _inside "$with_dockerd" "$@" || rc=$?
  return $rc
}

case ${1:-} in
  run) shift; run "$@" ;;
  enter) shift; enter "$@" ;;
  leave) leave ;;
  status) status ;;
  _inside) shift; inside "$@" ;;
  *) echo "usage: $0 run [--dockerd] [--cpu] -- CMD [ARG...] | enter [--cpu] | leave | status" >&2; exit 2 ;;
esac
