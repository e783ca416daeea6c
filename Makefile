# Two commands do all the set-up: `make train` and `make test`. Both bootstrap .venv if missing.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY      = $(VENV)/bin/python
ARGS   ?=

.PHONY: train test test-unit lint bench clean

# torch first (pinned CPU build by default, overridable: make train TORCH="torch==2.6.0"), then the
# project with its own range, which the installed torch satisfies, so pip keeps it.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

train: $(VENV)/.installed
	$(PY) train.py $(ARGS)

# The tests keep Python's bytecode caches (__pycache__/, git-ignored) even where the shell sets
# PYTHONDONTWRITEBYTECODE: without them every pytest worker and every training process the suite starts
# compiles the project's modules again, and pytest rewrites every test module's asserts again.
KEEP_BYTECODE = env -u PYTHONDONTWRITEBYTECODE

test: $(VENV)/.installed
	$(KEEP_BYTECODE) $(PY) -m pytest -n 2 --dist loadfile $(ARGS)

# the fast tier (in-process tests) on both cores
test-unit: $(VENV)/.installed
	$(KEEP_BYTECODE) $(PY) -m pytest tests/unit -n 2 --dist worksteal $(ARGS)

# ruff: lint and formatting, configured in pyproject.toml; .ci/run runs it before the tests
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(VENV)/.installed
	$(PY) benchmarks/overhead.py

clean:
	rm -rf outputs multirun wandb .pytest_cache .ruff_cache
