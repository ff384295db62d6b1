# scopefs: `make demo` shows the isolation end to end; `make test` runs the suite.
# Both install what is missing first: Debian packages and a .venv with the
# project (editable) and its test dependencies.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# fuse3/libfuse3-dev/pkg-config/gcc/libc6-dev: the FUSE mount (pyfuse3 builds
# against libfuse3); bubblewrap: the sandbox; vim/nano: real editors in tests;
# strace: fsync fault injection; e2fsprogs/util-linux: loop-mounted ext4 for
# the power-loss tests; ripgrep/findutils/grep/coreutils/python3: the tools
# the mount tests and benchmarks run on a mounted view.
DEB_PACKAGES := fuse3 libfuse3-dev pkg-config gcc libc6-dev bubblewrap vim nano strace e2fsprogs util-linux ripgrep findutils grep coreutils python3 libseccomp2

.PHONY: all deps venv bytecode lint test coverage lock demo bench bench-fuse bench-fuse-quick bench-sandbox bench-search clean

all: test

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# Every package at the exact version in requirements.lock (pip constraints):
# a new pyfuse3, apsw, trio or sqlite-vec release changes nothing until the
# lock is regenerated on purpose (make lock).
EXTRAS := test,embeddings,lint,coverage

$(STAMP): pyproject.toml requirements.lock | deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c requirements.lock -e '.[$(EXTRAS)]'
	touch $@

venv: $(STAMP)

# Bytecode written up front: the command line starts once per sandboxed
# command, and some environments set PYTHONDONTWRITEBYTECODE.
bytecode: venv
	$(BIN)/python -m compileall -q scopefs

# ruff (style, bugs, imports, async hazards) and mypy --strict on the package.
lint: deps venv
	$(BIN)/ruff check .
	$(BIN)/mypy

test: deps venv bytecode
	$(BIN)/pytest -q

# The whole suite under coverage, with branches, including the command line
# and mount servers that tests start as subprocesses; a report, no threshold.
coverage: deps venv bytecode
	rm -rf .coverage-data && mkdir -p .coverage-data
	$(BIN)/coverage run -m pytest -q
	$(BIN)/coverage combine -q
	$(BIN)/coverage report --format=total > .coverage-data/total
	$(BIN)/coverage report | tail -n 40
	@echo "branch coverage, total: $$(cat .coverage-data/total)%"

# Regenerate requirements.lock from a fresh resolution of pyproject.toml.
lock: deps
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install -q --upgrade pip
	.lock-venv/bin/pip install -q -e '.[$(EXTRAS)]'
	{ echo "# Exact versions of everything make installs into .venv (pip constraints)."; \
	  echo "# Regenerate with: make lock  (after changing pyproject.toml's dependencies)"; \
	  .lock-venv/bin/pip freeze --exclude-editable | grep -v '^scopefs'; } > requirements.lock
	rm -rf .lock-venv

demo: deps venv bytecode
	./demo/demo.sh

bench: deps venv
	$(BIN)/python bench/write_read.py

bench-fuse: deps venv
	$(BIN)/python bench/fuse_bench.py

bench-fuse-quick: deps venv
	$(BIN)/python bench/fuse_bench.py --quick

bench-sandbox: deps venv bytecode
	$(BIN)/python bench/sandbox_bench.py

bench-search: deps venv
	$(BIN)/python bench/search_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .coverage-data .mypy_cache .ruff_cache build *.egg-info
