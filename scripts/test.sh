#!/usr/bin/env bash
# The test command. Stages, in the order `all` runs them:
#   unit         pytest tests/unit tests/gpusim
#   integration  pytest tests/integration tests/device tests/slurm
#   sanity       ansible-test sanity
#   lint         ansible-doc, ansible-lint (production profile), antsibull-changelog lint, the
#                collection tarball (build, install, no development files), galaxy-importer
#                (Galaxy's import checks) on the tarball, antsibull-docs lint-collection-docs
#   molecule     the Molecule scenarios in podman containers (as root)
# and, run on request only:
#   stress       stress [STAGE] [pytest arguments...]: STAGE (default all) while stress-ng --cpu N
#                (N: the machine's cores) keeps every core busy beside it, stopped however the
#                stage ends: the suite shown to pass on a loaded machine
# Usage: scripts/test.sh [unit|integration|sanity|lint|molecule|all|stress [STAGE]] [--fail-fast]
#                       [pytest arguments...]
#        (default all; the pytest arguments go to the unit and integration stages: a file, a
#        directory or a node id among them, from the repository root, runs only that, in place of
#        the stage's own directories; `all` takes options only)
# Every stage runs, also after one failed (--fail-fast: none after the first that fails); the
# last lines name each stage's result (passed, failed, not run) and time, and the command exits
# non-zero when a stage failed.
# pytest runs in parallel (pytest-xdist): GPUOPS_TEST_WORKERS workers, one a core by default (0:
# none, as does -p no:xdist); the tests marked alone run after the others, one at a time.
# Before anything else it says what it will install or change (scripts/test.sh --help prints
# it); everything else it writes stays in this checkout (.venv*, .build: the tools' caches, the
# collection link, ansible-test's home), and nothing is left in /dev, /etc/containers, ~/.ansible
# or ~/.cache (tests/leftovers.sh checks that).
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

usage() { sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "$0"; }

# What the stage will install or change outside this checkout, said before it does (help: what
# any stage may).
plan() {
  local stage=$1 all='' help=''
  case $stage in all | help) all=1 ;; esac
  [ "$stage" = help ] && help=1
  if [ "$stage" = help ]; then
    echo "What scripts/test.sh installs or changes outside this checkout:"
  else
    say "scripts/test.sh $stage: what it installs or changes outside this checkout"
  fi
  echo "  - Debian packages, when missing: procps psmisc gcc git rsync shellcheck"
  if [ "$stage" = help ] || [ -n "$stress" ]; then
    echo "  - for stress${help:+ (any stage)}, when missing (as root): Debian's stress-ng; it runs beside the"
    echo "    stage and is stopped when the stage ends, however it ends."
  fi
  if [ "$stage" = integration ] || [ -n "$all" ]; then
    echo "  - for tests/slurm${all:+ (integration)}, when missing (as root): Debian's munge slurmctld slurmd slurm-client;"
    echo "    their installation creates /etc/munge/munge.key, /etc/slurm and the users munge and slurm."
    echo "    The tests' own cluster runs from a temporary directory and is stopped at the end."
    echo "  - NVIDIA's nvidia-smi and libnvidia-ml1 packages (Debian non-free) are downloaded with a"
    echo "    private apt configuration and unpacked under .build/cache, never installed; as root they"
    echo "    run in a private mount namespace with a /dev of their own."
    echo "  - for tests/integration/test_monitoring.py${all:+ (integration)}, when missing (as root): Debian's prometheus"
    echo "    (promtool) and prometheus-node-exporter; on a host that runs systemd, Debian's packages enable"
    echo "    and start prometheus.service and prometheus-node-exporter.service (ports 9090 and 9100)."
  fi
  if [ "$stage" = sanity ] || [ -n "$all" ]; then
    echo "  - ansible-test${all:+ (sanity)} runs on a copy of the collection in ${TMPDIR:-/tmp}/gpuops-nvidia-sanity (it"
    echo "    needs one outside a git work tree), kept and refreshed by the next run."
  fi
  if [ "$stage" = molecule ] || [ -n "$all" ]; then
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

# tests/integration/test_monitoring.py runs promtool and node_exporter: Debian's, installed here.
ensure_monitoring() {
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "tests/integration/test_monitoring.py needs Debian's prometheus and prometheus-node-exporter (as root)"
    return 0
  fi
  ensure_commands promtool:prometheus prometheus-node-exporter:prometheus-node-exporter
}

is_stage() { case $1 in unit | integration | sanity | lint | molecule | all) return 0 ;; esac; return 1; }

# --fail-fast, anywhere among the arguments (pytest has no option of that name): stop at the first
# stage that fails; by default every stage runs.
fail_fast='' kept=()
for arg in "$@"; do
  if [ "$arg" = --fail-fast ]; then fail_fast=1; else kept+=("$arg"); fi
done
set -- ${kept[@]+"${kept[@]}"}

