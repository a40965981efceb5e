#!/bin/sh
# slurm.conf: Epilog=/etc/slurm/gpu-reset/epilog.sh (the gpu_reset hook after each job)
exec "$(dirname "$0")/gpu-reset-hook.sh" epilog
