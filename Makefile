# Every target installs what it needs into $(VENV) itself, so a fresh clone works. Another
# interpreter gets a venv of its own beside the first:
#   make test PYTHON=/root/.pyenv/versions/3.13.0/bin/python3.13 VENV=.venv-3.13
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev
NBVAL  := --nbval-lax --nbval-current-env --nbval-cell-timeout=120
# Tests outside the notebooks run without nbval's plugin (its import costs each process ~1.5 s).
PYTEST := $(BIN)/python -m pytest -p no:nbval
# This machine's environment sets PYTHONDONTWRITEBYTECODE: every test process then compiles
# nbqueue again and pytest rewrites every test module's asserts again (~6 s per process).
unexport PYTHONDONTWRITEBYTECODE
# Test processes for the fast set: two cores, shared with the PostgreSQL server.
JOBS   ?= 4
SLOW_JOBS ?= 3
# `make bench` runs in a venv of its own: this checkout plus the peers it is measured against
# (huey, litequeue, procrastinate, pgqueuer; langgraph-checkpoint-sqlite next to QueueSaver), so
# .venv (and a plain worker install) stays small.
BENCH_VENV  ?= .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed-bench
BENCH_PEERS := huey litequeue procrastinate 'pgqueuer[asyncpg]' langgraph-checkpoint-sqlite==3.1.2

.PHONY: help install test test-fast test-notebooks test-slow test-ui soak lint demo lab bench bounds clean

help:
	@echo "make demo     run a short real scenario, then execute the quickstart notebook into build/"
	@echo "make test     install into .venv, lint, run the tests and the tutorial notebooks (about 7 minutes here)"
	@echo "make test-fast  the everyday loop (45-50 s here): tests not marked slow or ui, the contract suite on SQLite"
	@echo "               (BACKENDS=postgres: its PostgreSQL half), in $(JOBS) processes"
	@echo "make test-ui  JupyterLab in headless Chromium: the board and dead-letter view really work"
	@echo "make soak     the reliability suite, long: 500 worker kills, 100,000 contended jobs (NBQUEUE_SOAK=2 doubles it)"
	@echo "make lab      open JupyterLab on notebooks/"
	@echo "make bench    throughput next to raw SQLite and the peers (huey, litequeue, procrastinate, pgqueuer, langgraph-checkpoint-sqlite)"
	@echo "make bounds   profiles of what the missed bench goals cost (enqueue by layer, schema per row, PostgreSQL CPU per job, agent shapes)"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check nbqueue tests benchmarks
	$(BIN)/ruff format --check nbqueue tests benchmarks
	$(BIN)/mypy

# Everything: lint and the fast set first (a broken change fails in a minute), then the
# notebooks, then the slow and browser tests. The fast set runs its hypothesis models at full
# size here.
test: lint
	$(PYTEST) -q -m "not slow and not ui" -n $(JOBS) --durations=10 --timeout=60
	$(MAKE) test-notebooks test-slow

# The everyday loop: the contract suite on SQLite (BACKENDS=postgres for its other half; the
# PostgreSQL-only tests run either way), the models at fewer examples (NBQUEUE_TEST_PROFILE=fast),
# the slowest ten named at the end; the pytest cache is on, so `pytest --lf` reruns what failed.
BACKENDS ?= sqlite
test-fast: $(STAMP)
	NBQUEUE_TEST_BACKENDS=$(BACKENDS) NBQUEUE_TEST_PROFILE=fast $(PYTEST) -q -m "not slow and not ui" -n $(JOBS) --durations=10 --timeout=60

# One process per notebook (its cells run in order in one kernel), two at a time.
test-notebooks: $(STAMP)
	$(BIN)/python -m pytest $(NBVAL) -n 2 --dist loadfile notebooks

# The slow tests mostly wait (on kills, leases, timeouts, kernels, other processes), so three
# run at once; their time limits leave room for a loaded machine.
test-slow: $(STAMP)
	$(PYTEST) -q -m "slow or ui" -n $(SLOW_JOBS) --durations=10

test-ui: $(STAMP)
	$(BIN)/python -m pytest -m ui tests/ui

NBQUEUE_SOAK ?= 1
soak: $(STAMP)
	NBQUEUE_SOAK=$(NBQUEUE_SOAK) $(BIN)/python -m pytest tests/reliability

demo: $(STAMP)
	$(BIN)/python -m nbqueue.demo
	mkdir -p build
	$(BIN)/jupyter execute --timeout=120 --kernel_name=python3 \
		--output=$(CURDIR)/build/01-quickstart.ipynb notebooks/01-quickstart.ipynb
	@echo "executed notebook: build/01-quickstart.ipynb (open it with: make lab)"

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks

$(BENCH_STAMP): pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet -e '.[notebook,postgres,langgraph]' $(BENCH_PEERS)
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python benchmarks/bench.py

bounds: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python benchmarks/bounds.py

clean:
	rm -rf $(VENV) $(BENCH_VENV) build .pytest_cache .mypy_cache .ruff_cache
