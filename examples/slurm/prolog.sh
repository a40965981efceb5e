#!/bin/sh
# slurm.conf: Prolog=/etc/slurm/gpu-reset/prolog.sh (the gpu_reset hook before each job)
exec "$(dirname "$0")/gpu-reset-hook.sh" prolog
