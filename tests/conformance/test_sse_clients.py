"""Third-party clients against real nodes: every message exactly once, in order.

Each client (npm `eventsource`, `httpx-sse`, `aiohttp-sse-client`, `sseclient-py`,
and long polls on `requests` and Node's `fetch`) follows one channel from
`since=now` through a relay, and must hand its user each published message once:

- across node restarts (SIGTERM, then `pushup serve` again on the same port and
  data directory), with messages published while it is away;
- across a disconnect before its first event (API.md, "As an event stream": the
  stream names its position at once, so a reconnect's Last-Event-ID resumes there).

Reconnecting is each client's own (its retry, its Last-Event-ID; for the two SSE
parsers that leave reconnecting to their user, the loop their docs describe).
A final message marks the end, so "nothing more" is checked without waiting.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.conformance.harness import (
    MESSAGES,
    POLL_CLIENTS,
    RESTARTS,
    STREAM_CLIENTS,
    Relay,
    RestartableNode,
)
from tests.toolkit import wait_until

END = "end"


def publish_batch(node: RestartableNode, channel: str, start: int, count: int) -> list[int]:
    for n in range(start, start + count):
        node.publish(channel, n)
    return list(range(start, start + count))


def wait_until_positioned(node: RestartableNode, relay: Relay, channel: str, client: str) -> None:
    """The client's subscription is held and, for a stream, its position was named
    (an event block reached the client): only then may it be cut."""
    node.wait_subscribers(channel, 1)
    if client in STREAM_CLIENTS:
        try:
            wait_until(lambda: any(b"\n\n" in body for body in relay.opened_streams()),
                       5.0, msg="event block")
        except AssertionError:
            raise AssertionError("the stream did not name its position when it opened "
                                 "(API.md: `id: <cursor>` before any message)") from None


@pytest.mark.parametrize("client", STREAM_CLIENTS + POLL_CLIENTS)
def test_client_gets_every_message_once_across_node_restarts(
        node: RestartableNode, relay: Relay, run_client: Any, client: str) -> None:
    channel = f"restart-{uuid.uuid4().hex[:8]}"
    reader = run_client(client, relay.url, channel)
    node.wait_subscribers(channel, 1)  # since=now is resolved: publishing may begin
    per_round = max(1, MESSAGES // (2 * RESTARTS + 1))
    expected = publish_batch(node, channel, 0, per_round)
    reader.wait_for_data(expected[-1])
    for _ in range(RESTARTS):
        relay.cut()  # the reconnect waits in the relay's backlog until release()
        node.restart()
        expected += publish_batch(node, channel, len(expected), per_round)  # while away
        relay.release()
        expected += publish_batch(node, channel, len(expected), per_round)
        reader.wait_for_data(expected[-1])
    expected += publish_batch(node, channel, len(expected), MESSAGES - len(expected))
    node.publish(channel, END)
    assert reader.wait_for_data(END) == [*expected, END]


@pytest.mark.parametrize("client", STREAM_CLIENTS + POLL_CLIENTS)
def test_client_reconnecting_before_its_first_event_misses_nothing(
        node: RestartableNode, relay: Relay, run_client: Any, client: str) -> None:
    channel = f"early-{uuid.uuid4().hex[:8]}"
    reader = run_client(client, relay.url, channel)
    wait_until_positioned(node, relay, channel, client)
    relay.cut()  # before any message: the client reconnects into the relay's backlog
    expected = publish_batch(node, channel, 0, MESSAGES // 2)  # published while it is away
    relay.release()
    expected += publish_batch(node, channel, len(expected), MESSAGES - len(expected))
    node.publish(channel, END)
    assert reader.wait_for_data(END) == [*expected, END]

