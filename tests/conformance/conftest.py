"""Conformance fixtures: real `pushup serve` nodes, a relay that can cut streams, and
third-party clients run as processes.

A node runs on a free loopback port with a data directory, so it can be restarted
on the same port and keep what it acknowledged; it is stopped by PID (SIGTERM,
exit 0 expected). The relay stands between the clients and the node: it can hold
new connections back (the client is "away") and end every open response cleanly,
as a server or proxy ending a stream does. Each client is a process printing one
JSON line per message it hands to its user (tests/conformance/clients/).

The parts themselves are tests/conformance/harness.py.

`make conformance` sets PUSHUP_CONFORMANCE_MESSAGES and PUSHUP_CONFORMANCE_RESTARTS
for a longer run; `make test` runs the short defaults.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conformance.harness import ClientProcess, Relay, RestartableNode, client_argv


@pytest.fixture
def node() -> Iterator[RestartableNode]:
    served = RestartableNode()
    served.start()
    yield served
    served.stop()


@pytest.fixture
def relay(node: RestartableNode) -> Iterator[Relay]:
    front = Relay(node.port)
    yield front
    front.close()


@pytest.fixture
def run_client() -> Iterator[Any]:
    started: list[ClientProcess] = []

    def run(name: str, base: str, channel: str) -> ClientProcess:
        client = ClientProcess(client_argv(name, base, channel))
        started.append(client)
        return client

    yield run
    for client in started:
        client.stop()
