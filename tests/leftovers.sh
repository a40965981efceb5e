#!/usr/bin/env bash
# Runs a command (default: scripts/demo.sh, then scripts/test.sh) and checks that it left the
# machine as README says: git status as before, /dev as before (no device node left by NVIDIA's
# library), no file in /etc/containers that no Debian package owns, nothing new in the home
# directory itself, ~/.ansible or ~/.cache, nothing new or changed in the machine's own state
# directories /run/gpuops and /var/lib/gpuops (simulated hosts keep theirs under their root), and nothing new in the
# temporary directory ${TMPDIR:-/tmp}. Prints what changed and exits 1 when anything did.
# Usage: tests/leftovers.sh [COMMAND [ARGS...]]
#   e.g. tests/leftovers.sh .venv/bin/python -m pytest -q tests/integration/test_release_module.py
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
TMP_DIR=$(cd "${TMPDIR:-/tmp}" && pwd -P)
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

# The home directory's own entries (a log file a tool drops there), ~/.ansible and ~/.cache
# (either may be missing: nothing in it, then).
home_state() {
  { find "$HOME" -mindepth 1 -maxdepth 1 -print; find "$HOME/.ansible" "$HOME/.cache" -mindepth 1 -print || true; } 2>/dev/null | sort
}

# The machine's own state directories of the collection (/run/gpuops, root's default state_dir
# and lock directory; /var/lib/gpuops, the GPUs' history), files with their content: a cure, a
# kernel-log cursor or a GPU's history a test wrote there hides or changes the next run's verdict.
run_state() {
  local path
  { find /run/gpuops /var/lib/gpuops -print 2>/dev/null || true; } | sort | while read -r path; do
    if [ -f "$path" ]; then echo "$path $(sha256sum <"$path" | cut -c1-16)"; else echo "$path"; fi
  done
}

# The temporary directory's own entries, shared by every checkout of one user. Not counted:
# pytest-of-<user>, pytest's own base directory, where pytest keeps the last few runs' tmp_path
# directories and removes older ones itself; gpuops-nvidia-sanity, the copy of the collection
# that scripts/test.sh sanity keeps there for ansible-test, as it says.
tmp_entries() {
  find "$TMP_DIR" -mindepth 1 -maxdepth 1 ! -name 'pytest-of-*' ! -name gpuops-nvidia-sanity -print | sort
}

snapshot() {
  local dir=$1
  mkdir -p "$dir"
  git_status >"$dir/git-status"
  dev_nodes >"$dir/dev"
  containers_conf >"$dir/etc-containers"
  home_state >"$dir/home"
  run_state >"$dir/run-gpuops"
  tmp_entries >"$dir/tmp"
}

if [ $# -eq 0 ]; then
  set -- bash -c 'scripts/demo.sh && scripts/test.sh'
fi

snapshot "$work/before"
status=0
"$@" || status=$?
snapshot "$work/after"

left=0
for part in git-status dev etc-containers home run-gpuops tmp; do
  # comm needs both sides in one order (git status is in git's own): bytewise, whatever the locale.
  added=$(LC_ALL=C comm -13 <(LC_ALL=C sort "$work/before/$part") <(LC_ALL=C sort "$work/after/$part"))
  if [ -n "$added" ]; then
    left=1
    echo "left behind ($part):" >&2
    printf '%s\n' "$added" | sed 's/^/  /' >&2
  fi
done
[ "$status" -eq 0 ] || { echo "the command failed (exit $status)" >&2; exit "$status"; }
[ "$left" -eq 0 ] || exit 1
echo "nothing left behind in git status, /dev, /etc/containers, ~/.ansible, ~/.cache, /run/gpuops, /var/lib/gpuops or $TMP_DIR"
