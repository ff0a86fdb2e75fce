#!/usr/bin/env bash
# Load the CANN environment, then run the command (ray start ...), so that every Ray worker and
# every rank process inherits LD_LIBRARY_PATH, ASCEND_* and the HCCL settings.
#
# The vendor's set_env.sh scripts are not written for strict shells: they read variables that
# may be unset ($ZSH_VERSION, $LD_LIBRARY_PATH, ...) and let some tests fail. They are sourced
# with -e, -u and pipefail off, and the strict options come back before the command runs. The
# toolkit's script is required (without it no NPU code can load): its absence, or a toolkit that
# sets neither ASCEND_TOOLKIT_HOME nor ASCEND_HOME_PATH, stops the container with that reason.
# The NNAL (ATB) script is optional. ASCEND_INSTALL_ROOT (default /usr/local/Ascend) is where
# CANN is installed: ascend-toolkit/ (CANN 8.x), or cann/ (the newer layout).
set -euo pipefail

root="${ASCEND_INSTALL_ROOT:-/usr/local/Ascend}"
toolkit=""
for candidate in "$root/ascend-toolkit/set_env.sh" "$root/cann/set_env.sh"; do
    if [ -f "$candidate" ]; then
        toolkit="$candidate"
        break
    fi
done
optional=("$root/nnal/atb/set_env.sh")

if [ -z "$toolkit" ]; then
    echo "gdnval-npu-entrypoint: no CANN toolkit environment under $root (ascend-toolkit/set_env.sh or cann/set_env.sh); is CANN installed in this image?" >&2
    exit 78
fi

load() {
    local script="$1" status=0
    set +euo pipefail
    # shellcheck disable=SC1090
    source "$script"
    status=$?
    set -euo pipefail
    if [ "$status" -ne 0 ]; then
        echo "gdnval-npu-entrypoint: note: $script returned $status" >&2
    fi
}

load "$toolkit"
for script in "${optional[@]}"; do
    if [ -f "$script" ]; then
        load "$script"
    fi
done

if [ -z "${ASCEND_TOOLKIT_HOME:-}${ASCEND_HOME_PATH:-}" ]; then
    echo "gdnval-npu-entrypoint: $toolkit set neither ASCEND_TOOLKIT_HOME nor ASCEND_HOME_PATH; the CANN environment is not loaded" >&2
    exit 78
fi

exec "$@"
