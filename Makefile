# One entry point for a fresh machine: every target installs what it needs first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The package alone, for `make demo`: plus the `embedded` extra (PostgreSQL binaries) only on a
# machine without its own. The dev tools (linters, moto, xdist...) come with `make test`.
RUN_STAMP := $(VENV)/.installed-run
HAVE_PG := $(shell ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | head -n 1; command -v initdb 2>/dev/null)
RUN_TARGET := $(if $(strip $(HAVE_PG)),.,.[embedded])
AZURITE := tests/azurite/node_modules/.bin/azurite-blob
# The pooler and the failover tools the suite starts on local ports (Debian packages).
HA_PACKAGES := pgbouncer postgresql-15-auto-failover pg-auto-failover-cli
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install demo demo-stop test lint browser ha-tools bench bench-scale bench-fleet-scale clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP) $(RUN_STAMP)

$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '$(RUN_TARGET)'
	touch $(RUN_STAMP)

$(AZURITE): tests/azurite/package.json tests/azurite/package-lock.json
	npm ci --prefix tests/azurite --no-audit --no-fund --loglevel=error
	touch $(AZURITE)

# Provision a demo tenant on the embedded PostgreSQL under .provisioner/ (started on first use).
demo: $(RUN_STAMP)
	$(BIN)/provisioner migrate
	$(BIN)/provisioner provision demo

demo-stop: $(RUN_STAMP)
	$(BIN)/provisioner local stop

# The static checks, the import contracts among them ([tool.importlinter] in pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check provisioner bench tests
	$(BIN)/mypy
	$(BIN)/lint-imports

# The console's browser test drives Debian's chromium through chromedriver: installed here on a
# fresh machine (nothing when both are on PATH). A missing browser fails that test, never skips.
browser:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		{ apt-get update && apt-get install -y chromium chromium-driver; }

# PgBouncer and pg_auto_failover, installed only when missing (a second run touches nothing).
ha-tools:
	@if command -v pg_autoctl >/dev/null && { command -v pgbouncer >/dev/null || test -x /usr/sbin/pgbouncer; }; \
	then :; else $(SUDO) apt-get update && $(SUDO) apt-get install -y $(HA_PACKAGES); fi

# The static checks, then the suite: it starts its own PostgreSQL (unless DATABASE_URL names a
# superuser URL), PgBouncer, a pg_auto_failover formation, moto, Azurite and Chromium, one
# pytest-xdist process per core. The tests start hundreds of `python -m provisioner` and worker
# processes from this tree; with PYTHONDONTWRITEBYTECODE set (as on the CI machine) none writes
# its bytecode, and each compiled every module it imported (~0.3 s): compiled once here instead.
test: lint ha-tools $(AZURITE) browser
	$(BIN)/python -m compileall -q provisioner tests bench > /dev/null
	$(BIN)/pytest -n auto

bench: $(STAMP)
	$(BIN)/python -m bench

bench-scale: $(STAMP)
	$(BIN)/python -m bench --scale

bench-fleet-scale: $(STAMP)
	$(BIN)/python -m bench --only fleet-scale --fleet-scale-tenants 10000 \
		--output bench/results/latest-fleet-scale.json

clean:
	-$(BIN)/provisioner local stop
	rm -rf $(VENV) .provisioner tests/azurite/node_modules .pytest_cache .ruff_cache .mypy_cache
