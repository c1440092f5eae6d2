# accord: `make demo` and `make test` work on a fresh machine (they install what they need).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-stamp

export ACCORD_PG_DSN ?= postgresql://postgres@127.0.0.1:5432/accord
export ACCORD_AMQP_URL ?= amqp://guest:guest@127.0.0.1:5672/

.PHONY: venv services test lint demo bench schema clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

services:
	bash deploy/services.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# pytest exits 5 when it ran no test; make treats that as a failure like any other.
test: venv services
	$(BIN)/pytest -q --durations=15

# The demo is one application (accord.demo:app): its tables are its own migrations.
demo: venv services
	$(BIN)/accord migrate --app accord.demo:app
	$(BIN)/accord demo

# Each prints its ratios against the raw limits measured in the same run (figures in README).
bench: venv services
	$(BIN)/python -m bench.relay_bench
	$(BIN)/python -m bench.consumer_bench
	$(BIN)/python -m bench.jobs_bench
	$(BIN)/python -m bench.worker_start_bench
	$(BIN)/python -m bench.retention_bench
	$(BIN)/python -m bench.pipeline_bench --n 200 --dbos

# After adding a migration: rewrite each module's current SQL (jobs/schema.sql, ...) from a
# scratch database migrated by the code; tests/integration/test_schema_files.py checks them.
schema: venv services
	$(BIN)/python -m accord.schemas.schema_files

clean:
	rm -rf $(VENV) var
