#!/usr/bin/env bash
# Runs a command the way this machine kind's CI runner runs the test command: as a child of a PID 1 that never
# made a session (session 0), so in the kernel's root scheduling group (/proc/self/autogroup reads empty) and the
# root cgroup of every hierarchy. A shell here (setsid'd, a session group of its own) cannot reach that state; a
# kernel usermode helper starts in it. This points kernel.core_pattern at a one-off helper, crashes one process to
# start it, and puts core_pattern back at once. The command runs in the background, detached.
#
#   scripts/diag/as-kernel-helper.sh OUTDIR 'cd /path && ./.ci/run'
#
# OUTDIR gets: autogroup.txt (the helper's group: empty = root), out.txt (stdout+stderr), rc (exit status, at the end).
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "as-kernel-helper: needs root (kernel.core_pattern)" >&2; exit 2; }
[ $# = 2 ] || { echo "usage: $0 OUTDIR COMMAND" >&2; exit 2; }
out=$(realpath -m "$1")
mkdir -p "$out"
rm -f "$out/rc" "$out/out.txt" "$out/autogroup.txt"
printf '%s\n' "$2" > "$out/command.sh"
helper="$out/helper.sh"
cat > "$helper" <<HELPER
#!/bin/sh
exec </dev/null >"$out/out.txt" 2>&1
cat /proc/self/autogroup > "$out/autogroup.txt"
export HOME=/root PATH="$PATH" CI="\${CI:-true}"
# A usermode helper gets the kernel's default limits; CI's runner inherits PID 1's open-files limit.
ulimit -n $(awk '/^Max open files/ {print $5}' /proc/1/limits) 2>/dev/null || true
sh "$out/command.sh"
echo "\$?" > "$out/rc"
HELPER
chmod +x "$helper"
old=$(cat /proc/sys/kernel/core_pattern)
restore() { printf '%s\n' "$old" > /proc/sys/kernel/core_pattern; }
trap restore EXIT
printf '|%s\n' "$helper" > /proc/sys/kernel/core_pattern
sh -c 'ulimit -c unlimited; kill -SEGV $$' 2>/dev/null || true
for _ in $(seq 50); do [ -e "$out/autogroup.txt" ] && break; sleep 0.1; done
restore
trap - EXIT
[ -e "$out/autogroup.txt" ] || { echo "as-kernel-helper: the helper did not start" >&2; exit 1; }
echo "as-kernel-helper: started; group: '$(cat "$out/autogroup.txt")' (empty: the root group); output in $out/out.txt, exit status in $out/rc"
