#!/usr/bin/env bash
# The main job on the built-in simulated host: a hung 8-GPU distributed job (76113 MiB held
# on each GPU at 0 % utilisation) plus nvidia-persistenced, shown, released and verified.
# Needs no GPU. Usage: scripts/demo.sh
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

ensure_commands ps:procps
ensure_venv "$REPO/.venv-demo" "$REPO/requirements/demo.txt"
link_collection

HOST_ROOT="$BUILD/demo-host"
gpusim() { python -m gpusim "$@"; }
trap 'gpusim stop --root "$HOST_ROOT" >/dev/null 2>&1 || true' EXIT

say "starting a simulated 8 x H200 host with a hung job in $HOST_ROOT"
gpusim scenario --root "$HOST_ROOT" hung-job --release-delay 1 >/dev/null
say "what an operator sees today: $HOST_ROOT/bin/nvidia-smi"
"$HOST_ROOT/bin/nvidia-smi"

say "the collection at work"
export ANSIBLE_PYTHON_INTERPRETER="$REPO/.venv-demo/bin/python" ANSIBLE_NOCOLOR="${ANSIBLE_NOCOLOR:-}"
ansible-playbook -i localhost, "$REPO/scripts/demo.yml" -e gpusim_root="$HOST_ROOT"
