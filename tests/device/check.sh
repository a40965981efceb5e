#!/usr/bin/env bash
# Copyright (c) gpuops.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# The collection on a host with a real NVIDIA GPU: record what the driver says (idle, then with a
# real CUDA holder on GPU 0), then run nvidia_gpu_facts and nvidia_device_release through the
# ansible CLI with each backend and check that the holder is stopped and GPU 0 reads free; then
# what the facts read of MIG (said when MIG is off); the allocation probe (nvidia_gpu_probe): on the
# free GPUs at each level (allocation, memory: result and time), and with a holder that fills GPU 0
# (its answer). Nothing changes a GPU setting: no compute mode, no reset.
#
# Usage: tests/device/check.sh [WHEELS_DIR]
#
# Environment:
#   OUT             where everything is written (default: a new temporary directory; printed)
#   WHEELS          directory of wheels holding ansible-core and its dependencies (or the first
#                   argument); installed with pip --no-index into a venv made with
#                   --system-site-packages, so that torch and pynvml stay visible.
#                   Without it, plain pip (needs the network) is tried.
#   ANSIBLE_PYTHON  a python that already has ansible-core: no venv is made.
#   PYTHON          the python for the venv, the holder and NVML (default: python3).
#   HOLD_MIB        MiB the CUDA holder allocates on GPU 0 (default 2048).
#   STEP_TIMEOUT    seconds any one step may take (default 180).
#   TOTAL_TIMEOUT   seconds the whole check may take (default 1200).
#   GPUOPS_DEVICE_CHECK_SIM=ROOT  test mode: a gpusim host under ROOT (gpusim init done) stands in
#                   for the GPU: its fake nvidia-smi and libnvidia-ml.so.1, host_root ROOT, and a
#                   `gpusim hold` in place of the torch holder (HOLD_MIB=0: one that only opens
#                   the device files, as without torch).
#
# Exit status: 0 when every check passed, 1 on a FAIL, 2 when the check could not run.

set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/../.." && pwd)
TOTAL_TIMEOUT=${TOTAL_TIMEOUT:-1200}
STEP_TIMEOUT=${STEP_TIMEOUT:-180}

# The whole check runs under one deadline: re-run this script under timeout(1).
if [[ -z ${GPUOPS_DEVICE_CHECK_TIMED:-} ]]; then
    export GPUOPS_DEVICE_CHECK_TIMED=1
    rc=0
    timeout --kill-after=15 "$TOTAL_TIMEOUT" bash "${BASH_SOURCE[0]}" "$@" || rc=$?
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
        echo "FAIL the whole check ran past TOTAL_TIMEOUT=${TOTAL_TIMEOUT}s and was stopped" >&2
    fi
    exit "$rc"
fi

WHEELS=${WHEELS:-${1:-}}
PYTHON=${PYTHON:-python3}
HOLD_MIB=${HOLD_MIB:-2048}
SIM=${GPUOPS_DEVICE_CHECK_SIM:-}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpuops-device-check.XXXXXX")}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
HOLDER_PID=
FAILS=0

say() { printf '%s\n' "$*" | tee -a "$OUT/check.log"; }
die() { say "ERROR $*"; exit 2; }
verdict() {  # verdict PASS|FAIL|SKIP text
    say "$1 $2"
    if [[ $1 == FAIL ]]; then FAILS=$((FAILS + 1)); fi
}
step() { timeout --kill-after=10 "$STEP_TIMEOUT" "$@"; }

