#!/usr/bin/env bash
# Issue 39's measurements for one GPU window, in priority order, each under its own time limit, so a
# call of at most 10 minutes keeps what finished. Every table and log lands in $OUT.
#
#   on the device:  bash .gpu/on-device.sh && export PYTHONPATH=/tmp/site && bash benchmarks/gpu_window.sh
#   a second call:  bash benchmarks/gpu_window.sh tests
#
# 1. step:          the full-depth step on the default kernels, each pass profiled by kernel kind (the baseline)
# 2. choices:       what --attention-choice / --verify-choice measure pick at Qwen3-8B's shapes, every candidate timed
# 3. step_measured: the full-depth step at 1k context on the measured choices, each pass also timed with
#                   its kernels as programmatic dependent launches (--dependent-launch both)
# `tests`: the GPU tests of the kernel choices, CUDA graphs and the compiled kernels.
set -u
out=${OUT:?set OUT to the folder that comes back}
python=${PYTHON:-python3}
summary="$out/summary.txt"

run() {  # run LIMIT_S NAME COMMAND...: its output in $OUT/NAME.log, its exit status in summary.txt
  local limit=$1 name=$2
  shift 2
  echo "== $name (at most ${limit} s): $*"
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local status=$?
  echo "$name: exit $status$([ $status -eq 124 ] && echo ' (time limit)')" | tee -a "$summary"
  tail -n 3 "$out/$name.log"
}

if [ "${1:-}" = "tests" ]; then
  run 560 tests "$python" -m pytest -q tests/test_kernel_choice_gpu.py tests/test_cuda_graphs_gpu.py tests/test_fused_layer_gpu.py \
    tests/test_plugin_gpu.py tests/test_plugin_target_split_gpu.py::test_the_merge_in_the_split_launch_gives_the_two_launch_bits_on_gpu \
    tests/test_dependent_launch_gpu.py
  exit 0
fi
run 300 step "$python" benchmarks/bench_gpu_step.py --repeats 10 --profile --out "$out/step.md"
run 80 choices "$python" -m trtllm_dflash.cli.app selftest --gpu --step choices --out "$out/choices.md"
run 180 step_measured "$python" benchmarks/bench_gpu_step.py --repeats 10 --contexts 1024 --loop-contexts 1024 \
  --attention-choice measure --verify-choice measure --linear-choice measure --dependent-launch both --out "$out/step_measured.md"
