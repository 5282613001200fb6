"""pushup/http/handlers.py as plain values: a Request in, a Response (or Held) out.

No protocol, no transport: this is what a handler promises on its own.
"""

from __future__ import annotations

import gc
import json
import tracemalloc

import pytest
from twisted.internet.task import Clock

from pushup.config import Config
from pushup.core.service import Delivery
from pushup.http.exchange import Held, Request, Response
from pushup.http.params import QUERY_CACHE_BYTES
from pushup.http.render import poll_body
from pushup.http.tokens import issue
from pushup.ops.node import Node

START = 1_763_800_000.0


class Client:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def respond(self, delivery: Delivery, hold: bool = False) -> bool:
        self.bodies.append(poll_body(delivery))
        return True


@pytest.fixture
def handlers():
    clock = Clock()
    clock.advance(START)
    return Node(Config(node_id="h"), clock).handlers


def request(method: bytes, target: bytes, body: bytes = b"", **headers: bytes) -> Request:
    path, _, query = target.partition(b"?")
    return Request(method, path, query, {k.encode(): v for k, v in headers.items()}, body)


def test_publish_then_pull_are_values(handlers):
    published = handlers.handle(request(b"POST", b"/publish",
                                        b'{"channels": ["a"], "data": 7}'), Client())
    assert isinstance(published, Response) and published.status == 201
    pulled = handlers.handle(request(b"GET", b"/subscribe?channels=a&timeout=0"), Client())
    assert isinstance(pulled, Response)
    assert [m["data"] for m in json.loads(pulled.body)["messages"]] == [7]


def test_a_waiting_subscribe_is_held_and_answered_through_its_client(handlers):
    client = Client()
    held = handlers.handle(request(b"GET", b"/subscribe?channels=a&timeout=30"), client)
    assert isinstance(held, Held)
    handlers.handle(request(b"POST", b"/publish", b'{"channels": ["a"], "data": 1}'), Client())
    handlers.service.clock.advance(0)
    assert [m["data"] for m in json.loads(client.bodies[0])["messages"]] == [1]


def test_a_gone_client_is_forgotten(handlers):
    held = handlers.handle(request(b"GET", b"/subscribe?channels=a&timeout=30"), Client())
    assert len(handlers.service.hub) == 1
    held.cancel()
    assert len(handlers.service.hub) == 0


@pytest.mark.parametrize("param", ["since=1e308", "since=-1e308", "until=1e308",
                                   "until=-1e308", "since=1e12"])
def test_out_of_range_times_are_400_not_500(handlers, param):
    answer = handlers.handle(request(b"GET", b"/subscribe?channels=a&timeout=0&" +
                                     param.encode()), Client())
    assert answer.status == 400
    assert json.loads(answer.body)["error"]["code"] == "bad_parameter"


def test_an_unsigned_peer_request_is_refused_before_its_body(make_node):
    handlers = make_node(cluster_secret="s").node.handlers
    verdict = handlers.admit(b"POST", b"/peer/repair", {b"content-length": b"15000000"})
    assert isinstance(verdict, Response) and verdict.status == 401 and verdict.close
    assert handlers.admit(b"POST", b"/publish", {}) == handlers.config.max_body_bytes


# -- the parsed-query cache: bounded in bytes, filled only once authorised ---------

HUGE = 250_000  # an ignored parameter this long: the target limit allows ~300 KB
SECRET = "a-subscribe-secret-of-32-bytes-or-more"


def huge_pull(i: int, token: str = "") -> Request:
    extra = b"&token=" + token.encode() if token else b""
    return request(b"GET", b"/subscribe?channels=a&timeout=0%s&pad%d=%s"
                   % (extra, i, b"x" * HUGE))


def retained_by(run) -> int:
    """Bytes still allocated after ``run()``, once garbage is collected."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_huge_distinct_queries_hold_no_more_than_the_cache_budget(handlers):
    def pulls() -> None:
        for i in range(60):  # 15 MB of distinct query strings
            answer = handlers.handle(huge_pull(i), Client())
            assert answer.status == 200, answer

    assert retained_by(pulls) < QUERY_CACHE_BYTES + 1024 * 1024
    assert handlers.parsed_queries.bytes <= QUERY_CACHE_BYTES


def test_an_unauthorised_subscribe_leaves_nothing_cached(make_node):
    handlers = make_node(subscribe_secret=SECRET).node.handlers
    now = handlers.service.now() / 1e6
    forged = issue("not-the-secret-of-this-node-at-all!", ["a"], now + 60)
    expired = issue(SECRET, ["a"], now - 60)

    def refused() -> None:
        for i in range(60):
            token = ("", forged, expired)[i % 3]
            answer = handlers.handle(huge_pull(i, token), Client())
            assert answer.status == 401, answer

    assert retained_by(refused) < 1024 * 1024
    assert len(handlers.parsed_queries) == 0
    granted = issue(SECRET, ["a"], now + 60)
    assert handlers.handle(huge_pull(0, granted), Client()).status == 200


def test_a_repeated_query_is_parsed_once(handlers):
    # The handlers' parser wrapped (a compiled module's functions cannot be patched).
    parsed = []
    real = handlers._parse_subscribe
    handlers._parse_subscribe = lambda raw: parsed.append(raw) or real(raw)
    for _ in range(3):  # a fan-out's clients re-polling with the same query
        assert handlers.handle(request(b"GET", b"/subscribe?channels=a&timeout=0"),
                               Client()).status == 200
    assert len(parsed) == 1


# -- a channel's ttl: one rule (pushup.core.channels.check_ttl), in seconds ---------


@pytest.mark.parametrize("ttl", ["0", "-1", "31622401", "1e308", "-1e308", "true", '"60"',
                                 "0.0000001"])
def test_a_ttl_out_of_the_one_rule_is_400_with_the_rule(handlers, ttl):
    answer = handlers.handle(request(b"POST", b"/channels",
                                     b'{"name": "t", "ttl": %s}' % ttl.encode()), Client())
    assert answer.status == 400
    error = json.loads(answer.body)["error"]
    assert error == {"code": "bad_parameter", "message":
                     "ttl must be a number of seconds, more than 0, at most 31622400"}


def test_the_longest_ttl_is_taken(handlers):
    answer = handlers.handle(request(b"POST", b"/channels", b'{"name": "t", "ttl": 31622400}'),
                             Client())
    assert answer.status == 201
