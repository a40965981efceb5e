# shellcheck shell=bash
# Shared set-up for scripts/demo.sh and scripts/test.sh: Debian packages, a pinned virtual
# environment, and the ansible_collections/gpuops/nvidia tree that Ansible imports from.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD="$REPO/.build"
COLLECTIONS="$BUILD/collections"

# The tools' own state stays in the checkout: Ansible's (its temporary files, the galaxy cache),
# and every cache that follows XDG (pip's, Molecule's, the real NVIDIA packages the tests fetch).
export ANSIBLE_HOME="$BUILD/ansible-home" XDG_CACHE_HOME="$BUILD/cache"

say() { printf '==> %s\n' "$*"; }

apt_install() {
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "please install these Debian packages first: $*" >&2
    return 1
  fi
  say "installing Debian packages: $*"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# ensure_commands CMD:PACKAGE...: install the packages whose command is missing.
ensure_commands() {
  local missing=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
  done
  [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
}

pick_python() {
  local candidate
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  echo "Python 3.11 or newer is required" >&2
  return 1
}

# ensure_venv DIR REQUIREMENTS [CONSTRAINTS]: create or reuse DIR, install the pinned
# requirements once, under CONSTRAINTS (default requirements/constraints.txt).
ensure_venv() {
  local venv=$1 requirements=$2 constraints=${3:-$REPO/requirements/constraints.txt} python stamp want
  python=$(pick_python) || return 1
  if [ ! -x "$venv/bin/python" ]; then
    say "creating virtual environment $venv"
    if ! "$python" -m venv "$venv" 2>/dev/null; then
      rm -rf "$venv"
      apt_install python3-venv || return 1
      "$python" -m venv "$venv" || return 1
    fi
  fi
  stamp="$venv/.requirements.sha256"
  want=$(cat "$requirements" "$constraints" | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "installing $(basename "$requirements") into $venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check \
      -r "$requirements" -c "$constraints" || return 1
    echo "$want" >"$stamp"
  fi
  export PATH="$venv/bin:$PATH"
}

# Make the repository importable as ansible_collections.gpuops.nvidia.
link_collection() {
  mkdir -p "$COLLECTIONS/ansible_collections/gpuops"
  ln -sfn "$REPO" "$COLLECTIONS/ansible_collections/gpuops/nvidia"
  export ANSIBLE_COLLECTIONS_PATH="$COLLECTIONS"
  export PYTHONPATH="$COLLECTIONS:$REPO/tests${PYTHONPATH:+:$PYTHONPATH}"
}

# ansible-test bootstraps pip in its sanity environments with a get-pip.py from its own
# download site; where that site is out of reach, put the offline stand-in in its cache
# (under HOME, the home ansible-test is given: see stage_sanity).
offline_get_pip() {
  local home=$1 version cache
  version=$("$REPO/.venv-sanity/bin/python" - <<'PY'
import os, re, ansible_test
source = os.path.join(os.path.dirname(ansible_test.__file__), '_internal', 'python_requirements.py')
print(re.search(r"pip='([0-9.]+)'", open(source).read()).group(1))
PY
)
  cache="$home/.ansible/test/cache/get_pip_${version//./_}.py"
  if [ ! -f "$cache" ]; then
    say "writing ansible-test's offline get-pip stand-in to $cache"
    mkdir -p "$(dirname "$cache")"
    cp "$REPO/tests/sanity/get_pip_offline.py" "$cache"
  fi
}

# Podman's settings for the test hosts, for this checkout's runs only: CONTAINERS_CONF names
# .build/containers.conf (podman then reads that file instead of the system's), nothing is
# written to /etc/containers. runc with cgroupfs (crun refuses the hybrid cgroup layout of
# these machines) and ulimits below the machine's hard limits (podman's defaults are above
# them, and every container would fail to start).
configure_podman() {
  local conf="$BUILD/containers.conf" old=/etc/containers/containers.conf.d/50-gpuops-nvidia.conf runtime
  mkdir -p "$BUILD"
  mkdir -p "$BUILD/podman-networks"
  # network_config_dir: netavark's network files and lock, otherwise in /etc/containers/networks.
  cat >"$conf" <<CONF
# Written by gpuops.nvidia scripts/lib.sh (configure_podman), used through CONTAINERS_CONF.
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"

[network]
network_config_dir = "$BUILD/podman-networks"
CONF
  export CONTAINERS_CONF="$conf"
  # The system-wide drop-in that earlier versions of this script wrote: theirs to remove.
  if head -n 1 "$old" 2>/dev/null | grep -q '^# Written by gpuops.nvidia'; then
    say "removing $old, written by an earlier version of these tests"
    rm -f "$old"
    rmdir --ignore-fail-on-non-empty "$(dirname "$old")"
  fi
  runtime=$(podman info --format '{{.Host.OCIRuntime.Name}}' 2>/dev/null || true)
  if [ "$runtime" != "runc" ]; then
    echo "podman does not pick up $conf (runtime: ${runtime:-unknown})" >&2
    return 1
  fi
}
