#!/usr/bin/env bash
# One device call for the GDN kernels: ours beside FLA 0.6.0 and FlashQLA 0.1.3, each backend in
# its own process (benchmarks/bench_gdn_peers.py), plus the GPU kernel tests. Logs and JSON go to
# $OUT (or ./device-out); a short table is printed last.
#   bash benchmarks/kernel_session.sh step ...
#   steps: gputest[:EXPR]     tests/kernels/test_kernels_gpu.py, only the tests pytest's -k EXPR selects if
#                             given (needs the pydantic wheels in .whl/py)
#          ours[:LENS[:HEADS]] ours at the default settings (LENS e.g. 8192,65536; HEADS 32,16)
#          sweep:LENS:NAME=JSON;NAME=JSON...   ours under config overrides (KernelConfig fields) beside
#                             the defaults, Hqk = SWEEP_HEADS (default 32), one seed
#          call[:LENS[:HEADS]] the one-call measurement (benchmarks/gdn_one_call.py): ours, FLA and FlashQLA in
#                             turns, PROCS (default 3) processes each, at LENS (default 16384,32768,65536),
#                             HEADS (default 32,16), accuracy CALL_SEEDS (default 0,1,2) for ours, VARIANTS
#                             ('NAME=JSON;...') of ours in its first VARIANT_PROCS (default 1) processes, at
#                             VARIANT_LENS (default LENS); cut at CALL_LIMIT s (default 540); $OUT/call.json.
#                             Warm first (FLA's autotuning and FlashQLA's compiles take minutes cold): a `warm`
#                             call just before, on the same machine (COMMIT: the commit measured, for a tree
#                             copied without .git)
#          warm[:LENS[:HEADS]] one untimed process of each backend at once at LENS (default 16384), filling
#                             the on-disk caches (Triton's, autotuning included, and TileLang's) for `call`
#          fla[:LENS[:HEADS]] | qla[:LENS[:HEADS]]   the peers (wheels: .whl/fla/*.whl, .whl/qla_site.tar.xz);
#                             on a fresh machine FLA autotunes ~2.5 min per head layout (fla: cut at 560 s,
#                             best alone in its call)
#          repro[:T]          benchmarks/stage_repro_probe.py twice-run comparison, stage by stage, on the
#                             gdn-op 16K packed batch (or one dense sequence of T rows), Hqk 16 / Hv 32,
#                             under SET (JSON of KernelConfig overrides)
#          prof:T:BACKEND     per-kernel GPU time of one fwd+bwd (mean of 5) at T, 32/32
#          stages:T:HEADS[:KNOBS]   ours per stage (benchmarks/profile_gdn_stages.py), sweeping KNOBS
#                             (comma-separated config fields; "-" for none), HEADS = Hqk,Hv
#          gdnop:LIMIT[:ONLY,...]   the gdn-op suite's full preset (benchmarks/run_suite.py) with
#                             BACKENDS (default triton, fla, flashqla) in one process, FLA the baseline,
#                             only the cases whose name contains one of ONLY; cut at LIMIT seconds
#                             (each case is written as it ends). Cold: ~2-3 min of FLA autotuning and
#                             FlashQLA compiles per head layout
#          timing[:LENS]       the gdn-op suite's fwd+bwd beside do_bench of each backend's own call
#                             (benchmarks/timing_check.py; LENS default 16384,65536; stateful, 32/32):
#                             the three backends compile at once (untimed, filling the on-disk caches),
#                             then each is timed alone, in its own process; $OUT/timing.json, ~400 s cold;
#                             TIMING_BACKENDS (default "triton fla flashqla") names fewer, to run again
#          suite:NAME:PRESET:LIMIT   any suite on one GPU (benchmarks/run_suite.py), parameter overrides
#                             from PARAMS (';'-separated key=value), e.g. the cp-layer emulation over
#                             FlashQLA: PARAMS='candidates=["p2p_emulated+flashqla"]' ... suite:cp-layer:gate:400
# Environment: SEEDS (accuracy seeds, default 0), REP (do_bench ms, default 200), GPUTEST_LIMIT (s,
# default 330), SET (JSON of
# KernelConfig overrides for ours' default settings in the ours/sweep/prof/stages/call steps),
# STAGES_LIMIT (s, default 200) and TUNING_OUT (a file for the best overrides a stages sweep found).
# Carry `.whl`. FLA runs from a folder without flash_qla and with FLA_FLASH_QLA=0 (FLA 0.6.0 would
# otherwise run FlashQLA); FlashQLA compiles its TileLang kernels on first use (~2 min cold).
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SEEDS=${SEEDS:-0}
REP=${REP:-200}
DEFAULT_LENS=8192,16384,32768,65536
ROOT=$PWD

