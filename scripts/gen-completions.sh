#!/usr/bin/env bash
# Writes the shell completions and man pages of a built ddiskqos-agent under OUTDIR as a package installs them
# (OUTDIR is a DESTDIR; the Debian packaging step calls this):
#   OUTDIR/usr/share/bash-completion/completions/ddiskqos-agent
#   OUTDIR/usr/share/zsh/vendor-completions/_ddiskqos-agent
#   OUTDIR/usr/share/fish/vendor_completions.d/ddiskqos-agent.fish
#   OUTDIR/usr/share/man/man1/ddiskqos-agent.1.gz and one page per subcommand (ddiskqos-agent-status.1.gz, ...),
#     compressed as Debian ships them (gzip -9n: no name, no time stamp, so the same binary gives the same bytes)
# Usage: scripts/gen-completions.sh OUTDIR [AGENT]   AGENT: the built binary, else $DDISKQOS_AGENT.
# Needs no root, no config and no running agent.
set -euo pipefail
usage() { echo "usage: $0 OUTDIR [AGENT] (or DDISKQOS_AGENT=path/to/ddiskqos-agent $0 OUTDIR)" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
out=$1
agent=${2:-${DDISKQOS_AGENT:-}}
[ -n "$agent" ] || usage
[ -x "$agent" ] || { echo "$0: $agent is not an executable (build it: cargo build --profile ship -p qos-agent)" >&2; exit 1; }
umask 022

bash_dir=$out/usr/share/bash-completion/completions
zsh_dir=$out/usr/share/zsh/vendor-completions
fish_dir=$out/usr/share/fish/vendor_completions.d
man_dir=$out/usr/share/man/man1
mkdir -p "$bash_dir" "$zsh_dir" "$fish_dir" "$man_dir"

"$agent" completions bash >"$bash_dir/ddiskqos-agent"
"$agent" completions zsh >"$zsh_dir/_ddiskqos-agent"
"$agent" completions fish >"$fish_dir/ddiskqos-agent.fish"

# Pages from an earlier run (a subcommand since removed) would be shipped as well: start from none.
rm -f "$man_dir"/ddiskqos-agent.1.gz "$man_dir"/ddiskqos-agent-*.1.gz
"$agent" man --dir "$man_dir" >/dev/null
gzip -9nf "$man_dir"/ddiskqos-agent.1 "$man_dir"/ddiskqos-agent-*.1
