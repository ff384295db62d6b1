# scopefs: `make demo` shows the isolation end to end; `make test` runs the suite.
# Both install what is missing first: Debian packages and a .venv with the
# project (editable) and its test dependencies.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# fuse3/libfuse3-dev/pkg-config/gcc/libc6-dev/patch: the FUSE mount (our
# patched pyfuse3 is built from source against libfuse3); bubblewrap: the sandbox; vim/nano: real editors in tests;
# strace: fsync fault injection; e2fsprogs/util-linux: loop-mounted ext4 for
# the power-loss tests; ripgrep/findutils/grep/coreutils/python3: the tools
# the mount tests and benchmarks run on a mounted view.
DEB_PACKAGES := fuse3 libfuse3-dev pkg-config gcc libc6-dev patch bubblewrap vim nano strace e2fsprogs util-linux ripgrep findutils grep coreutils python3 libseccomp2
# npm: installs Node 24 and OpenClaw for the plugin's test (make openclaw);
# only when no npm is on PATH (nodesource's nodejs ships its own).
DEB_PACKAGES += $(if $(shell command -v npm),,npm)

.PHONY: all deps venv bytecode lint openclaw test coverage lock demo bench bench-fuse bench-fuse-quick bench-sandbox bench-search clean

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

# pyfuse3 is the pinned upstream release with vendor/pyfuse3's patch applied,
# built from source (vendor/pyfuse3/README.md); installed before the project so
# that pip keeps it (3.5.0+inode.6 satisfies the lock's pyfuse3==3.5.0).
PYFUSE3_BUILD := build/pyfuse3
PYFUSE3_INPUTS := $(wildcard vendor/pyfuse3/*)

$(STAMP): pyproject.toml requirements.lock $(PYFUSE3_INPUTS) | deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	vendor/pyfuse3/build.sh $(BIN)/pip $(PYFUSE3_BUILD)
	$(BIN)/pip install -q --no-deps --force-reinstall $(PYFUSE3_BUILD)/wheel-*/pyfuse3-*.whl
	$(BIN)/pip install -q -c requirements.lock -e '.[$(EXTRAS)]'
	$(BIN)/python -c 'import pyfuse3, sys; sys.exit(pyfuse3.__version__ != "3.5.0+inode.6")' || \
	  { echo "the installed pyfuse3 is not vendor/pyfuse3's patched build (3.5.0+inode.6)" >&2; exit 1; }
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

# OpenClaw for tests/test_openclaw.py, outside the clone so it survives
# clean clones: Node 24 from the node@24 npm package (it ships no npm, so the
# system npm runs under whichever node is first on PATH) and openclaw, both
# pinned. Installed into a fresh folder and renamed into place once both
# versions check, so an interrupted install is redone, a complete one skipped.
NODE_VERSION := 24.21.0
OPENCLAW_VERSION := 2026.9.6
OPENCLAW_DIR ?= /var/cache/scopefs/openclaw-$(OPENCLAW_VERSION)
NPM_CACHE ?= /var/cache/scopefs/npm
NPM_INSTALL := npm install --no-audit --no-fund --prefer-offline --loglevel=error
export SCOPEFS_OPENCLAW_DIR := $(OPENCLAW_DIR)

openclaw: deps
	@oc="$(OPENCLAW_DIR)"; \
	complete() { [ "$$(PATH="$$1/node/node_modules/.bin:$$PATH" node --version 2>/dev/null)" = "v$(NODE_VERSION)" ] && \
	  [ "$$(PATH="$$1/node/node_modules/.bin:$$PATH" node -p 'require(process.argv[1]).version' \
	        "$$1/app/node_modules/openclaw/package.json" 2>/dev/null)" = "$(OPENCLAW_VERSION)" ]; }; \
	if complete "$$oc"; then exit 0; fi; \
	echo "installing Node $(NODE_VERSION) and openclaw@$(OPENCLAW_VERSION) into $$oc"; \
	$(SUDO) mkdir -p "$$(dirname "$$oc")" "$(NPM_CACHE)" && $(SUDO) chown "$$(id -u):$$(id -g)" "$$(dirname "$$oc")" "$(NPM_CACHE)" && \
	tmp="$$oc.partial" && rm -rf "$$tmp" && mkdir -p "$$tmp" && \
	export npm_config_cache="$(NPM_CACHE)" npm_config_update_notifier=false && \
	$(NPM_INSTALL) --prefix "$$tmp/node" node@$(NODE_VERSION) >/dev/null && \
	export PATH="$$tmp/node/node_modules/.bin:$$PATH" && \
	$(NPM_INSTALL) --prefix "$$tmp/app" openclaw@$(OPENCLAW_VERSION) >/dev/null && \
	complete "$$tmp" && rm -rf "$$oc" && mv "$$tmp" "$$oc" && complete "$$oc" || \
	{ echo "make openclaw: the install into $$oc did not complete" >&2; exit 1; }

# Three workers (xdist) for all but the tests that look at what the whole host
# shares (marked serial), which run alone after them; both parts always run.
TEST_WORKERS ?= 3
test: deps venv bytecode openclaw
	@$(BIN)/pytest -q -n $(TEST_WORKERS) -m 'not serial'; parallel=$$?; \
	$(BIN)/pytest -q -m serial; serial=$$?; \
	[ $$parallel -eq 0 ] && [ $$serial -eq 0 ]

# The whole suite under coverage, with branches, including the command line
# and mount servers that tests start as subprocesses; a report, no threshold.
coverage: deps venv bytecode openclaw
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
