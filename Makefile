# Every target installs what it needs into .venv itself, so a fresh clone works.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

.PHONY: help install test lint demo bench clean

help:
	@echo "make demo   run a short real scenario on a SQLite queue"
	@echo "make test   install into .venv, lint, run the whole test suite"
	@echo "make lint   ruff (lint + format check) and mypy"
	@echo "make bench  throughput next to raw SQLite"

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

test: lint
	$(BIN)/python -m pytest

demo: $(STAMP)
	$(BIN)/python -m nbqueue.demo

bench: $(STAMP)
	$(BIN)/python benchmarks/bench.py

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
