#!/usr/bin/env bash
# One device-machine session: GPU tests, the runner on CUDA, a short network check and the
# dg/dbeta precision probe. Each step has its own time limit; logs go to $OUT (or ./device-out).
#   bash benchmarks/device_session.sh [step ...]
#   steps: tests capability gdnop network precision cpgpu gatespeed determinism cpprec
#          gdnopfull:T[,T...][:limit_s]   (the gdn-op full matrix at those lengths, JSON in $OUT)
#          net200:SEQ:limit_s[:nodet] netspeed   (the network full preset: 200-step trajectory; speed)
#          netfloor:SEQ:limit_s   (the same trajectory with an eager chunk-32 candidate: the rounding floor)
#          (NET_LR=X in the environment: both at AdamW lr X instead of the preset's; reference
#          file .refs/net200_SEQ_lrX.json)
#          detprobe   (what breaks bitwise reproducibility on the GPU)
#          gdnacc:T,..:limit_s gdnspeed:T,..:limit_s precgroups
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(tests capability gdnop precision network)

run_step() {  # name, limit (s), command...
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >"${LOGDIR:-$OUT}/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc ${limit}s-limit took=$((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
    tail -n 6 "${LOGDIR:-$OUT}/$name.log"
}

{ nvidia-smi -L; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } \
    >"$OUT/summary.txt" 2>&1
for step in "${steps[@]}"; do
    case $step in
        tests) run_step tests 150 python3 -m pytest -q -p no:cacheprovider -m "gpu and not slow" \
            tests/kernels/test_kernels_gpu.py tests/gdn/test_cp_gpu.py tests/gdn/test_device.py ;;
        capability) run_step capability 50 python3 -m service.cli run capability --device cuda ;;
        gdnop) run_step gdnop 80 python3 -m service.cli run gdn-op --preset quick --device cuda ;;
        network) run_step network 120 python3 -m service.cli run network --preset gate --device cuda \
            --param steps=20 --param warmup=2 --param repeat=5 --json "$OUT/network_gate.json" ;;
        precision)
            # at most 8 files come back from the device: JSON and tuning files stay in /tmp
            for mode in tf32x3 ieee; do
                echo "{\"f32_dot\": \"$mode\", \"f32_dot_tm\": \"\", \"f32_dot_wu\": \"\", \"f32_dot_wy_dt\": \"\", \"f32_dot_wy_da\": \"\", \"f32_dot_wy_dx\": \"\"}" \
                    >"/tmp/tuning_$mode.json"
                run_step "precision_$mode" 40 python3 benchmarks/run_suite.py --preset full --device cuda \
                    --out "/tmp/precision_$mode.json" --only T8192_stateless_hqk32 --set timing=False \
                    --set "backends=('triton',)" --tuning "/tmp/tuning_$mode.json"
                python3 -c 'import json, sys
