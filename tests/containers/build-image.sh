#!/usr/bin/env bash
# Builds the simulated GPU host image used by the Molecule scenarios and the fleet benchmark,
# or reuses it while it exists and its inputs have not changed.
#
#   localhost/gpuops-nvidia-base:CODENAME-HASH  debootstrap minbase + BASE_PACKAGES (HASH: of
#                                           that list, so a changed list builds a new base)
#   localhost/gpuops-nvidia-gpuhost:latest  + gpusim at the real paths: the package, the
#                                           simulated libnvidia-ml.so.1, nvidia-ml-py, and a
#                                           command that creates /dev/nvidia* and nvidia-smi
#   with --systemd: localhost/gpuops-nvidia-gpuhost-systemd:latest, the same host over a base
#                   with Debian's systemd, which boots as PID 1 (podman run --systemd=always)
#                   and creates the simulated GPUs in a unit of its own (gpuhost-init.service)
#
# Usage: tests/containers/build-image.sh [--force] [--systemd]   (as root; podman and debootstrap installed)
# Environment: PYTHON, a Python with pip for fetching nvidia-ml-py (default: the test venvs).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
IMAGE=localhost/gpuops-nvidia-gpuhost:latest
CONTAINERFILE=Containerfile
FORCE=0
SYSTEMD=0
for arg in "$@"; do
  case $arg in
    --force) FORCE=1 ;;
    --systemd) SYSTEMD=1 ;;
    *) echo "usage: $0 [--force] [--systemd]" >&2; exit 2 ;;
  esac
done

say() { printf '==> %s\n' "$*"; }

codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
# openssh-server: the fleet benchmark reaches the hosts over SSH, as a real fleet is reached.
BASE_PACKAGES=python3,psmisc,procps,openssh-server
if [ "$SYSTEMD" -eq 1 ]; then
  BASE_PACKAGES=$BASE_PACKAGES,systemd
  IMAGE=localhost/gpuops-nvidia-gpuhost-systemd:latest
  CONTAINERFILE=Containerfile.systemd
fi
BASE=localhost/gpuops-nvidia-base:$codename-$(echo "$BASE_PACKAGES" | sha256sum | cut -c1-8)

# The Debian mirror this machine's apt already uses, for the suite of this release.
debian_mirror() {
  python3 - "$codename" /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list \
    /etc/apt/sources.list <<'PY'
import os, sys
codename, paths = sys.argv[1], [p for p in sys.argv[2:] if os.path.isfile(p)]
for path in paths:
    text = open(path, encoding="utf-8", errors="replace").read()
    if path.endswith(".sources"):
        for stanza in text.split("\n\n"):
            fields = {}
            for line in stanza.splitlines():
                if line.strip().startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                key, value = line.split(":", 1)
                fields[key.strip().lower()] = value.split()
            if (fields.get("enabled", ["yes"])[0] != "no" and "deb" in fields.get("types", [])
                    and codename in fields.get("suites", []) and fields.get("uris")):
                print(fields["uris"][0]); sys.exit(0)
    else:
        for line in text.splitlines():
            words = line.split("#", 1)[0].split()
            if words[:1] != ["deb"]:
                continue
            words = words[1:]
            if words and words[0].startswith("["):
                while words and not words[0].endswith("]"):
                    words.pop(0)
                words = words[1:]
            if len(words) >= 2 and words[1] == codename:
                print(words[0]); sys.exit(0)
sys.exit("no Debian mirror for %s in /etc/apt/sources.list(.d)" % codename)
PY
}

image_exists() { podman image exists "$1"; }

build_base() {
  local mirror rootfs
  mirror=$(debian_mirror)
  rootfs=$(mktemp -d "${TMPDIR:-/tmp}/gpuops-rootfs.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$rootfs'" RETURN
  say "debootstrap $codename (minbase + $BASE_PACKAGES) from $mirror"
  debootstrap --variant=minbase --include="$BASE_PACKAGES" "$codename" "$rootfs" "$mirror" \
    >"$rootfs.log" 2>&1 || { tail -20 "$rootfs.log" >&2; rm -f "$rootfs.log"; return 1; }
  rm -f "$rootfs.log"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  say "importing $BASE"
  tar -C "$rootfs" -c . | podman import -q - "$BASE" >/dev/null
}

pick_pip_python() {
  local candidate
  for candidate in "${PYTHON:-}" "$REPO/.venv-molecule/bin/python" "$REPO/.venv/bin/python" python3; do
    [ -n "$candidate" ] || continue
    if "$candidate" -m pip --version >/dev/null 2>&1; then echo "$candidate"; return 0; fi
  done
  echo "no Python with pip found for nvidia-ml-py (set PYTHON)" >&2
  return 1
}

# Everything that goes into the image, staged in one directory.
stage_context() {
  local context=$1 python lib
  mkdir -p "$context/dist-packages"
  (cd "$REPO/tests" && tar -c --exclude=__pycache__ --exclude='*.pyc' --exclude=gpusim/tests gpusim) |
    tar -C "$context/dist-packages" -x
  python=$(pick_pip_python)
  "$python" -m pip install -q --disable-pip-version-check --no-deps --no-compile \
    --target "$context/dist-packages" -c "$REPO/requirements/constraints.txt" nvidia-ml-py
  lib=$(cd "$REPO/tests" && python3 -m gpusim.nvml_build)
  cp "$lib" "$context/libnvidia-ml.so.1"
  cp "$HERE/$CONTAINERFILE" "$HERE/gpuhost-start" "$HERE/gpuhost-init.service" "$context/"
}

# A digest of the inputs; the image carries it as a label and is rebuilt when it changes.
inputs_digest() {
  (cd "$REPO" && find tests/gpusim tests/containers -type f \
      ! -path '*/__pycache__/*' ! -path 'tests/gpusim/tests/*' -print0 | sort -z |
    xargs -0 sha256sum; grep -i '^nvidia-ml-py==' requirements/constraints.txt; echo "$BASE") |
    sha256sum | cut -c1-16
}

main() {
  local digest current context
  digest=$(inputs_digest)
  if [ "$FORCE" -eq 0 ] && image_exists "$IMAGE"; then
    current=$(podman image inspect --format '{{index .Labels "gpuops.inputs"}}' "$IMAGE" 2>/dev/null || true)
    if [ "$current" = "$digest" ]; then
      say "reusing $IMAGE ($digest)"
      return 0
    fi
  fi
  if [ "$FORCE" -eq 1 ] || ! image_exists "$BASE"; then
    build_base
  fi
  context=$(mktemp -d "${TMPDIR:-/tmp}/gpuops-image.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$context'" EXIT
  stage_context "$context"
  say "building $IMAGE ($digest)"
  podman build -q --pull=never --build-arg "BASE=$BASE" --label "gpuops.inputs=$digest" \
    -t "$IMAGE" -f "$context/$CONTAINERFILE" "$context" >/dev/null
  podman image prune -f >/dev/null 2>&1 || true
}

main