stage=all stress=''
if [ $# -gt 0 ]; then
  case $1 in
    -h | --help) usage; echo; plan help; exit 0 ;;
    stress)
      stress=1; shift
      if [ $# -gt 0 ] && is_stage "$1"; then stage=$1; shift; fi
      ;;
    *)
      if is_stage "$1"; then stage=$1; shift; else echo "unknown stage: $1" >&2; usage >&2; exit 2; fi
      ;;
  esac
fi

# Whether the pytest arguments name what to run: a file, a directory or a node id
# (tests/unit/test_x.py::test_y) that exists, not the value of an option (-k EXPR).
names_tests() {
  local arg skip=''
  for arg in "$@"; do
    if [ -n "$skip" ]; then skip=; continue; fi
    case $arg in
      -k | -m | -p | -c | -o | -W | -n | --deselect | --ignore | --ignore-glob | --basetemp | --rootdir | \
        --confcutdir | --junitxml | --junit-xml | --durations | --maxfail | --tb | --dist) skip=1 ;;
      -*) ;;
      *) [ -e "${arg%%::*}" ] && return 0 ;;
    esac
  done
  return 1
}

cd "$REPO"
if [ "$stage" = all ] && names_tests "$@"; then
  echo "all runs every stage: name a file or a test with the unit or integration stage" >&2
  exit 2
fi

plan "$stage"
ensure_commands fuser:psmisc ps:procps gcc:gcc git:git rsync:rsync shellcheck:shellcheck
[ -z "$stress" ] || ensure_commands stress-ng:stress-ng
ensure_venv "$REPO/.venv" "$REPO/requirements/test.txt"
link_collection

# pytest-xdist's workers: GPUOPS_TEST_WORKERS (a number, or 0 for none: every test in pytest's
# own process), by default one a core: the tests that wait on processes, grace periods and daemons
# overlap, and those that bound a release's time are not starved of the CPU.
test_workers() {
  local workers=${GPUOPS_TEST_WORKERS:-$(nproc)}
  case $workers in
    '' | *[!0-9]*) echo "GPUOPS_TEST_WORKERS must be a number of workers (0: none), not '$workers'" >&2; return 2 ;;
  esac
  echo "$workers"
}

# Whether the pytest arguments turn pytest-xdist off (-p no:xdist): no -n for pytest then.
xdist_off() {
  local arg previous=''
  for arg in "$@"; do
    case $previous$arg in -pno:xdist | -p=no:xdist) return 0 ;; esac
    previous=''
    [ "$arg" != -p ] || previous=-p
  done
  return 1
}

# pytest with the arguments given, over the stage's own directories unless they name what to run,
# in two runs: every test but those marked alone, on test_workers workers (--dist loadgroup: the
# tests of one xdist_group on one worker, in turn; see tests/conftest.py), then those marked
# alone, one at a time with nothing beside them. The arguments go to both (-n N among them
# overrides the workers of the first; -p no:xdist, none). Fails when either run failed; nothing
# to run in one of them is no failure.
run_pytest() {
  local count=$1
  shift
  local own=("${@:1:count}")
  shift "$count"
  local targets=() parallel=() serial=() workers rc=0 rc_alone=0
  names_tests "$@" || targets=("${own[@]}")
  workers=$(test_workers) || return 2
  if ! xdist_off "$@"; then
    serial=(-n 0)
    [ "$workers" -eq 0 ] || parallel=(-n "$workers" --dist loadgroup)
  fi
  python -m pytest -p no:cacheprovider ${parallel[@]+"${parallel[@]}"} --alone=skip "$@" \
    ${targets[@]+"${targets[@]}"} || rc=$?
  # 2, 3, 4: interrupted, pytest's own error, a usage error: the second run would fare no better.
  case $rc in 0 | 1 | 5) ;; *) return "$rc" ;; esac
  say "pytest: the tests marked alone, one at a time"
  python -m pytest -p no:cacheprovider --alone=only "$@" ${targets[@]+"${targets[@]}"} \
    ${serial[@]+"${serial[@]}"} || rc_alone=$?
  # 5: no test was collected (or every one deselected) in that run.
  if [ "$rc" -eq 5 ] && [ "$rc_alone" -eq 5 ]; then return 5; fi
  [ "$rc" -eq 5 ] && rc=0
  [ "$rc_alone" -eq 5 ] && rc_alone=0
  [ "$rc" -ne 0 ] && return "$rc"
  return "$rc_alone"
}

stage_unit() {
  say "pytest: unit and simulator tests"
  run_pytest 2 tests/unit tests/gpusim "$@"
}

