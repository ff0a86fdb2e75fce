#!/usr/bin/env bash
# Load the CANN toolkit environment, then run the command (ray start ...), so that every Ray
# worker and every rank process inherits LD_LIBRARY_PATH, ASCEND_* and the HCCL settings.
set -euo pipefail
for env in /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/nnal/atb/set_env.sh; do
    # shellcheck disable=SC1090
    [ -f "$env" ] && source "$env"
done
exec "$@"
