# The commands the README documents: `make demo`, `make test` and, on a GPU machine, `make gpu-check`.
# They set themselves up: a virtual environment in .venv with exactly the versions in requirements.lock.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The locked versions of every package `make setup` installs (`make lock` rewrites it).
LOCK ?= requirements.lock
# `make test-latest` installs the newest versions pyproject allows here, beside .venv.
LATEST_VENV ?= .venv-latest
# CPU-only machines get the pinned CPU build of torch (PLATFORM.md); GPU machines the default build.
TORCH_SPEC ?= $(shell if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then echo "torch>=2.6"; else echo "torch==2.13.0"; fi)
PYTEST_ARGS ?=
# Test processes (pytest-xdist). The tests are single-threaded (tests/conftest.py sets one torch
# thread) and many wait on subprocesses and servers, so two workers use a 2-core machine fully;
# --dist loadfile keeps each module (and its module fixtures) in one worker. TEST_WORKERS=0: serial.
TEST_WORKERS ?= 2
# e.g. GPU_CHECK_ARGS=--quick or GPU_CHECK_ARGS="--step kernels"
GPU_CHECK_ARGS ?=
# SYSTEM_PYTHON=1: `make gpu-check` uses the interpreter already there (CUDA torch preinstalled, no
# package index reachable): the project is installed into it without dependencies, nothing is downloaded.
SYSTEM_PYTHON ?=

.PHONY: setup demo test test-all test-latest lock gpu-check clean format

setup: $(VENV)/.installed

# PIP_CONSTRAINT also pins what pip installs into the isolated build environment (setuptools).
$(VENV)/.installed: pyproject.toml $(LOCK)
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --constraint $(LOCK) --upgrade pip setuptools
	PIP_CONSTRAINT=$(abspath $(LOCK)) $(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	PIP_CONSTRAINT=$(abspath $(LOCK)) $(BIN)/python -m pip install --quiet -e ".[ci]"
	@touch $@

demo: setup
	$(BIN)/dflash-trt demo

# ruff first (config in pyproject.toml): the tree stays formatted and lint-clean; `make format` fixes what it can.
test: setup
	$(BIN)/ruff format --check --quiet .
	$(BIN)/ruff check --quiet .
	$(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

# Also the slow tests (longer training runs, large sweeps).
test-all: setup
	$(BIN)/python -m pytest -q --runslow $(PYTEST_ARGS)

# The newest versions the ranges in pyproject.toml allow, in their own venv, then the suite.
# Run it before raising an upper bound in pyproject.toml, and before `make lock`.
$(LATEST_VENV)/.installed: pyproject.toml
	rm -rf $(LATEST_VENV)
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade pip setuptools
	$(LATEST_VENV)/bin/python -m pip install --quiet "$(TORCH_SPEC)"
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager -e ".[ci]"
	@touch $@

test-latest: $(LATEST_VENV)/.installed
	$(LATEST_VENV)/bin/python -m pip freeze | grep -iE '^(torch|transformers|triton|onnx|nvidia-modelopt|tritonclient)=='
	$(LATEST_VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

# Rewrite requirements.lock from the newest-allowed venv (after `make test-latest` passed on it).
# torch's local build tag (+cpu) is dropped: the same pin takes the CUDA build on GPU machines.
lock: $(LATEST_VENV)/.installed
	{ echo "# Exact versions \`make setup\` installs (Python $$($(LATEST_VENV)/bin/python -c 'import platform; print(platform.python_version())'), $$(uname -m) Linux)."; \
	  echo "# Written by \`make lock\` from the newest versions pyproject.toml allows; do not edit by hand."; \
	  $(LATEST_VENV)/bin/python -m pip freeze --all --exclude-editable | sed -E 's/\+(cpu|cu[0-9]+)$$//'; } > $(LOCK)

gpu-check:
ifeq ($(SYSTEM_PYTHON),1)
	$(PYTHON) -m trtllm_dflash.checks.system_install
	$(PYTHON) -m trtllm_dflash.cli.app selftest --gpu --out benchmarks/RESULTS.md $(GPU_CHECK_ARGS)
else
	$(MAKE) setup
	$(BIN)/dflash-trt selftest --gpu --out benchmarks/RESULTS.md $(GPU_CHECK_ARGS)
endif

clean:
	rm -rf $(VENV) $(LATEST_VENV) build *.egg-info

# Format the tree and apply ruff's safe fixes (what `make test` checks).
format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .
