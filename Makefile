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

.PHONY: help venv book test lint unit nbval notebooks gpu-check bench records compat clean system-deps unit-isa nbval-isa pdf

help:
	@echo "make book        build the site into _build/html (does not execute notebooks)"
	@echo "make pdf         the reader's book as one PDF, no API reference (_build/pdf/book.pdf)"
	@echo "make test        ruff, pytest tests/, the book build, nbval over every chapter; tests"
	@echo "                 and nbval again under ONEDNN_MAX_CPU_ISA=SSE41 ATEN_CPU_CAPABILITY=default"
	@echo "make notebooks   re-execute every chapter in place (NB=book/x.ipynb for one)"
	@echo "make gpu-check   on a CUDA machine: CUDA tests + every notebook on the GPU"
	@echo "make bench       benchmarks (never part of make test)"
	@echo "make records [QUICK=1] [SECTIONS=\"suite roofline\"] [CLOCK=cpu]  records per ISA"
	@echo "make compat TORCH=2.9.1 [RECORD=1] [CPP_ONLY=1]  chapters + tests (or only the C++ program) on another torch"
	@echo "make clean       remove _build and caches (keeps .venv)"

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	touch $(STAMP)

venv: $(STAMP)

book: $(STAMP)
	rm -rf _build/html
	$(VENV)/bin/jupyter-book build . -W -n --keep-going

# One PDF from the HTML (singlehtml + Chromium's print); the next `make book` links it.
pdf: $(STAMP) system-deps
	$(PY) scripts/book_pdf.py

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

# The second ISA setting `make test` runs under: the one most unlike any x86 CPU this runs on
# (oneDNN capped at SSE4.1, ATen's scalar kernels), so no test or compared notebook output may
# depend on the ISA. The browser tests, the PDF print (both Chromium), the standalone C++
# build and the records runner (whose child processes set each ISA setting themselves) run
# once.
ISA_LOW := ONEDNN_MAX_CPU_ISA=SSE41 ATEN_CPU_CAPABILITY=default

unit-isa: $(STAMP) system-deps
	$(ISA_LOW) $(PY) -m pytest tests -q --ignore=tests/test_browser.py \
	  --ignore=tests/test_book_pdf.py --ignore=tests/test_standalone_cpp.py \
	  --ignore=tests/test_records.py

nbval-isa: $(STAMP)
	$(ISA_LOW) $(PY) -m pytest -q -p no:cacheprovider --nbval --nbval-current-env \
	  --nbval-sanitize-with nbval_sanitize.cfg $$($(PY) scripts/toc_notebooks.py)

test: lint book unit nbval unit-isa nbval-isa

notebooks: $(STAMP)
	$(PY) scripts/run_notebooks.py $(NB)

gpu-check:
	$(PYTHON) scripts/gpu_check.py --store book/data/gpu

bench: $(STAMP)
	$(PY) -m convlab bench

# book/data/records/<machine>__<isa>.json: every section under each ISA this CPU offers,
# one fresh process per ISA (see convlab/lab/records.py). Never part of `make test`.
records: $(STAMP)
	$(PY) -m convlab.lab.records $(if $(QUICK),--quick) $(if $(SECTIONS),--sections "$(SECTIONS)") $(if $(CLOCK),--clock $(CLOCK))

# Another torch from the package registry in a throwaway venv, convlab installed as on Colab.
# Not part of `make test`: each version downloads a multi-GB wheel.
compat:
	@test -n "$(TORCH)" || { echo "usage: make compat TORCH=2.9.1 [RECORD=1]"; exit 2; }
	$(PYTHON) scripts/compat.py --torch $(TORCH) $(if $(RECORD),--record) $(if $(CPP_ONLY),--cpp-only)

clean:
	rm -rf _build .cache .pytest_cache .hypothesis .ruff_cache
