# tformer: build the book, test everything, run the five systems.
#
# Every target except help and clean first makes sure that the virtual environment .venv exists
# and holds the exact pins of requirements.txt (which installs tformer itself in editable mode);
# the test targets add requirements-test.txt (pytest, nbval, the PyTorch CPU build, hypothesis).
# On a fresh machine with Python 3.11 and make, `make book` and `make test` do all of the setup.
#
#   make book        build the site into _build/html (any warning fails the build)
#   make test        test-unit, test-nbval, test-nbval-other, test-browser, book, check-links,
#                    check-pages; then each one's result and time
#   make check-links internal links and anchors of the built site (_build/html) all lead somewhere
#   make check-pages every built page in headless Chromium at 1280 px: nothing overflows sideways
#   make test-unit   pytest tests (unit tests and the notebook hygiene check)
#   make test-nbval  nbval: re-run every notebook and compare with its stored outputs
#   make test-nbval-other  nbval again, under an older CPU's floating-point arithmetic
#   make test-browser  make lab in headless Chromium: the chapters render, one runs (needs chromium)
#   make execute     re-execute every notebook in place, in a fresh kernel (NB=path for one)
#   make serve       serve _build/html on http://127.0.0.1:8000 (PORT=...)
#   make lab         JupyterLab on 127.0.0.1:8888 (LAB_PORT=..., LAB_FLAGS="--no-browser --ip=..."),
#                    installed on first use from requirements-lab.txt
#   make torch       install the test set (requirements-test.txt: the PyTorch CPU build and the rest)
#   make run         run each source system: python -m tformer run SYSTEM (SYSTEMS="...")
#   make bench       python -m tformer bench: training and generation against PyTorch, written
#                    to book/data/bench_<CPU vendor>.json (chapter 20 reads each); BENCH_FLAGS adds flags
#   make clean       remove _build and caches (keeps .venv)

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:
MAKEFLAGS += --no-builtin-rules

VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.test-installed
LAB_STAMP := $(VENV)/.lab-installed
SYSTEM_PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3 2>/dev/null)

PORT ?= 8000
LAB_PORT ?= 8888
LAB_FLAGS ?=
SYSTEMS ?= attention transformer2 encoder transformer tinygpt
NB ?= $(sort $(shell find notebooks -name '*.ipynb' -not -path '*/.ipynb_checkpoints/*' 2>/dev/null))

RUN_NB := env -u MPLBACKEND
JB_BUILD := $(RUN_NB) $(BIN)/jupyter-book build . --all -W --keep-going
# nbval runs the notebooks NBVAL_WORKERS at a time (pytest-xdist; each notebook on one worker, in one
# kernel, one thread): the floats do not depend on it, only the wall-clock time.
NBVAL_WORKERS ?= 2
NBVAL := $(RUN_NB) $(BIN)/python -m pytest --nbval notebooks --nbval-current-env \
	--nbval-sanitize-with .nbval-sanitize.cfg -p no:cacheprovider -n $(NBVAL_WORKERS) --dist loadscope

# The environment under which notebooks are executed and checked: one BLAS thread (so floats do not
# depend on the core count), no progress bars, a fixed hash seed, and the venv's own kernel.
# MPLBACKEND is removed (RUN_NB) so that the kernel picks its inline backend and stores the figures.
NOTEBOOK_TARGETS := test test-unit test-nbval test-nbval-other book execute
$(NOTEBOOK_TARGETS): export OPENBLAS_NUM_THREADS := 1
$(NOTEBOOK_TARGETS): export OMP_NUM_THREADS := 1
$(NOTEBOOK_TARGETS): export MKL_NUM_THREADS := 1
$(NOTEBOOK_TARGETS): export TFORMER_NUM_THREADS := 1
$(NOTEBOOK_TARGETS): export TFORMER_PROGRESS := 0
$(NOTEBOOK_TARGETS): export PYTHONHASHSEED := 0
$(NOTEBOOK_TARGETS): export JUPYTER_PREFER_ENV_PATH := 1
$(NOTEBOOK_TARGETS): export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: help venv book check-links check-pages test test-unit test-nbval test-nbval-other test-browser execute \
	serve lab torch run \
	bench clean

help:
	@sed -n '3,24p' Makefile | sed 's/^# \{0,1\}//'

# --- environment -------------------------------------------------------------------------------

$(STAMP): requirements.txt requirements-data.txt pyproject.toml
	@if [ ! -x $(BIN)/python ]; then \
	  if [ -z "$(SYSTEM_PYTHON)" ]; then echo "error: neither python3.11 nor python3 is on PATH" >&2; exit 1; fi; \
	  echo "creating $(VENV) with $(SYSTEM_PYTHON) ($$($(SYSTEM_PYTHON) --version))"; \
	  $(SYSTEM_PYTHON) -m venv $(VENV); \
	fi
	$(BIN)/pip install -r requirements.txt
	$(BIN)/pip install --no-deps -r requirements-data.txt
	@touch $@

