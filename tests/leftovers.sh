#!/usr/bin/env bash
# Runs a command (default: scripts/demo.sh, then scripts/test.sh) and checks that it left the
# machine as README says: git status as before, /dev as before (no device node left by NVIDIA's
# library), no file in /etc/containers that no Debian package owns, nothing new in the home
# directory itself, ~/.ansible or ~/.cache. Prints what changed and exits 1 when anything did.
# Usage: tests/leftovers.sh [COMMAND [ARGS...]]
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

git_status() { git status --porcelain; }

# Every node of /dev with its type and device numbers (the shared memory and terminals apart).
dev_nodes() {
  find /dev \( -path /dev/shm -o -path /dev/pts -o -path /dev/mqueue \) -prune -o -print0 |
    xargs -0 stat -c '%n %F %t:%T' | sort
}

# What in /etc/containers no Debian package owns (podman's own state included, such as the
# networks directory netavark makes), files with their content.
containers_conf() {
  local path
  [ -d /etc/containers ] || return 0
  find /etc/containers -mindepth 1 -print | sort | while read -r path; do
    dpkg -S "$path" >/dev/null 2>&1 && continue
    if [ -f "$path" ]; then echo "$path $(sha256sum <"$path" | cut -c1-16)"; else echo "$path"; fi
  done
}

# The home directory's own entries (a log file a tool drops there), ~/.ansible and ~/.cache.
home_state() {
  { find "$HOME" -mindepth 1 -maxdepth 1 -print; find "$HOME/.ansible" "$HOME/.cache" -mindepth 1 -print; } 2>/dev/null | sort
}

snapshot() {
  local dir=$1
  mkdir -p "$dir"
  git_status >"$dir/git-status"
  dev_nodes >"$dir/dev"
  containers_conf >"$dir/etc-containers"
  home_state >"$dir/home"
}

if [ $# -eq 0 ]; then
  set -- bash -c 'scripts/demo.sh && scripts/test.sh'
fi

snapshot "$work/before"
status=0
"$@" || status=$?
snapshot "$work/after"

left=0
for part in git-status dev etc-containers home; do
  added=$(comm -13 "$work/before/$part" "$work/after/$part")
  if [ -n "$added" ]; then
    left=1
    echo "left behind ($part):" >&2
    printf '  %s\n' "$added" >&2
  fi
done
[ "$status" -eq 0 ] || { echo "the command failed (exit $status)" >&2; exit "$status"; }
[ "$left" -eq 0 ] || exit 1
echo "nothing left behind in git status, /dev, /etc/containers, ~/.ansible or ~/.cache"
