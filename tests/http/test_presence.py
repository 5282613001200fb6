"""pushup/http/presence.py through the handlers, as values on task.Clock: a
Request in, a Response (or Held) out; who a subscribe is, the window, the
counts said once a turn, a presence=1 poll woken by a join, and a cursor
that keeps both positions. (Real processes: tests/e2e/test_presence.py.)"""
from __future__ import annotations

import json

import pytest
from twisted.internet.task import Clock

from pushup.config import Config
from pushup.core.cursor import decode
from pushup.core.service import Delivery
from pushup.http.exchange import Held, Request, Response
from pushup.http.presence import POSITION_PREFIX
from pushup.http.render import poll_body
from pushup.ops.node import Node

START = 1_763_800_000.0
WINDOW = 2.0


class Client:
    """A held poll's end: what it was answered."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    def respond(self, delivery: Delivery, hold: bool = False) -> bool:
        self.bodies.append(json.loads(poll_body(delivery)))
        return True

    def answer_held(self, response: Response) -> bool:
        self.bodies.append(json.loads(response.body))
        return True


@pytest.fixture
def node():
    clock = Clock()
    clock.advance(START)
    return Node(Config(node_id="h", presence=True, presence_window=WINDOW), clock)


def get(node, target: str, client=None):
    path, _, query = target.encode().partition(b"?")
    return node.handlers.handle(Request(b"GET", path, query, {}, b""), client or Client())


def occupancy(node, ch: str) -> dict:
    node.reactor.advance(0)  # the counts that moved are said on the next turn
    return json.loads(get(node, f"/presence?channels={ch}&members=1").body)["channels"][ch]


def test_an_anonymous_poll_counts_while_held_only(node):
    held = get(node, "/subscribe?channels=a&timeout=30")
    assert isinstance(held, Held)
    assert occupancy(node, "a") == {"occupancy": 1, "members": [], "members_truncated": False}
    held.cancel()
    assert occupancy(node, "a")["occupancy"] == 0


def test_a_client_counts_between_its_polls_for_the_window(node):
    answered = get(node, "/subscribe?channels=a&timeout=0&client=tab1&user=ann")
    assert isinstance(answered, Response) and answered.status == 200
    assert occupancy(node, "a") == {"occupancy": 1, "members": [{"user": "ann"}],
                                    "members_truncated": False}
    node.reactor.advance(WINDOW - 0.1)
    get(node, "/subscribe?channels=a&timeout=0&client=tab1&user=ann")  # polls again
    node.reactor.advance(WINDOW - 0.1)
    assert occupancy(node, "a")["occupancy"] == 1
    node.reactor.advance(0.2)
    assert occupancy(node, "a") == {"occupancy": 0, "members": [], "members_truncated": False}


def test_a_held_presence_poll_is_answered_by_a_join_with_a_cursor_for_both(node):
    first = json.loads(get(node, "/subscribe?channels=a&since=now&presence=1&client=me"
                                 "&user=me").body)
    assert first["presence"] == [{"channel": "a", "event": "member_added", "user": "me"}]
    positions = dict(decode(first["cursor"]).positions)
    assert any(o.startswith(POSITION_PREFIX) for o in positions)
    follower = Client()
    held = get(node, f"/subscribe?channels=a&since={first['cursor']}&presence=1&client=me"
                     "&user=me&timeout=30", follower)
    assert isinstance(held, Held) and follower.bodies == []
    get(node, "/subscribe?channels=a&timeout=30&client=b&user=bob")
    node.reactor.advance(0)
    [joined] = follower.bodies
    assert joined["presence"] == [{"channel": "a", "event": "member_added", "user": "bob"}]
    assert joined["messages"] == []
    # the cursor still reads messages as one without presence would
    node.handlers.handle(Request(b"POST", b"/publish", b"", {},
                                 b'{"channels": ["a"], "data": 1}'), Client())
    after = json.loads(get(node, f"/subscribe?channels=a&since={joined['cursor']}&timeout=0"
                                 "&presence=1&client=me&user=me").body)
    assert [m["data"] for m in after["messages"]] == [1] and after["presence"] == []


@pytest.mark.parametrize("query", ["presence=yes", "client=no%20spaces", "client=" + "x" * 65,
                                   "user=" + "u" * 201])
def test_a_bad_presence_parameter_is_400(node, query):
    answer = get(node, "/subscribe?channels=a&timeout=0&" + query)
    assert answer.status == 400
    assert json.loads(answer.body)["error"]["code"] == "bad_parameter"


def test_presence_needs_channels_and_a_method_it_knows(node):
    assert get(node, "/presence").status == 400
    answer = node.handlers.handle(Request(b"POST", b"/presence", b"channels=a", {}, b""),
                                  Client())
    assert answer.status == 405


def test_ten_thousand_members_of_one_channel_are_listed_to_the_cap_and_counted_exactly(node):
    # docs/operations.md, "Presence: sizing": the cap (--presence-members, 100 by
    # default) bounds what GET /presence answers; the count is every subscriber
    polls = [get(node, f"/subscribe?channels=big&timeout=30&client=t{i}&user=u{i}")
             for i in range(10_000)]
    seen = occupancy(node, "big")
    assert seen["occupancy"] == 10_000
    assert len(seen["members"]) == 100 and seen["members_truncated"] is True
    assert len({m["user"] for m in seen["members"]}) == 100
    assert len(get(node, "/presence?channels=big&members=1").body) < 100 * 20 + 100
    for held in polls:
        held.cancel()
    node.reactor.advance(WINDOW + 0.1)  # every member leaves, each once, after the window
    assert occupancy(node, "big") == {"occupancy": 0, "members": [], "members_truncated": False}
    assert node.presence.figures()["presence_subscriptions"] == 0
