"""A publish on any node (or through HAProxy) answers subscribers held anywhere."""
from __future__ import annotations

import threading

from tests.cluster.clients import NETWORK_ERRORS, publish, stats, subscribe, uniq, wait_until


class HeldPoll(threading.Thread):
    """One long poll held open in a thread; `result` is (status, body) or the error."""

    def __init__(self, base: str, channels: list[str], since: str | None = None,
                 timeout: float = 20) -> None:
        super().__init__(daemon=True)
        self.args = (base, channels, since, timeout)
        self.result: object = None

    def run(self) -> None:
        base, channels, since, timeout = self.args
        try:
            self.result = subscribe(base, channels, since=since, timeout=timeout)
        except NETWORK_ERRORS as e:
            self.result = e


def hold(polls: list[HeldPoll], bases: list[str], before: int) -> None:
    """Start the polls and wait until the nodes hold all of them."""
    for p in polls:
        p.start()
    wait_until(lambda: sum(stats(b)["waiting"] for b in bases) >= before + len(polls),
               10, 0.02, f"{len(polls)} polls held")


def answered_with(poll: HeldPoll, msg_id: str, channel: str) -> None:
    poll.join(15)
    assert not poll.is_alive(), "the held poll was not answered"
    assert not isinstance(poll.result, Exception), poll.result
    status, body = poll.result
    assert status == 200, body
    assert [m["id"] for m in body["messages"]] == [msg_id], body
    assert body["messages"][0]["channels"] == [channel]


def test_publish_on_one_node_answers_subscriber_held_on_another(cluster):
    a, c = cluster.bases[0], cluster.bases[2]
    ch = uniq()
    before = sum(stats(b)["waiting"] for b in cluster.bases)
    poll = HeldPoll(c, [ch])
    hold([poll], cluster.bases, before)
    msg = publish(a, [ch], {"hello": "from node1"})
    assert msg["id"].startswith("node1."), msg
    answered_with(poll, msg["id"], ch)
    assert poll.result[1]["messages"][0]["data"] == {"hello": "from node1"}


def test_publish_through_haproxy_answers_subscribers_on_every_node_and_front(cluster):
    ch = uniq()
    before = sum(stats(b)["waiting"] for b in cluster.bases)
    polls = [HeldPoll(b, [ch]) for b in cluster.bases]
    polls += [HeldPoll(cluster.front_url, [ch]) for _ in range(3)]
    hold(polls, cluster.bases, before)
    msg = publish(cluster.front_url, [ch], {"via": "haproxy"})
    for p in polls:
        answered_with(p, msg["id"], ch)
    # Every copy is byte-identical in what a client sees.
    bodies = {repr(p.result[1]["messages"]) for p in polls}
    assert len(bodies) == 1, bodies


def test_held_poll_with_cursor_from_another_node_is_answered_once(cluster):
    """A cursor issued by node1 held on node2, answered by a publish on node3."""
    ch = uniq()
    first = publish(cluster.bases[0], [ch], 1)
    status, body = subscribe(cluster.bases[0], [ch], timeout=0)
    assert [m["id"] for m in body["messages"]] == [first["id"]]
    before = sum(stats(b)["waiting"] for b in cluster.bases)
    poll = HeldPoll(cluster.bases[1], [ch], since=body["cursor"])
    hold([poll], cluster.bases, before)
    second = publish(cluster.bases[2], [ch], 2)
    answered_with(poll, second["id"], ch)
