#!/bin/sh
# The Prolog and Epilog entry points (prolog.sh, epilog.sh): the gpu_reset hook, then the site's
# own Prolog or Epilog when the hook's settings name one (GPU_RESET_SITE_PROLOG,
# GPU_RESET_SITE_EPILOG in gpu-reset-hook.conf; the role's slurm_hooks_site_prolog and
# slurm_hooks_site_epilog), so that a site keeps the Prolog= and Epilog= it had (NHC and the like).
#
#   chain.sh prolog|epilog
#
# The site's script runs after the hook, whatever the hook found (a site's Epilog that cleans up
# after every job is never skipped), with what slurmd gave: the same environment, working
# directory and standard streams, no arguments. The exit status is the hook's when that is not 0
# (the node is then drained with the hook's reason), else the site script's: Slurm drains the node
# on either failure, with its bare "Prolog error" for the site's, and requeues the batch job whose
# Prolog failed, held. A site script that is not an executable file fails with status 2. Both run
# within PrologEpilogTimeout, which must cover the hook's budget and the site script's own time.

mode=${1:-}
case $mode in
  prolog | epilog) ;;
  *) echo "usage: $0 prolog|epilog" >&2; exit 64 ;;
esac
here=$(cd "$(dirname "$0")" && pwd) || exit 2
conf=${GPU_RESET_HOOK_CONF:-$here/gpu-reset-hook.conf}
# The site's script and the hook's log, read from the settings in a subshell: nothing of them
# reaches the site script's environment.
settings=$(
  # shellcheck disable=SC1090
  [ -r "$conf" ] && . "$conf" >/dev/null 2>&1
  if [ "$mode" = prolog ]; then printf '%s\n' "${GPU_RESET_SITE_PROLOG:-}"; else printf '%s\n' "${GPU_RESET_SITE_EPILOG:-}"; fi
  printf '%s\n' "${GPU_RESET_LOG:-/var/log/gpu-reset-hook.log}"
)
site=$(printf '%s\n' "$settings" | sed -n 1p)
log=$(printf '%s\n' "$settings" | sed -n 2p)

"$here/gpu-reset-hook.sh" "$mode"
status=$?
[ -n "$site" ] || exit "$status"

if [ -f "$site" ] && [ -x "$site" ]; then
  "$site"
  site_status=$?
else
  echo "gpu_reset $mode: the site's $mode $site is not an executable file" >&2
  site_status=2
fi
echo "=== $mode job ${SLURM_JOB_ID:-?}: site $mode $site exit $site_status" >>"$log" 2>/dev/null
[ "$status" -ne 0 ] || status=$site_status
exit "$status"
