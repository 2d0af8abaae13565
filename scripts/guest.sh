#!/usr/bin/env bash
# The systemd guest: a Debian 12 (or 13) virtual machine with systemd as PID 1 and a pure cgroup v2 hierarchy, booted under
# qemu's software emulation (TCG), for the tests that need cgroup v2 (../shared/TESTBED.md, "The systemd guest").
# The host of this machine kind boots cgroup v1 and its controllers cannot move to v2; the guest is the host our
# users run (systemd, cgroup v2, Docker and containerd from Debian).
#
#   scripts/guest.sh build                                  # build the cached image (only if its inputs changed)
#   scripts/guest.sh run [--dockerd] [--image NAME]... [--timeout SECS] -- CMD [ARG...]
#   scripts/guest.sh status | clean                         # what is cached / running; remove the cache
#
# run: boots the guest (2 vCPUs, $DDISKQOS_GUEST_MEM MiB, the cached root image copy-on-write (-snapshot), two empty
# 1 GiB virtio disks vdb and vdc for experiments), mounts this checkout into it over 9p at the same absolute path
# (so test binaries find the agent binary and the manifests by the paths they were built with), runs CMD there as
# root in the checkout, streams CMD's output here, powers the guest off and exits with CMD's status. Nothing is
# left behind: qemu is killed and the run directory removed on success, failure, timeout and Ctrl-C.
#   --dockerd      a throw-away dockerd in the guest (cgroupfs driver, no bridge, no iptables) at $DOCKER_HOST, with
#                  the test image ddiskqos-test:latest imported from the guest's busybox-static
#   --image NAME   an image of the host's dockerd to load into it (docker save here, docker load there)
#   --timeout SECS kill the guest after this long (default 1800); a timeout is a failure (exit 124)
# Inside, CMD sees DDISKQOS_GUEST=1, DDISKQOS_GUEST_DISKS="vdb vdc", DDISKQOS_GUEST_SUITE and
# DDISKQOS_GUEST_DISK_MODEL (as below), DDISKQOS_TIME_SCALE=10 (unless set here: how much longer waits may take under
# emulation), and the host's DDISKQOS_*, CI and RUST_* variables. The guest's own docker.service and containerd.service are installed but not started.
#
# The image (rootfs by mmdebstrap from the Debian mirror the host's apt uses, kernel and initrd from it, an ext4
# image by mke2fs -d) is cached under $DDISKQOS_GUEST_CACHE/<suite> (default /var/cache/ddiskqos-guest) keyed by a
# hash of its package list, suite, mirror and the files this script puts into it; a failing download is an error.
#
# Environment (all optional):
#   DDISKQOS_GUEST_SUITE=bookworm|trixie  the Debian release (default bookworm: Debian 12, kernel 6.1, systemd 252,
#                  Docker 20.10, containerd 1.6; trixie: Debian 13, kernel 6.12, systemd 257, Docker 26.1 whose CLI is
#                  the separate docker-cli package, containerd 1.7). Each suite has its own cached image.
#   DDISKQOS_GUEST_DISK_MODEL=none|ssd    what the experiment disks vdb and vdc are (default none):
#                  none  plain virtio on a host file (cache=none). Under TCG the emulated CPU, not this disk, is the
#                        bottleneck (1.6-3.4 GB/s sequential): no queue forms in the guest and weights show nothing.
#                  ssd   the same, throttled by qemu to 150 MiB/s and 1500 IOPS (throttling.bps-total,
#                        throttling.iops-total): a small SATA/cloud SSD volume's order of magnitude, and the values
#                        issue 25 measured with fio (a 1 MiB QD1 probe 0.97 ms alone, 216 ms behind a QD32 reader
#                        with no scheduler, 49 -> 8.7 ms with BFQ strict weights 100/100 -> 10/1000): slow enough
#                        that the queue forms in the guest, where its scheduler orders it, and far below what the
#                        emulated CPU can drive, so the CPU stops mattering. qemu lets an idle disk burst.
#   DDISKQOS_GUEST_DISK_SIZE=SIZE          size of vdb and vdc (default 1G; sparse files in the run directory).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
CHECKOUT=$(cd "$HERE/.." && pwd)
CACHE=${DDISKQOS_GUEST_CACHE:-/var/cache/ddiskqos-guest}
MEM=${DDISKQOS_GUEST_MEM:-6144}
SUITE=${DDISKQOS_GUEST_SUITE:-bookworm}
# What the tests need in the guest: systemd and D-Bus (PID 1, the systemd cgroup driver), the kernel and its
# modules (bfq, loop, 9p, null_blk), Docker and containerd (runc with them), the test image's busybox, fio, and the
# tools the tests call (losetup, mkfs.ext4, ip, ps); libfontconfig1 and a font for the bench's charts (plotters).
PACKAGES=systemd,systemd-sysv,dbus,linux-image-amd64,initramfs-tools,udev,kmod,docker.io,containerd,runc,busybox-static,fio,iproute2,procps,util-linux,mount,e2fsprogs,libfontconfig1,fonts-dejavu-core
case $SUITE in
  bookworm) ;;
  # Debian 13's docker.io ships the daemon only; the CLI (which the tests and the bench call) is docker-cli.
  trixie) PACKAGES=$PACKAGES,docker-cli ;;
  *) printf '[guest] error: DDISKQOS_GUEST_SUITE must be bookworm or trixie, got %s\n' "$SUITE" >&2; exit 2 ;;
