"""Webhooks from one real node to a real receiver of the test's own: the body
and its signature, batching, retries through a 500, a flap that is no event,
and a receiver that never answers (bounded queue, drops counted, the node
serving on)."""
from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import Iterator

import pytest

from tests.e2e.support import Node, Pending, assert_json_ok, serving, uniq
from tests.webhook_receiver import Receiver

SECRET = "webhook-secret-for-the-tests"
WINDOW = "1"


@pytest.fixture
def receiver():
    made: list[Receiver] = []

    def make(**kw) -> Receiver:
        made.append(Receiver(SECRET, **kw))
        return made[-1]
    yield make
    for r in made:
        r.close()


@contextlib.contextmanager
def node_for(receiver: Receiver, *flags: str) -> Iterator[Node]:
    """A node sending its webhooks to ``receiver``, stopped after."""
    served = serving("--webhook-url", receiver.url, "--webhook-secret", SECRET,
                     "--presence-window", WINDOW, *flags)
    try:
        yield next(served)
    finally:
        served.close()


def poll(node, channels, user, client, timeout=0.5):
    q = urllib.parse.urlencode({"channels": ",".join(channels), "since": "now",
                                "timeout": timeout, "user": user, "client": client})
    return assert_json_ok(node.get("/subscribe?" + q, timeout=timeout + 15))


def names(events):
    return [(e["name"], e["channel"], e.get("user")) for e in events]


def test_a_join_and_a_leave_are_posted_signed_in_one_batch_each(receiver):
    hook = receiver()
    with node_for(hook) as node:
        a, b = uniq("a"), uniq("b")
        poll(node, [a, b], "ann", "tab")  # one poll: four events, one batch
        first = hook.wait(lambda r: r.requests, "a first webhook")[0]
        assert first["valid"], first["headers"]  # HMAC over timestamp + "." + body
        assert first["headers"]["Content-Type"] == "application/json"
        body = first["body"]
        assert isinstance(body["time_ms"], int)
        assert sorted(names(body["events"])) == sorted([
            ("channel_occupied", a, None), ("member_added", a, "ann"),
            ("channel_occupied", b, None), ("member_added", b, "ann")])
        # the window passes: she leaves, in one more batch
        hook.wait(lambda r: len(r.accepted()) == 8, "the leave")
        leave = hook.requests[1]["body"]["events"]
        assert sorted(names(leave)) == sorted([
            ("channel_vacated", a, None), ("member_removed", a, "ann"),
            ("channel_vacated", b, None), ("member_removed", b, "ann")])
        ids = [e["id"] for e in hook.accepted()]
        assert len(set(ids)) == 8


def test_a_batch_holds_at_most_50_events(receiver):
    hook = receiver()
    with node_for(hook) as node:
        channels = [uniq(f"m{i}") for i in range(40)]  # 80 events at once
        poll(node, channels, "ann", "tab")
        hook.wait(lambda r: len(r.accepted()) >= 80, "80 events")
        sizes = [len(r["body"]["events"]) for r in hook.requests]
        assert sizes[:2] == [50, 30] and all(r["valid"] for r in hook.requests)


def test_a_receiver_that_answers_500_gets_the_same_events_again(receiver):
    hook = receiver(answers=[500, 503])
    with node_for(hook) as node:
        ch = uniq("retry")
        poll(node, [ch], "ann", "tab")
        hook.wait(lambda r: len(r.requests) >= 3, "two retries")
        bodies = [r["body"] for r in hook.requests[:3]]
        assert bodies[0] == bodies[1] == bodies[2]  # same ids, same body, signed anew
        assert [r["status"] for r in hook.requests[:3]] == [500, 503, 200]
        assert all(r["valid"] for r in hook.requests)
        assert names(hook.accepted()[:2]) == [("channel_occupied", ch, None),
                                              ("member_added", ch, "ann")]
        metrics = node.get("/metrics").body.decode()
        assert "pushup_webhook_failures_total 2.0" in metrics


def test_a_flap_within_the_window_is_no_event(receiver):
    hook = receiver()
    with node_for(hook) as node:
        ch, later = uniq("flap"), uniq("sentinel")
        poll(node, [ch], "ann", "tab1")
        poll(node, [ch], "ann", "tab2")  # her page reloaded: a new tab, within the window
        poll(node, [ch], "ann", "tab2")
        # everything before this channel's event was sent before it (in order)
        poll(node, [later], "bob", "b")
        hook.wait(lambda r: ("member_added", later, "bob") in names(r.accepted()), "bob")
        assert [n for n in names(hook.accepted()) if n[1] == ch] == [
            ("channel_occupied", ch, None), ("member_added", ch, "ann")]


def test_a_receiver_that_never_answers_costs_a_bounded_queue(receiver):
    hook = receiver(silent=True)
    with node_for(hook, "--webhook-queue", "50") as node:
        channels = [uniq(f"d{i}") for i in range(40)]
        poll(node, channels, "ann", "tab")  # 80 events: 50 in flight, 30 over the bound
        hook.wait(lambda r: r.requests, "the first request (never answered)")
        stats = node.wait_stat("webhooks", lambda w: w["dropped"] >= 30)
        assert stats["webhooks"]["queued"] <= 50
        metrics = node.get("/metrics").body.decode()
        assert "pushup_webhook_events_dropped_total" in metrics
        # the node serves on: a publish, a held poll answered by it
        ch = uniq("alive")
        held = Pending(lambda: node.subscribe_raw([ch], since="now", timeout=30))
        node.wait_subscribers(ch, 1)
        node.publish([ch], "still here")
        assert assert_json_ok(held.result(20))["messages"][0]["data"] == "still here"
