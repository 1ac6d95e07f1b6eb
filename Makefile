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

.PHONY: help venv book test lint unit nbval suite suite-isa notebooks gpu-check bench records compat clean system-deps unit-isa nbval-isa pdf installed

help:
	@echo "make book        build the site into _build/html (does not execute notebooks)"
	@echo "make pdf         the reader's book as one PDF, no API reference (_build/pdf/book.pdf)"
	@echo "make test        ruff, the book build, pytest tests/ and nbval over every chapter in one"
	@echo "                 session (make suite); again under ONEDNN_MAX_CPU_ISA=SSE41"
	@echo "                 ATEN_CPU_CAPABILITY=default (make suite-isa); then make installed"
	@echo "make unit, make nbval, make unit-isa, make nbval-isa  the parts of suite and suite-isa"
	@echo "make installed [REHEARSE=1]  tests of the installed package (a wheel, no checkout)"
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

# The tests and the notebooks run in $(JOBS) pytest-xdist workers, a file (or notebook) per
# worker at a time (--dist loadfile: a notebook's cells share one kernel, a module's
# fixtures one process). Much of the suite waits on child processes (Chromium, g++, the
# notebook kernels, the records runner's fresh processes), so three workers on two cores
# finish sooner than two. One run each, 2-core AMD EPYC (Zen 4), 2026-12-07: `make test` in
# a fresh clone took 1365 s with the tests and the chapters as separate sessions of 2
# workers, 1179 s as one session of 3; rerun on the warm checkout, one session took 662 s
# with 2 workers and 590 s with 3 (under ISA_LOW, 460 s and 363 s).
JOBS ?= 3
XDIST := -n $(JOBS) --dist loadfile

unit: $(STAMP) system-deps
	$(PY) -m pytest tests -q $(XDIST)

# nbval_unix_kernels.py: each chapter's kernel listens on Unix sockets, not TCP ports
NBVAL_FLAGS := --nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg \
  -p nbval_unix_kernels

nbval: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) $(NBVAL_FLAGS) \
	  $$($(PY) scripts/toc_notebooks.py)

# The second ISA setting `make test` runs under: the one most unlike any x86 CPU this runs on
# (oneDNN capped at SSE4.1, ATen's scalar kernels), so no test or compared notebook output may
# depend on the ISA. The browser tests, the PDF print (both Chromium), the standalone C++
# build and the records runner (whose child processes set each ISA setting themselves) run
# once.
ISA_LOW := ONEDNN_MAX_CPU_ISA=SSE41 ATEN_CPU_CAPABILITY=default
ISA_ONCE := tests/test_browser.py tests/test_book_pdf.py tests/test_standalone_cpp.py \
  tests/test_records.py

unit-isa: $(STAMP) system-deps
	$(ISA_LOW) $(PY) -m pytest tests -q $(XDIST) $(addprefix --ignore=,$(ISA_ONCE))

nbval-isa: $(STAMP)
	$(ISA_LOW) $(PY) -m pytest -q -p no:cacheprovider $(XDIST) $(NBVAL_FLAGS) \
	  $$($(PY) scripts/toc_notebooks.py)

# What `make test` runs: the tests and the chapters in one pytest session per ISA setting
# (the same files as unit + nbval, then unit-isa + nbval-isa). The workers take whole files
# longest first (--no-loadscope-reorder keeps the order given), so none sits idle at the end
# while another runs a long file. LONGEST_FIRST only orders: every tests/test_*.py
# and every chapter of _toc.yml runs, listed or not. Order from `--durations=0`, 2-core AMD
# EPYC, torch 2.13.0, 2026-12-07.
LONGEST_FIRST := tests/test_book_pdf.py tests/test_browser.py tests/test_records.py \
  book/09_beyond.ipynb book/03_dispatch.ipynb book/06_double_backward.ipynb \
  book/07_backends_performance.ipynb tests/test_claims.py tests/test_dp_step.py \
  book/12_migration_cookbook.ipynb book/10_determinism_accuracy.ipynb \
  tests/test_standalone_cpp.py tests/test_ch12_recipe.py
ALL_FILES = $(sort $(wildcard tests/test_*.py)) $(shell $(PY) scripts/toc_notebooks.py)
SUITE = $(filter $(ALL_FILES),$(LONGEST_FIRST)) $(filter-out $(LONGEST_FIRST),$(ALL_FILES))

