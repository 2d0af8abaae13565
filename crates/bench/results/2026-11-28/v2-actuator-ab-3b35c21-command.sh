# Session 22: does the systemd path cost the agent its 1 MiB reads against static best on v2? One guest boot, protect
# mode, the agent's actuator `files` (cgroup files only) then `auto` (shipped: units through systemd), static best
# beside both. Run in the Debian 13 guest at b73e0cd's release build, from the host as:
#   DDISKQOS_GUEST_SUITE=trixie DDISKQOS_GUEST_DISK_MODEL=ssd DDISKQOS_GUEST_DISK_SIZE=4G bash scripts/guest.sh run --timeout 3600 -- bash <this file> <out dir>
# Ran in session 23 (2026-11-28 01:43-01:55 UTC) with the release build of 3b35c21 (the bench and agent code are
# b73e0cd's but for d231e99's refactor of the bench's read-back), out dir ab-out: v2-actuator-ab-3b35c21-*.
set -u
NOTE="Debian 13 trixie"
A="--sizes 1 --reps 8 --exp2-reps 0 --static-best"
bash scripts/bench-v2.sh _inside "$1/files" protect none "$NOTE" 0 $A --agent-actuator files
bash scripts/bench-v2.sh _inside "$1/auto" protect none "$NOTE" 0 $A --agent-actuator auto
