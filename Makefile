# Two commands matter: `make run` and `make test`. Each sets everything up first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run

.PHONY: build run test image demo bench bench-packages cluster cluster-packages loadtest experiments lint setup system-packages \
        npm-clients conformance conformance-streams conformance-streams-cluster clean

# `make run` installs only what running needs; tests, benchmarks and load tests
# add their tools.
# Each step a fresh checkout takes says so in one line first; the quiet install
# and compile (1 to 3 minutes) say every 20 s which phase they are in
# (deploy/setup_progress.py) and how long they took; once set up, nothing runs.
$(RUN_STAMP): pyproject.toml setup.py
	@test -x $(PY) || echo "pushup: creating the virtual environment $(VENV)/ (first run only)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "pushup: installing Python packages into $(VENV)/ and compiling the core with mypyc where a C compiler exists (first run only, 1 to 3 minutes)..."
	$(PYTHON) deploy/setup_progress.py --every 20 -- $(PY) -m pip install -q --disable-pip-version-check -e .
	mkdir -p build && touch $(RUN_STAMP) $(BUILT)

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,loadtest,dev]'
	mkdir -p build && touch $(STAMP) $(RUN_STAMP) $(BUILT)

# The core compiled with mypyc (setup.py; pushup/_build.py names the modules), in
# place next to its sources, where a C compiler exists. Compiled again whenever a
# compiled source changed: a build whose sources changed since is never used
# (pushup/_build.py compares their SHA-256 with the build's record; the sources
# run instead, with a warning), so `make run` and `make test` rebuild first.
BUILT := build/.compiled
COMPILED_SOURCES := $(shell $(PYTHON) -c "import runpy; print(' '.join(n.replace('.', '/') \
  + '.py' for n in runpy.run_path('pushup/_build.py')['COMPILED']))")
$(BUILT): $(COMPILED_SOURCES) setup.py pushup/_build.py | $(RUN_STAMP)
	@echo "pushup: compiling the core with mypyc again (a compiled source changed; about a minute)..."
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	mkdir -p build && touch $(BUILT)
build: $(BUILT)

# Debian packages the tests and load tests use (HAProxy, nftables, Node, Chromium,
# Redis, Prometheus, systemd-analyze, ...), each installed only when the command it
# provides is missing, never one the machine already has (an image's own Node.js
# brings npm, and Debian's npm conflicts with it): deploy/system_packages.py says
# which and why. No package may start its Debian service during the install.
system-packages:
	@$(PYTHON) deploy/system_packages.py install test

setup: $(STAMP) system-packages npm-clients

# The npm clients tests/conformance/ runs (npm `eventsource`), pinned by the lock file
# and installed into tests/conformance/clients/node_modules (git-ignored); the network
# is used only when the lock file changed or nothing is installed yet.
NPM_CLIENTS := tests/conformance/clients
$(NPM_CLIENTS)/node_modules/.installed: $(NPM_CLIENTS)/package.json $(NPM_CLIENTS)/package-lock.json
	@command -v npm >/dev/null || $(MAKE) --no-print-directory system-packages
	npm ci --prefix $(NPM_CLIENTS) --no-audit --no-fund --loglevel=error
	touch $@
# The Durable Streams conformance suite (npm @durable-streams/server-conformance-tests
# and its vitest), pinned by its own lock file, installed the same way.
NPM_STREAMS := tests/conformance/streams
$(NPM_STREAMS)/node_modules/.installed: $(NPM_STREAMS)/package.json $(NPM_STREAMS)/package-lock.json
	@command -v npm >/dev/null || $(MAKE) --no-print-directory system-packages
	npm ci --prefix $(NPM_STREAMS) --no-audit --no-fund --loglevel=error
	touch $@
# The resumable AI answers example (examples/ai_answers: @durable-streams/client and
# esbuild, which bundles its page), installed the same way for its tests.
NPM_AI := examples/ai_answers
$(NPM_AI)/node_modules/.installed: $(NPM_AI)/package.json $(NPM_AI)/package-lock.json
	@command -v npm >/dev/null || $(MAKE) --no-print-directory system-packages
	npm ci --prefix $(NPM_AI) --no-audit --no-fund --loglevel=error
	touch $@
npm-clients: $(NPM_CLIENTS)/node_modules/.installed $(NPM_STREAMS)/node_modules/.installed \
	$(NPM_AI)/node_modules/.installed

# nginx with the nchan module, which `make bench` measures PushUp against (only the
# benchmark needs it), installed only when missing (deploy/system_packages.py). The
# benchmark never uses or stops a system nginx; it runs its own by PID.
bench-packages:
	@$(PYTHON) deploy/system_packages.py install bench

run: $(RUN_STAMP) $(BUILT)
	$(VENV)/bin/pushup serve

# N nodes (NODES=3) behind HAProxy on loopback, front on PORT (8000); a node that
# dies is reported and restarted; logs in .cluster/; Ctrl-C stops everything.
# ENGINE=mesh (peers, the default), redis (a redis-server of its own), redis-cluster (a
# Redis Cluster of its own: 3 primaries, a replica each) or a redis:// URL.
# BALANCE=channel sends each subscribe by a consistent hash of its channels;
# BALANCE=sticky keeps a keep-alive client on its last node (leastconn).
NODES ?= 3
ENGINE ?= mesh
PORT ?= 8000
BALANCE ?= roundrobin
cluster: cluster-packages
	$(PY) deploy/launch.py --nodes $(NODES) --port $(PORT) --engine $(ENGINE) --balance $(BALANCE)

