#!/usr/bin/env bash
# The GPU measurements the planner (issue 34) owes, in one device call: the layer-GEMM curve at the
# 512-token chunks tensor-parallel overlap runs, in BF16 and FP8; a layer's GEMMs held for a minute (does
# the rate the planner divides by hold under a long load?); and the fixed cost of a layer (the intercept of
# its time against tokens). Everything printed goes to $OUT/summary.txt, each stage's JSON beside it; the
# exit status is 1 where a stage failed.
#
#   bash benchmark/perf/gpu_planner_owed.sh        (from the repository root; DEVICE=cpu SMALL=1 rehearses)
set -u
OUT=${OUT:-/tmp/gpu-planner-owed}
mkdir -p "$OUT"
PERF=$(pwd)/benchmark/perf
exec > >(tee -a "$OUT/summary.txt") 2>&1
DEVICE=${DEVICE:-cuda}
# the rehearsal's token counts are small too: FP8 GEMMs on a CPU are emulated at about 1e-4 TFLOP/s, so 8192
# tokens alone outlast the stage's cap on a busy machine
TOKENS=512,2048,8192
if [ -n "${SMALL:-}" ]; then
    TOKENS=64,128
    RATES=(--hidden 64 --tp 1,2 --square 64 --copy-mib 1 --repeats 2)
    HOLD=(--hidden 128 --tp 2 --tokens 64 --seconds 1 --window 0.5)
    LAYER=(--hidden 64,128 --heads 4,8 --tp 1,2 --seq 32 --mbs 1,2 --layers 1 --repeats 2)
else
    RATES=() HOLD=() LAYER=(--hidden 4096,12288,12288 --heads 32,96,96 --tp 1,4,8)
fi
FAILED=0
stage() {
    local name=$1 cap=$2 rc
    shift 2
    echo "=== $name (at most ${cap}s) $(date -u +%T)"
    local began=$(date +%s)
    timeout --kill-after=5 "$cap" "$@"
    rc=$?
    echo "=== $name: exit $rc after $(( $(date +%s) - began ))s"
    (( rc == 0 )) || FAILED=$(( FAILED + 1 ))
}
echo "=== environment $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv 2>/dev/null
python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
stage "layer GEMMs at 512, 2048 and 8192 tokens" 120 \
    python3 "$PERF/gemm_rates.py" --device "$DEVICE" --tokens "$TOKENS" "${RATES[@]}" --json "$OUT/gemm_rates_tokens.json"
stage "BF16 layer GEMMs held for a minute" 90 \
    python3 "$PERF/gemm_sustained.py" --device "$DEVICE" --dtype bf16 "${HOLD[@]}" --json "$OUT/sustained_bf16.json"
stage "FP8 layer GEMMs held for 45 s" 75 \
    python3 "$PERF/gemm_sustained.py" --device "$DEVICE" --dtype fp8 --seconds 45 "${HOLD[@]}" --json "$OUT/sustained_fp8.json"
stage "a layer's fixed cost" 120 \
    python3 "$PERF/layer_fixed_cost.py" --device "$DEVICE" "${LAYER[@]}" --json "$OUT/layer_fixed_cost.json"
echo "=== $FAILED stage(s) failed"
exit $(( FAILED > 0 ))
