#!/usr/bin/env bash
# Create .venv and install gdnval with what it needs, on a fresh CPU machine.
#   bash scripts/bootstrap.sh          the service and its workers
#   bash scripts/bootstrap.sh test     also the test tools, Debian's chromium for the browser tests and
#                                      Debian's postgresql (the store tests start their own server), and
#                                      .venv-ascend: triton-ascend's compiler front end for the lowering test
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
# The CPU build of torch first: a bare "torch" requirement would pull a multi-GB CUDA build.
.venv/bin/python -c 'import torch' 2>/dev/null || "${pip[@]}" "torch==2.13.0"
# triton-ascend installs as the `triton` package, so it gets a venv of its own; its one wheel is
# cp311 manylinux, and its Ascend backend imports pybind11 without declaring it. When that venv
# cannot be made, the reason goes to .venv-ascend.skip, which
# tests/kernels/test_kernels_ascend.py reports as its skip reason.
TRITON_ASCEND=triton-ascend==3.2.0
ascend_env() {
    local py="" why=""
    rm -f .venv-ascend.skip
    local check='from triton.backends.ascend import compiler'
    .venv-ascend/bin/python -c "$check" 2>/dev/null && return 0
    for cand in python3.11 "$python"; do
        if command -v "$cand" >/dev/null 2>&1 \
            && [ "$("$cand" -c 'import sys; print(sys.version_info[:2] == (3, 11))')" = True ]; then
            py=$cand && break
        fi
    done
    if [ -z "$py" ]; then
        why="no Python 3.11 interpreter (python3.11): $TRITON_ASCEND ships a cp311 wheel only"
    elif ! { "$py" -m venv .venv-ascend && .venv-ascend/bin/python -m pip install --quiet \
            --disable-pip-version-check "torch==2.13.0" numpy pybind11 "$TRITON_ASCEND"; }; then
        why="pip could not install $TRITON_ASCEND (with torch 2.13.0) into .venv-ascend"
    elif ! .venv-ascend/bin/python -c "$check"; then
        why="$TRITON_ASCEND is installed in .venv-ascend but its Ascend backend does not import"
    fi
    if [ -n "$why" ]; then
        echo "bootstrap: $why; the Ascend lowering test will be skipped" >&2
        echo "$why" > .venv-ascend.skip
    fi
}
if [ "${1:-}" = "test" ]; then
    "${pip[@]}" -e '.[triton,ray,postgres,dev]'
    missing=()
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null || missing+=(postgresql)
    if [ "${#missing[@]}" -gt 0 ]; then
        { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; } \
            || echo "bootstrap: could not install ${missing[*]}; their tests will be skipped" >&2
    fi
    ascend_env
else
    "${pip[@]}" -e '.[triton,ray,postgres]'
fi
