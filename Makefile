# claimscope — see README.md. Every target installs what it needs on a bare Debian machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
UV_VERSION := 0.13.9
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: help venv venv-dev demo demo-stack test lint typecheck unit services services-stop cluster controlplane clean audit

help:
	@echo "make demo   - install and start the dashboard on http://$(HOST):$(PORT)/ (SQLite, simulated fleet)"
	@echo "make demo-stack - the production topology locally: PostgreSQL, Redis, Celery workers, beat, ASGI"
	@echo "make test   - install PostgreSQL, Redis, Chromium and the Kubernetes control plane; lint and test"
	@echo "make lint   - ruff (lint + format check), mypy and the layering contracts (lint-imports)"
	@echo "make audit  - pip-audit of the pinned requirements against PyPI's vulnerability data"
	@echo "make cluster - start the test Kubernetes control plane in the foreground (Ctrl-C stops it)"

# The stamp is pip: a half-made venv (python3-venv missing) must not look done on the next run.
$(VENV)/bin/pip:
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' 2>/dev/null || \
	  { echo "claimscope needs Python 3.11 as $(PYTHON) (set PYTHON=...)"; exit 1; }
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || { [ "$$(id -u)" = 0 ] && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; } || \
	  { echo "the venv module is missing: apt-get install python3-venv"; exit 1; }
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)

$(UV): | $(VENV)/bin/pip
	$(PY) -m pip install -q --disable-pip-version-check "uv==$(UV_VERSION)"

# The lock files pin every package: a fresh machine installs exactly the tested set.
$(VENV)/.base: requirements/base.txt | $(UV)
	$(UV) pip install -q --python $(PY) -r requirements/base.txt
	touch $@

$(VENV)/.dev: requirements/base.txt requirements/dev.txt | $(UV)
	$(UV) pip install -q --python $(PY) -r requirements/base.txt -r requirements/dev.txt
	touch $@

venv: $(VENV)/.base
venv-dev: $(VENV)/.dev

demo: venv
	@$(PY) manage.py demo --host $(HOST) --port $(PORT)

demo-stack: venv
	@scripts/demo-stack.sh

services:
	@scripts/services.sh start

services-stop:
	@scripts/services.sh stop

controlplane:
	bash tests/controlplane/build.sh

cluster: venv-dev controlplane
	$(PY) -m tests.controlplane.launcher

lint: venv-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .
	$(VENV)/bin/lint-imports

# Not part of lint: it needs PyPI's JSON API (per-release vulnerability data). --strict fails when a package
# could not be checked, so a mirror without that data cannot pass as "no known vulnerabilities".
PIP_AUDIT_VERSION := 2.10.1
audit: $(UV)
	$(UV) tool run --from "pip-audit==$(PIP_AUDIT_VERSION)" pip-audit --strict -s pypi --no-deps --disable-pip \
	  -r requirements/base.txt -r requirements/dev.txt

test: venv-dev
	scripts/test.sh

clean:
	rm -rf $(VENV) .run .artifacts .mypy_cache .ruff_cache .pytest_cache
