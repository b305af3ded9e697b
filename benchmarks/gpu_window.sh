#!/usr/bin/env bash
# Issue 39's measurements for one GPU window, in priority order, each under its own time limit, so a
# call of at most 10 minutes keeps what finished. Every table and log lands in $OUT.
#
#   on the device:  bash .gpu/on-device.sh && export PYTHONPATH=/tmp/site && bash benchmarks/gpu_window.sh
#   a second call:  bash benchmarks/gpu_window.sh tests
#
# 1. step_measured: the full-depth step at 1k context on the measured kernel choices (every candidate's
#                   time listed), each pass also timed with its kernels as programmatic dependent
#                   launches (--dependent-launch both), each pass profiled by kernel kind: the figures
#                   issue 39 asks for, first
# 2. step:          the same step on the default kernels at 1k and 4k, in its own process: the baseline
#                   to set beside it, and numbers even where a measured choice breaks the first run
# `tests`: the GPU tests of dependent launches, the kernel choices, CUDA graphs and the compiled kernels,
# one pytest each in priority order (COLLECT_ONLY=1: only check that they exist, on any machine).
set -u
out=${OUT:?set OUT to the folder that comes back}
python=${PYTHON:-python3}
summary="$out/summary.txt"

run() {  # run LIMIT_S NAME COMMAND...: its output in $OUT/NAME.log, its exit status in summary.txt
  local limit=$1 name=$2
  shift 2
  echo "== $name (at most ${limit} s): $*"
  PYTHONUNBUFFERED=1 timeout "$limit" "$@" >"$out/$name.log" 2>&1  # unbuffered: a run stopped at its limit keeps its log
  local status=$?
  echo "$name: exit $status$([ $status -eq 124 ] && echo ' (time limit)')" | tee -a "$summary"
  tail -n 3 "$out/$name.log"
}

if [ "${1:-}" = "tests" ]; then
  # newest and never yet run on a GPU first: what a window cut short must not lose. One pytest per
  # entry, each under its own limit, verbose, so a run stopped by the call's limit keeps each result.
  gpu_tests=(
    "150 dependent_launch tests/test_dependent_launch_gpu.py"
    "60 split_merge tests/test_plugin_target_split_gpu.py::test_the_merge_in_the_split_launch_gives_the_two_launch_bits_on_gpu"
    "150 kernel_choice tests/test_kernel_choice_gpu.py"
    "120 fused_layer tests/test_fused_layer_gpu.py"
    "120 cuda_graphs tests/test_cuda_graphs_gpu.py"
    "200 plugin tests/test_plugin_gpu.py"
  )
  if [ -n "${COLLECT_ONLY:-}" ]; then  # on any machine: every entry names tests that exist
    targets=()
    for entry in "${gpu_tests[@]}"; do read -r _ _ target <<<"$entry" && targets+=("$target"); done
    run 120 collect "$python" -m pytest -q --collect-only "${targets[@]}"
    exit 0
  fi
  for entry in "${gpu_tests[@]}"; do
    read -r limit name target <<<"$entry"
    run "$limit" "tests_$name" "$python" -m pytest -v -rfE "$target"
  done
  exit 0
fi
run 330 step_measured "$python" benchmarks/bench_gpu_step.py --repeats 10 --contexts 1024 --loop-contexts 1024 \
  --attention-choice measure --verify-choice measure --linear-choice measure --dependent-launch both --profile \
  --out "$out/step_measured.md"
run 210 step "$python" benchmarks/bench_gpu_step.py --repeats 10 --out "$out/step.md"
