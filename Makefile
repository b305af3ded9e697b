# The commands the README documents: `make demo`, `make test` and, on a GPU machine, `make gpu-check`.
# They set themselves up: a virtual environment in .venv with everything CI needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU-only machines get the pinned CPU build of torch (PLATFORM.md); GPU machines the default build.
TORCH_SPEC ?= $(shell if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then echo "torch>=2.6"; else echo "torch==2.13.0"; fi)
PYTEST_ARGS ?=
# e.g. GPU_CHECK_ARGS=--quick
GPU_CHECK_ARGS ?=

.PHONY: setup demo test test-all gpu-check clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[ci]"
	@touch $@

demo: setup
	$(BIN)/dflash-trt demo

test: setup
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# Also the slow tests (longer training runs, large sweeps).
test-all: setup
	$(BIN)/python -m pytest -q --runslow $(PYTEST_ARGS)

# On a GPU machine: GPU tests, kernel benchmark, torch-runtime decode with/without CUDA graphs;
# appends a section to benchmarks/RESULTS.md and exits non-zero if a step failed (or if there is no GPU).
gpu-check: setup
	$(BIN)/dflash-trt selftest --gpu --out benchmarks/RESULTS.md $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
