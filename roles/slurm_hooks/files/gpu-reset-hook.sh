#!/bin/sh
# Slurm Prolog/Epilog hook: put the job's GPUs back into a clean state with the gpuops.nvidia
# collection (the gpu_reset role's logic), and drain the node, saying why, when that fails.
#
#   gpu-reset-hook.sh prolog|epilog|health|cure
#
# health is Slurm's HealthCheckProgram (health-check.sh): on a node drained with a reason of this
# collection ("gpu_reset: ...") that runs no job, it puts every GPU back and resumes the node when
# they are clean; it only reads any other node, and never drains one itself.
#
# Runs as root on the compute node (slurmd runs Prolog, Epilog and HealthCheckProgram as root, with
# no HOME and no PATH). Settings come from the file named by GPU_RESET_HOOK_CONF (default:
# gpu-reset-hook.conf next to this script), shell syntax; the role gpuops.nvidia.slurm_hooks
# writes it:
#
#   GPU_RESET_PYTHON        the Python that has ansible-core and jmespath (default
#                           /opt/gpuops/bin/python)
#   GPU_RESET_COLLECTIONS_PATH  the directory holding ansible_collections/gpuops/nvidia (default:
#                           none, the collection is on that Python's own path)
#   GPU_RESET_RUNNER        module (default): the release module and the role's verdict run
#                           directly, without ansible-playbook (fast, for every job); playbook:
#                           ansible-playbook gpuops.nvidia.reset_gpus (GPU_RESET_PLAYBOOK)
#   GPU_RESET_BUDGET_S      seconds the whole hook may take (default 60); keep it under
#                           PrologEpilogTimeout in slurm.conf. The release gets half.
#   GPU_RESET_HEALTH_BUDGET_S  the same for the health check (default 40, at most 50: slurmd kills a
#                           health check after 60 s)
#   GPU_RESET_SCOPE         job (default): only the job's GPUs (SLURM_JOB_GPUS, their places in
#                           the node's gres.conf, mapped through its File= device nodes to the
#                           GPUs of those minor numbers), nothing for a job without GPUs; node:
#                           every GPU of the node, for nodes given whole to one job without GPUs
#                           configured in gres.conf
#   GPU_RESET_VARS_FILE     YAML file of gpu_reset_* variables (default gpu_reset.yml next to
#                           this script, used when it exists)
#   GPU_RESET_REBOOT        no (default): a node whose GPUs are not clean is drained; asap: when
#                           only a reboot cures them (a GPU lost or fallen off the bus), ask Slurm
#                           for one instead (scontrol reboot ASAP nextstate=resume; needs
#                           RebootProgram in slurm.conf); a fault back after that reboot, within
#                           a day, is drained for a person
#   GPU_RESET_REBOOT_STAMP  the file that notes the last reboot asked for (default
#                           /var/lib/gpuops/reboot-requested)
#   GPU_RESET_MAX_DRAINED   the fleet brake: past this many nodes, or this percentage of the
#                           cluster's, out of service with a gpu_reset reason, a node that is not
#                           clean but where a job can run (no GPU lost, no memory held) is left in
#                           service and the reason logged (the role's slurm_hooks_max_drained; not
#                           set, the runner's default, gpu_reset_max_drained's)
#   GPU_RESET_MAX_DRAIN_RATE  the fleet brake's rate: NODES/WINDOW (default 5/10m; WINDOW in s, m
#                           or h): as many nodes drained by gpu_reset within the window (the time
#                           Slurm gives their reasons) hold the brake as the cap does
#                           The runner checks both (one rule, _brake.py's): a value it cannot read
#                           is a setting the hook cannot read (exit 2, the node drained)
#   GPU_RESET_MODE          enforce (default), or observe: read, decide and log what would be
#                           signalled, reset, drained or resumed, and change nothing (the hook
#                           exits 0 whatever it finds), for a staged rollout on a live cluster
#   GPU_RESET_LOG           where the output goes (default /var/log/gpu-reset-hook.log)
#   GPU_RESET_SCONTROL      the scontrol command (default scontrol on PATH)
#   GPU_RESET_PATH          PATH for the hook (default /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
#   GPU_RESET_ANSIBLE_PLAYBOOK  ansible-playbook, for GPU_RESET_RUNNER=playbook (default: next to
#                           GPU_RESET_PYTHON)
#   GPU_RESET_ANSIBLE_HOME  Ansible's own files, for GPU_RESET_RUNNER=playbook (default /var/lib/gpuops/ansible)
#   GPU_RESET_CURE          yes (default): when a Prolog or Epilog drains the node, start its cure at
#                           once (cure, below) instead of leaving it to the next health check; no
#   GPU_RESET_CURE_WITHIN_S how long that cure may wait and try, in seconds (default 300)
#
# cure is the health check started at once by a Prolog or Epilog that drained the node, outside
# its time and outside any job: a transient unit of systemd (systemd-run, in system.slice), or where
# systemd does not run, a process of its own session (a restart of slurmd may end it). It
# waits while a job still runs or ends on the node, then runs the sequence as the health check
# does; while the GPUs may yet be found clean (not a hold, not a GPU that needs a reboot or a
# person) it checks again, for GPU_RESET_CURE_WITHIN_S in all; then the node is the next health
# check's. It never resumes a node it did not prove clean, nor one held for a person. Its log lines
# start "=== cure".
#
# Exit status of a Prolog or an Epilog (Slurm drains the node on any non-zero status of either,
# and requeues a batch job whose Prolog failed, held; it does not tell one status from another,
# so each names a case for slurmd's log and for people, and every non-zero one leaves a reason):
#   0  the GPUs are clean, or the fleet brake held (not clean, but left in service and logged)
#   1  they are not: the node is drained with the reason (each GPU and why), by the runner, or
#      by the hook itself pointing to the log when the runner's drain failed
#   2  the hook could not run its checks (no Python, no collection, settings or SLURM_JOB_GPUS it
#      cannot read, a crash): the node is drained saying so and pointing to the log
#   3  the hook was cut off at GPU_RESET_BUDGET_S: the node is drained saying so
#   64 wrong arguments (a hook run by hand): nothing is done
# The last line of each run in the log is "=== <mode> job <id>: hook exit <status>".
# Exit status of the health check and of the cure (slurmd only logs the health check's; the hook
# drains nothing itself here):
#   0  nothing to do, the node was resumed, or another health check was running (one runs at a
#      time; the later one does nothing); 1 its GPUs are still not clean: kept drained with
#   the new reason; 2 the checks could not run or Slurm's answers could not be read (nothing
#   done); 3 cut off at GPU_RESET_HEALTH_BUDGET_S. Its log lines start "=== health check".