# What the tests need on top (requirements-test.txt includes requirements.txt): installed on first
# use by the test targets, into the same venv, and again whenever either file changes.
$(TEST_STAMP): requirements-test.txt $(STAMP)
	$(BIN)/pip install -r requirements-test.txt
	@touch $@

venv: $(TEST_STAMP)

$(LAB_STAMP): requirements-lab.txt $(STAMP)
	$(BIN)/pip install -r requirements-lab.txt
	@touch $@

# --- the book ----------------------------------------------------------------------------------

# viewcode rewrites a _modules page only when its module's file is newer than the page, so an old
# page would miss the anchors of entries added to the API since: those pages are always remade.
book: $(STAMP)
	rm -rf _build/html/_modules
	$(JB_BUILD)
	@echo "book: $(CURDIR)/_build/html/index.html"

# Internal links, anchors, API cross-references and [source] links of the built site (no download).
check-links: $(STAMP)
	@if [ ! -f _build/html/index.html ]; then $(MAKE) --no-print-directory book; fi
	$(BIN)/python tools/check_links.py _build/html

# Every page of the built site (chapters, API, source pages) in headless Chromium at a 1280-pixel
# window: no page, code cell, output, table or equation may overflow sideways (tools/page_check.py,
# about 45 s). Needs Chromium and Playwright (requirements-lab.txt, installed on first use); where
# no Chromium is installed it says so in one line and skips.
check-pages: $(TEST_STAMP)
	@if [ ! -f _build/html/index.html ]; then $(MAKE) --no-print-directory book; fi
	@note="$$($(BIN)/python tools/page_check.py --brief)"; \
	if [ -n "$$note" ]; then echo "$$note"; \
	else $(MAKE) --no-print-directory $(LAB_STAMP) && $(BIN)/python tools/page_check.py _build/html; fi

serve: $(STAMP)
	@if [ ! -f _build/html/index.html ]; then $(MAKE) --no-print-directory book; fi
	@echo "serving http://127.0.0.1:$(PORT)/ (Ctrl-C to stop)"
	$(BIN)/python -m http.server $(PORT) --bind 127.0.0.1 --directory _build/html

# --- tests -------------------------------------------------------------------------------------

# -rfEs: the summary names every failure, error and skip with its reason. A skipped PyTorch parity
# test fails the run (tests/conftest.py).
# The unit tests run UNIT_WORKERS at a time (pytest-xdist, each file on one worker; every test
# sets its own thread count where it needs one), so that make test keeps within its budget.
UNIT_WORKERS ?= 2
test-unit: $(TEST_STAMP)
	$(RUN_NB) $(BIN)/python -m pytest tests -p no:cacheprovider -rfEs -n $(UNIT_WORKERS) --dist loadfile

test-nbval: $(TEST_STAMP)
	$(NBVAL)

# nbval once more, under another CPU's floating-point arithmetic forced on this machine: an older
# OpenBLAS kernel set (one rung below the CPU's: Haswell below AVX-512) and NumPy's dispatch level of
# the same instruction encoding (never AVX BLAS beside SSE NumPy: Intel's transition penalty).
# tools/other_arithmetic.py picks both, checks that they took effect, prints them, and runs nbval;
# where nothing older can be forced (not x86-64, no OpenBLAS) it says why in one line and skips.
test-nbval-other: $(TEST_STAMP)
	$(BIN)/python tools/other_arithmetic.py -- $(NBVAL)

# The interactive reader in a real browser: tools/browser_check.py starts `make lab` on a free local
# port, opens chapters 01, 04, 13 and 14 in headless Chromium, checks that their MyST renders, runs
# chapter 10 (Run All Cells: its training shows a live bar) and checks that the repository is left
# as it was. It installs requirements-lab.txt on first use; where no Chromium is installed it says
# so in one line and skips.
test-browser: $(TEST_STAMP)
	@note="$$($(BIN)/python tools/browser_check.py --brief)"; \
	if [ -n "$$note" ]; then echo "$$note"; \
	else $(MAKE) --no-print-directory $(LAB_STAMP) && $(BIN)/python tools/browser_check.py; fi