suite: $(STAMP) system-deps
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) --no-loadscope-reorder $(NBVAL_FLAGS) \
	  $(SUITE)

suite-isa: $(STAMP) system-deps
	$(ISA_LOW) $(PY) -m pytest -q -p no:cacheprovider $(XDIST) --no-loadscope-reorder \
	  $(NBVAL_FLAGS) $(filter-out $(ISA_ONCE),$(SUITE))

# Installed mode (part of `make test`): convlab as a reader gets it. A wheel is built from
# a copy of the files a commit would hold and installed non-editable, the copy's convlab/
# is removed, and the pinned torch of .venv is reused (a throwaway venv under
# .cache/installed reads .venv's site-packages through a .pth file: nothing is downloaded).
# `scripts/compat.py --pinned`: the same steps as `make compat`. A test that reads the
# checkout's convlab/ instead of the installed package fails here. Only the tests of what
# the wheel must carry and where it is found, so this adds about a minute: every module
# imports cleanly (test_imports); the measurement records, stored GPU runs and old-torch
# runs as package data (test_records, test_gpu_runs, test_gpu_check's store,
# test_version_runs, test_claims' readers); the source files the pages name (test_source_paths:
# convlab's C++ from the installed package); the Colab copies, whose chapter 5 inlines the
# wheel's convlab_ext.cpp (test_colab_copies); the C++ extension built from that file
# (test_extension's op and load); the console entry point (test_cli); and
# scripts/old_torch_runs.py beside the installed package (test_chapters_11_13). The whole
# suite on an installed convlab is `make compat`'s, and so is executing the Colab copies of
# the record chapters outside a checkout (about 3.5 CPU-minutes, over this target's share
# of `make test`): `make installed REHEARSE=1` adds it.
INSTALLED_TESTS := tests/test_imports.py tests/test_gpu_runs.py tests/test_version_runs.py \
  tests/test_colab_copies.py tests/test_source_paths.py \
  tests/test_records.py::test_every_committed_record_is_valid \
  tests/test_records.py::test_committed_records_cover_every_setting_of_their_machine \
  tests/test_records.py::test_records_travel_with_an_installed_package \
  tests/test_claims.py::test_matrix_reads_committed_records \
  tests/test_claims.py::test_cli_names_the_stored_gpu_runs_of_a_cuda_claim \
  tests/test_gpu_check.py::test_store_writes_the_cuda_claims_with_the_steps \
  tests/test_extension.py::test_raw_op_is_registered_and_matches_aten \
  tests/test_extension.py::test_load_is_cached \
  tests/test_cli.py::test_the_console_script_exits_2_with_one_line \
  tests/test_cli.py::test_importing_the_dispatcher_loads_no_command \
  tests/test_chapters_11_13.py::test_chapter_13_has_its_repros \
  tests/test_chapters_11_13.py::test_old_torch_runs_refuses_a_missing_interpreter

installed: $(STAMP)
	$(PY) scripts/compat.py --pinned $(if $(REHEARSE),--rehearse) $(INSTALLED_TESTS)

test: lint book suite suite-isa installed

notebooks: $(STAMP)
	$(PY) scripts/run_notebooks.py $(NB)

gpu-check:
	$(PYTHON) scripts/gpu_check.py --store book/data/gpu

bench: $(STAMP)
	$(PY) -m convlab bench

# book/data/records/<machine>__<isa>.json: every section under each ISA this CPU offers,
# fresh processes per ISA (PROCESSES of them for the timed sections, default 3; see
# convlab/lab/record/runner.py). Never part of `make test`.
records: $(STAMP)
	$(PY) -m convlab.lab.record.runner $(if $(QUICK),--quick) $(if $(SECTIONS),--sections "$(SECTIONS)") $(if $(CLOCK),--clock $(CLOCK)) $(if $(PROCESSES),--processes $(PROCESSES))

# Another torch from the package registry in a throwaway venv, convlab installed as on Colab.
# Not part of `make test`: each version downloads a multi-GB wheel.
compat:
	@test -n "$(TORCH)" || { echo "usage: make compat TORCH=2.9.1 [RECORD=1]"; exit 2; }
	$(PYTHON) scripts/compat.py --torch $(TORCH) $(if $(RECORD),--record) $(if $(CPP_ONLY),--cpp-only)

clean:
	rm -rf _build .cache .pytest_cache .hypothesis .ruff_cache
