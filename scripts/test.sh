#!/usr/bin/env bash
# The test command. Stages, in the order `all` runs them:
#   unit         pytest tests/unit tests/gpusim
#   integration  pytest tests/integration tests/device tests/slurm
#   sanity       ansible-test sanity
#   lint         ansible-doc, ansible-lint (production profile), antsibull-changelog lint, the
#                collection tarball (build, install, no development files), galaxy-importer
#                (Galaxy's import checks) on the tarball, antsibull-docs lint-collection-docs
#   molecule     the Molecule scenarios in podman containers (as root)
# Usage: scripts/test.sh [unit|integration|sanity|lint|molecule|all] [pytest arguments...]
#        (default all; the pytest arguments go to the unit and integration stages)
# Before anything else it says what it will install or change (see plan below); everything
# else it writes stays in this checkout (.venv*, .build: the tools' caches, the collection
# link, ansible-test's home), and nothing is left in /dev, /etc/containers, ~/.ansible or
# ~/.cache (tests/leftovers.sh checks that).
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

usage() { sed -n '2,15s/^# \{0,1\}//p' "$0"; }

# What the stage will install or change outside this checkout, said before it does.
plan() {
  local stage=$1
  say "scripts/test.sh $stage: what it installs or changes outside this checkout"
  echo "  - Debian packages, when missing: procps psmisc gcc git rsync shellcheck"
  if [ "$stage" = integration ] || [ "$stage" = all ]; then
    echo "  - for tests/slurm, when missing (as root): Debian's munge slurmctld slurmd slurm-client;"
    echo "    their installation creates /etc/munge/munge.key, /etc/slurm and the users munge and slurm."
    echo "    The tests' own cluster runs from a temporary directory and is stopped at the end."
    echo "  - NVIDIA's nvidia-smi and libnvidia-ml1 packages (Debian non-free) are downloaded with a"
    echo "    private apt configuration and unpacked under .build/cache, never installed; as root they"
    echo "    run in a private mount namespace with a /dev of their own."
  fi
  if [ "$stage" = sanity ] || [ "$stage" = all ]; then
    echo "  - ansible-test runs on a copy of the collection in ${TMPDIR:-/tmp}/gpuops-nvidia-sanity (it"
    echo "    needs one outside a git work tree), kept and refreshed by the next run."
  fi
  if [ "$stage" = molecule ] || [ "$stage" = all ]; then
    echo "  - for Molecule (as root), when missing: Debian's podman runc debootstrap gcc tar, and the"
    echo "    podman images localhost/gpuops-nvidia-base and localhost/gpuops-nvidia-gpuhost, and their"
    echo "    systemd variants (-systemd, for the quiesce scenario; kept for the next run); podman's"
    echo "    settings come from .build/containers.conf (CONTAINERS_CONF),"
    echo "    its network files go to .build/podman-networks."
  fi
}

# tests/slurm runs a real Slurm node: its packages, installed here (said in plan), not from a test.
ensure_slurm() {
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "tests/slurm needs root and apt-get to install Slurm; its tests are skipped, saying why"
    return 0
  fi
  ensure_commands munged:munge mungekey:munge slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client
}

stage=all
if [ $# -gt 0 ]; then
  case $1 in
    unit|integration|sanity|lint|molecule|all) stage=$1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown stage: $1" >&2; usage >&2; exit 2 ;;
  esac
fi

plan "$stage"
ensure_commands fuser:psmisc ps:procps gcc:gcc git:git rsync:rsync shellcheck:shellcheck
ensure_venv "$REPO/.venv" "$REPO/requirements/test.txt"
link_collection
cd "$REPO"

stage_unit() {
  say "pytest: unit and simulator tests"
  python -m pytest -p no:cacheprovider "$@" tests/unit tests/gpusim
}

stage_integration() {
  ensure_slurm
  say "pytest: integration, device-check and Slurm hook tests"
  python -m pytest -p no:cacheprovider "$@" tests/integration tests/device tests/slurm
}

