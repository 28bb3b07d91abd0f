# Every target works on a fresh clone: run and test install what they need first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Two stamps: what serving needs (make run), and that plus the test extras (the rest).
STAMP  := $(VENV)/.installed-stamp
TEST_STAMP := $(VENV)/.installed-test-stamp
PYZ    ?= dist/keysvc.pyz
PINS   := .ci/constraints.txt

# Where make run serves: make run PORT=9090 wins, then the environment's KEYSVC_PORT
# (the variable keysvc itself reads), then the default; the same for DB and HOST.
# A plain PORT or HOST in the environment (a shell's HOST is the machine's name) is
# not taken: these assignments override it.
DB   := $(or $(KEYSVC_DB),var/keysvc.db)
HOST := $(or $(KEYSVC_HOST),127.0.0.1)
PORT := $(or $(KEYSVC_PORT),8080)

# Real components that tests drive, from Debian's packages, as command:package:
# systemd only for systemd-analyze on the unit file; wrk for the bench's smoke test on
# PostgreSQL (tests/system/test_bench_postgres.py), and with hey for the forward-auth
# one (tests/system/test_nginx_reuse_bench.py); caddy for docs/Caddyfile
# (tests/system/test_caddy*.py); PostgreSQL's initdb is looked for
# where Debian puts it, off PATH (PG_BIN). Installed when missing, where
# this user may (root, or sudo without a password); else make says what to install
# and goes on, and the tests that need one report it as not run (failed under CI=true).
# An entry whose first part is a path (starting with /) is a file the package installs
# that has no command of its own: nginx's set-misc module (with the NDK module it
# depends on), which the shipped nginx config needs.
SYSTEM_DEPS ?= chromium:chromium nginx:nginx systemd-analyze:systemd initdb:postgresql pgbouncer:pgbouncer wrk:wrk hey:hey \
	caddy:caddy /usr/lib/nginx/modules/ngx_http_set_misc_module.so:libnginx-mod-http-set-misc
