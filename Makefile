# kafka-retry-scheduler: every target creates and uses .venv/ at the repository root.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

# Python caches what it compiles (__pycache__): a machine that sets PYTHONDONTWRITEBYTECODE (Python's
# Docker images do) would otherwise compile Airflow's modules again in every process the tests and the
# dev stack start, and uv installs without compiling. `import airflow` took 7.2 CPU seconds, 2.8 cached.
unexport PYTHONDONTWRITEBYTECODE

# Targets that do not depend on each other run side by side, two at a time (make test's lint, Spark's
# class archive and the browser check); their lines may interleave.
MAKEFLAGS += --jobs=2
# apt-get, one at a time: two targets installing side by side would find dpkg's lock taken.
APT := flock --wait 900 /tmp/.retry-scheduler-apt.lock apt-get

.PHONY: help venv lint format postgres spark-deps browser-deps test test-fast test-random test-unit up demo bench bench-quick clean docs

help:
	@echo "make demo   run an end-to-end scenario under the real Airflow scheduler (embedded defaults)"
	@echo "make test   lint, type-check and run every test (needs PostgreSQL; started if missing)"
	@echo "make test-fast  unit and integration tests without Airflow, Spark or clusters, in parallel"
	@echo "make up     broker + PostgreSQL + Airflow (http://localhost:8080, admin/admin) until Ctrl-C"
	@echo "make bench  benchmark report against baselines, full sizes (bench/out/report.md; ~1 h)"
	@echo "make chaos  fault injection: 100 trials and the bad-input corpus (bench/out/chaos.json; ~18 min)"
	@echo "make lint   ruff + mypy only"
	@echo "make docs   the documentation site from docs/ into site/ (make test builds it strictly)"

# uv installs the packages (about 30 s from an empty cache against pip's 80, and the install tests'
# environments then come from its cache); pip does it where uv cannot run.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
		echo "make: Python 3.11 or newer is needed, and $(PYTHON) is $$($(PYTHON) --version 2>&1): run make PYTHON=python3.11 (or newer)" >&2; exit 1; }
	@if [ -x $(BIN)/python ] && ! $(BIN)/python -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then \
		echo "make: $(VENV) was made with $$($(BIN)/python --version 2>&1), older than 3.11: remove it (make clean) and run make again" >&2; exit 1; fi
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip uv
	$(BIN)/uv pip install --quiet --python $(BIN)/python -e ".[dev]" || $(BIN)/pip install --quiet -e ".[dev]"
	@rm -f $(VENV)/.installed-*
	@touch $@

venv: $(STAMP)

lint: venv
	$(BIN)/ruff check plugins dags examples tests include bench
	$(BIN)/ruff format --check plugins dags examples tests include bench
	$(BIN)/mypy

format: venv
	$(BIN)/ruff format plugins dags examples tests include bench
	$(BIN)/ruff check --fix plugins dags examples tests include bench

# PostgreSQL must answer for the tests; the dev tooling starts one from the machine's binaries if not.
postgres: venv
	$(BIN)/retry-scheduler dev postgres

# Spark reads PostgreSQL over JDBC: Debian's driver locally (a cluster uses RETRY_SPARK_PACKAGES), and Java 17+.
# Then the class archive that makes every Spark job's driver start faster (once per JDK and Spark version).
JDBC_JAR ?= /usr/share/java/postgresql.jar
spark-deps: venv
	@command -v java >/dev/null || { echo "Spark needs Java 17+: apt-get install openjdk-17-jre-headless" >&2; exit 1; }
	@test -f $(JDBC_JAR) || { \
		if [ "$$(id -u)" = 0 ]; then ($(APT) install -y -q libpostgresql-jdbc-java || \
			($(APT) update -q && $(APT) install -y -q libpostgresql-jdbc-java)) >/dev/null; \
		else echo "Spark needs the PostgreSQL JDBC driver: sudo apt-get install libpostgresql-jdbc-java" >&2; exit 1; fi; }
	$(BIN)/retry-scheduler dev spark-archive

# The Dead letters page is tested in Debian's chromium, driven by Playwright (which cannot download its own here).
CHROMIUM ?= /usr/bin/chromium
browser-deps:
	@test -x $(CHROMIUM) || { \
		if [ "$$(id -u)" = 0 ]; then ($(APT) install -y -q chromium || \
			($(APT) update -q && $(APT) install -y -q chromium)) >/dev/null; \
		else echo "The browser tests need Debian's chromium: sudo apt-get install chromium" >&2; exit 1; fi; }

