"""pushup/http/render.py: a long poll's 200 body is the contract's JSON (docs/api.md,
"Subscribe"): the messages in order, each listing only the channels the query names,
the cursor, ``gap`` only when true, and ``closed``."""

from __future__ import annotations

import json

from pushup.core.cursor import Cursor
from pushup.core.model import Message, Query
from pushup.core.service import Delivery
from pushup.core.store import Result
from pushup.http.render import poll_body

FIRST = Message("n1.a", 1, 1_800_000_000_000_001, ("a", "b"), b'{"k":[1,2]}')
SECOND = Message("n1.a", 2, 1_800_000_000_500_000, ("b",), b'"two"')
CURSOR = Cursor.of({"n1.a": 2})


def body(delivery: Delivery) -> dict:
    return json.loads(poll_body(delivery))


def test_messages_in_order_each_listing_only_the_channels_asked_for():
    delivery = Delivery(Query(("b",), 0, None, 10), Result((FIRST, SECOND), CURSOR, False))
    assert body(delivery) == {
        "messages": [
            {"id": "n1.a-1", "timestamp": 1_800_000_000.000001, "channels": ["b"],
             "data": {"k": [1, 2]}},
            {"id": "n1.a-2", "timestamp": 1_800_000_000.5, "channels": ["b"], "data": "two"}],
        "cursor": CURSOR.encode(), "closed": []}


def test_gap_is_there_only_when_true_and_closed_names_the_channels():
    gap = Delivery(Query(("a", "gone"), 0, None, 10), Result((), CURSOR, True), ("gone",))
    assert body(gap) == {"messages": [], "cursor": CURSOR.encode(), "gap": True,
                         "closed": ["gone"]}
    assert b'"gap"' not in poll_body(Delivery(Query(("a",), 0, None, 10),
                                              Result((), CURSOR, False)))


def test_timestamps_keep_their_six_decimals_exactly():
    raw = poll_body(Delivery(Query(("a",), 0, None, 10), Result((FIRST,), CURSOR, False)))
    assert b'"timestamp":1800000000.000001,' in raw