# shellcheck disable=SC2317  # run from the trap too
stop_holder() {
    if [[ -n $HOLDER_PID ]] && kill -0 "$HOLDER_PID" 2>/dev/null; then
        kill -KILL "$HOLDER_PID" 2>/dev/null || true
    fi
    HOLDER_PID=
}
# shellcheck disable=SC2317  # run from the trap
cleanup() {
    stop_holder
    if [[ -n $SIM ]]; then
        PYTHONPATH="$REPO/tests" "$PYTHON" -m gpusim stop --root "$SIM" >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT
trap 'exit 2' INT TERM

: >"$OUT/check.log"
say "gpuops device check: writing everything under $OUT"

# --- the host: real, or a gpusim host in test mode ---------------------------------------------
HOST_ROOT=/
KERNEL_LOG_ARG=
if [[ -n $SIM ]]; then
    [[ -f $SIM/var/lib/gpusim/state.json ]] || die "GPUOPS_DEVICE_CHECK_SIM=$SIM is not a gpusim host (run gpusim init)"
    [[ -f $SIM/lib/libnvidia-ml.so.1 ]] || PYTHONPATH="$REPO/tests" "$PYTHON" -m gpusim nvml --root "$SIM" >/dev/null
    [[ -f $SIM/lib/libcuda.so.1 ]] || PYTHONPATH="$REPO/tests" "$PYTHON" -m gpusim cuda --root "$SIM" >/dev/null
    export PATH="$SIM/bin:$PATH"
    export LD_LIBRARY_PATH="$SIM/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    HOST_ROOT=$SIM
    KERNEL_LOG_ARG=", \"kernel_log\": \"$SIM/dev/kmsg\""
    say "test mode: simulated GPU host under $SIM"
fi
SMI=$(command -v nvidia-smi) || die "nvidia-smi not found on PATH: is the NVIDIA driver installed?"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found (set PYTHON)"
say "nvidia-smi: $SMI; python: $(command -v "$PYTHON")"

# The collection, as ansible finds it.
COLLECTIONS="$OUT/collections"
mkdir -p "$COLLECTIONS/ansible_collections/gpuops"
ln -sfn "$REPO" "$COLLECTIONS/ansible_collections/gpuops/nvidia"
export GPUOPS_COLLECTIONS=$COLLECTIONS
record() { step "$PYTHON" "$REPO/tests/device/record.py" "$@"; }

# --- ansible-core --------------------------------------------------------------------------------
if [[ -n ${ANSIBLE_PYTHON:-} ]]; then
    APY=$ANSIBLE_PYTHON
    say "ansible-core: using $APY (ANSIBLE_PYTHON)"
else
    say "ansible-core: making a venv in $OUT/venv (--system-site-packages)"
    step "$PYTHON" -m venv --system-site-packages "$OUT/venv" >>"$OUT/venv.log" 2>&1 \
        || die "could not make a venv with $PYTHON -m venv (see $OUT/venv.log; Debian needs python3-venv)"
    APY="$OUT/venv/bin/python"
    if [[ -n $WHEELS ]]; then
        [[ -d $WHEELS ]] || die "WHEELS=$WHEELS is not a directory"
        step "$APY" -m pip install --no-index --find-links "$WHEELS" ansible-core >>"$OUT/venv.log" 2>&1 \
            || die "pip could not install ansible-core from the wheels in $WHEELS (see $OUT/venv.log):" \
                   "carry wheels for this python ($("$PYTHON" -V 2>&1)) and platform"
    else
        say "no WHEELS given: trying plain pip install ansible-core (needs the network)"
        step "$APY" -m pip install ansible-core >>"$OUT/venv.log" 2>&1 \
            || die "pip install ansible-core failed (no network?): give WHEELS=<dir of wheels> (see tests/device/README.md); log in $OUT/venv.log"
    fi
    # --system-site-packages shares the base interpreter's packages only: where $PYTHON is itself a
    # venv (PyTorch's own, say), its packages (torch, nvidia-ml-py) are shared through a .pth file,
    # once ansible-core is installed (the venv's own come first).
    "$PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))' \
        >"$("$APY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/gpuops-device-check.pth" \
        || die "could not share $PYTHON's packages with the venv"
fi
"$APY" -c 'import ansible' 2>/dev/null || die "$APY cannot import ansible"
say "ansible-core $("$APY" -c 'import ansible.release as r; print(r.__version__)')"
THRESHOLD=$(record threshold)

# --- readings of the idle host -------------------------------------------------------------------
say "== recording the idle host (before any holder)"
record host "$OUT/host" --root "$HOST_ROOT" | tee -a "$OUT/check.log"
record smi "$OUT/idle/smi" --smi "$SMI" | tee -a "$OUT/check.log"
record nvml "$OUT/idle" | tee -a "$OUT/check.log"
IDLE_USED=$(record memory-used --smi "$SMI" --index 0) || die "nvidia-smi cannot read GPU 0's memory.used (see $OUT/idle/smi)"
say "GPU 0 idle: memory.used $IDLE_USED MiB (default memory_threshold_mib $THRESHOLD)"

# --- the holder ----------------------------------------------------------------------------------
COMPUTE_HOLDER=1
if [[ -n $SIM && $HOLD_MIB -eq 0 ]]; then
    COMPUTE_HOLDER=0  # gpusim hold --mib 0 holds the files and is no compute app
    say "NOTE HOLD_MIB=0: the holder only opens the device files (checks that need a CUDA context are skipped)"
elif [[ -z $SIM ]] && ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    COMPUTE_HOLDER=0
    say "NOTE torch with CUDA is not importable by $PYTHON: the holder only opens the device files (no CUDA context; checks that need one are skipped)"
fi
MINOR0=$("$SMI" --query-gpu=minor_number -i 0 --format=csv,noheader,nounits 2>/dev/null | head -n 1 | tr -d ' ') || true
[[ $MINOR0 =~ ^[0-9]+$ ]] || MINOR0=0

start_holder() {  # start_holder LOGFILE: sets HOLDER_PID once the holder holds GPU 0
    local log=$1 waited=0
    if [[ -n $SIM ]]; then
        PYTHONPATH="$REPO/tests" step "$PYTHON" -m gpusim hold --root "$SIM" --gpus 0 --mib "$HOLD_MIB" --name cuda-holder >"$log" \
            || die "gpusim hold failed (see $log)"
        HOLDER_PID=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["pid"])' "$log")
        return 0
    fi
    if [[ $COMPUTE_HOLDER -eq 1 ]]; then
        # cuda:0 must be nvidia-smi's GPU 0: CUDA numbers the fastest GPU first unless told the bus
        # order, and CUDA_VISIBLE_DEVICES would renumber them (env execs: $! is the holder).
        env -u CUDA_VISIBLE_DEVICES CUDA_DEVICE_ORDER=PCI_BUS_ID "$PYTHON" -c '
import sys, time, torch
mib = int(sys.argv[1])
x = torch.empty(mib * 1024 * 1024, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(3600)
' "$HOLD_MIB" >"$log" 2>&1 &
    else
        "$PYTHON" -c '
import os, sys, time
fds = [os.open(path, os.O_RDWR) for path in sys.argv[1:]]
print("ready", flush=True)
time.sleep(3600)
' "/dev/nvidia$MINOR0" /dev/nvidiactl /dev/nvidia-uvm >"$log" 2>&1 &
    fi
    HOLDER_PID=$!
    until grep -qx ready "$log" 2>/dev/null; do
        kill -0 "$HOLDER_PID" 2>/dev/null || die "the holder died before it was ready (see $log)"
        ((waited++ < 240)) || die "the holder was not ready after 120 s (see $log)"
        sleep 0.5
    done
}

# --- each backend: facts, release, facts -------------------------------------------------------
run_module() {  # run_module DIR NAME MODULE ARGS_JSON: DIR/NAME.{stdout,stderr,rc,json}
    local dir=$1 name=$2 module=$3 args=$4 rc=0
    env ANSIBLE_COLLECTIONS_PATH="$COLLECTIONS" ANSIBLE_PYTHON_INTERPRETER="$APY" ANSIBLE_NOCOLOR=1 \
        ANSIBLE_LOCAL_TEMP="$OUT/ansible-tmp" ANSIBLE_REMOTE_TEMP="$OUT/ansible-tmp" \
        timeout --kill-after=10 "$STEP_TIMEOUT" "$APY" -m ansible adhoc localhost -c local -i localhost, \
        -m "gpuops.nvidia.$module" -a "$args" >"$dir/$name.stdout" 2>"$dir/$name.stderr" || rc=$?
    echo "$rc" >"$dir/$name.rc"
    record adhoc "$dir/$name.stdout" "$dir/$name.json" || say "WARN no result in $dir/$name.stdout (rc $rc)"
    say "  $module ($name): rc $rc, result in $dir/$name.json"
}

FIRST=1
for backend in nvidia-smi nvml; do
    dir="$OUT/ansible/$backend"
    mkdir -p "$dir"
    say "== backend $backend"
    start_holder "$dir/holder.log"
    kind="CUDA, $HOLD_MIB MiB"
    [[ -z $SIM ]] || kind="gpusim hold, $HOLD_MIB MiB"
    [[ $COMPUTE_HOLDER -eq 1 ]] || kind='device files only'
    say "  holder pid $HOLDER_PID on GPU 0 ($kind)"
    if [[ $FIRST -eq 1 ]]; then
        say "== recording the host with the holder"
        record smi "$OUT/holder/smi" --smi "$SMI" | tee -a "$OUT/check.log"
        record nvml "$OUT/holder" | tee -a "$OUT/check.log"
        HELD_USED=$(record memory-used --smi "$SMI" --index 0) || HELD_USED=
        if [[ -n $HELD_USED ]]; then
            context=null
            if [[ $COMPUTE_HOLDER -eq 1 ]]; then
                context=$((HELD_USED - IDLE_USED - HOLD_MIB))
                say "GPU 0 with the holder: memory.used $HELD_USED MiB, of which $context MiB beyond" \
                    "the idle reading and the $HOLD_MIB MiB allocated (the CUDA context)"
            else
                say "GPU 0 with the holder: memory.used $HELD_USED MiB (no CUDA context)"
            fi
            printf '{"idle_used_mib": %s, "held_used_mib": %s, "hold_mib": %s, "context_mib": %s, "threshold_mib": %s}\n' \
                "$IDLE_USED" "$HELD_USED" "$HOLD_MIB" "$context" "$THRESHOLD" >"$OUT/holder/summary.json"
        fi
        FIRST=0
    fi
    common="\"backend\": \"$backend\", \"host_root\": \"$HOST_ROOT\""
    run_module "$dir" facts_before nvidia_gpu_facts "{$common$KERNEL_LOG_ARG}"
    run_module "$dir" release nvidia_device_release \
        "{$common, \"gpus\": [0], \"grace_period\": 5, \"timeout\": 90, \"lock_file\": \"$OUT/release.lock\", \"facts_after\": true}"
    run_module "$dir" facts_after nvidia_gpu_facts "{$common$KERNEL_LOG_ARG}"
    no_compute=()
    [[ $COMPUTE_HOLDER -eq 1 ]] || no_compute=(--no-compute-holder)
    rc=0
    record check "$dir" --pid "$HOLDER_PID" --index 0 --smi "$SMI" --label "$backend: " --backend "$backend" "${no_compute[@]}" >"$dir/checks.txt" || rc=$?
    while IFS= read -r line; do
        verdict "${line%% *}" "${line#* }"
    done <"$dir/checks.txt"
    [[ $rc -le 1 ]] || verdict FAIL "$backend: the checks could not run (rc $rc)"
    stop_holder
done

# --- MIG: what the facts read of it (nothing is changed: with MIG off, that is said) -------------
say "== MIG (the facts of each backend, as read above)"
for backend in nvidia-smi nvml; do
    "$PYTHON" - "$OUT/ansible/$backend/facts_before.json" "$backend" >"$OUT/ansible/$backend/mig.txt" <<'PY' ||
import json, sys
result, backend = json.load(open(sys.argv[1])), sys.argv[2]
gpus = (result.get('ansible_facts') or {}).get('nvidia_gpus') or []
on = [gpu for gpu in gpus if (gpu.get('mig') or {}).get('mode_current') == 'enabled']
for gpu in on:
    instances = gpu['mig'].get('instances') or []
    print('NOTE %s: GPU %s has MIG enabled, %d instance(s) read: %s' % (backend, gpu.get('index'), len(instances), ', '.join(
        '%s GI %s CI %s %s' % (i.get('profile'), i.get('gpu_instance_id'), i.get('compute_instance_id'), i.get('uuid'))
        for i in instances) or 'none'))
if gpus and not on:
    modes = sorted(set(str((gpu.get('mig') or {}).get('mode_current')) for gpu in gpus))
    print('NOTE %s: MIG is not enabled on any GPU (mode %s); the check changes no GPU setting, so no MIG instance '
          'is read' % (backend, ', '.join(modes)))
if not gpus:
    print('FAIL %s: the facts hold no GPU (%s)' % (backend, result.get('msg')))
PY
        verdict FAIL "$backend: the MIG facts could not be read"
    while IFS= read -r line; do
        if [[ $line == FAIL* ]]; then verdict FAIL "${line#* }"; else say "$line"; fi
    done <"$OUT/ansible/$backend/mig.txt"
done

# --- the allocation probe: free GPUs, then GPU 0 filled by a holder -------------------------------
say "== the allocation probe (nvidia_gpu_probe)"
dir="$OUT/probe"
mkdir -p "$dir"
probe_args="{\"backend\": \"nvidia-smi\", \"host_root\": \"$HOST_ROOT\", \"timeout\": 60}"
run_module "$dir" free nvidia_gpu_probe "$probe_args"
# The probe at each level, with its time: the default level (allocation) above, then all the free
# memory (probe_level memory), each GPU's MiB, milliseconds and the GB/s written and read back.
run_module "$dir" memory nvidia_gpu_probe \
    "{\"backend\": \"nvidia-smi\", \"host_root\": \"$HOST_ROOT\", \"timeout\": 300, \"probe_level\": \"memory\"}"
for level in free memory; do
    "$PYTHON" - "$dir/$level.json" "$level" >"$dir/$level.checks.txt" <<'PY' || verdict FAIL "probe ($level): no result to read"
import json, sys
result, level = json.load(open(sys.argv[1])), sys.argv[2]
name = 'allocation' if level == 'free' else level
for gpu in result.get('gpus') or []:
    ms = gpu.get('kernel_ms') or gpu.get('ms') or 0
    rate = 2.0 * (gpu.get('mib') or 0) * 1048576 / ms / 1e6 if ms else 0
    print('%s probe %s: GPU %s %s MiB in %s ms (%.1f GB/s written and read back), module %s ms%s' % (
        'PASS' if gpu.get('ok') else 'FAIL', name, gpu.get('index'), gpu.get('mib'), gpu.get('ms'), rate,
        result.get('duration_ms'), '' if gpu.get('ok') else ': %s %s' % (gpu.get('error_name'), gpu.get('error_string'))))
if not result.get('gpus'):
    print('FAIL probe %s: no GPU result (%s)' % (name, result.get('msg')))
PY
    while IFS= read -r line; do
        verdict "${line%% *}" "${line#* }"
    done <"$dir/$level.checks.txt"
done
# The performance level: copies and kernels timed, the PCIe link read under load; the figures
# beside NVIDIA's published ones for an H200 (PCIe Gen5 x16: 64 GB/s each way; HBM3e: 4.8 TB/s).
# The link read before it (idle, or still up after the last probe's copies) and the topology are
# kept as fixtures for gpusim.
"$SMI" --query-gpu=index,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max \
    --format=csv,noheader,nounits >"$dir/pcie_idle.csv" 2>&1 || true
"$SMI" topo -m >"$dir/topo_m.txt" 2>&1 || true
run_module "$dir" performance nvidia_gpu_probe \
    "{\"backend\": \"nvidia-smi\", \"host_root\": \"$HOST_ROOT\", \"timeout\": 60, \"probe_level\": \"performance\"}"
"$PYTHON" - "$dir/performance.json" >"$dir/performance.checks.txt" <<'PY' || verdict FAIL "probe (performance): no result to read"
import json, sys
result = json.load(open(sys.argv[1]))
for gpu in result.get('gpus') or []:
    link = gpu.get('link') or {}
    figures = ('h2d %s GB/s, d2h %s GB/s (published 64 each way), hbm %s GB/s (published 4800), link under load '
               'Gen%s x%s of Gen%s x%s, copy round %s, module %s ms' % (
                   gpu.get('h2d_gbps'), gpu.get('d2h_gbps'), gpu.get('hbm_gbps'), link.get('gen'), link.get('width'),
                   link.get('max_gen'), link.get('max_width'), gpu.get('copy_round'), result.get('duration_ms')))
    ok = gpu.get('ok') and None not in (gpu.get('h2d_gbps'), gpu.get('d2h_gbps'), gpu.get('hbm_gbps'), link.get('gen'))
    slow = '; slow: %s' % '; '.join(reason['message'] for reason in gpu['slow']) if gpu.get('slow') else ''
    print('%s probe performance: GPU %s %s%s%s' % ('PASS' if ok else 'FAIL', gpu.get('index'), figures, slow,
          '' if gpu.get('ok') else ': %s %s' % (gpu.get('error_name'), gpu.get('error_string'))))
if not result.get('gpus'):
    print('FAIL probe performance: no GPU result (%s)' % result.get('msg'))
PY
while IFS= read -r line; do
    verdict "${line%% *}" "${line#* }"
done <"$dir/performance.checks.txt"
FREE0=$("$SMI" --query-gpu=memory.free -i 0 --format=csv,noheader,nounits 2>/dev/null | head -n 1 | tr -d ' ') || true
if [[ -n $SIM ]]; then
    # What the probe's 1024 MiB cannot fit in: all but 512 MiB of GPU 0's free memory.
    [[ $FREE0 =~ ^[0-9]+$ ]] || die "nvidia-smi cannot read GPU 0's memory.free"
    PYTHONPATH="$REPO/tests" step "$PYTHON" -m gpusim hold --root "$SIM" --gpus 0 --mib $((FREE0 - 512)) \
        --name cuda-filler >"$dir/filler.log" || die "gpusim hold failed (see $dir/filler.log)"
    HOLDER_PID=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["pid"])' "$dir/filler.log")
elif [[ $COMPUTE_HOLDER -eq 1 ]]; then
    # PyTorch takes GPU 0's memory in 1 GiB, then 64 MiB, pieces until none is left.
    env -u CUDA_VISIBLE_DEVICES CUDA_DEVICE_ORDER=PCI_BUS_ID "$PYTHON" -c '
import time, torch
keep = []
for size in (1 << 30, 64 << 20):
    while True:
        try:
            keep.append(torch.empty(size, dtype=torch.uint8, device="cuda:0"))
        except RuntimeError:
            break
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(3600)
' >"$dir/filler.log" 2>&1 &
    HOLDER_PID=$!
    waited=0
    until grep -qx ready "$dir/filler.log" 2>/dev/null; do
        kill -0 "$HOLDER_PID" 2>/dev/null || die "the filler died before it was ready (see $dir/filler.log)"
        ((waited++ < 240)) || die "the filler was not ready after 120 s (see $dir/filler.log)"
        sleep 0.5
    done
fi
if [[ -n $HOLDER_PID ]]; then
    say "  filler pid $HOLDER_PID on GPU 0: memory.free $("$SMI" --query-gpu=memory.free -i 0 --format=csv,noheader 2>/dev/null | head -n 1) left (was $FREE0 MiB)"
    run_module "$dir" full nvidia_gpu_probe "$probe_args"
    stop_holder
    rc=0
    record probe-check "$dir" --index 0 >"$dir/checks.txt" || rc=$?
    while IFS= read -r line; do
        verdict "${line%% *}" "${line#* }"
    done <"$dir/checks.txt"
    [[ $rc -le 1 ]] || verdict FAIL "probe: the checks could not run (rc $rc)"
    say "  probe figures in $dir/summary.json"
else
    verdict SKIP "probe: no holder can fill GPU 0 without torch (the free run is in $dir/free.json)"
fi

record smi "$OUT/after/smi" --smi "$SMI" >/dev/null
record nvml "$OUT/after" >/dev/null

if [[ $FAILS -eq 0 ]]; then
    say "PASS all checks; everything is under $OUT"
    exit 0
fi
say "FAIL $FAILS check(s) failed; everything is under $OUT"
exit 1
