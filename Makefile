# Two entry points (see README): `make demo` runs the main job, `make test` the whole suite.
# Both create .venv and install everything they need on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint soak clean test-deps screenshots

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/eventlane demo invoicing --data ./demo-data

lint: $(STAMP)
	$(BIN)/ruff check framework tests benchmarks example_apps migrations
	$(BIN)/mypy
	$(BIN)/lint-imports

# Debian's chromium + chromium-driver for the console's browser tests (tests/console/);
# installed once, quietly, only when missing (needs root or sudo; nothing downloaded at run time).
test-deps:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; }

test: lint test-deps
	$(BIN)/python -m pytest -q

# Re-take the screenshots of docs/console.md (docs/img/console-*.png) with the browser tests.
screenshots: $(STAMP) test-deps
	EVENTLANE_SCREENSHOTS=1 $(BIN)/python -m pytest -q tests/console

soak: $(STAMP)
	$(BIN)/python -m pytest -q -m soak

clean:
	rm -rf $(VENV) build *.egg-info demo-data