stage_integration() {
  ensure_slurm
  ensure_monitoring
  say "pytest: integration, device-check and Slurm hook tests"
  run_pytest 3 tests/integration tests/device tests/slurm "$@"
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
  # rstcheck (antsibull-docs' RST check) leaves each shell code block it checks behind as a
  # tmp*.bash file in the temporary directory: the stage's own one, removed however it ends.
  mkdir -p "$BUILD"
  TMPDIR=$(mktemp -d "$BUILD/lint-tmp.XXXXXX")
  export TMPDIR
  trap 'rm -rf "$TMPDIR"' EXIT

  say "ansible-doc"
  for module in plugins/modules/*.py; do
    name=$(basename "$module" .py)
    ansible-doc "gpuops.nvidia.$name" >/dev/null
    echo "gpuops.nvidia.$name renders"
  done
  for filter in plugins/filter/*.py; do
    grep -q '^DOCUMENTATION' "$filter" || continue
    name=$(basename "$filter" .py)
    ansible-doc -t filter "gpuops.nvidia.$name" >/dev/null
    echo "filter gpuops.nvidia.$name renders"
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

  say "antsibull-docs lint-collection-docs --plugin-docs --check-extra-docs-refs"
  # The plugins' and roles' documentation, and the guides of docs/docsite (extra-docs.yml,
  # links.yml, rst/): their RST, and the modules, options and roles they name.
  # antsibull's default logging writes ~/antsibull.log: a home of its own here.
  mkdir -p "$BUILD/antsibull-home"
  HOME="$BUILD/antsibull-home" antsibull-docs lint-collection-docs --plugin-docs --check-extra-docs-refs \
    "$COLLECTIONS/ansible_collections/gpuops/nvidia"
  echo "antsibull-docs: no findings"
)

stage_molecule() {
  say "Molecule scenarios in podman containers"
  "$REPO/scripts/molecule.sh"
}

# stress: stress-ng beside the stage, in a session of its own (a Ctrl-C stops the stage, and the
# trap stress-ng), stopped on every way out; where setpriv can, it also gets SIGTERM when this
# script dies without running its traps (SIGKILL).
stress_pid=''
stop_stress() {
  if [ -n "$stress_pid" ]; then
    kill -TERM -- "-$stress_pid" 2>/dev/null || kill -TERM "$stress_pid" 2>/dev/null || true
    wait "$stress_pid" 2>/dev/null || true
    stress_pid=
    say "stress-ng stopped"
  fi
}
if [ -n "$stress" ]; then
  trap stop_stress EXIT
  trap 'exit 143' TERM HUP
  cores=$(nproc)
  say "stress-ng --cpu $cores beside the $stage stage"
  deathsig=()
  setpriv --help 2>/dev/null | grep -q -- --pdeathsig && deathsig=(setpriv --pdeathsig TERM)
  setsid "${deathsig[@]}" stress-ng --cpu "$cores" --quiet </dev/null >/dev/null 2>&1 &
  stress_pid=$!
fi

# Each stage in a subshell of its own, errexit on: a stage that fails stops there, and the next
# stage runs all the same (unless --fail-fast). Its result and time are kept for the summary.
declare -A result=() took=()
run_stage() {
  local name=$1 started rc
  shift
  started=$SECONDS
  set +e
  (
    set -e
    case $name in
      unit) stage_unit "$@" ;;
      integration) stage_integration "$@" ;;
      sanity) stage_sanity ;;
      lint) stage_lint ;;
      molecule) stage_molecule ;;
    esac
  )
  rc=$?
  set -e
  took[$name]=$((SECONDS - started))
  if [ "$rc" -eq 0 ]; then result[$name]=passed; else result[$name]=failed; fi
}

# The last lines: each stage, passed, failed or not run, with its time in minutes:seconds.
summarise() {
  local name failed=0
  say "${stress:+stress: }$stage: stages"
  for name in "${stages[@]}"; do
    if [ -n "${took[$name]:-}" ]; then
      printf '    %-12s %-8s %d:%02d\n' "$name" "${result[$name]}" $((took[$name] / 60)) $((took[$name] % 60))
    else
      printf '    %-12s not run\n' "$name"
    fi
    [ "${result[$name]:-}" != failed ] || failed=$((failed + 1))
  done
  if [ -n "$interrupted" ]; then
    say "${stress:+stress: }$stage: interrupted"
  elif [ "$failed" -gt 0 ]; then
    say "${stress:+stress: }$stage: $failed stage(s) failed"
  else
    say "${stress:+stress: }$stage: all checks passed"
  fi
  [ "$failed" -eq 0 ]
}

if [ "$stage" = all ]; then stages=(unit integration sanity lint molecule); else stages=("$stage"); fi
# A Ctrl-C ends the stage that runs (its programs get it too) and runs no further stage.
interrupted=''
trap 'interrupted=1' INT
for name in "${stages[@]}"; do
  [ -z "$interrupted" ] || break
  run_stage "$name" "$@"
  [ -z "$fail_fast" ] || [ "${result[$name]}" = passed ] || break
done
stop_stress
rc=0
summarise || rc=1
[ -z "$interrupted" ] || rc=130
exit "$rc"
