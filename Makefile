# Two entry points (see README): `make demo` runs the main job, `make test` the whole suite.
# Both create .venv and install everything they need on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint soak clean

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[dev,spark,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/eventlane demo invoicing --data ./demo-data

lint: $(STAMP)
	$(BIN)/ruff check framework tests benchmarks example_apps migrations
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint
	$(BIN)/python -m pytest -q

soak: $(STAMP)
	$(BIN)/python -m pytest -q -m soak

clean:
	rm -rf $(VENV) build *.egg-info demo-data
