# Leasing: `make test` runs everything CI runs; `make demo` runs the demo on SQLite.
SHELL := /bin/sh
VENV := .venv
PY := $(VENV)/bin/python
# A second environment with the oldest supported Django (6.0).
VENV60 := .venv-django60
PY60 := $(VENV60)/bin/python
# 1: `make test` also runs the suite on Django 6.0 (see test-django60).
TEST_DJANGO60 ?= 0
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
# The tests and benchmarks start hundreds of Python processes, each importing
# leasing anew: on a host that sets PYTHONDONTWRITEBYTECODE each would compile
# it from source again (a third of a process's start).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv venv-django60 lint test test-unit test-db test-process test-browser \
	test-sqlite test-postgres test-sqlite-pass test-postgres-pass test-django60 \
	test-postgres-db-job test-postgres-model-job test-postgres-process-job \
	test-postgres-browser-job test-sqlite-db-job test-sqlite-process-job \
	test-django60-postgres new-user test-ha ha-packages test-faults test-faults-short \
	test-bench-smoke test-model-long ci ci-prepare ci-django60 ci-django60-browser ci-tail \
	ha-capacity demo bench bench-history bench-dashboard bench-blocked clean docs deadcode

$(VENV)/.installed: pyproject.toml
	@test -n "$(PYTHON)" || { echo "Python 3.12 or newer is needed (with pyenv, the .python-version file selects 3.12)." >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

$(VENV60)/.installed: pyproject.toml
	@test -n "$(PYTHON)" || { echo "Python 3.12 or newer is needed (with pyenv, the .python-version file selects 3.12)." >&2; exit 1; }
	$(PYTHON) -m venv $(VENV60)
	$(PY60) -m pip install -q --upgrade pip
	$(PY60) -m pip install -q -e '.[test]' 'Django>=6.0,<6.1'
	touch $@

venv-django60: $(VENV60)/.installed

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(MAKE) --no-print-directory deadcode
	DATABASE_URL=$(SQLITE_TEST_URL) $(PY) manage.py makemigrations --check --dry-run

# Dead code in leasing/ (vulture): code nothing in the app calls. What Django, the
# templates or the app's users call by name is listed, with who calls it, in
# scripts/vulture_whitelist.py; code only the tests call is dead too.
deadcode: venv
	$(VENV)/bin/vulture leasing scripts/vulture_whitelist.py --min-confidence 60

# The tiers (tests/<tier>/, docs/how-to/contributing.md): `unit` needs no database
# server (SQLite in memory) and runs once; `db`, `process` and `browser` run on
# SQLite and on PostgreSQL (never skipped there). `make test-db` and the others
# run one tier on both databases.
UNIT_URL := sqlite:///$(CURDIR)/.test-unit.sqlite3
PG_PASS := DATABASE_URL=$(DATABASE_URL) LEASING_REQUIRE_POSTGRES=1
SERVER_TIERS := tests/db tests/process tests/browser

test-unit: venv
	DATABASE_URL=$(UNIT_URL) SQLITE_TEST_NAME=:memory: $(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-db test-process test-browser: test-%: venv
	@./scripts/ensure-chromium.sh
	@PY=$(PY) DATABASE_URL=$(DATABASE_URL) ./scripts/ensure-postgres.sh
	DATABASE_URL=$(SQLITE_TEST_URL) $(PY) -m pytest tests/$* $(PYTEST_ARGS)
	$(PG_PASS) $(PY) -m pytest tests/$* $(PYTEST_ARGS)

# Every tier on one database (the unit tier with the SQLite pass).
test-sqlite: venv
	@./scripts/ensure-chromium.sh
	DATABASE_URL=$(SQLITE_TEST_URL) $(PY) -m pytest tests/unit $(SERVER_TIERS) $(PYTEST_ARGS)

test-postgres: venv
	@./scripts/ensure-chromium.sh
	@PY=$(PY) DATABASE_URL=$(DATABASE_URL) ./scripts/ensure-postgres.sh
	$(PG_PASS) $(PY) -m pytest $(SERVER_TIERS) $(PYTEST_ARGS)

# On Django 6.0, the oldest Django the app supports: test-django60 is the
# SQLite pass of every tier, test-django60-postgres the PostgreSQL pass.
test-django60: venv-django60
	@./scripts/ensure-chromium.sh
	DATABASE_URL=$(SQLITE_TEST_URL) $(PY60) -m pytest tests/unit $(SERVER_TIERS) $(PYTEST_ARGS)

test-django60-postgres: venv-django60
	@./scripts/ensure-chromium.sh
	@PY=$(PY60) DATABASE_URL=$(DATABASE_URL) ./scripts/ensure-postgres.sh
	$(PG_PASS) $(PY60) -m pytest $(SERVER_TIERS) $(PYTEST_ARGS)

# Only the new-user test (scripts/new_user.py), on SQLite and on PostgreSQL; the
# process tier runs it too.
new-user: venv
	$(PY) scripts/new_user.py sqlite
	@PY=$(PY) DATABASE_URL=$(DATABASE_URL) ./scripts/ensure-postgres.sh
	$(PY) scripts/new_user.py postgres --database-url $(DATABASE_URL)

# The README's test command: lint beside the unit tier, then the SQLite and the
# PostgreSQL passes of the other tiers, TEST_JOBS jobs at a time (each job's output
# is shown as it ends). Each pass is cut into jobs by tier, and on PostgreSQL the
# model test (MODEL_TEST, the longest single test) apart, so that both CPUs stay
# busy to the end: the jobs are listed longest first. The browser tier runs on
# PostgreSQL only here: its pages run the same views as on SQLite, and what
# differs by database, the console's queries, the db tier runs on both; CI
# drives the pages on SQLite on Django 6.0 (ci-django60-browser), and `make
# test-browser` and `make test-sqlite` run them on SQLite too. Each PostgreSQL
# job has its own test database (LEASING_TEST_DB_SUFFIX, tests/settings.py), each
# SQLite job its own file. Set TEST_JOBS=1 to run them one after the other.
TEST_JOBS ?= 2
# The process and browser tiers mostly wait on the processes and pages they
# drive, so each of their jobs runs its test files on SLOW_TIER_WORKERS pytest
# workers (pytest-xdist; each worker has its own test database, test_<name>_gwN).
SLOW_TIER_WORKERS ?= 2
SLOW_TIER_XDIST := -n $(SLOW_TIER_WORKERS) --dist loadfile
MODEL_TEST := tests/db/test_state_model.py
SQLITE_TEST_URL_2 := sqlite:///$(CURDIR)/.test-run-2.sqlite3
TEST_PASS_JOBS := test-postgres-process-job test-sqlite-process-job test-sqlite-db-job \
	test-postgres-db-job test-postgres-browser-job test-postgres-model-job
test: venv
	$(MAKE) --no-print-directory -j$(TEST_JOBS) --output-sync=target lint test-unit
	@./scripts/ensure-chromium.sh
	@PY=$(PY) DATABASE_URL=$(DATABASE_URL) ./scripts/ensure-postgres.sh
	$(MAKE) --no-print-directory -j$(TEST_JOBS) --output-sync=target $(TEST_PASS_JOBS)
	@if [ "$(TEST_DJANGO60)" = 1 ]; then $(MAKE) --no-print-directory test-django60; fi

test-postgres-db-job: venv
	$(PG_PASS) LEASING_TEST_DB_SUFFIX=_db $(PY) -m pytest tests/db --ignore=$(MODEL_TEST) $(PYTEST_ARGS)

test-postgres-model-job: venv
	$(PG_PASS) LEASING_TEST_DB_SUFFIX=_model $(PY) -m pytest $(MODEL_TEST) $(PYTEST_ARGS)

test-postgres-process-job: venv
	$(PG_PASS) $(PY) -m pytest $(SLOW_TIER_XDIST) tests/process $(PYTEST_ARGS)

test-postgres-browser-job: venv
	$(PG_PASS) LEASING_TEST_DB_SUFFIX=_browser $(PY) -m pytest $(SLOW_TIER_XDIST) tests/browser $(PYTEST_ARGS)

test-sqlite-db-job: venv
	DATABASE_URL=$(SQLITE_TEST_URL_2) $(PY) -m pytest tests/db $(PYTEST_ARGS)

test-sqlite-process-job: venv
	DATABASE_URL=$(SQLITE_TEST_URL) $(PY) -m pytest $(SLOW_TIER_XDIST) tests/process $(PYTEST_ARGS)

# One pass of every server tier in one run.
test-sqlite-pass: venv
	DATABASE_URL=$(SQLITE_TEST_URL) $(PY) -m pytest $(SERVER_TIERS) $(PYTEST_ARGS)

test-postgres-pass: venv
	$(PG_PASS) $(PY) -m pytest $(SERVER_TIERS) $(PYTEST_ARGS)

# Every benchmark scenario at small sizes against PostgreSQL (2-5 minutes;
# the first run also builds the peers' virtualenv): checks that each runs and
# reports sane figures, never a speed.
test-bench-smoke: venv
	@PY=$(PY) DATABASE_URL=$(DATABASE_URL) ./scripts/ensure-postgres.sh
	LEASING_BENCH_SMOKE=1 DATABASE_URL=$(DATABASE_URL) LEASING_REQUIRE_POSTGRES=1 \
		$(PY) -m pytest tests/bench/test_bench_smoke.py $(PYTEST_ARGS)

# The model test (tests/db/test_state_model.py) with MODEL_EXAMPLES examples of up
# to 50 steps, on SQLite then on PostgreSQL (`make test` runs 150). A failure
# prints the shrunk sequence of steps; .hypothesis/ keeps it, so the next run
# replays it first.
MODEL_EXAMPLES ?= 5000
test-model-long: venv
	DATABASE_URL=$(SQLITE_TEST_URL) LEASING_MODEL_EXAMPLES=$(MODEL_EXAMPLES) \
		$(PY) -m pytest tests/db/test_state_model.py $(PYTEST_ARGS)
	@PY=$(PY) DATABASE_URL=$(DATABASE_URL) ./scripts/ensure-postgres.sh
	DATABASE_URL=$(DATABASE_URL) LEASING_REQUIRE_POSTGRES=1 LEASING_MODEL_EXAMPLES=$(MODEL_EXAMPLES) \
		$(PY) -m pytest tests/db/test_state_model.py $(PYTEST_ARGS)

# What CI runs (.ci/run): the README's `make test`, then five pipelines at once:
# the benchmark smoke run, the HA suite, the short fault run, ci-tail (the
# documentation site, then the unit tier and part of the db tier on Django
# 6.0) and the browser tier on Django 6.0.
# CI's pass on Django 6.0 is the unit, db (in part) and browser tiers on SQLite: the
# browser tier there is also the console in a page on SQLite, which `make test`
# drives on PostgreSQL only, and the admin's templates are the release's own.
# The process tier runs the same code in other processes, whose behaviour does
# not depend on the Django release, and the new-user test installs the newest
# Django whatever runs the suite.
# Its db tier is the files whose code calls Django's own APIs beyond the
# connection and the transaction (the admin, the console's views, the Tasks
# backend, models and forms, settings checks, commands, the test helpers):
# the engine's statements are raw SQL, run the same on either release, and
# `make test` runs them on both databases. `make test-django60` runs them all.
# Its browser tier is a pipeline of its own (ci-django60-browser), with its own file.
DJANGO60_URL := sqlite:///$(CURDIR)/.test-django60.sqlite3
DJANGO60_BROWSER_URL := sqlite:///$(CURDIR)/.test-django60-browser.sqlite3
DJANGO60_DB_TESTS := $(wildcard tests/db/test_admin*.py tests/db/test_schedules_admin.py \
	tests/db/test_fuzz_admin.py tests/db/test_tasks.py tests/db/test_dashboard.py \
	tests/db/test_console_*.py tests/db/internal/test_console_*.py tests/db/test_entry_points.py \
	tests/db/test_models.py tests/db/test_conf.py tests/db/test_settings_strict.py \
	tests/db/test_public_api.py tests/db/test_read_database.py tests/db/test_command_flags.py \
	tests/db/test_*_command.py tests/db/test_testing_*.py tests/db/test_signals.py \
	tests/db/test_optional_dependencies.py tests/db/test_django_q.py)
ci-django60: venv-django60
	DATABASE_URL=$(DJANGO60_URL) $(PY60) -m pytest tests/unit $(DJANGO60_DB_TESTS) $(PYTEST_ARGS)

ci-django60-browser: venv-django60
	@./scripts/ensure-chromium.sh
	DATABASE_URL=$(DJANGO60_BROWSER_URL) $(PY60) -m pytest $(SLOW_TIER_XDIST) tests/browser $(PYTEST_ARGS)

# What phase two of .ci/run installs (downloads, mostly), built while `make test`
# runs: the Django 6.0 virtualenv and the benchmark peers' (bench.peers.venv).
ci-prepare: venv venv-django60
	$(PY) -c "from bench.peers.venv import peers_python; peers_python()"

ci-tail:
	$(MAKE) --no-print-directory docs
	$(MAKE) --no-print-directory ci-django60

ci:
	./.ci/run

# Debian's packages of test-ha and the fault runs, installed once even when
# .ci/run makes test-ha and test-faults-short at once (one apt-get at a time).
ha-packages:
	@./scripts/ha/ensure-packages.sh

# Failover, a transaction pooler, network partitions, a read replica and
# autovacuum with the shipped per-table settings, on
# throwaway clusters, pgbouncer and network namespaces this machine makes and
# removes (needs root and Debian's PostgreSQL packages); about 4-5 minutes.
test-ha: venv ha-packages
	@PY=$(PY) DATABASE_URL=$(DATABASE_URL) ./scripts/ensure-postgres.sh
	LEASING_HA_TESTS=1 DATABASE_URL=$(DATABASE_URL) $(PY) -m pytest tests/ha -m ha $(PYTEST_ARGS)

# Real workers, sweeps and schedulers on a throwaway cluster behind pgbouncer
# while processes are killed, backends ended, PostgreSQL and pgbouncer restarted
# and clocks skewed; then a checker proves the history kept every promise
# (docs/fault-run.md, which this target rewrites). Needs root and Debian's
# PostgreSQL packages; FAULTS_SECONDS of faults (default 240), about 6 minutes.
FAULTS_SECONDS ?= 240
test-faults: venv ha-packages
	LEASING_FAULT_TESTS=1 FAULTS_SECONDS=$(FAULTS_SECONDS) FAULTS_REPORT=$(CURDIR)/docs/fault-run.md \
		$(PY) -m pytest tests/faults -m faults -p no:cacheprovider -s $(PYTEST_ARGS)

# The same with 75 s of faults (what CI runs): under 3 minutes; its report goes
# to artifacts/faults/report.md only.
test-faults-short: venv ha-packages
	LEASING_FAULT_TESTS=1 FAULTS_SECONDS=75 FAULTS_SETTLE_SECONDS=60 \
		$(PY) -m pytest tests/faults -m faults -p no:cacheprovider -s $(PYTEST_ARGS)

# Throughput against worker processes 1..32 through pgbouncer (BENCHMARKS.md).
ha-capacity: venv
	@./scripts/ha/ensure-packages.sh
	$(PY) scripts/ha/capacity.py $(BENCH_ARGS)

# The documentation site (mkdocs.yml, docs/) into site/, warnings as errors: a
# broken link or anchor, or a gap in the reference generated from the code,
# fails it. The `docs` extra installs on first use.
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install -q -e '.[test,docs]'
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# Everything on the embedded SQLite database: data, a worker pass, then the
# dashboard, a worker and the sweep (Ctrl-C stops them).
demo: venv
	DEBUG=1 DATABASE_URL=$(DEMO_URL) $(PY) manage.py demo

# The benchmark suite (BENCHMARKS.md): its own database on the PostgreSQL server
# of DATABASE_URL; under 15 minutes (the first run also builds the peers'
# virtualenv, bench/.peers-venv). Not part of `make test` (`make test-bench-smoke` runs every scenario small).
bench: venv
	@PY=$(PY) DATABASE_URL=$(DATABASE_URL) ./scripts/ensure-postgres.sh
	DATABASE_URL=$(DATABASE_URL) $(PY) -m bench.run $(BENCH_ARGS)

# Claim latency and the sweep with 10,000,000 rows of history against 1,000,000
# (BENCHMARKS.md); loading the rows takes most of its 10-20 minutes.
bench-history: venv
	@PY=$(PY) DATABASE_URL=$(DATABASE_URL) ./scripts/ensure-postgres.sh
	DATABASE_URL=$(DATABASE_URL) $(PY) -m bench.run --only history $(BENCH_ARGS)

# Every admin console page at 1,000,000 work items with 4 live workers; about 10 minutes.
bench-dashboard: venv
	@PY=$(PY) DATABASE_URL=$(DATABASE_URL) ./scripts/ensure-postgres.sh
	DATABASE_URL=$(DATABASE_URL) $(PY) bench/dashboard.py

# Claim latency with 100,000 items blocked by dependencies vs none; about 10 minutes.
bench-blocked: venv
	@PY=$(PY) DATABASE_URL=$(DATABASE_URL) ./scripts/ensure-postgres.sh
	DATABASE_URL=$(DATABASE_URL) $(PY) -m bench.blocked $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(VENV60) .cache bench/.peers-venv .test-*.sqlite3* artifacts
