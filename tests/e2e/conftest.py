"""End-to-end fixtures: real `pushup serve` processes on 127.0.0.1; the helpers they
use, and the tests too, are tests/e2e/support.py's.

`start_node(*flags, env=None, token=None)` starts a node with `--port 0` and stops it
with SIGTERM at teardown (a node that does not exit 0 within 15 s is killed and the
test fails); `node` is one default node shared by a module's cheap tests.
"""
from __future__ import annotations

import pytest

from tests.e2e.support import Nodes, serving


@pytest.fixture
def start_node():
    nodes = Nodes()
    yield nodes
    nodes.close()


@pytest.fixture(scope="module")
def node():
    """A default node shared by the cheap tests of one module (unique channels per test)."""
    yield from serving()
