# `make demo` and `make test` each set up .venv on a fresh machine, then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# The CPU build of torch; a bare `torch` requirement could pull a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu

.PHONY: setup demo test test-deep bench-scheduler mutation clean

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_PIN)" || \
		$(PY) -m pip install --quiet "$(TORCH_PIN)" --index-url $(TORCH_CPU_INDEX)
	$(PY) -m pip install --quiet -e ".[dev,plots,ray,serve-test,duckdb]"
	@touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/replayllm demo

test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -q

test-deep: setup
	HYPOTHESIS_PROFILE=deep $(PY) -m pytest -q

bench-scheduler: setup
	$(VENV)/bin/replayllm bench scheduler

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis

mutation: setup
	$(PY) tools/mutation_check.py
