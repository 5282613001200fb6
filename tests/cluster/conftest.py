"""Cluster tests: real `pushup serve` nodes peered with each other, real HAProxy.

Everything talks HTTP over loopback with the standard library only
(tests/cluster/clients.py; ports and waits from tests/toolkit.py).

Fixtures:
  cluster        one 3-node cluster + HAProxy for the whole session; tests on it
                 must not kill nodes (use fresh_cluster for that)
  fresh_cluster  factory: a new LocalCluster, stopped at teardown
  workers        `pushup serve --workers 2` in a process group of its own
"""
from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from deploy.launch import LocalCluster
from tests.cluster.clients import peers_idle
from tests.toolkit import ServedNode, wait_until

# -- fixtures ------------------------------------------------------------------

@pytest.fixture(scope="session")
def cluster():
    with LocalCluster(nodes=3, haproxy=True) as c:
        c.bases = [c.node_url(i) for i in range(3)]
        wait_until(lambda: peers_idle(c.bases), 20, 0.1, "every peer link up")
        yield c


@pytest.fixture
def fresh_cluster():
    made: list[LocalCluster] = []

    def make(nodes: int = 3, haproxy: bool = True, **kw) -> LocalCluster:
        c = LocalCluster(nodes=nodes, haproxy=haproxy, **kw)
        made.append(c)
        c.start()
        c.bases = [c.node_url(i) for i in range(nodes)]
        wait_until(lambda: peers_idle(c.bases), 20, 0.1, "every peer link up")
        return c

    yield make
    for c in made:
        c.stop()


@pytest.fixture
def workers() -> Iterator[ServedNode]:
    """``pushup serve --workers 2``: the supervisor in its own process group (its
    ``.url``, its stderr in ``.log``). At the end it must exit 0 on SIGTERM, and no
    worker may outlive it."""
    node = ServedNode("--workers", "2", session=True)
    try:
        yield node
    finally:
        if node.proc.poll() is None:
            assert node.stop() == 0, f"log {node.log}"
        else:
            try:
                os.killpg(node.pid, 0)
            except ProcessLookupError:
                pass
            else:
                os.killpg(node.pid, signal.SIGKILL)
                pytest.fail("workers outlived the supervisor")
        node.log.unlink(missing_ok=True)