set -u

mode=${1:-prolog}
case $mode in
  prolog | epilog | health | cure) ;;
  *) echo "usage: $0 prolog|epilog|health|cure" >&2; exit 64 ;;
esac

here=$(cd "$(dirname "$0")" && pwd) || exit 2
# Python puts the working directory first on its path: run from /, not from wherever slurmd is.
cd / || exit 2
conf=${GPU_RESET_HOOK_CONF:-$here/gpu-reset-hook.conf}
# A settings file that does not parse would end the hook where it is sourced, with no reason:
# try it in a subshell first, and without it drain saying so (below).
conf_broken=
if [ -r "$conf" ]; then
  # shellcheck disable=SC1090
  if (. "$conf") >/dev/null 2>&1; then . "$conf"; else conf_broken=1; fi
fi

PATH=${GPU_RESET_PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}
scontrol=${GPU_RESET_SCONTROL:-scontrol}
# The role's drain command runs scontrol from PATH.
case $scontrol in
  */*) PATH=$(dirname "$scontrol"):$PATH ;;
esac
export PATH
python=${GPU_RESET_PYTHON:-/opt/gpuops/bin/python}
collections=${GPU_RESET_COLLECTIONS_PATH:-}
runner=${GPU_RESET_RUNNER:-module}
budget=${GPU_RESET_BUDGET_S:-60}
case $budget in
  '' | *[!0-9]*) budget=60 conf_broken=1 ;;  # not a whole number of seconds: said below
esac
checks_health=
case $mode in health | cure) checks_health=1 ;; esac
cure=
case ${GPU_RESET_CURE:-yes} in
  yes) cure=1 ;;
  no) ;;
  *) conf_broken=1 ;;
esac
cure_within=${GPU_RESET_CURE_WITHIN_S:-300}
case $cure_within in
  '' | 0 | *[!0-9]*) cure_within=300 conf_broken=1 ;;
esac
if [ -n "$checks_health" ]; then
  budget=${GPU_RESET_HEALTH_BUDGET_S:-40}
  case $budget in
    '' | *[!0-9]*) budget=40 conf_broken=1 ;;
  esac
  # Well below the 60 s after which slurmd kills a health check.
  [ "$budget" -le 50 ] || budget=50
fi
scope=${GPU_RESET_SCOPE:-job}
reboot=
case ${GPU_RESET_REBOOT:-no} in
  asap) reboot=1 ;;
  no) ;;
  *) conf_broken=1 ;;
esac
reboot_stamp=${GPU_RESET_REBOOT_STAMP:-/var/lib/gpuops/reboot-requested}
# The fleet brake's settings go to the runner as they are: it checks them, by the rule the action
# and the role slurm_hooks check them by (_brake.py), and a value it cannot read stops it before
# anything is done, as settings it cannot read (its status 2, the hook's 2: the node drained).
max_drain_rate=${GPU_RESET_MAX_DRAIN_RATE:-5/10m}
# observe: read, decide and report what would be signalled, reset, drained or resumed; change
# nothing (the hook exits 0, so that Slurm does not drain the node either). A mode that is
# neither is a broken setting, and changes nothing either: a rollout meant to observe must not
# drain the cluster for a typo.
observe=
case ${GPU_RESET_MODE:-enforce} in
  enforce) ;;
  observe) observe=1 ;;
  *) observe=1 conf_broken=1 ;;
esac
vars_file=${GPU_RESET_VARS_FILE:-$here/gpu_reset.yml}
log=${GPU_RESET_LOG:-/var/log/gpu-reset-hook.log}
# A log that cannot be written must not stop the checks (a redirection that fails runs nothing).
if ! (: >>"$log") 2>/dev/null; then
  log_note=" (its log $log could not be written)"
  log=/dev/null
else
  log_note=", see $log"
fi
playbook=${GPU_RESET_PLAYBOOK:-gpuops.nvidia.reset_gpus}
ansible_playbook=${GPU_RESET_ANSIBLE_PLAYBOOK:-$(dirname "$python")/ansible-playbook}
node=${SLURMD_NODENAME:-$(hostname -s)}
job=${SLURM_JOB_ID:-?}
[ -r "$vars_file" ] || vars_file=
# How the log names this run: "prolog job 42", or "health check" (no job: every GPU).
what="$mode job $job"
[ -n "$checks_health" ] && what="health check" scope=node
[ "$mode" = cure ] && what="cure"

gpus=
if [ "$scope" = job ]; then
  gpus=${SLURM_JOB_GPUS:-}
  if [ -z "$gpus" ]; then
    # A job without GPUs: the GPUs of the node belong to other jobs, or to none.
    exit 0
  fi
fi
# The GPUs as the log and a drain reason show them: the runner parses and checks SLURM_JOB_GPUS
# (one parser, in Python, for both runners); here only the characters of a GPU list, 40 at most.
shown_gpus=$(printf '%.40s' "${gpus:-all}" | tr -c '0-9a-z,-' '?')

# The release gets half the budget; the rest is for starting up, reading the GPUs once more
# (each read bounded by the release's timeout too) and draining. The whole run is cut off at
# the budget.
release_timeout=$((budget / 2))
[ "$release_timeout" -ge 3 ] || release_timeout=3

# The collection comes from GPU_RESET_COLLECTIONS_PATH, or from the Python's own path: never
# from a PYTHONPATH or ANSIBLE_COLLECTIONS_PATH the hook happened to inherit.
unset PYTHONPATH ANSIBLE_COLLECTIONS_PATH
if [ -n "$collections" ]; then
  PYTHONPATH=$collections
  ANSIBLE_COLLECTIONS_PATH=$collections
  export PYTHONPATH ANSIBLE_COLLECTIONS_PATH
fi

run_module() {
  timeout -k 2 "$budget" "$python" -m ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_hook \
    --node "$node" ${vars_file:+--vars-file "$vars_file"} ${gpus:+--gpus "$gpus"} \
    --timeout "$release_timeout" --deadline "$budget" --scontrol "$scontrol" \
    ${reboot:+--reboot --reboot-stamp "$reboot_stamp"} ${observe:+--observe} \
    ${GPU_RESET_MAX_DRAINED:+"--max-drained=$GPU_RESET_MAX_DRAINED"} "--max-drain-rate=$max_drain_rate"
}

run_health() {
  limit=$budget
  [ "$mode" = cure ] && limit=$((budget + cure_within))
  timeout -k 2 "$limit" "$python" -m ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_hook \
    --health-check ${cure_within_arg:+"$cure_within_arg"} --node "$node" ${vars_file:+--vars-file "$vars_file"} \
    --timeout "$release_timeout" --deadline "$budget" --scontrol "$scontrol" \
    ${reboot:+--reboot --reboot-stamp "$reboot_stamp"} ${observe:+--observe} \
    ${GPU_RESET_MAX_DRAINED:+"--max-drained=$GPU_RESET_MAX_DRAINED"} "--max-drain-rate=$max_drain_rate"
}

run_playbook() {
  ansible_home=${GPU_RESET_ANSIBLE_HOME:-/var/lib/gpuops/ansible}
  mkdir -p "$ansible_home" && chmod 0700 "$ansible_home" || return 20
  # The hook's own settings (drain on failure, the release's time, the job's GPUs, parsed as the
  # module runner parses them) as JSON written by Python, for -e @file: never spliced into a
  # shell word, where SLURM_JOB_GPUS could add variables (a drain command) of its own.
  hook_vars=$(mktemp "$ansible_home/hook-vars.XXXXXX") || return 20
  # The job's GPUs mapped through gres.conf; when they cannot be told, the node is drained with
  # why (10, 11) and nothing is released.
  "$python" -m ansible_collections.gpuops.nvidia.plugins.plugin_utils._slurm_hook --node "$node" \
    ${vars_file:+--vars-file "$vars_file"} ${gpus:+--gpus "$gpus"} --timeout "$release_timeout" \
    --scontrol "$scontrol" --playbook-vars "$hook_vars" \
    ${GPU_RESET_MAX_DRAINED:+"--max-drained=$GPU_RESET_MAX_DRAINED"} "--max-drain-rate=$max_drain_rate"
  rc=$?
  if [ "$rc" -ne 0 ]; then
    rm -f "$hook_vars"
    case $rc in 10 | 11) return "$rc" ;; *) return 20 ;; esac
  fi
  set -- -i "$node," -c local -e target=all -e gpu_reset_become=false \
    -e "ansible_python_interpreter=$python"
  [ -n "$vars_file" ] && set -- "$@" -e "@$vars_file"
  # The hook's own settings come last and win over the variables file.
  set -- "$@" -e "@$hook_vars"
  [ -n "$observe" ] && set -- "$@" --check
  HOME=${HOME:-$ansible_home} ANSIBLE_HOME=$ansible_home ANSIBLE_LOCAL_TEMP=$ansible_home/tmp \
    ANSIBLE_RETRY_FILES_ENABLED=0 ANSIBLE_NOCOLOR=1 \
    ANSIBLE_GATHERING=explicit ANSIBLE_LOCALHOST_WARNING=0 \
    timeout -k 2 "$budget" "$ansible_playbook" "$@" "$playbook"
  rc=$?
  rm -f "$hook_vars"
  # ansible-playbook's 2 (a host failed): the role drained the node with the reason.
  case $rc in
    0 | 124 | 137) return "$rc" ;;
    2) return 10 ;;
    *) return 20 ;;
  esac
}

# slurmctld asks for a health check every HealthCheckInterval, and slurmd runs each request in a
# thread of its own: a check that outlasts the interval (a slow probe, a loaded node) would meet the
# next one, and their probes would find each other's memory. One at a time: a check that finds
# another running (a lock on this script) does nothing.
# A cure waits for a health check that runs (a minute at most) and runs after it.
cure_within_arg=
if [ "$mode" = cure ]; then
  cure_within_arg="--cure-within=$cure_within"
fi
if [ -n "$checks_health" ] && command -v flock >/dev/null 2>&1; then
  exec 9<"$0"
  if [ "$mode" = cure ]; then locked() { flock -w 60 9; }; else locked() { flock -n 9; }; fi
  if ! locked; then
    echo "=== $what: another health check is running; nothing done" >>"$log"
    exit 0
  fi
fi

# The cure of a node this run drained, started at once (GPU_RESET_CURE): outside this run's time
# and outside any job, with what the hook itself was started with.
start_cure() {
  if [ -d /run/systemd/system ] && command -v systemd-run >/dev/null 2>&1; then
    if systemctl is-active --quiet gpu-reset-cure.service 2>/dev/null; then
      echo "the cure of the node runs already (gpu-reset-cure.service)"
      return 0
    fi
    if systemd-run --quiet --no-block --collect --unit=gpu-reset-cure \
        --property="RuntimeMaxSec=$((cure_within + budget + 60))" \
        --setenv=SLURMD_NODENAME="$node" --setenv=GPU_RESET_HOOK_CONF="$conf" \
        ${SLURM_CONF:+--setenv=SLURM_CONF="$SLURM_CONF"} "$here/gpu-reset-hook.sh" cure; then
      echo "the cure of the node is started: gpu-reset-cure.service, for at most $cure_within s"
      return 0
    fi
  fi
  # Not `setsid ... &`: that child may still be in the Prolog's process group when the hook exits,
  # which slurmd may then end (under load, such a cure never ran). Popen with start_new_session
  # returns once the child runs in a session of its own.
  if pid=$(SLURMD_NODENAME=$node GPU_RESET_HOOK_CONF=$conf "$python" -c '
import subprocess, sys
print(subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       start_new_session=True, close_fds=True).pid)
' "$here/gpu-reset-hook.sh" cure); then
    echo "the cure of the node is started: pid $pid, for at most $cure_within s"
  else
    echo "the cure of the node could not be started: the next health check will look at it"
  fi
}

# The runners' statuses, as the rest of the hook reads them: 0 clean; 10 not clean, the node
# drained with the reason; 11 not clean and that drain failed; 124 or 137 cut off at the budget;
# anything else (20, Python's own 1 when it crashes or cannot import the collection, 2 settings
# it cannot read, 127 no Python) means the checks could not run.
(
  started=$(date +%s)
  [ -n "$checks_health" ] && runner=module
  echo "=== $(date '+%Y-%m-%dT%H:%M:%S%z') $what on $node, GPUs $shown_gpus, $runner"
  if [ -n "$conf_broken" ]; then
    echo "$conf is not valid shell, or GPU_RESET_BUDGET_S is not a whole number of seconds, or GPU_RESET_REBOOT is neither no nor asap, or GPU_RESET_MODE is neither enforce nor observe, or GPU_RESET_CURE is neither yes nor no, or GPU_RESET_CURE_WITHIN_S is not a whole number of seconds above 0: the hook cannot read its settings"
    rc=20
  elif [ -n "$checks_health" ]; then
    # The health check runs the module runner only: settings that need the playbook (3) stop it.
    run_health
    rc=$?
    [ "$rc" -eq 3 ] && echo "the health check runs without ansible-playbook; $vars_file needs the playbook: nothing done"
  elif [ "$runner" = module ]; then
    run_module
    rc=$?
    # 3: the variables file needs the playbook (a clean query, a drain command of its own).
    if [ "$rc" -eq 3 ]; then
      run_playbook
      rc=$?
    fi
  else
    run_playbook
    rc=$?
  fi
  echo "=== $what: exit $rc after $(($(date +%s) - started)) s"
  case $rc in
    0 | 10 | 11 | 12 | 13 | 14) exit "$rc" ;;
    124 | 137) exit 124 ;;
    *) exit 20 ;;
  esac
) >>"$log" 2>&1
rc=$?

# Why GPU_RESET_PYTHON cannot run the hook (empty when it can): said in the drain reason.
python_problem() {
  if [ ! -x "$python" ]; then
    echo "cannot run GPU_RESET_PYTHON $python: no such executable; set GPU_RESET_PYTHON to the Python that has ansible-core"
  elif ! "$python" -c 'import ansible_collections.gpuops.nvidia.plugins.plugin_utils._hook.job' >/dev/null 2>&1; then
    echo "GPU_RESET_PYTHON $python cannot import gpuops.nvidia; install the collection for it or set GPU_RESET_COLLECTIONS_PATH"
  fi
}

case $rc in
  0) status=0 ;;
  12) status=0; echo "the fleet brake holds: the node is not clean but stays in service (see the reason above)" >>"$log" ;;
  10) status=1 ;;
  11) status=1 why="found the GPUs not clean and could not drain the node with the reason" ;;
  13) status=2 why="could not resume the node (scontrol update state=resume failed)" ;;
  14) status=2 why="could not read Slurm's answers about the node" ;;
  124) status=3 why="gave up after ${budget} s" ;;
  *) status=2 why=$(python_problem); why=${why:-could not check the GPUs} ;;
esac
if [ -n "$observe" ] && [ "$status" -ne 0 ]; then
  echo "observe mode: the node is left as it is (the hook ${why:-found the GPUs not clean}; it would have drained it)" >>"$log"
  status=0
elif [ -n "$checks_health" ]; then
  # The health check drains nothing itself: a node it could not check is either drained already
  # (by this collection, and stays so) or none of its business.
  [ -n "${why:-}" ] && echo "the $what $why: nothing done" >>"$log"
elif [ -n "${why:-}" ]; then
  # Ended without draining the node with the reason: drain it here, saying so.
  timeout 10 "$scontrol" update "nodename=$node" state=drain \
    "reason=gpu_reset: $mode hook $why (job $job, GPUs $shown_gpus)$log_note" >>"$log" 2>&1 && drained=1
fi
[ "$rc" -eq 10 ] && [ -z "$observe" ] && drained=1
if [ -n "${drained:-}" ] && [ -n "$cure" ] && [ -z "$checks_health" ]; then
  start_cure >>"$log" 2>&1
fi
echo "=== $what: hook exit $status" >>"$log"
[ "$status" -eq 0 ] || echo "gpu_reset $mode failed on $node (exit $status)$log_note" >&2
exit "$status"