PG_BIN := $(subst $(eval) ,:,$(wildcard /usr/lib/postgresql/*/bin))

.PHONY: install system-deps run test test-fast lint fmt docs docs-screenshots bench soak dist \
	constraints clean

# The versions installed are the ones $(PINS) names (see its head), the build backend's
# too: setuptools goes in first, and builds keysvc without an isolated environment
# (where pip would fetch the newest setuptools, whatever the pins say).
QUIET_PIP := --quiet --disable-pip-version-check
PIP := $(BIN)/python -m pip install $(QUIET_PIP)
BASE_VENV := test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); $(PIP) -c $(PINS) setuptools
$(STAMP): pyproject.toml $(PINS)
	$(BASE_VENV)
	$(PIP) -c $(PINS) --no-build-isolation -e .
	touch $(STAMP)

# What the docs site's pages load that Material would otherwise fetch from a CDN in
# every reader's browser: Mermaid, which draws the diagrams, and iframe-worker's shim,
# which lets search run on the site opened from the disk (Material's offline plugin).
# Each the pinned release from the npm registry (npm: the machine's, else Debian's
# package), checked against the SHA-512 the registry published for it
# (npm view NAME@VERSION dist.integrity, in hex), and one file of it kept in the
# virtualenv as NAME-VERSION.js, where docs/hooks/offline.py adds it to the site.
# Each entry: NAME-VERSION := the file in the package, then the SHA-512.
DOCS_VENDOR := $(VENV)/docs-vendor
mermaid-11.17.2 := dist/mermaid.min.js \
	57a2b70bc101744b0f1595d228c25eea9a50384371b87011afd1af1d7e21878ee501b84c443f6a7f8a042bb2e869143150b31af34feab798073bbdda0a578106
iframe-worker-1.0.4 := shim/index.js \
	ae879a688f8b8352c935f8290a3a117bff96cc48f2f7e674f0ba04beef393023db063c26faa5f3f00839534e651dae95d42cac6721b313448e900b52500e6aed
VENDORED := $(DOCS_VENDOR)/mermaid-11.17.2.js $(DOCS_VENDOR)/iframe-worker-1.0.4.js
$(DOCS_VENDOR)/%.js:
	@command -v npm >/dev/null || { echo "npm is missing: sudo apt-get install npm"; exit 1; }
	set -- $($*) && name=$$(echo $* | sed 's/-[^-]*$$//') && \
	version=$$(echo $* | sed 's/.*-//') && \
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	npm pack --silent --pack-destination "$$tmp" "$$name@$$version" >/dev/null && \
	echo "$$2  $$tmp/$*.tgz" | sha512sum --check --quiet && \
	tar -xzf "$$tmp/$*.tgz" -C "$$tmp" "package/$$1" && \
	mkdir -p $(DOCS_VENDOR) && rm -f $(DOCS_VENDOR)/$$name-*.js && \
	cp "$$tmp/package/$$1" $@

# The test extras hold all that serving needs, so one pip run (not one more after
# serving's) makes both stamps. The docs extra (MkDocs, Material) comes along: make
# test builds the site (tests/system/test_docs_site.py).
$(TEST_STAMP): pyproject.toml $(PINS) $(VENDORED)
	$(BASE_VENV)
	$(PIP) -c $(PINS) --no-build-isolation -e '.[test,docs]'
	touch $(STAMP) $(TEST_STAMP)

install: $(TEST_STAMP)

system-deps:
	@PATH="$$PATH:/usr/sbin:/sbin:$(PG_BIN)"; commands=""; packages=""; \
	for dep in $(SYSTEM_DEPS); do case "$${dep%%:*}" in \
		/*) test -e "$${dep%%:*}";; *) command -v "$${dep%%:*}" >/dev/null 2>&1;; esac || { \
		commands="$$commands $${dep%%:*}"; packages="$$packages $${dep#*:}"; }; done; \
	[ -z "$$packages" ] && exit 0; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo"; \
	else sudo="none"; fi; \
	if [ "$$sudo" != none ]; then \
		echo "installing from Debian's packages:$$packages"; \
		$$sudo env DEBIAN_FRONTEND=noninteractive sh -c \
			"apt-get update -qq && apt-get install -y -qq $$packages" && exit 0; \
	fi; \
	echo "missing:$$commands; install them with: sudo apt-get install$$packages"; \
	echo "the tests that need them are reported as not run (failed under CI=true)"

# The docs site (mkdocs.yml) into site/, strict: a broken link, an anchor that is not
# there, a page missing from the nav or from docs/ fails. Open site/index.html.
docs: $(TEST_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --clean

# The console's screenshots in docs/img/, which docs/console.md shows: the browser tests
# that take them (into test-artifacts/console/), then the ones the page shows copied.
DOCS_SHOTS := console-keys-1280 console-key-details-1280 console-activities-1280 \
	console-usage-1280 identities-1280
docs-screenshots: $(TEST_STAMP) system-deps
	$(PYTEST) -p no:cacheprovider -n 0 \
		tests/system/test_console_browser.py::test_screenshots_at_both_widths \
		tests/system/test_console_views_browser.py::test_activities_list_the_create_and_the_rotation_made_in_the_page \
		tests/system/test_console_views_browser.py::test_usage_chart_shows_the_counts_the_api_answers \
		tests/system/test_identity_console_browser.py
	mkdir -p docs/img
	for shot in $(DOCS_SHOTS); do cp test-artifacts/console/$$shot.png docs/img/; done

# Bootstraps an organization on first use (credentials are printed once), then serves.
run: $(STAMP)
	mkdir -p $(dir $(DB))
	$(BIN)/keysvc bootstrap --if-empty --db $(DB)
	exec $(BIN)/keysvc serve --db $(DB) --host $(HOST) --port $(PORT)

lint: $(TEST_STAMP)
	$(BIN)/ruff check keysvc tests bench docs/hooks
	$(BIN)/ruff format --check keysvc tests bench docs/hooks
	$(BIN)/mypy keysvc bench docs/hooks
	$(BIN)/lint-imports --no-cache

fmt: $(TEST_STAMP)
	$(BIN)/ruff format keysvc tests bench docs/hooks
	$(BIN)/ruff check --fix keysvc tests bench docs/hooks

# On every core (pytest-xdist): a worker per core and one more, each with a PostgreSQL
# cluster of its own (tests/postgres.py). The system tests spend part of their time
# waiting (for a server to start, a timeout to pass, a flush to come round), and the
# extra worker fills it. A test file's tests run on one worker, so that its module's
# servers, nginx or Chromium start once; the system tests' files go first
# (tests/conftest.py, by_cost), so that no long one is left for the end.
CORES := $(shell nproc 2>/dev/null || echo 1)
PARALLEL := -n $(shell echo $$(( $(CORES) + 1 )))
# The tests' files (SQLite databases, PostgreSQL clusters, sockets) go to memory when
# /dev/shm has room (2 GiB free): the same files, without each commit waiting for the
# disk. A test that kills keysvc finds what a killed process leaves either way.
TEST_TMP := $(or $(shell df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 && $$4 > 2097152 { print "/dev/shm" }'),$(TMPDIR),/tmp)
PYTEST := TMPDIR=$(TEST_TMP) $(BIN)/pytest
# keysvc's bytecode, written before the tests run: every keysvc process the system
# tests start (several hundred) would otherwise compile the whole package again where
# the environment says PYTHONDONTWRITEBYTECODE (compileall writes it regardless, and
# only for a source changed since).
BYTECODE := $(BIN)/python -m compileall -q keysvc tests bench

test: system-deps $(TEST_STAMP) lint
	$(BYTECODE)
	$(PYTEST) $(PARALLEL) --dist loadfile

# The inner loop, without lint: tests/unit and tests/api on SQLite alone, in parallel.
test-fast: $(TEST_STAMP)
	$(BYTECODE)
	$(PYTEST) $(PARALLEL) -m "not postgres and not browser and not nginx and not slow" \
		tests/unit tests/api

# wrk (from Debian's packages, installed when missing) against a bare aiohttp app and
# keysvc on 1,000 seeded keys, in alternating rounds: GET of a key by itself and by the
# admin key (keys it is not, never in memory), verify, the list, create; then verify
# paced by hey (Debian's package too) at half keysvc's verify peak, p99 against the
# baseline's at the same rate. Prints the table and writes it to docs/PERFORMANCE.md.
# SCALE=1: keysvc on 1,000 vs 1,000,000 keys. LOOP=uvloop: every app on uvloop (its own
# section). Exits 1 if a scenario answers more than 1% non-2xx.
# With PostgreSQL installed, a third app, keysvc on a throwaway PostgreSQL cluster
# (durability at its defaults) seeded with the same keys, takes its turn in every
# round; its section compares it with SQLite's. BACKEND=sqlite leaves it out;
# BACKEND=postgres fails without PostgreSQL rather than leave it out.
# Then forward-auth (bench/forward.py): nginx in front of a static file with no auth,
# auth_basic, and auth_request to keysvc with the shipped config, reuse off and on
# (1 s), wrk through each in turn, ratios to auth_basic; and hey through auth_basic
# and reuse at one paced rate, p99 against p99. Its own section.
# Options: .venv/bin/python -m bench.run --help.
bench: $(TEST_STAMP)
	$(BIN)/python -m bench.run $(if $(SCALE),--keys 1000000)$(if $(LOOP), --loop $(LOOP))$(if $(BACKEND), --backend $(BACKEND))

# The full soak: 60 s of mixed load against a real server; no 5xx, RSS growth under
# 10% from the 20th to the 60th second, no descriptor growth. make test runs 9 s of it
# after 10 s of warm-up.
soak: $(TEST_STAMP)
	KEYSVC_SOAK_SECONDS=60 $(BIN)/pytest -p no:cacheprovider -s tests/system/test_soak.py

# One file holding keysvc and its dependencies at the pinned versions, for this platform
# (shiv, from PyPI; keysvc built with the virtualenv's setuptools, as in install); it
# runs with a plain python3 of the same minor version: python3 dist/keysvc.pyz serve.
# pip builds a local project inside its folder, and a stale build/lib would end up
# in the zip, so the build works on a throwaway copy of the sources.
# The zip unpacks into $SHIV_ROOT (else ~/.shiv) and runs what it finds there; with
# --no-modify it refuses to start when a .py file there differs from the build. That
# covers .py files only: the folder must be one only the service's user can write
# (docs/keysvc.service puts it in the 0700 state directory).
dist: $(TEST_STAMP)
	mkdir -p $(dir $(PYZ))
	src=$$(mktemp -d) && trap 'rm -rf "$$src"' EXIT && \
	cp -R pyproject.toml README.md keysvc "$$src" && \
	$(BIN)/shiv --reproducible --no-modify --console-script keysvc --output-file $(PYZ) \
		"$$src" --quiet --disable-pip-version-check --constraint $(CURDIR)/$(PINS) \
		--no-build-isolation

# $(PINS) again: the newest versions pyproject.toml allows (build backend included),
# installed as above into a throwaway virtualenv from a copy of the sources (as dist
# does). Then make test, and commit the file.
constraints:
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	mkdir "$$tmp/src" && cp -R pyproject.toml README.md keysvc "$$tmp/src" && \
	$(PYTHON) -m venv "$$tmp/venv" && \
	backend=$$("$$tmp/venv/bin/python" -c 'import sys, tomllib; \
		print(*tomllib.load(sys.stdin.buffer)["build-system"]["requires"], sep="\n")' \
		< pyproject.toml) && \
	"$$tmp/venv/bin/python" -m pip install $(QUIET_PIP) --upgrade $$backend && \
	"$$tmp/venv/bin/python" -m pip install $(QUIET_PIP) --no-build-isolation "$$tmp/src[test,docs]" && \
	{ sed -n '/^#/p' $(PINS); \
	  "$$tmp/venv/bin/python" -m pip freeze --all --exclude pip --exclude keysvc; } \
		> "$$tmp/pins" && \
	cp "$$tmp/pins" $(PINS)

clean:
	rm -rf $(VENV) build dist site *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
