# The two commands a newcomer needs: `make run` and `make test` (see README.md).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test lint lock clean

$(VENV)/bin/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "Ankusa needs Python 3.11 or newer ($(PYTHON) is older); set PYTHON=python3.x"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.installed: requirements.txt | $(VENV)/bin/python
	$(PY) -m pip install --quiet -r requirements.txt
	@touch $@

$(VENV)/.installed-dev: requirements.txt requirements-dev.txt | $(VENV)/bin/python
	$(PY) -m pip install --quiet -r requirements-dev.txt
	@touch $@ $(VENV)/.installed

# The whole system on the embedded default: SQLite + the node-local store, admin and API on
# http://127.0.0.1:$(PORT) (8000; another: make run PORT=8001), the dispatch loop beside it. The
# demo's http connector posts to the demo receiver on that port. DEBUG=1 unless you say otherwise,
# so a local secret key is generated into var/. Connectors may reach loopback here, unless you say
# otherwise: the demo's receiver is on it. Set here, not in `manage.py serve`, because a deployment
# may run serve too, and must open loopback to its connectors only by saying so.
PORT ?= 8000
run: $(VENV)/.installed
	export DEBUG=$${DEBUG:-1} \
	  ANKUSA_CONNECTOR_ALLOWED_NETWORKS=$${ANKUSA_CONNECTOR_ALLOWED_NETWORKS-127.0.0.0/8,::1/128}; \
	$(PY) manage.py migrate --noinput && \
	$(PY) manage.py collectstatic --noinput --verbosity 0 && \
	$(PY) manage.py demo --site-url http://127.0.0.1:$(PORT) \
	  --receiver-url http://127.0.0.1:$(PORT)/demo/receiver/ && \
	exec $(PY) manage.py serve --bind 127.0.0.1:$(PORT)

# The whole suite plus the linter and the type checker (its cache in var/mypy_cache), then the
# intake, dispatch and database-queue tests once more with every fast path turned back to stock Django
# (ankusa_site/core/stock.py), which each is held to. Uses DATABASE_URL / REDIS_URL when set. The
# suite runs on TEST_WORKERS pytest-xdist workers (each its own test database and Redis database;
# 0: in one process); then, one at a time, the tests marked `machine`: the benchmarks' smoke tests,
# which load both cores, and the tests timed to a few milliseconds (status 5: what was asked for
# held none of that pass's tests). Choose tests by marker with TEST_MARKS (`make test
# TEST_MARKS=slow`), not with -m in PYTEST_ARGS: a second -m replaces the first, and both passes
# would then run the same tests.
TEST_WORKERS ?= 2
TEST_MARKS ?=
and_marks = $(if $(TEST_MARKS), and ($(TEST_MARKS)))
STOCK_TESTS := tests/commands/test_intake_hooks.py tests/commands/test_intake_api.py \
	tests/commands/test_intake_json.py tests/commands/test_dispatch.py \
	tests/commands/test_dispatch_statements.py tests/commands/test_dispatch_outcomes.py \
	tests/commands/test_connector_health.py tests/commands/test_hold.py \
	tests/queues/test_contract.py tests/queues/test_database.py tests/queues/test_transactional_enqueue.py
test: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy .
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not machine$(and_marks)" $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(PY) -m pytest -m "machine$(and_marks)" $(PYTEST_ARGS) || [ $$? -eq 5 ]
	ANKUSA_STOCK_DJANGO=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(STOCK_TESTS)

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Re-pin requirements*.txt from the ranges in pyproject.toml, in a throw-away venv.
lock:
	rm -rf var/lock-venv && $(PYTHON) -m venv var/lock-venv
	$(PYTHON) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	  open("var/lock-runtime.in", "w").write("\n".join(p["dependencies"])); \
	  open("var/lock-dev.in", "w").write("\n".join(p["optional-dependencies"]["dev"]))'
	var/lock-venv/bin/pip install --quiet -r var/lock-runtime.in
	{ echo '# Pinned runtime dependencies (ranges in pyproject.toml). Regenerate with `make lock`.'; \
	  var/lock-venv/bin/pip freeze; } > requirements.txt
	var/lock-venv/bin/pip install --quiet -r var/lock-dev.in
	{ echo '-r requirements.txt'; var/lock-venv/bin/pip freeze | grep -vxFf requirements.txt; } > requirements-dev.txt
	rm -rf var/lock-venv var/lock-*.in

clean:
	rm -rf $(VENV) var/static
