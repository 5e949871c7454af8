# make setup | models | bench | test | test-all | native | report | lint | clean
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
# llama.cpp's own llama-server, llama-speculative-simple and llama-bench (make native; harness crosscheck runs
# them): the wheel's vendored llama.cpp with the wheel's flags, cached per build flavour outside the clone.
NATIVE_CACHE ?= $(HOME)/.cache/harness/native
NATIVE_SRC := $(NATIVE_CACHE)/src/llama_cpp_python-$(LLAMA_VERSION)
NATIVE_BUILD := $(NATIVE_CACHE)/$(BUILD_TAG)/build
NATIVE_BIN := $(NATIVE_CACHE)/$(BUILD_TAG)/bin
NATIVE_TOOLS := llama-server llama-speculative-simple llama-bench
# static binaries, no network at build time: no curl/OpenSSL, no web UI download (the server runs without one)
NATIVE_CMAKE_ARGS := -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
PROFILE ?= default
TEST_MODELS := smollm2-135m-instruct-q4_1 smollm2-135m-instruct-q2_k

.PHONY: setup models test-models bench bench-engine test test-all native report lint clean clean-models gpu-check-prepare

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

bench: setup models native
	$(HARNESS) bench --profile $(PROFILE)

# the fast tier; test-all adds the slow one (tests marked slow)
test: setup test-models
	$(PY) -m pytest -q -m "not slow"

test-all: setup test-models native
	HARNESS_NATIVE_BIN=$(NATIVE_BIN) $(PY) -m pytest -q

# llama.cpp's own binaries from the wheel's sources (its sdist, fetched once): 5-15 minutes on 2 cores the first
# time; after that the binaries' presence skips the build
native:
	ls $(addprefix $(NATIVE_BIN)/,$(NATIVE_TOOLS)) >/dev/null 2>&1 || { \
	  test -f $(NATIVE_SRC)/vendor/llama.cpp/CMakeLists.txt || { mkdir -p $(NATIVE_CACHE)/src && \
	    { ls $(NATIVE_CACHE)/src/llama_cpp_python-$(LLAMA_VERSION).tar.gz >/dev/null 2>&1 || \
	      $$(test -x $(PY) && echo $(PY) || echo $(PYTHON)) -m pip download -q --disable-pip-version-check \
	        --no-binary :all: --no-deps -d $(NATIVE_CACHE)/src llama-cpp-python==$(LLAMA_VERSION); } && \
	    tar -xzf $(NATIVE_CACHE)/src/llama_cpp_python-$(LLAMA_VERSION).tar.gz -C $(NATIVE_CACHE)/src; } && \
	  echo "building llama.cpp's $(NATIVE_TOOLS) from llama-cpp-python $(LLAMA_VERSION)'s sources (CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)'), about 5-15 minutes on 2 cores" && \
	  cmake -S $(NATIVE_SRC)/vendor/llama.cpp -B $(NATIVE_BUILD) $(NATIVE_CMAKE_ARGS) $(LLAMA_CMAKE_ARGS) >/dev/null && \
	  cmake --build $(NATIVE_BUILD) --config Release --target $(NATIVE_TOOLS) -j$$(nproc) >/dev/null && \
	  rm -rf $(NATIVE_BIN).tmp && mkdir -p $(NATIVE_BIN).tmp && \
	  cp $(addprefix $(NATIVE_BUILD)/bin/,$(NATIVE_TOOLS)) $(NATIVE_BIN).tmp/ && \
	  rm -rf $(NATIVE_BIN) && mv $(NATIVE_BIN).tmp $(NATIVE_BIN); }
	echo "llama.cpp's $(NATIVE_TOOLS): $(NATIVE_BIN)"

report: setup
	$(HARNESS) report reports/runs/latest

lint: setup
	$(VENV)/bin/ruff check harness tests
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .import_linter_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

clean-models:
	rm -rf models

# Figures for the README (run alone on a quiet machine): engine speed, alignment-check speed.
bench-engine: setup models
	$(PY) benchmarks/bench_engine.py
	$(PY) benchmarks/bench_check_speed.py
	$(PY) benchmarks/bench_batch_split.py

# Issue 47's GPU check: .gpucheck/ (ignored) for the device machine, sized against its 64 MiB (docs/gpu.md)
gpu-check-prepare: setup
	$(PY) benchmarks/gpu_check/prepare.py
