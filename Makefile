# Leasing: `make test` runs everything CI runs; `make demo` runs the demo on SQLite.
SHELL := /bin/sh
VENV := .venv
PY := $(VENV)/bin/python
# The first Python >= 3.12 on PATH (pyenv: .python-version selects 3.12).
PYTHON ?= $(shell for p in python3.12 python3.13 python3 python; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null \
	&& { echo $$p; break; }; done)
DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
SQLITE_TEST_URL := sqlite:///$(CURDIR)/.test-run.sqlite3
DEMO_URL := sqlite:///$(CURDIR)/db.sqlite3
PYTEST_ARGS ?=
BENCH_ARGS ?=

# Browser tests use Debian's Chromium; Playwright must never fetch its own.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1

.PHONY: venv lint test test-sqlite test-postgres demo bench bench-dashboard bench-blocked clean

$(VENV)/.installed: pyproject.toml
	@test -n "$(PYTHON)" || { echo "Python 3.12 or newer is needed (with pyenv, the .python-version file selects 3.12)." >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

lint: venv
	$(VENV)/bin/ruff check .
	DATABASE_URL=$(SQLITE_TEST_URL) $(PY) manage.py makemigrations --check --dry-run

test-sqlite: venv
	@./scripts/ensure-chromium.sh
	DATABASE_URL=$(SQLITE_TEST_URL) $(PY) -m pytest $(PYTEST_ARGS)

test-postgres: venv
	@./scripts/ensure-chromium.sh
	@PY=$(PY) DATABASE_URL=$(DATABASE_URL) ./scripts/ensure-postgres.sh
	DATABASE_URL=$(DATABASE_URL) LEASING_REQUIRE_POSTGRES=1 $(PY) -m pytest $(PYTEST_ARGS)

# The whole suite on SQLite, then on PostgreSQL (never skipped).
test: lint
	@PY=$(PY) DATABASE_URL=$(DATABASE_URL) ./scripts/ensure-postgres.sh
	$(MAKE) --no-print-directory test-sqlite
	$(MAKE) --no-print-directory test-postgres

# Everything on the embedded SQLite database: data, a worker pass, then the
# dashboard, a worker and the sweep (Ctrl-C stops them).
demo: venv
	DEBUG=1 DATABASE_URL=$(DEMO_URL) $(PY) manage.py demo

# The benchmark suite (BENCHMARKS.md): its own database on the PostgreSQL server
# of DATABASE_URL; about 7 minutes. Not part of `make test` (a smoke run is).
bench: venv
	@PY=$(PY) DATABASE_URL=$(DATABASE_URL) ./scripts/ensure-postgres.sh
	DATABASE_URL=$(DATABASE_URL) $(PY) -m bench.run $(BENCH_ARGS)

# The admin pages at 1,000,000 work items (SPEC §15); about 3 minutes.
bench-dashboard: venv
	@PY=$(PY) DATABASE_URL=$(DATABASE_URL) ./scripts/ensure-postgres.sh
	DATABASE_URL=$(DATABASE_URL) $(PY) bench/dashboard.py

# Claim latency with 100,000 items blocked by dependencies vs none; about 10 minutes.
bench-blocked: venv
	@PY=$(PY) DATABASE_URL=$(DATABASE_URL) ./scripts/ensure-postgres.sh
	DATABASE_URL=$(DATABASE_URL) $(PY) -m bench.blocked $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .test-run.sqlite3* .test-db.sqlite3* artifacts
