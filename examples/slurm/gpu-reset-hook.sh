#!/bin/sh
# Slurm Prolog/Epilog hook: put this node's GPUs (or only the job's GPUs) back into a clean
# state with the gpuops.nvidia.reset_gpus playbook, and drain the node when that fails.
#
#   gpu-reset-hook.sh prolog|epilog
#
# Runs as root on the compute node (slurmd runs Prolog and Epilog as root). Settings come
# from the environment, or from the file named by GPU_RESET_HOOK_CONF (default
# /etc/gpuops/gpu-reset-hook.conf, shell syntax):
#
#   GPU_RESET_BUDGET_S      seconds the whole hook may take (default 60); keep it under
#                           PrologEpilogTimeout in slurm.conf
#   GPU_RESET_VARS_FILE     YAML file of gpu_reset_* variables (default /etc/gpuops/gpu_reset.yml,
#                           used when it exists)
#   GPU_RESET_PLAYBOOK      playbook to run (default gpuops.nvidia.reset_gpus)
#   GPU_RESET_ANSIBLE_PLAYBOOK  the ansible-playbook command (default ansible-playbook)
#   GPU_RESET_LOG           where the playbook's output goes (default /var/log/gpu-reset-hook.log)
#   GPU_RESET_SCONTROL      the scontrol command (default scontrol)
#
# Exit status: 0 when the GPUs are clean; 1 otherwise (slurmd then drains the node too,
# and requeues the job when the prolog failed).

set -u

mode=${1:-prolog}
case $mode in
  prolog | epilog) ;;
  *) echo "usage: $0 prolog|epilog" >&2; exit 2 ;;
esac

conf=${GPU_RESET_HOOK_CONF:-/etc/gpuops/gpu-reset-hook.conf}
# shellcheck disable=SC1090
[ -r "$conf" ] && . "$conf"

budget=${GPU_RESET_BUDGET_S:-60}
vars_file=${GPU_RESET_VARS_FILE:-/etc/gpuops/gpu_reset.yml}
playbook=${GPU_RESET_PLAYBOOK:-gpuops.nvidia.reset_gpus}
ansible_playbook=${GPU_RESET_ANSIBLE_PLAYBOOK:-ansible-playbook}
log=${GPU_RESET_LOG:-/var/log/gpu-reset-hook.log}
scontrol=${GPU_RESET_SCONTROL:-scontrol}
node=${SLURMD_NODENAME:-$(hostname -s)}

# The release gets the budget minus a margin for starting Ansible, reading the GPUs and
# draining; the whole run is cut off at the budget.
release_timeout=$((budget * 2 / 3))
[ "$release_timeout" -ge 5 ] || release_timeout=5

set -- -i "$node," -c local -e target=all -e gpu_reset_become=false \
  -e gpu_reset_on_failure=drain -e "gpu_reset_timeout=$release_timeout"
[ -r "$vars_file" ] && set -- "$@" -e "@$vars_file"
# On a node shared by several jobs, touch only this job's GPUs (Slurm's indexes, which match
# nvidia-smi's when gres.conf lists /dev/nvidia0.. in order).
if [ -n "${SLURM_JOB_GPUS:-}" ]; then
  set -- "$@" -e "{\"gpu_reset_gpus\": [${SLURM_JOB_GPUS}]}"
fi

{
  echo "=== $(date '+%Y-%m-%dT%H:%M:%S%z') $mode job ${SLURM_JOB_ID:-?} on $node"
  ANSIBLE_RETRY_FILES_ENABLED=0 ANSIBLE_NOCOLOR=1 \
    timeout -k 5 "$budget" "$ansible_playbook" "$@" "$playbook"
} >>"$log" 2>&1
rc=$?

if [ "$rc" -eq 0 ]; then
  exit 0
fi
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  # Cut off before the role could drain the node: drain it here.
  "$scontrol" update "nodename=$node" state=drain \
    "reason=gpu_reset: $mode hook gave up after ${budget} s" >>"$log" 2>&1
fi
echo "gpu_reset $mode failed on $node (exit $rc), see $log" >&2
exit 1
