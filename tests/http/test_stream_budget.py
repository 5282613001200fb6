"""The streams' byte budget (``--max-cached-bytes``, pushup/core/streams.py) and
the streams' figures in /stats (pushup/ops/node.py).

docs/api.md: "all of a node's streams hold at most --max-cached-bytes". Issue
35, item 10: a stream's path and a JSON append's messages were not charged
(400 streams of 200 KB paths under a 1 MiB budget, all created; a JSON append
held as its joined bytes and one ``bytes`` per message, only its body
charged), nor what each append costs besides its bytes. So these tests
measure what the streams really hold (``tracemalloc``: every allocation
between the first request and the refusal, freed ones not counted) and check
it against the budget, whatever the charge's own estimates say.
"""

from __future__ import annotations

import gc
import json
import random
import tracemalloc
from collections.abc import Callable

from twisted.internet.task import Clock

from pushup.config import Config
from pushup.core.errors import StreamsFull
from pushup.core.stream_values import Append, Creation
from pushup.core.streams import Streams
from pushup.ops.node import Node
from tests.http.test_streams import START, answered, ask

KIB = 1024


def held_while(run: Callable[[], int]) -> tuple[int, int]:
    """``run()``'s result, and the bytes allocated while it ran and still held."""
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        result = run()
        return result, tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()


def store(budget: int) -> Streams:
    return Streams(lambda: f"{random.getrandbits(64):016x}", budget)


def fill(until_full: Callable[[int], None], most: int) -> int:
    """How many of ``until_full(0..most-1)`` pass before the budget refuses one."""
    for i in range(most):
        try:
            until_full(i)
        except StreamsFull:
            return i
    raise AssertionError(f"{most} requests and the budget never refused one")


def test_the_streams_paths_count_against_the_budget():
    budget = 256 * KIB
    streams = store(budget)
    created, held = held_while(lambda: fill(lambda i: streams.create(
        "/v1/stream/" + f"{i:04d}" * 250, Creation("text/plain", None, None, False, b""), 0),
        1000))
    assert created > 0
    assert held <= budget


def test_a_json_streams_messages_count_against_the_budget():
    budget = 256 * KIB
    streams = store(budget)
    streams.create("/v1/stream/j", Creation("application/json", None, None, False, b""), 0)
    appended, held = held_while(lambda: fill(lambda i: streams.append("/v1/stream/j", Append(
        "application/json", json.dumps(list(range(10_000, 11_000))).encode(), False), 0), 200))
    assert appended > 0
    assert held <= budget


def test_small_appends_count_what_each_append_holds_besides_its_bytes():
    budget = 64 * KIB
    streams = store(budget)
    streams.create("/v1/stream/b", Creation("text/plain", None, None, False, b""), 0)
    appended, held = held_while(lambda: fill(lambda i: streams.append("/v1/stream/b", Append(
        "text/plain", bytes((65 + i % 26, 66)), False), 0), 40_000))
    assert appended > 0
    assert held <= budget


def test_a_create_over_the_budget_is_507_streams_full_and_the_node_serves_on():
    clock = Clock()
    clock.advance(START)
    handlers = Node(Config(node_id="s", max_cached_bytes=16 * KIB), clock).handlers  # type: ignore[arg-type]
    answers = [answered(ask(handlers, b"PUT", b"/v1/stream/" + b"%04d" % i * 250)).status
               for i in range(20)]
    created = answers.count(201)
    assert answers == [201] * created + [507] * (20 - created)
    assert created * 1000 <= 16 * KIB  # the paths alone fit
    refused = answered(ask(handlers, b"PUT", b"/v1/stream/" + b"x" * 1000))
    assert json.loads(refused.body or b"")["error"]["code"] == "streams_full"
    assert answered(ask(handlers, b"GET", b"/v1/stream/" + b"0000" * 250)).status == 200


def test_stats_say_how_many_streams_the_node_holds_their_bytes_and_producers():
    clock = Clock()
    clock.advance(START)
    whole = Node(Config(node_id="s", max_cached_bytes=1 << 20), clock)  # type: ignore[arg-type]
    handlers = whole.handlers
    assert whole.stats()["streams"] == {"count": 0, "bytes": 0, "budget": 1 << 20,
                                        "producers": 0}
    answered(ask(handlers, b"PUT", b"/v1/stream/a", content_type=b"text/plain"))
    answered(ask(handlers, b"PUT", b"/v1/stream/b", b"hello", content_type=b"text/plain"))
    for name in (b"p", b"q"):
        answered(ask(handlers, b"POST", b"/v1/stream/a", b"x", content_type=b"text/plain",
                     producer_id=name, producer_epoch=b"0", producer_seq=b"0"))
    figures = whole.stats()["streams"]
    assert (figures["count"], figures["producers"]) == (2, 2)
    assert figures["bytes"] == handlers.streams.streams.held > 0
    answered(ask(handlers, b"DELETE", b"/v1/stream/a"))
    answered(ask(handlers, b"DELETE", b"/v1/stream/b"))
    assert whole.stats()["streams"] == {"count": 0, "bytes": 0, "budget": 1 << 20,
                                        "producers": 0}