esac
DISK_MODEL=${DDISKQOS_GUEST_DISK_MODEL:-none}
# The experiment disks' device model as qemu -drive options (see the header).
case $DISK_MODEL in
  none) DISK_OPTS="" ;;
  ssd) DISK_OPTS=",throttling.bps-total=157286400,throttling.iops-total=1500" ;;
  *) printf '[guest] error: DDISKQOS_GUEST_DISK_MODEL must be none or ssd, got %s\n' "$DISK_MODEL" >&2; exit 2 ;;
esac
DISK_SIZE=${DDISKQOS_GUEST_DISK_SIZE:-1G}
[[ $DISK_SIZE =~ ^[0-9]+[KMGT]?$ ]] || { printf '[guest] error: bad DDISKQOS_GUEST_DISK_SIZE %s\n' "$DISK_SIZE" >&2; exit 2; }
DOCKER_CLI=/usr/bin/docker

log() { printf '[guest] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The Debian mirror of the host's apt (deb822 or one-line sources), else deb.debian.org.
mirror() {
  local m
  m=$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
    | grep -v security | sed -E 's/^URIs:[[:space:]]*//; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?//' \
    | awk '{ print $1; exit }')
  echo "${m:-http://deb.debian.org/debian}"
}

# The files this script puts into the image, written below directory $1 (the rootfs or a scratch dir for hashing).
image_files() {
  local root=$1
  mkdir -p "$root/usr/local/sbin" "$root/etc/systemd/system/multi-user.target.wants" \
    "$root/etc/systemd/system.conf.d" "$root/etc/docker"
  # The runner: mounts the host's checkout (9p tag "checkout") at the path named on the kernel command line, runs
  # this script's guest side from it, powers off whatever happens (the host waits for qemu to exit).
  cat > "$root/usr/local/sbin/ddiskqos-guest-run" <<'EOF'
#!/bin/sh
# Runs once after boot (ddiskqos-guest.service): the host's checkout over 9p, then scripts/guest.sh _inside.
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^$1=//p"; }
share=$(arg ddiskqos.share); run=$(arg ddiskqos.run)
console=/dev/ttyS0
if [ -n "$share" ] && mkdir -p "$share" && modprobe 9pnet_virtio && \
   mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576,access=any checkout "$share" && \
   [ -d "$run" ]; then
  bash "$share/scripts/guest.sh" _inside "$run" > "$run/output.log" 2>&1 < /dev/null
  echo "$?" > "$run/rc.tmp" && mv "$run/rc.tmp" "$run/rc"
  sync
else
  echo "[guest] error: cannot mount the checkout (share=$share run=$run)" > "$console"
fi
systemctl poweroff -ff
EOF
  chmod 755 "$root/usr/local/sbin/ddiskqos-guest-run"
  cat > "$root/etc/systemd/system/ddiskqos-guest.service" <<'EOF'
[Unit]
Description=dDiskQoS: run the host's command in the guest, then power off
After=multi-user.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/ddiskqos-guest-run
TimeoutStartSec=infinity
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
EOF
  ln -sf ../ddiskqos-guest.service "$root/etc/systemd/system/multi-user.target.wants/ddiskqos-guest.service"
  # io and cpu accounting for every unit: systemd then keeps io and cpu enabled down the tree (as on hosts where
  # Docker, the kubelet or an operator asks for IOWeight/CPUWeight), and the tests' cgroups at the root get them.
  cat > "$root/etc/systemd/system.conf.d/ddiskqos.conf" <<'EOF'
[Manager]
DefaultIOAccounting=yes
DefaultCPUAccounting=yes
EOF
  echo ddiskqos-guest > "$root/etc/hostname"
}

# The cache key: package list, suite, mirror, the build steps and the image files' content.
image_key() {
  local scratch; scratch=$(mktemp -d)
  image_files "$scratch"
  { echo "$PACKAGES $SUITE $(mirror)"; declare -f build; (cd "$scratch" && find . -type f -o -type l | sort |
      while read -r f; do echo "$f"; if [ -L "$f" ]; then readlink "$f"; else cat "$f"; fi; done); } \
    | sha256sum | cut -c1-16
  rm -rf "$scratch"
}

image_dir() { echo "$CACHE/$SUITE/$(image_key)"; }

need_host_tools() {
  local need=()
  command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
  command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
  command -v mke2fs >/dev/null 2>&1 || need+=(e2fsprogs)
  if [ ${#need[@]} -gt 0 ]; then
    log "installing: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed (the Debian mirror is needed to build the guest)"
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null || die "installing ${need[*]} failed"
  fi
}

build() {
  [ "$(id -u)" = 0 ] || die "must run as root (mmdebstrap's root mode, mke2fs of a root file system)"
  need_host_tools
  local dir; dir=$(image_dir)
  if [ -f "$dir/ready" ]; then
    log "image cached: $dir"
    return 0
  fi
  mkdir -p "$CACHE/$SUITE"
  local tmp; tmp=$(mktemp -d "$CACHE/$SUITE/build.XXXXXX")
  # Removed on any exit of the build, also a failed or interrupted one.
  trap 'rm -rf "'"$tmp"'"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  local m; m=$(mirror)
  log "building the guest image (Debian $SUITE from $m; about 3 minutes): $dir"
  local t0=$SECONDS
  mmdebstrap --quiet --variant=important --include="$PACKAGES" \
    --customize-hook='rm -f "$1"/etc/machine-id; touch "$1"/etc/machine-id' \
    "$SUITE" "$tmp/rootfs" "deb $m $SUITE main" "deb $m $SUITE-updates main" \
    > "$tmp/mmdebstrap.log" 2>&1 || { tail -30 "$tmp/mmdebstrap.log" >&2; die "mmdebstrap failed (Debian mirror $m)"; }
  image_files "$tmp/rootfs"
  local r=$tmp/rootfs
  # Boot fast and quietly: no login prompts on the console, no timers, Docker and containerd started by the tests
  # that want them.
  local unit
  for unit in serial-getty@ttyS0.service getty@tty1.service apt-daily.timer apt-daily-upgrade.timer \
    man-db.timer e2scrub_all.timer fstrim.timer logrotate.timer dpkg-db-backup.timer systemd-timesyncd.service; do
    ln -sf /dev/null "$r/etc/systemd/system/$unit"
  done
  rm -f "$r/etc/systemd/system/multi-user.target.wants/docker.service" \
    "$r/etc/systemd/system/sockets.target.wants/docker.socket" \
    "$r/etc/systemd/system/multi-user.target.wants/containerd.service"
  printf '/dev/vda / ext4 rw,relatime 0 1\n' > "$r/etc/fstab"
  local kernel initrd
  kernel=$(ls "$r"/boot/vmlinuz-* | sort -V | tail -1)
  initrd=$(ls "$r"/boot/initrd.img-* | sort -V | tail -1)
  [ -f "$kernel" ] && [ -f "$initrd" ] || die "no kernel or initrd in the guest's /boot"
  cp "$kernel" "$tmp/vmlinuz"
  cp "$initrd" "$tmp/initrd.img"
  mke2fs -q -t ext4 -d "$r" -L ddiskqos-guest "$tmp/rootfs.img" 4G >/dev/null || die "mke2fs of the guest's root failed"
  rm -rf "$r"
  echo "$PACKAGES $SUITE $m" > "$tmp/inputs"
  touch "$tmp/ready"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  # Images of this suite's older inputs are of no use any more (another suite's image stays), nor are images of
  # the cache's earlier layout (one directory per key, no suite level).
  local other
  for other in "$CACHE/$SUITE"/*/ "$CACHE"/*/; do
    case ${other%/} in
      "$dir" | "$CACHE/bookworm" | "$CACHE/trixie") ;;
      *) rm -rf "${other%/}" ;;
    esac
  done
  trap - EXIT INT TERM
  log "image built in $((SECONDS - t0)) s: $dir ($(du -sh "$dir" | cut -f1) on disk)"
}

