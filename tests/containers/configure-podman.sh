#!/usr/bin/env bash
# Configures podman for the test hosts: runc with cgroupfs (crun refuses the hybrid cgroup
# layout of these machines) and ulimits below the machine's hard limits (podman's defaults
# are above them, and every container would fail to start). A drop-in, so an existing
# /etc/containers/containers.conf is left as it is.
# Usage: tests/containers/configure-podman.sh   (as root)
set -euo pipefail

DROPIN=/etc/containers/containers.conf.d/50-gpuops-nvidia.conf

want=$(cat <<'CONF'
# Written by gpuops.nvidia tests/containers/configure-podman.sh
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
)

if [ "$(cat "$DROPIN" 2>/dev/null)" != "$want" ]; then
  echo "writing podman configuration $DROPIN (runc, cgroupfs, ulimits nofile/nproc 1024)"
  mkdir -p "$(dirname "$DROPIN")"
  printf '%s\n' "$want" >"$DROPIN"
fi

runtime=$(podman info --format '{{.Host.OCIRuntime.Name}}' 2>/dev/null || true)
if [ "$runtime" != "runc" ]; then
  echo "podman does not pick up $DROPIN (runtime: ${runtime:-unknown})" >&2
  exit 1
fi
