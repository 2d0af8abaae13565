# Session 23: does writing a settled container's weight through systemd at the end of its entry window (this
# commit) instead of at the round after Docker's start event (3b35c21) give back what the systemd path cost the
# agent's 1 MiB reads against static best on v2 (session 22's lead; session 23's first A/B: files 1.20 / 1.07 of
# static best by median / means, auto 1.57 / 1.96)? One guest boot, protect mode, static best beside every arm:
# the new agent with `auto`, the old bench binary (3b35c21, copied to $1/ddiskqos-bench-3b35c21) with `auto`, the
# new agent with `files`; then the shipped agent's io.cost protection (`iocost-protect`) on the v2 plan.
# NOTE: the old arm did not run ("no Docker daemon answers": the _inside arm before it stops docker.service at its
# end), and was not run again: this boot's `files` arm (1.38 / 1.48 of static best, one STARVED read) was no better
# than its `auto` arm (0.84 / 1.14) nor than the first boot's `auto` (1.57 / 1.96): in this mode under emulation the
# reads' noise (Alone 11-156 ms) is larger than the effect looked for. Run from the host, with the release build of this commit in the checkout and the old binary in the out dir, as:
#   DDISKQOS_GUEST_SUITE=trixie DDISKQOS_GUEST_DISK_MODEL=ssd DDISKQOS_GUEST_DISK_SIZE=4G bash scripts/guest.sh run --timeout 3600 -- bash <this file> <out dir>
set -u
NOTE="Debian 13 trixie"
A="--sizes 1 --reps 8 --exp2-reps 0 --static-best"
bash scripts/bench-v2.sh _inside "$1/new-auto" protect none "$NOTE" 0 $A --agent-actuator auto
# The old binary, as _inside runs the bench (docker.service is up from the arm above).
versions="Debian $(cat /etc/debian_version), kernel $(uname -r), systemd $(systemctl --version | awk 'NR == 1 { print $2 }'), Docker $(docker version --format '{{.Server.Version}}')"
"$1/ddiskqos-bench-3b35c21" run --runtime docker --device /dev/vdb --format --modes protect --out "$1/old-auto/protect" \
  --note "TEST BED: the systemd guest (scripts/guest.sh, $NOTE: $versions) under qemu's SOFTWARE EMULATION (TCG, 2 vCPUs), on a virtio disk THROTTLED by qemu (qemu throttling.bps-total=157286400 (150 MiB/s), throttling.iops-total=1500); Docker's systemd cgroup driver (system.slice/docker-<id>.scope, weights through systemd). Ratios within this run only; figures are not comparable with the host's. OLD BENCH BINARY 3b35c21 (settled rewrite at the next round)" \
  $A --agent-actuator auto
bash scripts/bench-v2.sh _inside "$1/new-files" protect none "$NOTE" 0 $A --agent-actuator files
bash scripts/bench-v2.sh _inside "$1" iocost-protect none "$NOTE" 1
