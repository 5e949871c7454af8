# make setup | models | bench | test | test-all | report | lint | clean
# GPU builds: make setup CMAKE_ARGS="-DGGML_CUDA=on"  (or -DGGML_VULKAN=on, -DGGML_METAL=on)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HARNESS := $(VENV)/bin/harness
LLAMA_VERSION := 0.3.36
# ggml's AMX kernels segfault on batched decodes of quantized weights in this llama.cpp
# (ggml-org/llama.cpp#20824); undefining the macro drops only them and keeps every other native kernel.
LLAMA_CMAKE_ARGS := -DCMAKE_C_FLAGS=-U__AMX_INT8__ -DCMAKE_CXX_FLAGS=-U__AMX_INT8__ $(CMAKE_ARGS)
# One cached wheel per build flavour, outside the clone, so a second setup (or a fresh clone) skips the build.
BUILD_TAG := $(shell printf '%s' "$(LLAMA_CMAKE_ARGS)" | sha256sum | cut -c1-12)
WHEEL_CACHE ?= $(HOME)/.cache/harness/wheels/$(BUILD_TAG)
SETUP_STAMP := $(VENV)/.setup-$(BUILD_TAG)
PROFILE ?= default
TEST_MODELS := smollm2-135m-instruct-q4_1 smollm2-135m-instruct-q2_k

.PHONY: setup models test-models bench bench-engine test test-all report lint clean clean-models

setup: $(SETUP_STAMP)

$(SETUP_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	ls $(WHEEL_CACHE)/llama_cpp_python-$(LLAMA_VERSION)-*.whl >/dev/null 2>&1 || \
	  { echo "building llama-cpp-python $(LLAMA_VERSION) from source (CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)'), about 5-10 minutes on 2 cores"; \
	    CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip wheel -q --no-cache-dir --no-deps -w $(WHEEL_CACHE) llama-cpp-python==$(LLAMA_VERSION); }
	$(PY) -m pip install -q --disable-pip-version-check --force-reinstall --no-deps $(WHEEL_CACHE)/llama_cpp_python-$(LLAMA_VERSION)-*.whl
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev,plot]'
	rm -f $(VENV)/.setup-*
	touch $@

models: setup
	$(HARNESS) models fetch --all
	$(HARNESS) models list

test-models: setup
	$(HARNESS) models fetch $(TEST_MODELS)

bench: setup models
	$(HARNESS) bench --profile $(PROFILE)

# the fast tier; test-all adds the slow one (tests marked slow)
test: setup test-models
	$(PY) -m pytest -q -m "not slow"

test-all: setup test-models
	$(PY) -m pytest -q

report: setup
	$(HARNESS) report reports/runs/latest

lint: setup
	$(VENV)/bin/ruff check harness tests

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

clean-models:
	rm -rf models

# Figures for the README (run alone on a quiet machine): engine speed, alignment-check speed.
bench-engine: setup models
	$(PY) benchmarks/bench_engine.py
	$(PY) benchmarks/bench_check_speed.py
	$(PY) benchmarks/bench_batch_split.py
