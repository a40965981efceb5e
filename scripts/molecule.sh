#!/usr/bin/env bash
# Runs the Molecule scenarios of extensions/molecule (default, fleet, deploy, quiesce) against podman
# containers of the simulated GPU host image. Installs what it needs (podman, runc, debootstrap,
# gcc; the pinned .venv-molecule), gives podman its settings for these runs only
# (CONTAINERS_CONF=.build/containers.conf), and builds the image once, reusing it while it
# exists and its inputs are unchanged. Runs as root (podman and debootstrap need it).
# Usage: scripts/molecule.sh [SCENARIO...]     (default: default fleet deploy quiesce)
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/molecule.sh needs root (rootful podman, debootstrap)" >&2
  exit 1
fi

ensure_commands podman:podman runc:runc debootstrap:debootstrap gcc:gcc tar:tar
configure_podman
ensure_venv "$REPO/.venv-molecule" "$REPO/requirements/molecule.txt"
link_collection

say "simulated GPU host image"
start=$SECONDS
PYTHON="$REPO/.venv-molecule/bin/python" "$REPO/tests/containers/build-image.sh"
echo "image ready in $((SECONDS - start)) s"
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(default fleet deploy quiesce)
# The quiesce scenario's hosts boot systemd: an image of their own.
if [[ " ${scenarios[*]} " == *" quiesce "* ]]; then
  say "simulated GPU host image with systemd"
  start=$SECONDS
  PYTHON="$REPO/.venv-molecule/bin/python" "$REPO/tests/containers/build-image.sh" --systemd
  echo "image ready in $((SECONDS - start)) s"
fi

# Molecule finds the scenarios under extensions/molecule and the shared config.yml there when
# it runs from the collection root (where galaxy.yml is).
cd "$REPO"
if [ ! -t 1 ]; then
  export NO_COLOR=1 ANSIBLE_FORCE_COLOR=0
fi
for scenario in "${scenarios[@]}"; do
  say "molecule test -s $scenario"
  start=$SECONDS
  molecule test -s "$scenario"
  echo "scenario $scenario passed in $((SECONDS - start)) s"
done
