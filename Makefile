# The two set-up commands of the README: `make run` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: run test lint install

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -r requirements.txt -r requirements-dev.txt
	touch $(STAMP)

install: $(STAMP)

# scripts/run.sh: `manage.py setup --demo`, then a worker, the beat and `serve --role all` (docs/operations.md).
run: $(STAMP)
	./scripts/run.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Debian's Chromium drives the dashboard's browser tests (installed once, here, when missing).
/usr/bin/chromium:
	apt-get install -y --no-install-recommends chromium || (apt-get update && apt-get install -y --no-install-recommends chromium)

# HAProxy, the real load balancer of the fleet test (tests/fleet), from Debian's packages likewise.
/usr/sbin/haproxy:
	apt-get install -y --no-install-recommends haproxy || (apt-get update && apt-get install -y --no-install-recommends haproxy)

# The whole suite on SQLite, then again on PostgreSQL when DATABASE_URL is set.
test: $(STAMP) /usr/bin/chromium /usr/sbin/haproxy lint
	env -u DATABASE_URL $(VENV)/bin/python -m pytest
	if [ -n "$$DATABASE_URL" ]; then $(VENV)/bin/python -m pytest; fi
