#!/bin/sh
# slurm.conf: HealthCheckProgram=/etc/slurm/gpu-reset/health-check.sh (return a node the gpu_reset
# hook drained to service once its GPUs are clean again)
exec "$(dirname "$0")/gpu-reset-hook.sh" health
