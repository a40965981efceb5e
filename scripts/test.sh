#!/usr/bin/env bash
# Runs every test: unit, gpusim, integration, ansible-doc, sanity, lint, changelog.
# Usage: scripts/test.sh [pytest arguments...]
set -euo pipefail
. "$(dirname "$0")/lib.sh"

ensure_commands fuser:psmisc ps:procps gcc:gcc git:git rsync:rsync
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

say "ansible-test sanity"
SANITY="$BUILD/sanity/ansible_collections/gpuops/nvidia"
mkdir -p "$SANITY"
rsync -a --delete --exclude=/.git --exclude=/.build --exclude=/.venv --exclude=/.venv-* --exclude=__pycache__ \
  --exclude=/.pytest_cache --exclude=/.hypothesis --exclude=/tests/output "$REPO/" "$SANITY/"
(cd "$SANITY" && ansible-test sanity --python "$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
  --venv --color no --exclude tests/gpusim/)

say "ansible-lint (production profile)"
ansible-lint --profile production

say "antsibull-changelog lint"
antsibull-changelog lint

say "all checks passed"
