# One entry point for a fresh machine: every target installs what it needs first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
AZURITE := tests/azurite/node_modules/.bin/azurite-blob

.PHONY: install demo demo-stop test lint bench bench-scale clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(AZURITE): tests/azurite/package.json tests/azurite/package-lock.json
	npm ci --prefix tests/azurite --no-audit --no-fund --loglevel=error
	touch $(AZURITE)

# Provision a demo tenant on the embedded PostgreSQL under .provisioner/ (started on first use).
demo: $(STAMP)
	$(BIN)/provisioner migrate
	$(BIN)/provisioner provision demo

demo-stop: $(STAMP)
	$(BIN)/provisioner local stop

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check provisioner
	$(BIN)/mypy

# Starts its own PostgreSQL (unless DATABASE_URL names a superuser URL), moto and Azurite.
test: $(STAMP) $(AZURITE)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python -m bench

bench-scale: $(STAMP)
	$(BIN)/python -m bench --scale

clean:
	-$(BIN)/provisioner local stop
	rm -rf $(VENV) .provisioner tests/azurite/node_modules .pytest_cache .ruff_cache .mypy_cache
