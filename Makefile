# Two commands matter: `make run` and `make test`. Each sets everything up first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test bench cluster loadtest lint setup system-packages clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,loadtest,dev]'
	touch $(STAMP)

# Debian packages the tests and load tests use (HAProxy for the cluster, nftables
# for wire-byte counters). Installed only when missing; we run as root.
system-packages:
	@command -v haproxy >/dev/null && command -v nft >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy nftables >/dev/null; }

setup: $(STAMP) system-packages

run: $(STAMP)
	$(VENV)/bin/pushup serve

# N nodes (NODES=3) behind HAProxy on loopback; Ctrl-C stops everything.
NODES ?= 3
cluster: setup
	$(PY) deploy/launch.py --nodes $(NODES) --port 8000

test: setup
	$(PY) -m pytest

bench: setup
	$(PY) -m loadtest.bench

# The paper's evaluation with real Locust (PROFILE=quick|paper|scale); results,
# report.md and figures in loadtest/results/$(PROFILE)/. Needs root for NT.
PROFILE ?= quick
loadtest: setup
	$(PY) -m loadtest.run --profile $(PROFILE)

lint: $(STAMP)
	$(VENV)/bin/ruff check pushup tests loadtest
	$(VENV)/bin/mypy --strict pushup/errors.py pushup/model.py pushup/cursor.py pushup/store.py pushup/hub.py pushup/config.py pushup/metrics.py pushup/replica.py pushup/fleet.py

clean:
	rm -rf $(VENV) build *.egg-info