status() {
  local dir; dir=$(image_dir)
  if [ -f "$dir/ready" ]; then echo "image: $dir (current)"; else echo "image: not built (would be $dir)"; fi
  local other
  for other in "$CACHE"/*/*/; do
    [ -d "$other" ] && [ "${other%/}" != "$dir" ] && echo "other image: ${other%/}"
  done
  pgrep -a -f 'qemu-system-x86_64.*ddiskqos.run=' || echo "no guest running"
}

clean() { rm -rf "$CACHE"; log "removed $CACHE"; }

run() {
  local dockerd=0 timeout=1800 images=()
  while [ $# -gt 0 ]; do
    case $1 in
      --dockerd) dockerd=1; shift ;;
      --image) [ $# -ge 2 ] || die "--image needs a name"; images+=("$2"); shift 2 ;;
      --timeout) [ $# -ge 2 ] && [[ $2 =~ ^[0-9]+$ ]] || die "--timeout needs seconds, got '${2:-}'"; timeout=$2; shift 2 ;;
      --) shift; break ;;
      *) die "run: unknown option '$1' (usage: $0 run [--dockerd] [--image NAME]... [--timeout SECS] -- CMD...)" ;;
    esac
  done
  [ $# -gt 0 ] || die "run needs a command after --"
  [[ $CHECKOUT != *[[:space:]]* ]] || die "the checkout's path has white space: $CHECKOUT"
  build
  local dir; dir=$(image_dir)
  mkdir -p "$CHECKOUT/target/guest"
  RUN_DIR=$(mktemp -d "$CHECKOUT/target/guest/run.XXXXXX")
  QEMU_PID=""
  trap 'cleanup_run' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  # The command, its environment and the guest-side options, for _inside.
  { printf '%q ' "$@"; echo; } > "$RUN_DIR/cmd"
  env | grep -E '^(DDISKQOS_[A-Z0-9_]*|CI|RUST_[A-Z_]*)=' | grep -v '^DDISKQOS_GUEST_' \
    | sed -E "s/'/'\\\\''/g; s/^([^=]*)=(.*)$/export \1='\2'/" > "$RUN_DIR/env" || true
  echo "$dockerd" > "$RUN_DIR/dockerd"
  mkdir -p "$RUN_DIR/images"
  local image
  for image in "${images[@]}"; do
    "$DOCKER_CLI" image inspect "$image" >/dev/null 2>&1 || die "image $image is not in the host's dockerd"
    "$DOCKER_CLI" save -o "$RUN_DIR/images/$(echo "$image" | tr '/:' '__').tar" "$image"
  done
  truncate -s "$DISK_SIZE" "$RUN_DIR/vdb.img" "$RUN_DIR/vdc.img"
  echo "$DISK_MODEL" > "$RUN_DIR/disk-model"
  echo "$SUITE" > "$RUN_DIR/suite"
  : > "$RUN_DIR/output.log"
  log "booting the guest (Debian $SUITE, qemu TCG, 2 vCPUs, ${MEM} MiB; experiment disks $DISK_SIZE, model $DISK_MODEL; about a minute), then: $*"
  local t0=$SECONDS
  qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m "$MEM" -smp 2 -nodefaults -display none -no-reboot \
    -serial "file:$RUN_DIR/console.log" -monitor none \
    -kernel "$dir/vmlinuz" -initrd "$dir/initrd.img" \
    -append "root=/dev/vda rw console=ttyS0 quiet apparmor=0 systemd.show_status=0 ddiskqos.share=$CHECKOUT ddiskqos.run=$RUN_DIR" \
    -drive "file=$dir/rootfs.img,format=raw,if=virtio,snapshot=on" \
    -drive "file=$RUN_DIR/vdb.img,format=raw,if=virtio,cache=none$DISK_OPTS" \
    -drive "file=$RUN_DIR/vdc.img,format=raw,if=virtio,cache=none$DISK_OPTS" \
    -virtfs "local,path=$CHECKOUT,mount_tag=checkout,security_model=passthrough,id=checkout" \
    -nic none &
  QEMU_PID=$!
  # The command's output as it comes (the guest writes it into the shared run directory).
  tail -n +1 -F --pid="$QEMU_PID" "$RUN_DIR/output.log" 2>/dev/null &
  local tail_pid=$! deadline=$((SECONDS + timeout)) timed_out=0
  while kill -0 "$QEMU_PID" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then timed_out=1; kill "$QEMU_PID" 2>/dev/null || true; break; fi
    sleep 1
  done
  wait "$QEMU_PID" 2>/dev/null || true
  QEMU_PID=""
  wait "$tail_pid" 2>/dev/null || true
  if [ "$timed_out" = 1 ]; then
    log "error: the guest did not finish within ${timeout}s; its console:"; tail -40 "$RUN_DIR/console.log" >&2
    return 124
  fi
  if [ ! -f "$RUN_DIR/rc" ]; then
    log "error: the guest stopped without a result; its console:"; tail -40 "$RUN_DIR/console.log" >&2
    return 1
  fi
  local rc; rc=$(cat "$RUN_DIR/rc")
  log "guest run finished in $((SECONDS - t0)) s (boot included), exit status $rc"
  return "$rc"
}

