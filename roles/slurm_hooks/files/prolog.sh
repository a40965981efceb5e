#!/bin/sh
# slurm.conf: Prolog=/etc/slurm/gpu-reset/prolog.sh (the gpu_reset hook before each job, then the
# site's own Prolog when GPU_RESET_SITE_PROLOG names one: see chain.sh)
exec "$(dirname "$0")/chain.sh" prolog
