#!/usr/bin/env bash
# Runs every test: unit, gpusim, integration, ansible-doc, sanity, lint, changelog, the
# collection tarball, and the Molecule scenarios in podman containers (as root).
# Usage: scripts/test.sh [pytest arguments...]
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

ensure_commands fuser:psmisc ps:procps gcc:gcc git:git rsync:rsync shellcheck:shellcheck
ensure_venv "$REPO/.venv" "$REPO/requirements/test.txt"
link_collection
cd "$REPO"

say "pytest"
python -m pytest -p no:cacheprovider "$@" tests

say "ansible-doc"
for module in plugins/modules/*.py; do
  name=$(basename "$module" .py)
  ansible-doc "gpuops.nvidia.$name" >/dev/null
  echo "gpuops.nvidia.$name renders"
done
for filter in plugins/filter/*.py; do
  ansible-doc -t filter "gpuops.nvidia.$(basename "$filter" .py)" >/dev/null
  echo "filter gpuops.nvidia.$(basename "$filter" .py) renders"
done
ansible-doc -t role gpuops.nvidia.gpu_reset >/dev/null
echo "role gpuops.nvidia.gpu_reset renders"

say "ansible-test sanity"
# ansible-test wants the collection at .../ansible_collections/gpuops/nvidia, outside any git
# work tree that would hide untracked files, and runs in an environment of its own.
ensure_venv "$REPO/.venv-sanity" "$REPO/requirements/sanity.txt"
offline_get_pip
SANITY="${TMPDIR:-/tmp}/gpuops-nvidia-sanity/ansible_collections/gpuops/nvidia"
mkdir -p "$SANITY"
rsync -a --delete --delete-excluded --exclude=/.git --exclude=/.build --exclude='/.venv*' \
  --exclude=__pycache__ --exclude=/.pytest_cache --exclude=/.hypothesis --exclude=/tests/output \
  "$REPO/" "$SANITY/"
(cd "$SANITY" && "$REPO/.venv-sanity/bin/ansible-test" sanity --requirements --color no \
  --python "$("$REPO/.venv-sanity/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')")

say "ansible-lint (production profile)"
ansible-lint --profile production

say "antsibull-changelog lint"
antsibull-changelog lint

say "ansible-galaxy collection build and install"
rm -rf "$BUILD/dist" "$BUILD/installed"
ansible-galaxy collection build --output-path "$BUILD/dist" "$REPO" >/dev/null
ansible-galaxy collection install --collections-path "$BUILD/installed" "$BUILD/dist"/gpuops-nvidia-*.tar.gz >/dev/null
for module in plugins/modules/*.py; do
  ANSIBLE_COLLECTIONS_PATH="$BUILD/installed" ansible-doc "gpuops.nvidia.$(basename "$module" .py)" >/dev/null
done
if tar -tzf "$BUILD/dist"/gpuops-nvidia-*.tar.gz | grep -E '^(tests|scripts|benchmarks|requirements|\.venv)' ; then
  echo "development files leaked into the collection tarball" >&2
  exit 1
fi
echo "built $(basename "$BUILD/dist"/gpuops-nvidia-*.tar.gz); installs and documents every module"

say "Molecule scenarios in podman containers"
"$REPO/scripts/molecule.sh"

say "all checks passed"
