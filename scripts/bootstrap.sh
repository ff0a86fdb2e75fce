#!/usr/bin/env bash
# Create .venv and install gdnval with what it needs, on a fresh CPU machine.
#   bash scripts/bootstrap.sh          the service and its workers
#   bash scripts/bootstrap.sh test     also the test tools, Debian's chromium for the browser tests and
#                                      Debian's postgresql (the store tests start their own server)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
# The CPU build of torch first: a bare "torch" requirement would pull a multi-GB CUDA build.
.venv/bin/python -c 'import torch' 2>/dev/null || "${pip[@]}" "torch==2.13.0"
if [ "${1:-}" = "test" ]; then
    "${pip[@]}" -e '.[triton,ray,postgres,dev]'
    missing=()
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null || missing+=(postgresql)
    if [ "${#missing[@]}" -gt 0 ]; then
        { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; } \
            || echo "bootstrap: could not install ${missing[*]}; their tests will be skipped" >&2
    fi
else
    "${pip[@]}" -e '.[triton,ray,postgres]'
fi