setup_fla() {
    [ -d /tmp/site_fla ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target /tmp/site_fla .whl/fla/*.whl >>"$OUT/summary.txt" 2>&1
}
setup_qla() {
    [ -d /tmp/site_qla ] || { mkdir -p /tmp/site_qla && xz -dc .whl/qla_site.tar.xz | tar xf - -C /tmp/site_qla; }
}
setup_py() {
    [ -d /tmp/site_py ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target /tmp/site_py .whl/py/*.whl >>"$OUT/summary.txt" 2>&1
}

timing_check() {  # limit, backend, extra PYTHONPATH, args... (FLA_FLASH_QLA from the caller)
    local limit=$1 backend=$2 path=$3
    shift 3
    PYTHONPATH="$ROOT:/tmp/site_py${path:+:$path}" timeout "$limit" python3 benchmarks/timing_check.py \
        --backends "$backend" --out "$OUT/timing.json" "$@" 2>&1 | grep -v TileLang >>"$OUT/timing.log"
    echo "timing $backend${*:+ $*} rc=${PIPESTATUS[0]}" | tee -a "$OUT/summary.txt"
}

# backend, lens, limit, args...: FLA from a folder without flash_qla and with its switch off,
# FlashQLA from its own folder, ours from the tree
timing_backend() {
    local b=$1 lens=$2 limit=$3
    shift 3
    case $b in
        fla) FLA_FLASH_QLA=0 timing_check "$limit" fla /tmp/site_fla --seq-lens "$lens" "$@" ;;
        flashqla) timing_check "$limit" flashqla /tmp/site_qla --seq-lens "$lens" "$@" ;;
        *) timing_check "$limit" "$b" "" --seq-lens "$lens" "$@" ;;
    esac
}

gputest() {  # limit, pytest -k expression (empty: every test)
    local t0=$SECONDS sel=()
    setup_py
    [ -n "$2" ] && sel=(-k "$2")
    PYTHONPATH="$ROOT:/tmp/site_py" timeout "$1" python3 -m pytest -q -p no:cacheprovider -m gpu "${sel[@]}" \
        tests/kernels/test_kernels_gpu.py >>"$OUT/gputest.log" 2>&1
    echo "gputest${2:+:$2} rc=$? took=$((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
    tail -n 5 "$OUT/gputest.log"
}

bench() {  # tag, limit, backend, extra PYTHONPATH, args...
    local tag=$1 limit=$2 backend=$3 path=$4
    shift 4
    local t0=$SECONDS json="$OUT/$tag.json"
    case $tag in prof_*) json="/tmp/$tag.json" ;; esac  # at most 8 files come back: profiles print only
    PYTHONPATH="$ROOT${path:+:$path}" timeout "$limit" python3 benchmarks/bench_gdn_peers.py --backend "$backend" \
        --accuracy-seeds "$SEEDS" --rep "$REP" --out "$json" ${SET:+--set "$SET"} "$@" 2>&1 | tee -a "$OUT/bench.log"
    echo "$tag rc=${PIPESTATUS[0]} took=$((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
}

{ nvidia-smi -L; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } \
    >>"$OUT/summary.txt" 2>&1
for step in "$@"; do
    IFS=: read -r kind a b <<<"$step"
    case $kind in
        gputest)
            gputest "${GPUTEST_LIMIT:-330}" "$a" ;;
        ours) bench ours 400 ours "" --repro --seq-lens "${a:-$DEFAULT_LENS}" --qk-heads "${b:-32,16}" ;;
        sweep)
            args=()
            IFS=';' read -ra vs <<<"$b"
            for v in "${vs[@]}"; do args+=(--variant "$v"); done
            bench sweep 400 ours "" --seq-lens "$a" --qk-heads "${SWEEP_HEADS:-32}" --repro "${args[@]}" ;;
        warm)
            export TRITON_CACHE_AUTOTUNING=1  # FLA autotunes once here; `call` reads the choice back
            setup_fla; setup_qla
            t0=$SECONDS
            wargs=()
            IFS=';' read -ra vs <<<"${WARM_SET:-}"
            for v in "${vs[@]}"; do wargs+=(--variant "$v"); done
            for bk in ours fla flashqla; do
                path=""
                [ "$bk" = fla ] && path=/tmp/site_fla
                [ "$bk" = flashqla ] && path=/tmp/site_qla
                FLA_FLASH_QLA=0 PYTHONPATH="$ROOT${path:+:$path}" timeout 400 python3 benchmarks/bench_gdn_peers.py \
                    --backend "$bk" --seq-lens "${a:-16384}" --qk-heads "${b:-32,16}" --accuracy-seeds "" --rep 1 \
                    --warmup 1 --out "/tmp/warm_$bk.json" "${wargs[@]}" >"$OUT/warm_$bk.log" 2>&1 &
            done
            wait
            echo "$step took=$((SECONDS - t0))s" | tee -a "$OUT/summary.txt" ;;
        call)
            export TRITON_CACHE_AUTOTUNING=1
            setup_fla; setup_qla
            t0=$SECONDS
            vargs=()
            IFS=';' read -ra vs <<<"${VARIANTS:-}"
            for v in "${vs[@]}"; do vargs+=(--variant "$v"); done
            PYTHONPATH=$ROOT timeout "${CALL_LIMIT:-540}" python3 benchmarks/gdn_one_call.py --out "$OUT/call.json" \
                --seq-lens "${a:-16384,32768,65536}" --qk-heads "${b:-32,16}" --processes "${PROCS:-3}" \
                --accuracy-seeds "${CALL_SEEDS:-0,1,2}" --rep "$REP" --fla-path /tmp/site_fla --qla-path /tmp/site_qla \
                --deadline "$((${CALL_LIMIT:-540} - 15))" --variant-processes "${VARIANT_PROCS:-1}" "${vargs[@]}" \
                ${VARIANT_LENS:+--variant-seq-lens "$VARIANT_LENS"} \
                ${COMMIT:+--commit "$COMMIT"} ${SET:+--set "$SET"} \
                2>&1 | tee -a "$OUT/call.log"
            echo "$step rc=${PIPESTATUS[0]} took=$((SECONDS - t0))s" | tee -a "$OUT/summary.txt" ;;
        fla) setup_fla; FLA_FLASH_QLA=0 bench fla 560 fla /tmp/site_fla --seq-lens "${a:-$DEFAULT_LENS}" --qk-heads "${b:-32,16}" ;;
        repro)
            t0=$SECONDS
            shape=(--packed 1,63,64,65,1000,3000,4096,8095)
            [ -n "$a" ] && shape=(--seq-len "$a")
            PYTHONPATH=$ROOT timeout 200 python3 benchmarks/stage_repro_probe.py "${shape[@]}" --qk-heads 16 --v-heads 32 \
                ${SET:+--set "$SET"} 2>&1 | tee -a "$OUT/repro.log"
            echo "$step ${SET:-} rc=${PIPESTATUS[0]} took=$((SECONDS - t0))s" | tee -a "$OUT/summary.txt" ;;
        qla) setup_qla; bench qla 420 flashqla /tmp/site_qla --seq-lens "${a:-$DEFAULT_LENS}" --qk-heads "${b:-32,16}" ;;
        prof)
            path=""
            [ "$b" = fla ] && { setup_fla; path=/tmp/site_fla; }
            [ "$b" = flashqla ] && { setup_qla; path=/tmp/site_qla; }
            FLA_FLASH_QLA=0 bench "prof_$b" 200 "$b" "$path" --seq-lens "$a" --qk-heads 32 --profile "$a" ;;
        stages)
            IFS=: read -r _ len heads knobs <<<"$step"
            t0=$SECONDS
            sweep=()
            [ "${knobs:--}" != - ] && sweep=(--sweep --knobs "$knobs")
            PYTHONPATH=$ROOT timeout "${STAGES_LIMIT:-200}" python3 benchmarks/profile_gdn_stages.py --seq-len "$len" \
                --qk-heads "${heads%,*}" --v-heads "${heads#*,}" ${SET:+--set "$SET"} "${sweep[@]}" \
                ${TUNING_OUT:+--write-tuning "$TUNING_OUT"} 2>&1 | tee -a "$OUT/stages.log"
            echo "$step rc=${PIPESTATUS[0]} took=$((SECONDS - t0))s" | tee -a "$OUT/summary.txt" ;;
        gdnop)
            setup_py; setup_fla; setup_qla
            t0=$SECONDS n=$((${n:-0} + 1))
            only=()
            IFS=, read -ra pats <<<"$b"
            for pat in "${pats[@]}"; do only+=(--only "$pat"); done
            PYTHONPATH="$ROOT:/tmp/site_py:/tmp/site_fla:/tmp/site_qla" timeout "$a" python3 benchmarks/run_suite.py \
                --preset full --device cuda --out "$OUT/gdnop_$n.json" \
                --set "backends=${BACKENDS:-[\"triton\",\"fla\",\"flashqla\"]}" "${only[@]}" 2>&1 \
                | grep -v TileLang | tee "$OUT/gdnop_$n.log"
            echo "$step rc=${PIPESTATUS[0]} took=$((SECONDS - t0))s" | tee -a "$OUT/summary.txt" ;;
        timing)
            setup_py; setup_fla; setup_qla
            t0=$SECONDS lens=${a:-16384,65536}
            read -ra which <<<"${TIMING_BACKENDS:-triton fla flashqla}"
            for b in "${which[@]}"; do  # untimed compiles of every backend at once
                timing_backend "$b" "$lens" 200 --compile-only &
            done
            wait
            for b in "${which[@]}"; do  # then each timed alone
                timing_backend "$b" "$lens" "$([ "$b" = triton ] && echo 50 || echo 70)"
            done
            PYTHONPATH=$ROOT python3 benchmarks/timing_check.py --print --out "$OUT/timing.json" | tee -a "$OUT/summary.txt"
            echo "$step took=$((SECONDS - t0))s" | tee -a "$OUT/summary.txt" ;;
        suite)
            IFS=: read -r _ name preset limit <<<"$step"
            setup_py; setup_fla; setup_qla
            t0=$SECONDS n=$((${n:-0} + 1))
            sets=()
            IFS=';' read -ra kvs <<<"${PARAMS:-}"
            for kv in "${kvs[@]}"; do sets+=(--set "$kv"); done
            PYTHONPATH="$ROOT:/tmp/site_py:/tmp/site_fla:/tmp/site_qla" timeout "$limit" python3 benchmarks/run_suite.py \
                --suite "$name" --preset "$preset" --device cuda --out "$OUT/${name}_$n.json" "${sets[@]}" 2>&1 \
                | grep -v TileLang | tee "$OUT/${name}_$n.log"
            echo "$step rc=${PIPESTATUS[0]} took=$((SECONDS - t0))s" | tee -a "$OUT/summary.txt" ;;
        *) echo "unknown step $step" | tee -a "$OUT/summary.txt" ;;
    esac
done
cat "$OUT/summary.txt"
