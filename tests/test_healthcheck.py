"""deploy/healthcheck.py, the container image's HEALTHCHECK: it asks /health where the
PUSHUP_* variables say the node listens, and exits 0 only for a 200."""

from __future__ import annotations

import subprocess
import sys

import pytest

from deploy.healthcheck import health_url
from tests.toolkit import ROOT, clean_env, free_port

CHECK = [sys.executable, str(ROOT / "deploy" / "healthcheck.py")]


@pytest.mark.parametrize(("environ", "url"), [
    ({}, "http://127.0.0.1:8080/health"),
    ({"PUSHUP_HOST": "0.0.0.0", "PUSHUP_PORT": "9000"}, "http://127.0.0.1:9000/health"),
    ({"PUSHUP_HOST": "::", "PUSHUP_PORT": "9000"}, "http://[::1]:9000/health"),
    ({"PUSHUP_HOST": "10.0.0.5", "PUSHUP_PORT": "9000"}, "http://10.0.0.5:9000/health"),
    ({"PUSHUP_PORT": "9000", "PUSHUP_ADMIN_PORT": "9100"}, "http://127.0.0.1:9100/health"),
    ({"PUSHUP_PORT": "9000", "PUSHUP_ADMIN_PORT": "0"}, "http://127.0.0.1:9000/health"),
])
def test_it_asks_where_the_variables_say_the_node_listens(environ, url):
    assert health_url(environ) == url


def test_a_serving_node_is_healthy_and_a_closed_port_is_not(serve):
    admin = free_port()
    node = serve("--admin-port", str(admin))
    env = clean_env({"PUSHUP_PORT": str(node.port), "PUSHUP_ADMIN_PORT": str(admin)})
    assert subprocess.run(CHECK, env=env, timeout=30).returncode == 0
    closed = clean_env({"PUSHUP_PORT": str(free_port())})
    refused = subprocess.run(CHECK, env=closed, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1 and "Connection refused" in refused.stderr
