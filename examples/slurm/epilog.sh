#!/bin/sh
# slurm.conf: Epilog=/etc/slurm/epilog.d/*  (or Epilog=/path/to/this script)
exec "$(dirname "$0")/gpu-reset-hook.sh" epilog
