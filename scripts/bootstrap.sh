#!/usr/bin/env bash
# Create .venv and install gdnval with what it needs, on a fresh CPU machine.
#   bash scripts/bootstrap.sh          the service and its workers
#   bash scripts/bootstrap.sh test     also the test tools, Debian's chromium for the browser tests and
#                                      Debian's postgresql (the store tests start their own server),
#                                      .venv-ascend: triton-ascend's compiler front end for the lowering test,
#                                      and .venv-ray-lower: Ray at the lower bound the project declares
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
# .venv-ray-lower: this venv's packages (a .pth adds its site-packages after its own) with Ray at the
# lower bound of the `ray` extra, so the executor's tests run against the oldest Ray a cluster may
# have (tests/workers/test_ray_range.py). Why it cannot be made goes to .venv-ray-lower.skip.
ray_lower_env() {
    local want why="" site lower
    rm -f .venv-ray-lower.skip
    want=$(.venv/bin/python -c 'import tomllib
from packaging.requirements import Requirement
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["ray"]
print(next(s.version for s in Requirement(extra[0]).specifier if s.operator == ">="))')
    .venv-ray-lower/bin/python -c "import ray, sys; sys.exit(ray.__version__ != '$want')" 2>/dev/null && return 0
    rm -rf .venv-ray-lower
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if ! .venv/bin/python -m venv --without-pip .venv-ray-lower; then
        why="python -m venv could not make .venv-ray-lower"
    else
        lower=$(.venv-ray-lower/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        echo "import site; site.addsitedir('$site')" > "$lower/gdnval-parent.pth"
        ln -sf "$PWD/.venv/bin/uv" .venv-ray-lower/bin/uv  # the backend installer next to the interpreter
        .venv/bin/python -m pip --python .venv-ray-lower/bin/python install --quiet \
            --disable-pip-version-check "ray[default]==$want" \
            || why="pip could not install ray[default]==$want into .venv-ray-lower"
    fi
    if [ -n "$why" ]; then
        echo "bootstrap: $why; the Ray lower-bound test will be skipped" >&2
        echo "$why" > .venv-ray-lower.skip
    fi
}
if [ "${1:-}" = "test" ]; then
    "${pip[@]}" -e '.[torch,triton,ray,postgres,dev]'
    missing=()
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null || missing+=(postgresql)
    if [ "${#missing[@]}" -gt 0 ]; then
        { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; } \
            || echo "bootstrap: could not install ${missing[*]}; their tests will be skipped" >&2
    fi
    ascend_env
    ray_lower_env
else
    "${pip[@]}" -e '.[torch,triton,ray,postgres]'
fi