for name, case in json.load(open(sys.argv[1]))["cases"].items():
    print(name, {m: f"{v:.2e}" for m, v in sorted(case["worst_rel_l2"].items())})' \
                    "/tmp/precision_$mode.json" | tee -a "$OUT/precision_$mode.log"
            done ;;
        cpgpu) run_step cpgpu 110 python3 -m pytest -q -p no:cacheprovider -m gpu -s tests/gdn/test_cp_gpu.py ;;
        gatespeed) run_step gatespeed 80 python3 -m service.cli run gdn-op --preset gate --device cuda \
            --param 'backends=["triton","fla"]' ;;
        determinism) run_step determinism 60 python3 -m service.cli run network --preset gate --device cuda \
            --param trajectory=false --param speed=false ;;
        cpprec) run_step cpprec 170 python3 benchmarks/cp_layer_precision.py --seq-lens 8192 32768 ;;
        gdnopfull:*)
            # eager is timed 1+3 (it takes ~1 s per fwd+bwd at 64K); --deadline keeps what finished
            IFS=: read -r _ lens limit <<<"$step"
            limit=${limit:-300}
            tag=${lens//,/_}
            run_step "gdnop_$tag" "$limit" python3 -m service.cli run gdn-op --preset full --device cuda \
                --param "seq_lens=[$lens]" --param eager_warmup=1 --param eager_repeat=3 \
                --deadline $((limit - 15)) --json "$OUT/gdnop_$tag.json" ;;
        net200:* | netfloor:*)
            # net200: the full preset's 200-step trajectory (checkpoint off), then the determinism
            # pair unless a fourth field says "nodet". netfloor: the same trajectory with an eager
            # candidate whose GDN chunk is 32 (the rounding floor) against the same reference. The
            # eager reference is kept in .refs/ (carry it to reuse it: `carry: [".refs"]`) and
            # copied to $OUT, so a later call runs only the candidate. Without one in .refs/ the
            # one recorded in benchmarks/results/ seeds it (a key that differs fails the step and
            # names the field; RECOMPUTE_REF=1 skips the seed).
            IFS=: read -r kind seq limit det <<<"$step"
            extra=(--param "determinism=$([ "${det:-}" = nodet ] && echo false || echo true)")
            [ "$kind" = netfloor ] && extra=(--param determinism=false --param backend=eager
                                             --param candidate_chunk_size=32)
            [ -n "${NET_LR:-}" ] && extra+=(--param "lr=$NET_LR")  # another learning rate (own reference)
            ref=net200_$seq${NET_LR:+_lr$NET_LR}.json
            mkdir -p .refs
            [ -f ".refs/$ref" ] || [ -n "${RECOMPUTE_REF:-}" ] || [ ! -f "benchmarks/results/reference_$ref" ] ||
                cp "benchmarks/results/reference_$ref" ".refs/$ref"
            run_step "${kind}_$seq" "$limit" python3 -m service.cli run network --preset full --device cuda \
                --param speed=false --param 'checkpoints=["off"]' --param "seq_len=$seq" "${extra[@]}" \
                --param "reference_file=$PWD/.refs/$ref" \
                --deadline $((limit - 10)) --json "$OUT/${kind}_$seq.json"
            [ -f ".refs/$ref" ] && cp ".refs/$ref" "$OUT/reference_$ref" ;;
        detprobe) run_step detprobe 150 python3 benchmarks/determinism_probe.py --seq-len 2048 ;;
        netspeed) run_step netspeed 150 python3 -m service.cli run network --preset full --device cuda \
            --param trajectory=false --param determinism=false --deadline 140 --json "$OUT/netspeed.json" ;;
        gdnacc:*)
            # the accuracy matrix alone: triton against the fp32 reference, three seeds, no timing
            IFS=: read -r _ lens limit <<<"$step"
            run_step gdnacc "$limit" python3 -m service.cli run gdn-op --preset full --device cuda \
                --param "seq_lens=[$lens]" --param 'backends=["triton"]' --param timing=false \
                --deadline $((limit - 10)) --json "$OUT/gdnacc.json" ;;
        gdnspeed:*)
            # speed and memory beside FLA, stateful Hqk = Hv = 32, no accuracy
            IFS=: read -r _ lens limit <<<"$step"
            run_step gdnspeed "$limit" python3 -m service.cli run gdn-op --preset full --device cuda \
                --param "seq_lens=[$lens]" --param 'backends=["triton","fla"]' --param 'modes=["stateful"]' \
                --param 'qk_heads=[32]' --param accuracy_max_seq_len=0 \
                --deadline $((limit - 10)) --json "$OUT/gdnspeed.json" ;;
        precgroups)
            # the named dot groups at tf32, the rest tf32x3: accuracy (1 seed) and time at 8K
            for v in wu,wy_dx,wy_dt wy_da wu,wy_dx; do
                python3 -c 'import json, sys
tf32 = sys.argv[1].split(",")
print(json.dumps({f"f32_dot_{g}": "tf32" if g in tf32 else "tf32x3" for g in ("tm", "wu", "wy_dt", "wy_da", "wy_dx")}))' \
                    "$v" >"/tmp/tuning_$v.json"
                LOGDIR=/tmp run_step "prec_$v" 45 python3 benchmarks/run_suite.py --preset full --device cuda \
                    --out "/tmp/prec_$v.json" --only T8192_stateless_hqk32 --set "backends=('triton',)" \
                    --set "accuracy_seeds=(0,)" --tuning "/tmp/tuning_$v.json"
                python3 -c 'import json, sys
for name, case in json.load(open(sys.argv[1]))["cases"].items():
    m, w = case["median"], case["worst_rel_l2"]
    print(sys.argv[2], name, "fwd_bwd_ms", m.get("triton_fwd_bwd_ms"), {k: f"{x:.2e}" for k, x in sorted(w.items())})' \
                    "/tmp/prec_$v.json" "$v" | tee -a "$OUT/precgroups.log"
            done ;;
        *) echo "unknown step $step" | tee -a "$OUT/summary.txt" ;;
    esac
done
cat "$OUT/summary.txt"
