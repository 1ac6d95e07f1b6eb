# The two commands: `make book` and `make test`. Both bootstrap .venv from requirements.txt.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
NB      ?=
PYTHON  ?= python3
# ninja (for the C++ extension) is looked up on PATH; the venv ships one.
export PATH := $(abspath $(VENV))/bin:$(PATH)
export TORCH_EXTENSIONS_DIR ?= $(abspath .cache/torch_extensions)
export PYTHONHASHSEED := 0

.PHONY: help venv book test lint unit nbval notebooks gpu-check bench compat clean system-deps

help:
	@echo "make book        build the site into _build/html (does not execute notebooks)"
	@echo "make test        ruff, pytest tests/, the book build, nbval over every chapter"
	@echo "make notebooks   re-execute every chapter in place (NB=book/x.ipynb for one)"
	@echo "make gpu-check   on a CUDA machine: CUDA tests + every notebook on the GPU"
	@echo "make bench       benchmarks (never part of make test)"
	@echo "make compat TORCH=2.9.1 [RECORD=1]  chapters + tests on another torch (throwaway venv)"
	@echo "make clean       remove _build and caches (keeps .venv)"

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	touch $(STAMP)

venv: $(STAMP)

book: $(STAMP)
	rm -rf _build/html
	$(VENV)/bin/jupyter-book build . -W -n --keep-going

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# Debian packages the tests use: chromium (browser tests), gdb (kernel traces), cmake (the
# standalone C++ program). Installed only when missing.
SYSTEM_DEPS := chromium:/usr/bin/chromium gdb:/usr/bin/gdb cmake:/usr/bin/cmake
system-deps:
	@missing=""; for pair in $(SYSTEM_DEPS); do \
	  test -x "$${pair#*:}" || missing="$$missing $${pair%%:*}"; done; \
	if [ -n "$$missing" ]; then echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi

unit: $(STAMP) system-deps
	$(PY) -m pytest tests -q

nbval: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider --nbval --nbval-current-env \
	  --nbval-sanitize-with nbval_sanitize.cfg $$($(PY) scripts/toc_notebooks.py)

test: lint book unit nbval

notebooks: $(STAMP)
	$(PY) scripts/run_notebooks.py $(NB)

gpu-check:
	$(PYTHON) scripts/gpu_check.py

bench: $(STAMP)
	$(PY) -m convlab bench

# Another torch from the package registry in a throwaway venv, convlab installed as on Colab.
# Not part of `make test`: each version downloads a multi-GB wheel.
compat:
	@test -n "$(TORCH)" || { echo "usage: make compat TORCH=2.9.1 [RECORD=1]"; exit 2; }
	$(PYTHON) scripts/compat.py --torch $(TORCH) $(if $(RECORD),--record)

clean:
	rm -rf _build .cache .pytest_cache .hypothesis .ruff_cache
