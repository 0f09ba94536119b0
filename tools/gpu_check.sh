#!/usr/bin/env bash
# One prepared GPU check: builds the package in place with the CUDA kernels, runs
# tests/gpu, the seed's examples on CUDA, a level-10 mm_fp4 session and its replay, CUDA
# graphs at levels 5 and 10, the ring's NaN trigger on CUDA tensors and the short
# benchmarks; prints a table of every step and figure. Without a GPU it runs the build
# and the steps that need no device, and says which were skipped.
#
#   tools/gpu_check.sh [OUT]        (or OUT=dir tools/gpu_check.sh; make gpu-check)
#
# Everything it keeps goes under OUT (default ./gpu_check_out): summary.json, junit.xml
# and gpu_check.log. Each step has its own timeout and a failing step never stops the
# rest; the exit status is 1 when any step failed. Variables: PYTHON (default: .venv's
# python if there is one, else python3), FLASHINFER_CUDA_ARCHS (default 90a),
# GPU_CHECK_STEPS (a comma list of steps to run; default all), GPU_CHECK_SCALE (1: the
# benchmarks' short forms; the check stays under 8 minutes on an H100).
set -u
cd "$(dirname "$0")/.."
REPO=$(pwd)

if [ "${1:-}" != "--run-step" ]; then
    OUT=${1:-${OUT:-gpu_check_out}}
    mkdir -p "$OUT"
    OUT=$(cd "$OUT" && pwd)
    LOG=$OUT/gpu_check.log
    : >"$LOG"
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
    trap 'rm -rf "$WORK"' EXIT
    FIG=$WORK/figures
    mkdir -p "$FIG"
    STEPS=$WORK/steps.tsv
    : >"$STEPS"
    if [ -z "${PYTHON:-}" ]; then
        if [ -x .venv/bin/python ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python3; fi
    fi
    export OUT LOG WORK FIG PYTHON REPO
    export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
    export PYTHONUNBUFFERED=1
    export FLASHINFER_CUDA_ARCHS=${FLASHINFER_CUDA_ARCHS:-90a}
    unset FLASHINFER_LOGLEVEL FLASHINFER_DUMP_DIR FLASHINFER_LOGDEST FLASHINFER_DUMP_RING \
        FLASHINFER_DUMP_ON FLASHINFER_NATIVE_LOGGING
fi

say() { printf '%s\n' "$*" | tee -a "$LOG"; }

# The steps, each run as `tools/gpu_check.sh --run-step FUNCTION ARGS` under timeout.
build() {
    # the core from native/ (flashinfer-native), then the mirror's kernels (flashinfer-c)
    (cd native && "$PYTHON" setup.py -q build_ext --inplace --build-temp "$REPO/build/gpu_check") &&
        "$PYTHON" setup.py -q build_ext --inplace --build-temp build/gpu_check &&
        "$PYTHON" -c 'import sys; from flashinfer import _kernels; import flashinfer_native._C
print("flashinfer._kernels: CUDA kernels built:", _kernels.cuda_built)
sys.exit(0 if _kernels.cuda_built or not '"$GPU"' else 1)'
}

pytest_gpu() {
    local per_test=()
    # one hung kernel must not take the whole step (pytest-timeout, where installed)
    "$PYTHON" -c 'import pytest_timeout' 2>/dev/null && per_test=(--timeout 60)
    "$PYTHON" -m pytest -q -p no:cacheprovider -o addopts= "${per_test[@]}" tests/gpu \
        --junitxml="$OUT/junit.xml" -rfEs
}

# The seed's four example scripts as their usage lines say, in a fresh folder (they pick
# CUDA when it is there).
examples() {
    local d=$WORK/examples
    mkdir -p "$d" && cd "$d" || return 1
    FLASHINFER_LOGLEVEL=10 FLASHINFER_DUMP_DIR=./bmm_fp8_dumps "$PYTHON" "$REPO/examples/bmm_fp8_producer.py" || return 1
    "$PYTHON" "$REPO/examples/bmm_fp8_reproducer.py" | tee out1
    grep -q 'Output matches expected result' out1 || return 1
    FLASHINFER_LOGLEVEL=10 FLASHINFER_DUMP_DIR=./batch_decode_dumps "$PYTHON" "$REPO/examples/batch_decode_producer.py" || return 1
    "$PYTHON" "$REPO/examples/batch_decode_reproducer.py" | tee out2
    grep -q 'Summary: 3 passed, 0 failed' out2 || return 1
    if [ "$GPU" = 1 ]; then
        # the recorded tensors came from the GPU
        grep -q '"device": "cuda:0"' bmm_fp8_dumps/*/metadata.jsonl || { echo "no cuda:0 tensor recorded"; return 1; }
    fi
}

# The seed's level-10 mm_fp4 benchmark line, then `flashinfer replay` of its session.
mm_fp4_session() {
    local d=$WORK/mm_fp4
    mkdir -p "$d" && cd "$d" || return 1
    FLASHINFER_LOGLEVEL=10 FLASHINFER_DUMP_DIR=./my_dumps "$PYTHON" "$REPO/benchmarks/flashinfer_benchmark.py" \
        --routine mm_fp4 --m 4 --n 1024 --k 7168 --out_dtype bfloat16 --backends cudnn \
        --use_128x4_sf_layout --use_nvfp4 --refcheck -vv --generate_repro_command --use_cupti \
        --no_cuda_graph --num_iters 5 >bench.txt || { tail -20 bench.txt; return 1; }
    grep -v '^\(Dumped\|Inputs dumped\|Outputs dumped\)' bench.txt | tail -5
    FLASHINFER_LOGLEVEL=0 "$PYTHON" -m flashinfer replay --dir ./my_dumps | tee replay.txt
    grep -Eq '^Summary: [1-9][0-9]* passed, 0 failed' replay.txt
}

serving() {
    [ -f benchmarks/bench_serving.py ] || { echo "benchmarks/bench_serving.py does not exist yet"; return 0; }
    "$PYTHON" benchmarks/bench_serving.py --device cuda --layers 32 --steps 2 --warmup 1 \
        --modes level0,level5,level10,level10-compact,ring-memory --json "$FIG/serving.json"
}

gpu_py() { "$PYTHON" tools/gpu_check.py "$@"; }

if [ "${1:-}" = "--run-step" ]; then
    shift
    "$@"
    exit
fi

if "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>>"$LOG"; then
    GPU=1
    MACHINE=$("$PYTHON" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"{p.name}, {p.multi_processor_count} SMs, {p.total_memory >> 30} GiB, torch {torch.__version__}")')
else
    GPU=0
    MACHINE="no CUDA device ($(uname -m), torch $("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo 'not importable'))"
fi
export GPU
say "== gpu_check: $MACHINE; python $PYTHON; archs $FLASHINFER_CUDA_ARCHS; out $OUT"

wanted() { [ -z "${GPU_CHECK_STEPS:-}" ] || [[ ",$GPU_CHECK_STEPS," == *",$1,"* ]]; }

# step NAME TIMEOUT_S NEEDS_GPU COMMAND...: run COMMAND with its output in the log, and
# record passed / FAILED (exit N) / TIMEOUT / skipped with its seconds.
step() {
    local name=$1 limit=$2 needs_gpu=$3
    shift 3
    if ! wanted "$name"; then return; fi
    if [ "$needs_gpu" = 1 ] && [ "$GPU" = 0 ]; then
        say "-- $name: skipped (needs a CUDA device)"
        printf '%s\tskipped\t0\tneeds a CUDA device\n' "$name" >>"$STEPS"
        return
    fi
    say "-- $name (timeout ${limit}s): $*"
    local t0=$SECONDS status note
    timeout --kill-after=10 "$limit" "$REPO/tools/gpu_check.sh" --run-step "$@" >>"$LOG" 2>&1
    status=$?
    case $status in
        0) note="" ; result=passed ;;
        124|137) note="timed out after ${limit}s" ; result=TIMEOUT ;;
        *) note="exit $status" ; result=FAILED ;;
    esac
    say "   $name: $result $note ($((SECONDS - t0)) s)"
    printf '%s\t%s\t%s\t%s\n' "$name" "$result" "$((SECONDS - t0))" "$note" >>"$STEPS"
}

step build 420 0 build
step tests-gpu 240 0 pytest_gpu
step examples 180 0 examples
step mm-fp4-level10 180 0 mm_fp4_session
step graph 120 1 gpu_py graph --json "$FIG/graph.json"
step ring-nan 120 1 gpu_py ring --json "$FIG/ring.json"
step bench-attention 150 1 gpu_py bench-attention --json "$FIG/attention.json"
step bench-gemm 150 1 gpu_py bench-gemm --json "$FIG/gemm.json"
step bench-stats 90 1 gpu_py bench-stats --json "$FIG/stats.json"
step bench-level10 120 1 gpu_py bench-level10 --json "$FIG/level10.json"
step bench-serving 240 1 serving

gpu_py summary --steps "$STEPS" --figures "$FIG" --machine "$MACHINE" --json "$OUT/summary.json" | tee -a "$LOG"
exit "${PIPESTATUS[0]}"
