# make setup | models | bench | test | report | lint | clean
# GPU builds: make setup CMAKE_ARGS="-DGGML_CUDA=on"  (or -DGGML_VULKAN=on, -DGGML_METAL=on)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HARNESS := $(VENV)/bin/harness
LLAMA_VERSION := 0.3.36
export CMAKE_ARGS
# One cached wheel per build flavour, outside the clone, so a second setup (or a fresh clone) skips the build.
BUILD_TAG := $(if $(strip $(CMAKE_ARGS)),$(shell printf '%s' "$(CMAKE_ARGS)" | sha256sum | cut -c1-12),cpu)
WHEEL_CACHE ?= $(HOME)/.cache/harness/wheels/$(BUILD_TAG)
SETUP_STAMP := $(VENV)/.setup-$(BUILD_TAG)
PROFILE ?= default
TEST_MODELS := smollm2-135m-instruct-q4_1 smollm2-135m-instruct-q2_k

.PHONY: setup models test-models bench test report lint clean clean-models

setup: $(SETUP_STAMP)

$(SETUP_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	ls $(WHEEL_CACHE)/llama_cpp_python-$(LLAMA_VERSION)-*.whl >/dev/null 2>&1 || \
	  { echo "building llama-cpp-python $(LLAMA_VERSION) from source (CMAKE_ARGS='$(CMAKE_ARGS)'), about 5 minutes on 2 cores"; \
	    CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip wheel -q --no-deps -w $(WHEEL_CACHE) llama-cpp-python==$(LLAMA_VERSION); }
	$(PY) -m pip install -q --disable-pip-version-check --force-reinstall --no-deps $(WHEEL_CACHE)/llama_cpp_python-$(LLAMA_VERSION)-*.whl
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	rm -f $(VENV)/.setup-*
	touch $@

models: setup
	$(HARNESS) models fetch --all
	$(HARNESS) models list

test-models: setup
	$(HARNESS) models fetch $(TEST_MODELS)

bench: setup models
	$(HARNESS) bench --profile $(PROFILE)

test: setup test-models
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
