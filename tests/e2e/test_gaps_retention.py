"""Retention: per-channel cap, cached-bytes cap, message ttl; gaps are said, never silent."""
from __future__ import annotations

import pytest

from tests.e2e.support import assert_json_ok, serving, uniq, wait_until


def ids(body):
    return [m["id"] for m in body["messages"]]


@pytest.fixture(scope="module")
def capped():
    yield from serving("--max-messages-per-channel", "3")


def test_since_zero_after_evictions_has_gap(capped):
    ch = uniq("gap")
    pubs = [capped.publish([ch], i) for i in range(5)]
    body = capped.subscribe([ch], since="0")
    assert body.get("gap") is True, body
    assert ids(body) == [p["id"] for p in pubs[2:]]
    # the cursor after it is current: nothing missed since
    body2 = capped.subscribe([ch], since=body["cursor"])
    assert body2["messages"] == [] and not body2.get("gap", False)


def test_no_gap_without_evictions(capped):
    ch = uniq("nogap")
    pubs = [capped.publish([ch], i) for i in range(3)]
    body = capped.subscribe([ch], since="0")
    assert ids(body) == [p["id"] for p in pubs]
    assert body.get("gap", False) is False


def test_cursor_that_saw_everything_has_no_gap_after_evictions(capped):
    ch = uniq("seen")
    [capped.publish([ch], i) for i in range(3)]
    cur = capped.subscribe([ch], since="0")["cursor"]
    later = [capped.publish([ch], i) for i in range(3, 5)]  # evicts 0 and 1, both seen
    body = capped.subscribe([ch], since=cur)
    assert ids(body) == [p["id"] for p in later]
    assert body.get("gap", False) is False


def test_cursor_that_missed_an_evicted_message_has_gap(capped):
    ch = uniq("missed")
    pubs = [capped.publish([ch], 0)]
    cur = capped.subscribe([ch], since="0")["cursor"]  # saw message 0
    pubs += [capped.publish([ch], i) for i in range(1, 5)]  # evicts 0 (seen) and 1 (unseen)
    body = capped.subscribe_guarded([ch], "a gap answered at once", since=cur)
    assert body.get("gap") is True
    assert ids(body) == [p["id"] for p in pubs[2:]]


def test_gap_on_one_of_several_channels(capped):
    a, b = uniq("a"), uniq("b")
    capped.publish([b], "b")
    for i in range(5):
        capped.publish([a], i)
    body = capped.subscribe([a, b], since="0")
    assert body.get("gap") is True and len(body["messages"]) == 4


def test_paging_through_a_capped_channel_reports_gap_once(capped):
    ch = uniq("pg")
    [capped.publish([ch], i) for i in range(4)]
    body = capped.subscribe([ch], since="0", limit=1)
    assert body.get("gap") is True
    body = capped.subscribe([ch], since=body["cursor"], limit=5)
    assert body.get("gap", False) is False and len(body["messages"]) == 2


def test_max_cached_bytes(start_node):
    n = start_node("--max-cached-bytes", "8000", "--max-message-bytes", "2000")
    ch = uniq("bytes")
    pubs = [n.publish([ch], "z" * 1000) for _ in range(30)]
    body = n.subscribe([ch], since="0")
    assert body.get("gap") is True
    assert 1 <= len(body["messages"]) < 30
    assert ids(body) == [p["id"] for p in pubs[-len(body["messages"]):]]  # newest kept
    assert n.stats()["messages"] < 30


def test_message_ttl_expiry_and_gaps(start_node):
    n = start_node("--message-ttl", "1")
    ch = uniq("mttl")
    c0 = n.subscribe([ch])["cursor"]  # before anything was published
    pub = n.publish([ch], "short-lived")
    seen = n.subscribe([ch], since=c0)
    assert ids(seen) == [pub["id"]]
    c1 = seen["cursor"]
    wait_until(lambda: n.subscribe([ch], since="0")["messages"] == [], 15, msg="message expiry")
    assert assert_json_ok(n.channel_info(ch))["messages"] == 0
    assert n.stats()["messages"] == 0
    # since=0 after evictions: gap
    assert n.subscribe([ch], since="0").get("gap") is True
    # a cursor that never saw the expired message: gap, answered at once with no messages
    body = n.subscribe_guarded([ch], "a gap answered at once", since=c0)
    assert body["messages"] == [] and body.get("gap") is True
    # a current cursor whose seen message expired: no gap (held until its timeout)
    body = n.subscribe([ch], since=c1, timeout=0.5)
    assert body["messages"] == [] and body.get("gap", False) is False
    # and it still works
    pub2 = n.publish([ch], "next")
    assert ids(n.subscribe([ch], since=c1)) == [pub2["id"]]


def test_batch_evicting_unseen_message_reports_gap(start_node):
    """A message evicted inside one batch, before any client could see it, is a gap."""
    n = start_node("--max-messages-per-channel", "2")
    ch = uniq("hg")
    n.publish([ch], 0)
    cur = n.subscribe([ch], since="0")["cursor"]
    # three publishes in one batch: message 1 is evicted before the client can see it
    r = n.publish_batch([{"channels": [ch], "data": i} for i in (1, 2, 3)])
    assert r.status == 201, r
    body = n.subscribe([ch], since=cur, timeout=60, http_timeout=10)
    assert body.get("gap") is True
    assert [m["data"] for m in body["messages"]] == [2, 3]
