#!/usr/bin/env bash
# The GPU measurements issue 35 owes, in one device call (a lease is 15 minutes, a call at most 10): the
# side-by-side at 1.3B (under both NVML energy meters), the trainer's profile, Megatron-LM beside the
# built-in trainer through the harness, the side-by-side at hidden 4096 and on four Llama 3 8B layers.
# Each stage has a cap and never runs past DEADLINE_S (default 575 s) from the start. Output:
# $OUT/summary.txt (everything printed) and $OUT/bundle.tgz (each stage's logs and JSON), rewritten after
# every stage so a call stopped from outside keeps what was measured.
#
#   bash benchmark/perf/gpu_owed.sh [MEGATRON_TARBALL]      (run from the repository root)
#
# A rehearsal on CPU runs every stage at tiny sizes (the test does):
#   DEVICE=cpu MAIN_SIZE=tiny WIDE_SIZE=tiny LLAMA_SIZE=llama-tiny HARNESS_SYSTEM=local bash benchmark/perf/gpu_owed.sh
set -u
ROOT=$(pwd)
OUT=${OUT:-/tmp/gpu-owed}
DEADLINE=$(( $(date +%s) + ${DEADLINE_S:-575} ))
WORK=/tmp/gpu-owed-work
mkdir -p "$OUT" "$WORK"
export PYTHONPATH=$ROOT/src:$ROOT/benchmark/perf PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
PERF=$ROOT/benchmark/perf
DEVICE=${DEVICE:-cuda} MAIN_SIZE=${MAIN_SIZE:-1.3b} WIDE_SIZE=${WIDE_SIZE:-4096} LLAMA_SIZE=${LLAMA_SIZE:-llama3-8b-4l}
HARNESS_SYSTEM=${HARNESS_SYSTEM:-local-gpu}
exec > >(tee -a "$OUT/summary.txt") 2>&1

bundle() { tar czf "$OUT/bundle.tgz" -C "$WORK" . 2>/dev/null; }
# stage NAME CAP_S COMMAND...: runs COMMAND for at most CAP_S seconds and never past the deadline
stage() {
    local name=$1 cap=$2 left
    shift 2
    left=$(( DEADLINE - $(date +%s) - 10 ))
    (( cap > left )) && cap=$left
    if (( cap < 20 )); then
        echo "=== $name: skipped, ${left}s left"
        return
    fi
    echo "=== $name (at most ${cap}s) $(date -u +%T)"
    local began=$(date +%s)
    timeout --kill-after=5 "$cap" "$@"
    echo "=== $name: exit $? after $(( $(date +%s) - began ))s"
    bundle
}

echo "=== environment $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv
python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'nccl', torch.cuda.nccl.version())"
python3 -c "import pynvml; print('nvidia-ml-py', pynvml.__version__ if hasattr(pynvml, '__version__') else 'present')"
python3 -c "import transformer_engine" 2>/dev/null && echo "transformer_engine: present" || echo "transformer_engine: absent"
python3 -c "import apex" 2>/dev/null && echo "apex: present" || echo "apex: absent"
if [ -n "${1:-}" ]; then
    mkdir -p /tmp/mlm && tar xzf "$1" -C /tmp/mlm
    MEGATRON_LM_REPO=$(ls -d /tmp/mlm/*/ | head -n 1)
    export MEGATRON_LM_REPO=${MEGATRON_LM_REPO%/}
    export PYTHONPATH=$PYTHONPATH:$MEGATRON_LM_REPO
    python3 -c "import megatron.core as m; print('megatron-core', m.__version__, 'from', m.__file__)"
    # Megatron-LM compiles its dataset helpers with make at start; where this machine cannot, a build
    # for this Python carried beside the tarball takes their place
    make -s -C "$MEGATRON_LM_REPO/megatron/core/datasets" || cp -v "$(dirname "$1")"/helpers_cpp*.so "$MEGATRON_LM_REPO/megatron/core/datasets/"
fi

stage "side by side at $MAIN_SIZE, under both energy meters" 230 \
    python3 "$PERF/energy_meters.py" --window 10 --json "$WORK/energy-main.json" -- \
    python3 "$PERF/gpu_side_by_side.py" --size "$MAIN_SIZE" --device "$DEVICE" --repeats 2 --iters 10 --budget-s 200 \
    --peers builtin,megatron-core,torch-compile,builtin-mbs2x,torch-eager \
    --json "$WORK/sbs-main.json" --logs "$WORK/logs-main"

mapfile -t PROFILE_FLAGS < <(python3 -c "import gpu_side_by_side as g; import sys; print('\n'.join(g.builtin_flags(sys.argv[1], 8, sys.argv[2])))" "$MAIN_SIZE" "$DEVICE")
stage "profile of the built-in trainer at $MAIN_SIZE" 75 \
    python3 -m nlp_bench.train "${PROFILE_FLAGS[@]}" --profile --use-pytorch-profiler \
    --profile-step-start 5 --profile-step-end 7 --tensorboard-dir /tmp/gpu-owed-profile
cp /tmp/gpu-owed-profile/profile_rank0.json "$WORK/" 2>/dev/null && python3 - "$WORK/profile_rank0.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
print(f"profile: {p['wall_ms_per_step']:.1f} ms per step ({p['basis']})")
for name, c in p["categories"].items():
    print(f"  {name:18} {c['ms_per_step']:8.1f} ms {100 * c['share']:5.1f}%")
for k in p.get("top", []):
    print(f"  {k['ms_per_step']:8.2f} ms {100 * k['share']:5.1f}% {k['category']:16} {k['name'][:90]}")
PY

if [ -n "${MEGATRON_LM_REPO:-}" ]; then
    stage "Megatron-LM beside the built-in trainer through the harness" 170 \
        python3 -m nlp_bench.cli sweep benchmark/grids/trainers-1gpu.yaml --system "$HARNESS_SYSTEM" --hang-timeout 120
    RUN=$(ls -d results/nlp/*/ 2>/dev/null | tail -n 1)
    if [ -n "$RUN" ]; then
        python3 -m nlp_bench.cli result table "$RUN"
        python3 -m nlp_bench.cli result compare trainers "$RUN"
        python3 -m nlp_bench.cli result table "$RUN" --wide --format json > "$WORK/harness-table.json" 2>&1
        mkdir -p "$WORK/harness"
        for d in "$RUN"*/; do
            p=$(basename "$d"); mkdir -p "$WORK/harness/$p"
            cp "$d"/*.json "$d"/*.args "$d"/jobscript.sbatch "$WORK/harness/$p/" 2>/dev/null
            for f in "$d"/*.out "$d"/*.err "$d"/*.log; do [ -f "$f" ] && tail -c 200000 "$f" > "$WORK/harness/$p/$(basename "$f")"; done
        done
        bundle
    fi
fi

stage "side by side at $WIDE_SIZE" 130 \
    python3 "$PERF/gpu_side_by_side.py" --size "$WIDE_SIZE" --device "$DEVICE" --repeats 2 --iters 8 --budget-s 115 \
    --peers builtin,megatron-core,torch-compile --json "$WORK/sbs-wide.json" --logs "$WORK/logs-wide"

stage "side by side on four Llama 3 8B layers" 90 \
    python3 "$PERF/gpu_side_by_side.py" --size "$LLAMA_SIZE" --device "$DEVICE" --repeats 2 --iters 6 --budget-s 80 \
    --peers builtin,megatron-core --json "$WORK/sbs-llama.json" --logs "$WORK/logs-llama"

echo "=== done $(date -u +%T), $(( DEADLINE - $(date +%s) ))s before the deadline"
bundle
