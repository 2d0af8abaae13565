# Run in the Debian 13 guest at 112399d (2026-11-27 02:21-02:48 UTC), from the host as:
#   DDISKQOS_GUEST_SUITE=trixie DDISKQOS_GUEST_DISK_MODEL=ssd DDISKQOS_GUEST_DISK_SIZE=4G bash scripts/guest.sh run --timeout 3600 -- bash <this file> <out dir>
set -u
NOTE="Debian 13 trixie"
A="--sizes 1,10 --reps 5 --exp2-reps 2"
bash scripts/bench-v2.sh _inside "$1/files" protect none "$NOTE" $A --agent-actuator files
bash scripts/bench-v2.sh _inside "$1/auto" protect none "$NOTE" $A --agent-actuator auto
