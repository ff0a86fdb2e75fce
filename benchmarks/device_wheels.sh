#!/usr/bin/env bash
# Builds `.whl/`, the packages the device sessions carry (benchmarks/campaign_session.sh,
# benchmarks/kernel_session.sh): the device image's python (3.12) has torch, Triton, numpy, click,
# rich, httpx and jinja2, but not the service's packages, FLA or FlashQLA.
#   bash benchmarks/device_wheels.sh
# Writes .whl/py (the service's packages), .whl/fla (FLA 0.6.0) and .whl/qla_site.tar.xz (FlashQLA
# 0.1.3 with TileLang and its needs, unpacked into one folder and compressed to fit the carry limit).
set -euo pipefail
PY=${PY:-python3}
dl() {
    local dest=$1; shift
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 -d "$dest" "$@"
}
mkdir -p .whl/py .whl/fla
dl .whl/py 'fastapi>=0.115,<1' 'starlette<2' 'uvicorn>=0.30,<1' 'sqlalchemy>=2.0.30,<2.2' \
    'alembic>=1.13,<2' mako 'python-multipart>=0.0.9,<1' 'swagger-ui-bundle-v2>=5.31,<6' \
    'pydantic>=2.7,<3' pydantic-core 'pydantic-settings>=2.3,<3' typing-inspection annotated-types \
    python-dotenv opentelemetry-api annotated-doc
dl .whl/fla 'fla-core==0.6.0' 'flash-linear-attention==0.6.0'
if [ ! -f .whl/qla_site.tar.xz ]; then
    tmp=$(mktemp -d)
    dl "$tmp/w" 'flash-qla==0.1.3' 'tilelang==0.1.15' 'apache-tvm-ffi==0.1.12' \
        'torch-c-dlpack-ext==0.1.5' 'z3-solver==4.15.4.0'
    mkdir -p "$tmp/site"
    for w in "$tmp"/w/*.whl; do "$PY" -m zipfile -e "$w" "$tmp/site"; done
    tar cf - -C "$tmp/site" . | xz -9 -T2 > "$tmp/qla_site.tar.xz"
    mv "$tmp/qla_site.tar.xz" .whl/qla_site.tar.xz  # whole or not at all: a rerun skips an existing one
    rm -rf "$tmp"
fi
du -sh .whl/py .whl/fla .whl/qla_site.tar.xz