cleanup_run() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "${QEMU_PID:-}" ]; then
    kill "$QEMU_PID" 2>/dev/null || true
    wait "$QEMU_PID" 2>/dev/null || true
  fi
  [ -n "${RUN_DIR:-}" ] && rm -rf "$RUN_DIR"
  rmdir "$CHECKOUT/target/guest" 2>/dev/null || true
  exit "$rc"
}

# The guest side, run by the image's runner as root: kernel modules, the throw-away dockerd if asked, the command.
inside() {
  local run=$1
  cd "$CHECKOUT"
  export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
  # shellcheck disable=SC1091
  . "$run/env"
  export DDISKQOS_GUEST=1 DDISKQOS_GUEST_DISKS="vdb vdc"
  export DDISKQOS_GUEST_DISK_MODEL DDISKQOS_GUEST_SUITE
  DDISKQOS_GUEST_DISK_MODEL=$(cat "$run/disk-model")
  DDISKQOS_GUEST_SUITE=$(cat "$run/suite")
  # Software emulation: everything takes several times longer than on the host (testbed::process::patience).
  export DDISKQOS_TIME_SCALE=${DDISKQOS_TIME_SCALE:-10}
  echo "[guest] Debian $(cat /etc/debian_version), $(uname -r), systemd $(systemctl --version | awk 'NR == 1 { print $2 }'), cgroup $(stat -fc %T /sys/fs/cgroup), experiment disks $DDISKQOS_GUEST_DISK_MODEL, up $(cut -d' ' -f1 /proc/uptime) s"
  modprobe bfq
  modprobe loop
  # io and cpu for the root's children (systemd has them on already with DefaultIOAccounting=yes).
  echo "+io +cpu" > /sys/fs/cgroup/cgroup.subtree_control
  ip link set lo up
  if [ "$(cat "$run/dockerd")" = 1 ]; then
    local d=/run/ddiskqos-dockerd
    mkdir -p "$d"
    export DOCKER_HOST="unix://$d/docker.sock"
    /usr/sbin/dockerd --host "$DOCKER_HOST" --data-root "$d/data" --exec-root "$d/exec" --pidfile "$d/dockerd.pid" \
      --bridge=none --iptables=false --ip-masq=false --exec-opt native.cgroupdriver=cgroupfs \
      > "$d/dockerd.log" 2>&1 &
    local i
    for i in $(seq 1 240); do "$DOCKER_CLI" version >/dev/null 2>&1 && break; sleep 0.5; done
    "$DOCKER_CLI" version >/dev/null 2>&1 || { tail -20 "$d/dockerd.log"; echo "[guest] error: dockerd did not come up"; return 1; }
    bash "$HERE/test-image.sh"
    local tar
    for tar in "$run"/images/*.tar; do
      [ -f "$tar" ] && "$DOCKER_CLI" load -q -i "$tar"
    done
    echo "[guest] dockerd $("$DOCKER_CLI" version --format '{{.Server.Version}}') at $DOCKER_HOST (cgroup driver $("$DOCKER_CLI" info --format '{{.CgroupDriver}}'))"
  fi
  local rc=0
  eval "$(cat "$run/cmd")" || rc=$?
  if [ "$(cat "$run/dockerd")" = 1 ]; then
    local ids; ids=$("$DOCKER_CLI" ps -aq || true)
    [ -z "$ids" ] || "$DOCKER_CLI" rm -f $ids >/dev/null 2>&1 || true
  fi
  return $rc
}

case ${1:-} in
  build) build ;;
  run) shift; run "$@" ;;
  status) status ;;
  clean) clean ;;
  _inside) shift; inside "$@" ;;
  *) echo "usage: $0 build | run [--dockerd] [--image NAME]... [--timeout SECS] -- CMD [ARG...] | status | clean" >&2
     exit 2 ;;
esac
