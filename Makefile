# The two commands: `make run` and `make test`. Both set up what they need on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

NODE_AUDIT := tests/e2e/node/node_modules/.package-lock.json
NODE_OIDC := tests/e2e/oidc/node_modules/.package-lock.json

.PHONY: run test test-fast test-latest lint lock lock-upgrade lock-check audit sbom docs docs-build format bench bench-full schema clean

# Installs exactly the locked versions (hash-checked), then the project itself without its
# dependencies: `pip freeze` equals requirements/dev.txt. `make lock` after changing pyproject.toml.
$(STAMP): pyproject.toml requirements/dev.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements/dev.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@touch $(STAMP)

# The lock files: requirements/app.txt (the image) and requirements/dev.txt (make run/test, CI),
# with hashes, resolved for Python 3.11 on every platform. Existing pins are kept unless
# pyproject.toml no longer allows them; `make lock-upgrade` moves everything to the newest allowed.
UV_COMPILE = $(BIN)/uv pip compile pyproject.toml --quiet --generate-hashes --universal \
	--python-version 3.11 --custom-compile-command "make lock"
lock: $(STAMP)
	$(UV_COMPILE) -o requirements/app.txt
	$(UV_COMPILE) --extra dev --extra embedded --extra docs -o requirements/dev.txt

lock-upgrade: $(STAMP)
	$(UV_COMPILE) --upgrade -o requirements/app.txt
	$(UV_COMPILE) --upgrade --extra dev --extra embedded --extra docs -o requirements/dev.txt

## Fails when pyproject.toml asks for something the lock files do not give (run `make lock`).
lock-check: $(STAMP)
	@tmp=$$(mktemp -d) && cp requirements/app.txt requirements/dev.txt $$tmp/ \
	  && $(UV_COMPILE) -o $$tmp/app.txt && $(UV_COMPILE) --extra dev --extra embedded --extra docs -o $$tmp/dev.txt \
	  && diff -u requirements/app.txt $$tmp/app.txt && diff -u requirements/dev.txt $$tmp/dev.txt \
	  && echo "lock files are up to date" \
	  || { echo "requirements/*.txt are stale: run 'make lock' and commit them"; exit 1; }

## Known vulnerabilities in the locked versions (pip-audit; needs the PyPI JSON API or OSV).
audit: $(STAMP)
	$(BIN)/python .ci/audit.py requirements/app.txt requirements/dev.txt

## The documentation site: served with live reload, or built strictly (what CI does) into site/.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8001

docs-build: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

## The software bill of materials of the locked app (CycloneDX JSON); the image carries its own.
sbom: $(STAMP)
	$(BIN)/cyclonedx-py requirements --output-reproducible --of JSON -o sbom.cdx.json requirements/app.txt

## The suite on the newest releases the bounds allow, then on the next release past each bound.
test-latest:
	$(PYTHON) -m venv .venv-latest
	.venv-latest/bin/python -m pip install --quiet --upgrade pip
	.venv-latest/bin/python -m pip install --quiet --upgrade -e '.[dev,embedded]'
	.venv-latest/bin/python .ci/latest.py

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

## The whole suite (unit, integration, e2e) on embedded servers unless DATABASE_URL/REDIS_URL,
## in TEST_WORKERS processes (pytest-xdist; each has its own embedded PostgreSQL and Valkey). Most
## tests wait on processes, sockets and slow fake models rather than compute, so more workers
## than cores pays: 4 on 2 cores. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 4
test: $(STAMP) $(NODE_AUDIT) $(NODE_OIDC)
	$(BIN)/pytest -n $(TEST_WORKERS)

## Everything but the long end-to-end scenarios.
test-fast: $(STAMP) $(NODE_AUDIT) $(NODE_OIDC)
	$(BIN)/pytest -n $(TEST_WORKERS) -m "not slow"

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
