# Two entry points (see README): `make demo` runs the main job, `make test` the whole suite.
# Both create .venv and install everything they need on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-deps lint soak clean

# eventlane itself, then the sample app (a distribution of its own: example_apps/pyproject.toml).
$(STAMP): pyproject.toml setup.py example_apps/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	$(BIN)/python -m pip install --quiet --no-build-isolation --no-deps -e example_apps
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/eventlane demo invoicing --data ./demo-data

lint: $(STAMP)
	$(BIN)/ruff check framework tests benchmarks example_apps
	$(BIN)/mypy
	$(BIN)/lint-imports

# System packages the tests drive (Debian): installed once, quietly, when missing.
test-deps:
	@command -v kcat >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq kcat >/dev/null)
	@command -v strace >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq strace >/dev/null)

test: lint test-deps
	$(BIN)/python -m pytest -q

soak: $(STAMP) test-deps
	$(BIN)/python -m pytest -q -m soak

clean:
	rm -rf $(VENV) build *.egg-info demo-data
