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
APT := DEBIAN_FRONTEND=noninteractive flock --wait 900 /tmp/.retry-scheduler-apt.lock apt-get

.PHONY: help venv lint format system-deps pg-deps postgres kafka-deps redis-deps spark-deps browser-deps interop-tools interop-deps chaos-cluster chaos-failover test test-fast test-random test-unit up demo bench bench-quick clean docs

help:
	@echo "make demo   run an end-to-end scenario under the real Airflow scheduler (embedded defaults)"
	@echo "make test   lint, type-check and run every test (needs PostgreSQL; started if missing)"
	@echo "make test-fast  unit and integration tests without Airflow, Spark or clusters, in parallel"
	@echo "make up     broker + PostgreSQL + Airflow (http://localhost:8080, admin/admin) until Ctrl-C"
	@echo "make up CLUSTER=3  the same on a Kafka cluster of three brokers (topics with three replicas)"
	@echo "make bench  benchmark report against baselines, full sizes (bench/out/report.md; ~1 h)"
	@echo "make chaos  fault injection, every kind: the three below, one after the other (bench/out/chaos.json; ~65 min)"
	@echo "make chaos-service  100 trials of the service's processes killed, the broker frozen, PostgreSQL restarted, bad input (~18 min)"
	@echo "make chaos-cluster  100 trials of a three-broker Kafka cluster failing (the cluster entry of chaos.json; ~40 min)"
	@echo "make chaos-failover  24 trials of the PostgreSQL primary killed, its replica promoted (the failover entry; ~6 min)"
	@echo "make lint   ruff + mypy only"
	@echo "make system-deps  what the targets need from Debian's packages, installed when missing (root)"
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

# What the targets need from Debian's packages is installed when missing (as root; otherwise the one
# command that would): $(call need,CHECK,PACKAGES,WHAT NEEDS THEM).
define need
	@$(1) >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ]; then echo "installing $(2) (Debian's packages) for $(3)"; \
			($(APT) install -y -q $(2) || ($(APT) update -q && $(APT) install -y -q $(2))) >/dev/null \
				&& $(1) >/dev/null 2>&1 || { echo "installing $(2) failed: run apt-get install $(2)" >&2; exit 1; }; \
		else echo "$(3) needs $(2): sudo apt-get install $(2)" >&2; exit 1; fi; }
endef

