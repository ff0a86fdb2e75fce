#!/usr/bin/env bash
# A campaign on the device machine: the service on a SQLite store with the local executor runs a
# plan's jobs and writes the campaign's report. The store is kept in $OUT, so a later call that
# carries it back (as .devrun/gdnval.db) resumes the campaign: a job the call's time limit cut
# short runs again keeping the cases it finished.
#   bash benchmarks/campaign_session.sh PLAN [BACKENDS] [WAIT_S]
#   e.g. bash benchmarks/campaign_session.sh pr-report-1gpu fla,flashqla 540
# Carry `.whl` (as for benchmarks/kernel_session.sh: the service's packages in .whl/py, FLA in
# .whl/fla, FlashQLA's folder in .whl/qla_site.tar.xz); they go into one folder on PYTHONPATH (FLA's
# own switch keeps it from dispatching to FlashQLA; gdn.backends sets it).
# Carry `.devrun` too: `.devrun/git`, the checkout's git folder (`git clone --depth 1`), gives the
# jobs their commit; `.devrun/gdnval.db*`, a previous call's store, resumes its campaign.
# Writes to $OUT: gdnval.db (and -wal, -shm), report.md, campaign.txt (`campaign show`),
# service.log, summary.txt.
set -u
PLAN=${1:?plan name, e.g. pr-report-1gpu}
BACKENDS=${2:-}
WAIT_S=${3:-540}
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
ROOT=$PWD
SITE=/tmp/gdnval-site
if [ ! -d "$SITE" ]; then
    mkdir -p "$SITE"
    [ -f .whl/qla_site.tar.xz ] && xz -dc .whl/qla_site.tar.xz | tar xf - -C "$SITE"
    ls .whl/py/*.whl .whl/fla/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps \
        --no-compile --no-cache-dir --target "$SITE" .whl/py/*.whl .whl/fla/*.whl >>"$OUT/summary.txt" 2>&1
fi
export PYTHONPATH="$ROOT:$SITE"
export GDNVAL_DB_URL="sqlite:///$OUT/gdnval.db" GDNVAL_ARTIFACTS_DIR=/tmp/gdnval-artifacts \
    GDNVAL_MAX_ATTEMPTS=5 GDNVAL_SERVER=http://127.0.0.1:8000
PY=${PY:-python3}
cli() { "$PY" -m service.cli "$@"; }
# a resumed campaign: the store (SQLite with its write-ahead log) and the checkout's git folder
[ -f .devrun/gdnval.db ] && [ ! -f "$OUT/gdnval.db" ] && cp .devrun/gdnval.db* "$OUT/"
# (the device machine's copy of the tree carries a .git of its own: kept aside, not deleted)
if [ -d .devrun/git ]; then
    [ -e .git ] && rm -rf .git.before-devrun && mv .git .git.before-devrun
    cp -r .devrun/git .git
fi
{ nvidia-smi -L; "$PY" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } \
    >>"$OUT/summary.txt" 2>&1
cli db upgrade >>"$OUT/summary.txt" 2>&1 || { echo "db upgrade failed" | tee -a "$OUT/summary.txt"; exit 1; }
cli serve --port 8000 >"$OUT/service.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null' EXIT
for _ in $(seq 60); do curl -sf http://127.0.0.1:8000/healthz >/dev/null && break; sleep 1; done
# the store's newest campaign of the plan (a resumed one), or a new one
newest() {
    "$PY" -c 'import sys, httpx
page = httpx.get("http://127.0.0.1:8000/api/v1/campaigns", params={"plan": sys.argv[1], "limit": 1}).json()
print(page["items"][0]["id"] if page["items"] else "")' "$PLAN"
}
ID=$(newest)
if [ -z "$ID" ]; then
    cli campaign submit --plan "$PLAN" --device "${DEVICE:-cuda}" ${BACKENDS:+--backends "$BACKENDS"} \
        | tee -a "$OUT/summary.txt"
    ID=$(newest)
fi
t0=$SECONDS
while :; do
    cli campaign show "$ID" >"$OUT/campaign.txt" 2>&1
    rc=$?
    [ $rc -ne 3 ] && break
    [ $((SECONDS - t0)) -ge "$WAIT_S" ] && break
    sleep 10
done
echo "campaign $ID: show rc=$rc after $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
cat "$OUT/campaign.txt"
cli campaign report "$ID" --out "$OUT/report.md" | tee -a "$OUT/summary.txt"
