#!/bin/sh
# slurm.conf: Prolog=/etc/slurm/prolog.d/*  (or Prolog=/path/to/this script)
exec "$(dirname "$0")/gpu-reset-hook.sh" prolog