# Runs every stage even when one fails, then prints each stage's result and wall-clock time.
test: $(TEST_STAMP)
	@failed=0; report=""; \
	for stage in test-unit test-nbval test-nbval-other test-browser book check-links check-pages; do \
	  echo; echo "=== make $$stage"; \
	  start=$$(date +%s); note=""; \
	  if [ $$stage = test-nbval-other ]; then note="$$($(BIN)/python tools/other_arithmetic.py --brief)" || note="see the error above"; fi; \
	  if [ $$stage = test-browser ]; then note="$$($(BIN)/python tools/browser_check.py --brief)" || note="see the error above"; fi; \
	  if [ $$stage = check-pages ]; then note="$$($(BIN)/python tools/page_check.py --brief)" || note="see the error above"; fi; \
	  case "$$note" in \
	    skipped:*) echo "$$note"; status=skipped ;; \
	    *) if $(MAKE) --no-print-directory $$stage; then status=ok; else status=FAILED; failed=1; fi ;; \
	  esac; \
	  report="$$report$$(printf '  %-16s %-7s %5ss  %s' $$stage $$status $$(( $$(date +%s) - start )) "$$note")\n"; \
	done; \
	echo; echo "=== summary (wall-clock)"; printf "$$report"; \
	exit $$failed

# --- notebooks ---------------------------------------------------------------------------------

# Each notebook runs top to bottom in its own fresh kernel (the venv's `python3`), with the notebook's
# folder as working directory, exactly as nbval runs it. This is nbconvert's --execute --inplace,
# written against nbclient (the library under nbconvert's ExecutePreprocessor) so that it can also
# drop the per-cell timing metadata: re-executing an unchanged notebook then leaves no diff beyond
# its outputs. A failing cell stops the run and leaves that notebook's file untouched.
define EXECUTE_PY
import sys, time
from pathlib import Path
import nbformat
from nbclient import NotebookClient
from nbformat.corpus.words import generate_corpus_id
for name in sys.argv[1:]:
    path, start = Path(name), time.perf_counter()
    print(f"executing {path} ...", end=" ", flush=True)
    nb = nbformat.read(path, as_version=4)
    nb.nbformat_minor = max(nb.nbformat_minor, 5)  # nbformat 4.5 gives every cell an id
    for cell in nb.cells:
        cell.setdefault("id", generate_corpus_id())
        cell.metadata.pop("execution", None)
    NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(path.parent.resolve())}}).execute()
    nbformat.write(nb, path)
    print(f"{time.perf_counter() - start:.1f}s", flush=True)
endef
export EXECUTE_PY

execute: $(STAMP)
	@if [ -z "$(strip $(NB))" ]; then echo "no notebooks to execute" >&2; exit 1; fi
	$(RUN_NB) $(BIN)/python -c "$$EXECUTE_PY" $(NB)

# The interactive reader. Unlike the targets above, it keeps live progress bars (no
# TFORMER_PROGRESS=0) and tformer's own thread pool on every core (no TFORMER_NUM_THREADS=1); the
# stored outputs come from `make execute`, never from the lab. OpenBLAS stays on one thread unless
# the reader's environment says otherwise: on this book's small matrices its extra threads only
# contend with tformer's (measured on a loaded 2-core machine: 1.1 s a TinyGPT step against 0.11 s).
# Its settings (lab/jupyter_lab_config.py, lab/settings/): 127.0.0.1, autosave off (File >
# Autosave Documents turns it back on), no news or update checks. The repository's notebooks are
# trusted first, so that their stored outputs show as they are.
lab: export OPENBLAS_NUM_THREADS ?= 1
lab: export OMP_NUM_THREADS ?= 1
lab: export MKL_NUM_THREADS ?= 1
lab: export JUPYTER_PREFER_ENV_PATH := 1
lab: export PATH := $(CURDIR)/$(BIN):$(PATH)
lab: $(LAB_STAMP)
	@$(BIN)/jupyter trust $(NB) 2>&1 | grep -v '^Signing notebook' || true
	$(RUN_NB) $(BIN)/jupyter lab --config=lab/jupyter_lab_config.py --ServerApp.port=$(LAB_PORT) $(LAB_FLAGS)

# --- optional extras ---------------------------------------------------------------------------

# The PyTorch CPU build is part of the test set; this installs it without running anything.
torch: $(TEST_STAMP)

run: $(STAMP)
	@failed=""; \
	for s in $(SYSTEMS); do \
	  if ! $(BIN)/python -m tformer run $$s --help >/dev/null 2>&1; then \
	    echo "=== $$s: skipped (\`python -m tformer run $$s --help\` fails: not implemented yet?)"; \
	    continue; \
	  fi; \
	  echo "=== $$s"; \
	  $(BIN)/python -m tformer run $$s || failed="$$failed $$s"; \
	done; \
	if [ -n "$$failed" ]; then echo "failed:$$failed" >&2; exit 1; fi

# No thread variable is exported here: the benchmark measures what each library does by default
# (every core), unless BENCH_FLAGS says --threads N.
BENCH_FLAGS ?=
bench: $(TEST_STAMP)
	$(BIN)/python -m tformer bench $(BENCH_FLAGS)

clean:
	rm -rf _build .pytest_cache .ruff_cache
	find . -path ./$(VENV) -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -print0 \
	  | xargs -0 rm -rf
