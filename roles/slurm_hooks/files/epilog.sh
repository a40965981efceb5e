#!/bin/sh
# slurm.conf: Epilog=/etc/slurm/gpu-reset/epilog.sh (the gpu_reset hook after each job, then the
# site's own Epilog when GPU_RESET_SITE_EPILOG names one: see chain.sh)
exec "$(dirname "$0")/chain.sh" epilog