# What running a cluster needs, and no more: the run install, HAProxy, and
# redis-server (with redis-cli) for ENGINE=redis and ENGINE=redis-cluster (Debian
# packages installed only when missing).
CLUSTER_TOOLS := haproxy $(if $(filter redis redis-cluster,$(ENGINE)),redis-server)
cluster-packages: $(RUN_STAMP)
	@for tool in $(CLUSTER_TOOLS); do command -v $$tool >/dev/null || missing="$$missing $$tool"; \
	  done; [ -z "$$missing" ] || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; }

# The container image of a node, localhost/pushup:latest (deploy/Containerfile; README,
# "Container image"), built by podman with mypyc compiling the core inside; where no
# image registry is reachable, deploy/image.py first makes its Debian base images
# (mmdebstrap, once: podman keeps them). BASE= and BUILD_BASE= name public ones instead.
# podman, runc and mmdebstrap are installed when missing (deploy/system_packages.py).
image:
	@$(PYTHON) deploy/system_packages.py install image
	$(PYTHON) deploy/image.py build

# The lint (ruff, mypy --strict over the package) runs first: a layer or type
# error fails the tests as surely as a broken test does.
# The suite runs against the build pip made (compiled where a C compiler exists);
# the pure core's unit tests run once more on the interpreted sources.
# TEST_WORKERS pytest-xdist workers share the tests (docs/contributing.md): most
# wait on real processes, so three keep this 2-core machine busy (a fresh clone: 9.5 min).
TEST_WORKERS ?= 3
test: setup bench-packages lint $(BUILT)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25
	PUSHUP_PURE=1 $(PY) -m pytest tests/core

# The external checks, longer than `make test` runs them: the SSE clients (npm
# `eventsource`, httpx-sse, aiohttp-sse-client, sseclient-py) and long polls get 200
# messages exactly once across 3 node restarts and a reconnect before their first
# event, and the HTTP vectors (smuggler, Http11Probe, RFC 9112) are replayed.
conformance: setup
	PUSHUP_CONFORMANCE_MESSAGES=200 PUSHUP_CONFORMANCE_RESTARTS=3 \
	  $(PY) -m pytest tests/conformance -m '' --timeout 600

# The Durable Streams conformance suite, whole, against one `pushup serve` (make test
# runs the same; this runs only it, printing each group's counts).
conformance-streams: setup
	$(PY) -m pytest tests/conformance/test_durable_streams.py -s --timeout 900

# The same suite against 3 nodes behind HAProxy round robin: on one redis-server and
# on the mesh (make test runs these too), and on a 3-primary Redis Cluster (~70 s more,
# only here and in make conformance; tests/cluster/test_streams_redis.py's fork tests
# run on a Redis Cluster in make test).
conformance-streams-cluster: setup
	$(PY) -m pytest tests/conformance/test_durable_streams.py -m '' -k 'three' -s \
	  --timeout 900

# ONLY=scale runs just the node scaling (Figures 12-13: 1, 2, 4 nodes on the mesh and
# on Redis, each node in a CPU cgroup of BUDGET cores that the run makes and removes;
# with RESULTS=1 its table and figures go to loadtest/results/nodes, committed;
# unbudgeted, and saying so, where /sys/fs/cgroup/cpu is not writable). ONLY=workers
# runs --workers 2 against one process, each serving process in a cgroup of its own.
ONLY ?=
BUDGET ?=
bench: setup bench-packages
	$(PY) -m loadtest.bench$(if $(ONLY), --only $(ONLY))$(if $(BUDGET), --budget $(BUDGET))$(if $(filter 1 yes true,$(RESULTS)), --results)

# The paper's demo: a chat on NODES nodes behind HAProxy, front on :8000; each
# node's URL and PID printed. LEAVE_DEAD=1: a node killed stays dead (the page
# then shows "2 of 3 nodes up") instead of being restarted.
LEAVE_DEAD ?=
demo: cluster-packages
	$(PY) -m demo.run --nodes $(NODES) --port $(PORT)$(if $(filter 1 yes true,$(LEAVE_DEAD)), --leave-dead)

# The paper's evaluation with real Locust (PROFILE=quick|paper|scale|nodes-locust); results,
# report.md and figures in loadtest/out/$(PROFILE)/ (scratch, git-ignored), or
# with RESULTS=1 in loadtest/results/$(PROFILE)/, the committed results. Needs
# root for NT and for the per-node CPU cgroups of PROFILE=nodes-locust (or BUDGET=cores).
PROFILE ?= quick
RESULTS ?=
loadtest: setup
	$(PY) -m loadtest.paper.run --profile $(PROFILE)$(if $(filter 1 yes true,$(RESULTS)), --results)$(if $(BUDGET), --budget $(BUDGET))

# The seeds rerun on PushUp (issue 11): select/poll/epoll under idle held polls, and
# fan-out over a private veth with MTU and tbf caps (needs root). PROFILE=smoke|full
# (the default `quick` means smoke, under a minute; full about 15 minutes). Output in
# loadtest/out/seeds-PROFILE/, or with RESULTS=1 in loadtest/results/seeds/.
experiments: setup
	$(PY) -m loadtest.experiments --profile $(if $(filter quick,$(PROFILE)),smoke,$(PROFILE))$(if $(filter 1 yes true,$(RESULTS)), --out loadtest/results/seeds)

lint: $(STAMP)
	$(VENV)/bin/ruff check pushup tests loadtest clients/python
	$(VENV)/bin/mypy --strict pushup

clean:
	rm -rf $(VENV) build *.egg-info