# Every test. The tests that wait more than they compute run side by side in $(TEST_WORKERS) processes
# (pytest-xdist, work stealing: a worker whose tests are done takes over half of another's; each worker
# has its own broker, databases and Airflow home). Those that need the whole machine (marked serial:
# benchmarks, chaos, capacity, the Spark cluster) run alone after them. Each part prints its 15 slowest
# tests and writes a JUnit report to .test-reports/ (.ci/run prints the slowest of both); a process a
# test left running fails the run.
TEST_WORKERS ?= 4
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider --durations=15
PARALLEL := -n $(TEST_WORKERS) --dist worksteal -m "not serial"
test: lint postgres spark-deps browser-deps
	@mkdir -p .test-reports
	$(PYTEST) $(PARALLEL) --junitxml=.test-reports/parallel.xml
	$(PYTEST) -m serial --junitxml=.test-reports/serial.xml

# The parallel part in a random order (its seed is printed first; SEED=n replays one): no test may
# depend on what another left behind or did first.
ifndef SEED
SEED := $(shell od -An -N3 -tu4 /dev/urandom | tr -d ' ')
endif
test-random: venv postgres spark-deps browser-deps
	@echo "random order, seed $(SEED) (make test-random SEED=$(SEED) replays it)"
	$(PYTEST) $(PARALLEL) --random-order-bucket=global --random-order-seed=$(SEED)

# The edit-run loop: unit and integration tests without Airflow, Spark or the whole-machine ones (minutes).
test-fast: venv postgres
	$(PYTEST) -n $(TEST_WORKERS) --dist worksteal -m "not serial and not airflow and not spark and not cluster" tests/unit tests/integration

# The site (mkdocs.yml, docs/); tests/unit/test_docs.py builds it with --strict in make test.
docs: venv
	$(BIN)/mkdocs build --strict

test-unit: venv
	$(BIN)/python -m pytest -q tests/unit

# EXECUTOR=celery runs the tasks on a Celery worker with Redis (started when none answers).
EXECUTOR ?= local
up: venv spark-deps
	$(BIN)/retry-scheduler dev up --executor $(EXECUTOR)

demo: venv
	$(BIN)/retry-scheduler demo --executor $(EXECUTOR)

# The report (report.json, report.md, PNG plots) goes to $(BENCH_OUT); every figure is measured with its
# baseline in the same run, on a throwaway database (retry_bench) and an embedded broker on a free port.
BENCH_OUT ?= bench/out
BENCH_ARGS ?=
bench: venv postgres spark-deps
	@mkdir -p $(BENCH_OUT)
	$(BIN)/retry-scheduler bench --out $(BENCH_OUT) $(BENCH_ARGS)

bench-quick: venv postgres
	@mkdir -p $(BENCH_OUT)/quick
	$(BIN)/retry-scheduler bench --quick --out $(BENCH_OUT)/quick $(BENCH_ARGS)

# Fault injection: kill -9 of the workers and of the bulk jobs at named points, the broker frozen,
# PostgreSQL restarted, and a bad-input corpus, on a private PostgreSQL and broker; writes
# bench/out/chaos.json, fails unless nothing was lost (~18 min). CHAOS_SEED=S replays a run; `make test` runs a short version.
.PHONY: chaos chaos-ordered
CHAOS_TRIALS ?= 100
CHAOS_RECORDS ?= 2500
chaos: venv
	$(BIN)/retry-scheduler chaos --trials $(CHAOS_TRIALS) --records $(CHAOS_RECORDS) --out bench/out \
		$(if $(CHAOS_SEED),--seed $(CHAOS_SEED))

# Ordered mode's model-based test over many seeds (tests/integration/test_ordered_model.py): one JSON
# line per run in bench/out/chaos-ordered.jsonl, summed up in bench/out/chaos-ordered.json.
CHAOS_ORDERED_SEEDS ?= $(shell seq -s, 101 120)
chaos-ordered: venv
	rm -f bench/out/chaos-ordered.jsonl
	RETRY_MODEL_SEEDS=$(CHAOS_ORDERED_SEEDS) RETRY_MODEL_REPORT=$(CURDIR)/bench/out/chaos-ordered.jsonl \
		$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 tests/integration/test_ordered_model.py; \
		status=$$?; $(BIN)/python -m bench.chaos_ordered bench/out/chaos-ordered.jsonl bench/out/chaos-ordered.json; \
		exit $$status

clean:
	rm -rf $(VENV) .dev .airflow .airflow-test .airflow-test-* .test-reports .mypy_cache .ruff_cache site
