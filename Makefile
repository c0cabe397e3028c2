# `make test` is all a newcomer needs: it builds .venv, installs once with its
# test extras, and runs the whole suite (SQLite and an embedded PostgreSQL by
# default; docs/contributing.md "Test" names the machine's PostgreSQL and MariaDB),
# TEST_WORKERS tests at a time (pytest-xdist): they mostly wait on clocks and processes.
# TEST_WORKERS=0 runs them one by one in one process.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed
TEST_WORKERS ?= 4

.PHONY: test test-quick check lint types docs docs-build bench man completions generated clean torture

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "once needs Python 3.11 or newer" or 0)'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

# --dist loadgroup: the tests that share a harness one worker owns (tests/conftest.py
# ONE_WORKER) run on one worker; the servers the suite starts are started once for all.
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The unit tests and the integration tests on SQLite alone, leaving out those marked slow,
# four at a time (they mostly wait on processes and clocks): about 2 minutes on two quiet
# cores, 7 beside other runs (docs/contributing.md "Test").
test-quick: $(STAMP)
	ONCE_TEST_BACKENDS=sqlite $(BIN)/python -m pytest -n 4 --dist loadgroup tests/unit tests/integration -m "not slow" $(PYTEST_ARGS)

check: lint types docs-build

lint: $(STAMP)
	$(BIN)/ruff check src tests bench torture

types: $(STAMP)
	$(BIN)/mypy

# The docs site (docs/, mkdocs.yml): `make docs` serves it on http://127.0.0.1:8000 and
# rebuilds on every edit; `make check` builds it with --strict (a broken link fails).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

docs-build: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

bench: $(STAMP)
	$(BIN)/python bench/bench.py $(BENCH_ARGS)

# Fault injection on SQLite, PostgreSQL (embedded) and MariaDB: about an hour on two cores at scale 1 (the fleet, clock and hostile-input rows).
# Not part of `make test`; TORTURE_SCALE=0.1 for a quick pass (docs/operations/torture.md).
torture: $(STAMP)
	@command -v faketime >/dev/null || { apt-get update -qq && apt-get install -y -qq faketime; } \
		|| echo "make torture: install Debian's faketime for the clock rows" >&2
	$(BIN)/python torture/torture.py $(TORTURE_ARGS)

# Generated from the click definitions (and, for the docs' reference, the schema, the JSON
# documents' types and the metrics); tests/unit/test_docs.py and test_docs_site.py fail when
# they are stale.
man: $(STAMP)
	@mkdir -p man
	$(BIN)/python -m once._docs man > man/once.1.tmp && mv man/once.1.tmp man/once.1
	$(BIN)/python -m once._docs markdown docs/reference

completions: $(STAMP)
	$(BIN)/python -m once._docs completions completions

generated: man completions

clean:
	rm -rf $(VENV) build dist site .pytest_cache .mypy_cache .ruff_cache
