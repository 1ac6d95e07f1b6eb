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

.PHONY: help venv book test lint unit nbval notebooks gpu-check bench clean browser-deps

help:
	@echo "make book        build the site into _build/html (does not execute notebooks)"
	@echo "make test        ruff, pytest tests/, the book build, nbval over every chapter"
	@echo "make notebooks   re-execute every chapter in place (NB=book/x.ipynb for one)"
	@echo "make gpu-check   on a CUDA machine: CUDA tests + every notebook on the GPU"
	@echo "make bench       benchmarks (never part of make test)"
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

browser-deps:
	@test -x /usr/bin/chromium || { echo "installing Debian chromium for the browser tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

unit: $(STAMP) browser-deps
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

clean:
	rm -rf _build .cache .pytest_cache .hypothesis .ruff_cache
