"""Event streams through HAProxy: a reconnect with Last-Event-ID, landing on any
node, resumes exactly once."""

from __future__ import annotations

from tests.cluster.clients import publish, subscribe, uniq, wait_until
from tests.sse_client import SSE, data_of


def test_a_stream_through_the_front_resumes_exactly_once_on_any_node(fresh_cluster):
    c = fresh_cluster(2, haproxy=True)
    host, port = "127.0.0.1", c.front_port
    ch = uniq("sse")
    first = SSE(host, port, [ch])
    try:
        publish(c.bases[0], [ch], 1)
        assert data_of(first.events(1)) == [1]  # in order of arrival: one at a time
        publish(c.bases[1], [ch], 2)
        got = first.events(2)
        assert data_of(got) == [1, 2]
    finally:
        first.close()
    for i in (3, 4, 5):
        publish(c.bases[i % 2], [ch], i)
    for base in c.bases:  # every node has all five before we reconnect
        wait_until(lambda base=base: len(subscribe(base, [ch], since="0")[1]["messages"]) == 5,
                   20, msg="all five everywhere")
    for _ in range(2):  # round robin: once on each node
        again = SSE(host, port, [ch], last_event_id=got[1]["id"])
        try:
            assert data_of(again.events(3)) == [3, 4, 5]
        finally:
            again.close()