# PostgreSQL's server binaries. Debian's package creates and starts a cluster of its own on port 5432,
# which asks for passwords over TCP: it is stopped at once, and the dev tooling starts its own there.
PG_SERVER = ls /usr/lib/postgresql/*/bin/postgres
pg-deps:
	@$(PG_SERVER) >/dev/null 2>&1 || { \
		if [ "$$(id -u)" != 0 ]; then echo "PostgreSQL's server is not installed: sudo apt-get install postgresql" >&2; exit 1; fi; \
		echo "installing postgresql (Debian's package) for the retry database"; \
		($(APT) install -y -q postgresql || ($(APT) update -q && $(APT) install -y -q postgresql)) >/dev/null \
			&& $(PG_SERVER) >/dev/null 2>&1 || { echo "installing postgresql failed: run apt-get install postgresql" >&2; exit 1; }; \
		pg_lsclusters --no-header 2>/dev/null | while read -r version cluster _rest; do \
			pg_ctlcluster --skip-systemctl-redirect "$$version" "$$cluster" stop 2>/dev/null || true; done; }

# Everything the targets need from Debian's packages, at once (.ci/run starts with it: a fresh machine
# has no PostgreSQL server, Redis, Chromium, JDK, Maven or JDBC driver).
system-deps: pg-deps redis-deps browser-deps
	$(call need,command -v java,openjdk-17-jre-headless,Spark and the dev broker)
	$(call need,command -v mvn,maven,fetching the dev broker's jars)
	$(call need,command -v javac,openjdk-17-jdk-headless,the interop tests' Java programs)
	$(call need,command -v kcat,kcat,the docs' kcat examples)
	$(call need,test -f $(JDBC_JAR),libpostgresql-jdbc-java,Spark's JDBC reads)

# PostgreSQL must answer for the tests; the dev tooling starts one from the machine's binaries if not.
postgres: venv pg-deps
	$(BIN)/retry-scheduler dev postgres

# The dev broker, Apache Kafka 4.4 (KRaft): its jars from Maven Central by Maven, once, into a cache
# (~/.cache/kafka-retry-scheduler); it runs on the machine's Java 17+.
kafka-deps: venv
	$(call need,command -v java,openjdk-17-jre-headless,the dev broker (Apache Kafka))
	$(call need,command -v mvn,maven,fetching the dev broker's jars)
	@$(BIN)/retry-scheduler dev kafka-deps

# Redis, for the CeleryExecutor (make up EXECUTOR=celery and the Celery tests).
redis-deps:
	$(call need,command -v redis-server,redis-server,the CeleryExecutor's broker)

# Spark reads PostgreSQL over JDBC: Debian's driver locally (a cluster uses RETRY_SPARK_PACKAGES), and Java 17+.
# Then the class archive that makes every Spark job's driver start faster (once per JDK and Spark version).
JDBC_JAR ?= /usr/share/java/postgresql.jar
spark-deps: venv
	$(call need,command -v java,openjdk-17-jre-headless,Spark)
	$(call need,test -f $(JDBC_JAR),libpostgresql-jdbc-java,Spark's JDBC reads)
	$(BIN)/retry-scheduler dev spark-archive

# The interop tests run real applications of the tools whose dead letters the service adopts (Spring
# Kafka, Kafka Connect, Kafka Streams, a Java share consumer) and the docs' Java and kcat examples:
# Maven builds them once per machine into ~/.cache/kafka-retry-scheduler/interop-<hash> (tests/interop/),
# here or, under make test, by the first test that needs them (beside the other tests: a minute cold).
interop-tools:
	$(call need,command -v javac,openjdk-17-jdk-headless,the interop tests' Java programs)
	$(call need,command -v mvn,maven,building the interop tests' Java programs)
	$(call need,command -v kcat,kcat,the docs' kcat examples)
interop-deps: venv interop-tools
	@$(BIN)/python -c 'from tests.interop.build import build; print("interop programs built in", build())'

# The Dead letters page is tested in Debian's chromium, driven by Playwright (which cannot download its own here).
CHROMIUM ?= /usr/bin/chromium
browser-deps:
	$(call need,test -x $(CHROMIUM),chromium,the browser tests)

# Every test. The tests that wait more than they compute run side by side in $(TEST_WORKERS) processes
# (pytest-xdist, work stealing: a worker whose tests are done takes over half of another's; each worker
# has its own broker, databases and Airflow home); the longest start first (e2e, clusters, chaos trials,
# the ordered model, the benchmark in small). Those that measure the machine (marked serial: the
# capacity steps, whose lateness is timed, and CPU shares) run alone after them. Each part prints its
# 15 slowest tests and writes a JUnit report to .test-reports/ (.ci/run prints the slowest of both); a
# process a test left running fails the run.
TEST_WORKERS ?= 5
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider --durations=15
PARALLEL := -n $(TEST_WORKERS) --dist worksteal -m "not serial"
test: lint postgres kafka-deps spark-deps browser-deps redis-deps interop-tools
	@mkdir -p .test-reports
	$(PYTEST) $(PARALLEL) --junitxml=.test-reports/parallel.xml
	$(PYTEST) -m serial --junitxml=.test-reports/serial.xml

# The parallel part in a random order (its seed is printed first; SEED=n replays one): no test may
# depend on what another left behind or did first.
ifndef SEED
SEED := $(shell od -An -N3 -tu4 /dev/urandom | tr -d ' ')
endif
test-random: venv postgres kafka-deps spark-deps browser-deps redis-deps
	@echo "random order, seed $(SEED) (make test-random SEED=$(SEED) replays it)"
	$(PYTEST) $(PARALLEL) --random-order-bucket=global --random-order-seed=$(SEED)

# The edit-run loop: unit and integration tests without Airflow, Spark, clusters, chaos trials, the
# ordered model's random runs and the benchmark in small (marked long), or the machine's measures (minutes).
test-fast: venv postgres kafka-deps
	$(PYTEST) -n $(TEST_WORKERS) --dist worksteal -m "not serial and not long and not airflow and not spark and not cluster" tests/unit tests/integration

# The site (mkdocs.yml, docs/); tests/unit/test_docs.py builds it with --strict in make test.
docs: venv
	$(BIN)/mkdocs build --strict

test-unit: venv
	$(BIN)/python -m pytest -q tests/unit

# EXECUTOR=celery runs the tasks on a Celery worker with Redis (started when none answers).
EXECUTOR ?= local
up: venv pg-deps kafka-deps spark-deps $(if $(filter celery,$(EXECUTOR)),redis-deps)
	$(BIN)/retry-scheduler dev up --executor $(EXECUTOR) $(if $(CLUSTER),--kafka-brokers $(CLUSTER))

demo: venv pg-deps kafka-deps $(if $(filter celery,$(EXECUTOR)),redis-deps)
	$(BIN)/retry-scheduler demo --executor $(EXECUTOR)

# The report (report.json, report.md, PNG plots) goes to $(BENCH_OUT); every figure is measured with its
# baseline in the same run, on a throwaway database (retry_bench) and an embedded broker on a free port.
BENCH_OUT ?= bench/out
BENCH_ARGS ?=
bench: venv postgres kafka-deps spark-deps
	@mkdir -p $(BENCH_OUT)
	$(BIN)/retry-scheduler bench --out $(BENCH_OUT) $(BENCH_ARGS)

bench-quick: venv postgres kafka-deps
	@mkdir -p $(BENCH_OUT)/quick
	$(BIN)/retry-scheduler bench --quick --out $(BENCH_OUT)/quick $(BENCH_ARGS)

# Fault injection, every kind: the service's own (chaos-service), a Kafka cluster's (chaos-cluster) and
# a PostgreSQL failover's (chaos-failover), one after the other (~65 min); each writes its entry of
# bench/out/chaos.json and fails unless nothing was lost. CHAOS_SEED=S replays a run; `make test` runs
# a short version of each.
.PHONY: chaos chaos-service chaos-ordered
chaos: chaos-service chaos-cluster chaos-failover

# kill -9 of the workers and of the bulk jobs at named points, the broker frozen, PostgreSQL restarted,
# and a bad-input corpus, on a private PostgreSQL and broker (~18 min).
CHAOS_TRIALS ?= 100
CHAOS_RECORDS ?= 2500
chaos-service: venv pg-deps kafka-deps
	$(BIN)/retry-scheduler chaos --trials $(CHAOS_TRIALS) --records $(CHAOS_RECORDS) --out bench/out \
		$(if $(CHAOS_SEED),--seed $(CHAOS_SEED))

# The trials of a Kafka cluster failing (bench/chaos/cluster.py): the cluster entry of bench/out/chaos.json.
CHAOS_CLUSTER_TRIALS ?= 100
chaos-cluster: venv pg-deps kafka-deps
	$(BIN)/retry-scheduler chaos --cluster --trials $(CHAOS_CLUSTER_TRIALS) --records $(CHAOS_RECORDS) --out bench/out \
		$(if $(CHAOS_SEED),--seed $(CHAOS_SEED))

# The trials of the PostgreSQL primary killed and its replica promoted (bench/chaos/failover.py): the
# failover entry of bench/out/chaos.json.
CHAOS_FAILOVER_TRIALS ?= 24
chaos-failover: venv pg-deps kafka-deps
	$(BIN)/retry-scheduler chaos --postgres-failover --trials $(CHAOS_FAILOVER_TRIALS) --records $(CHAOS_RECORDS) \
		--out bench/out $(if $(CHAOS_SEED),--seed $(CHAOS_SEED))

# Ordered mode's model-based test over many seeds (tests/integration/test_ordered_model.py): one JSON
# line per run in bench/out/chaos-ordered.jsonl, summed up in bench/out/chaos-ordered.json (the ordered
# entry of chaos.json). CLUSTER=1: on three brokers and two controllers, the cluster's faults among the
# others (bench/out/chaos-ordered-cluster.json*, the ordered_cluster entry), one run at a time.
CHAOS_ORDERED_SEEDS ?= $(shell seq -s, 101 120)
ORDERED_NAME = chaos-ordered$(if $(filter 1,$(CLUSTER)),-cluster)
chaos-ordered: venv pg-deps kafka-deps
	rm -f bench/out/$(ORDERED_NAME).jsonl
	RETRY_MODEL_SEEDS=$(CHAOS_ORDERED_SEEDS) RETRY_MODEL_REPORT=$(CURDIR)/bench/out/$(ORDERED_NAME).jsonl \
		RETRY_MODEL_CLUSTER=$(if $(filter 1,$(CLUSTER)),1,0) \
		$(BIN)/python -m pytest -q -p no:cacheprovider -n $(if $(filter 1,$(CLUSTER)),1,2) \
		tests/integration/test_ordered_model.py -k test_every_key_keeps_its_order_under_random_faults; \
		status=$$?; $(BIN)/python -m bench.chaos_ordered bench/out/$(ORDERED_NAME).jsonl bench/out/$(ORDERED_NAME).json \
		$(if $(filter 1,$(CLUSTER)),ordered_cluster,ordered); \
		exit $$status

clean:
	rm -rf $(VENV) .dev .airflow .airflow-test .airflow-test-* .test-reports .mypy_cache .ruff_cache site