stage_sanity() {
  say "ansible-test sanity"
  # ansible-test wants the collection at .../ansible_collections/gpuops/nvidia, outside any git
  # work tree that would hide untracked files, and runs in an environment of its own.
  ensure_venv "$REPO/.venv-sanity" "$REPO/requirements/sanity.txt"
  # ansible-test keeps its environments and caches under ~/.ansible/test: a home of its own here.
  local home="$BUILD/ansible-test-home"
  mkdir -p "$home"
  offline_get_pip "$home"
  local sanity="${TMPDIR:-/tmp}/gpuops-nvidia-sanity/ansible_collections/gpuops/nvidia"
  mkdir -p "$sanity"
  rsync -a --delete --delete-excluded --exclude=/.git --exclude=/.build --exclude='/.venv*' \
    --exclude=__pycache__ --exclude=/.pytest_cache --exclude=/.hypothesis --exclude=/tests/output \
    --exclude=/.ansible "$REPO/" "$sanity/"
  (cd "$sanity" && HOME="$home" "$REPO/.venv-sanity/bin/ansible-test" sanity --requirements --color no \
    --python "$("$REPO/.venv-sanity/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')")
}

stage_lint() (
  mkdir -p "$ANSIBLE_HOME"

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
  for role in roles/*/; do
    name=$(basename "$role")
    ansible-doc -t role "gpuops.nvidia.$name" >/dev/null
    echo "role gpuops.nvidia.$name renders"
  done

  say "ansible-lint (production profile)"
  # --offline: lint this checkout as ANSIBLE_COLLECTIONS_PATH (.build/collections) has it, rather
  # than building and installing a copy of the collection into the Ansible home.
  ansible-lint --offline --project-dir "$REPO" --profile production

  say "antsibull-changelog lint"
  antsibull-changelog lint

  say "ansible-galaxy collection build and install"
  rm -rf "$BUILD/dist" "$BUILD/installed"
  ansible-galaxy collection build --output-path "$BUILD/dist" "$REPO" >/dev/null
  local tarball
  tarball=$(echo "$BUILD/dist"/gpuops-nvidia-*.tar.gz)
  ansible-galaxy collection install --collections-path "$BUILD/installed" "$tarball" >/dev/null
  for module in plugins/modules/*.py; do
    ANSIBLE_COLLECTIONS_PATH="$BUILD/installed" ansible-doc "gpuops.nvidia.$(basename "$module" .py)" >/dev/null
  done
  if tar -tzf "$tarball" | grep -E '^(tests|scripts|benchmarks|requirements|\.venv)' ; then
    echo "development files leaked into the collection tarball" >&2
    exit 1
  fi
  echo "built $(basename "$tarball"); installs and documents every module"

  # galaxy-importer needs an older attrs than constraints.txt: requirements/docs.txt pins its
  # whole tree and is its own constraints file.
  ensure_venv "$REPO/.venv-docs" "$REPO/requirements/docs.txt" "$REPO/requirements/docs.txt"

  say "galaxy-importer (Galaxy's import checks) on $(basename "$tarball")"
  local importer="$BUILD/importer"
  rm -rf "$importer"
  mkdir -p "$importer/tmp" "$importer/ansible-tmp"
  # It prints every finding (flake8, ansible-doc, ansible-lint, metadata) as a WARNING or
  # ERROR line and still exits 0; any such line fails the stage.
  (cd "$importer" && GALAXY_IMPORTER_CONFIG="$REPO/tests/galaxy-importer.cfg" \
    GALAXY_IMPORTER_TMP_ROOT_DIR="$importer/tmp" GALAXY_IMPORTER_ANSIBLE_LOCAL_TMP="$importer/ansible-tmp" \
    python -m galaxy_importer.main "$tarball" >"$importer/output.txt" 2>&1) || {
      cat "$importer/output.txt"; echo "galaxy-importer failed" >&2; exit 1; }
  if grep -E '^(WARNING|ERROR|CRITICAL|Traceback)' "$importer/output.txt" >&2; then
    echo "galaxy-importer reported the findings above (full output: $importer/output.txt)" >&2
    exit 1
  fi
  grep -q '^Importer processing completed successfully' "$importer/output.txt" || {
    cat "$importer/output.txt"; echo "galaxy-importer did not complete" >&2; exit 1; }
  echo "galaxy-importer: no warnings, no errors"

  say "antsibull-docs lint-collection-docs --plugin-docs"
  # antsibull's default logging writes ~/antsibull.log: a home of its own here.
  mkdir -p "$BUILD/antsibull-home"
  HOME="$BUILD/antsibull-home" antsibull-docs lint-collection-docs --plugin-docs "$COLLECTIONS/ansible_collections/gpuops/nvidia"
  echo "antsibull-docs: no findings"
)

stage_molecule() {
  say "Molecule scenarios in podman containers"
  "$REPO/scripts/molecule.sh"
}

case $stage in
  unit) stage_unit "$@" ;;
  integration) stage_integration "$@" ;;
  sanity) stage_sanity ;;
  lint) stage_lint ;;
  molecule) stage_molecule ;;
  all)
    stage_unit "$@"
    stage_integration "$@"
    stage_sanity
    stage_lint
    stage_molecule
    ;;
esac

say "$stage: all checks passed"
