"""Idempotent publish across real nodes: a retry with the first attempt's
``Idempotency-Key`` stores nothing new, on the node that took the first
attempt and on any other; on Redis, also when the first attempt's answer was
a timeout and Redis ran it afterwards."""
from __future__ import annotations

import json

from pushup.backplane.redis.partitions import keys_of
from tests.cluster.clients import jrequest, request, retained, subscribe, uniq, wait_until


def keyed_publish(base: str, channel: str, data: object, key: str,
                  timeout: float = 10) -> tuple[int, dict]:
    return jrequest("POST", base + "/publish", {"channels": [channel], "data": data},
                    headers={"Idempotency-Key": key}, timeout=timeout)


def test_a_retry_on_the_same_node_or_another_stores_once(cluster):
    ch, key = uniq("idem"), uniq("key")
    status, first = keyed_publish(cluster.bases[0], ch, {"n": 1}, key)
    assert status == 201, first
    # Every node holds the first attempt (and its key) once it has the message.
    for base in cluster.bases:
        wait_until(lambda base=base: first["id"] in retained(base, [ch]), 10, 0.02,
                   f"{base} holds the first attempt")
    for base in cluster.bases:  # the publisher retries anywhere, e.g. through HAProxy
        status, again = keyed_publish(base, ch, {"n": 1}, key)
        assert (status, again) == (201, first)
    status, refused = keyed_publish(cluster.bases[2], ch, {"n": 2}, key)
    assert status == 422 and refused["error"]["code"] == "idempotency_key_reused"
    for base in cluster.bases:
        assert list(retained(base, [ch])) == [first["id"]]


def test_a_publish_redis_ran_after_its_timeout_is_found_by_the_retry_and_delivered_once(
        fresh_cluster, redis_server):
    c = fresh_cluster(2, haproxy=False, engine=redis_server.url)
    ch, key, warm = uniq("frozen"), uniq("key"), uniq("warm")
    logs = {keys_of(ch).log, keys_of(warm).log}  # where the two publishes are appended

    def logged() -> int:
        return sum(redis_server.cli("XLEN", log) for log in logs)

    _, start = subscribe(c.bases[1], [ch], since="now", timeout=0)
    # (A first publish also has Redis cache the script, so the frozen EVALSHA runs.)
    assert keyed_publish(c.bases[0], warm, 0, uniq("key"))[0] == 201
    redis_server.pause()  # SIGSTOP: the publish reaches Redis's socket, no answer comes
    try:
        status, headers, raw = request(
            "POST", c.bases[0] + "/publish",
            json.dumps({"channels": [ch], "data": "once"}).encode(),
            headers={"Idempotency-Key": key}, timeout=20)
    finally:
        redis_server.resume()
    body = json.loads(raw)
    # Not "nothing was stored": the node cannot know.
    assert status == 504 and body["error"]["code"] == "outcome_unknown", body
    # Redis ran it on resuming: the log holds the first attempt.
    wait_until(lambda: logged() == 2, 10, 0.05, "the first attempt ran")
    # The other node, as a balancer may send the retry there: its connections saw
    # no command go unanswered (it only listens for notifications), so Redis
    # answers it; the answer is the first attempt's.
    status, receipt = keyed_publish(c.bases[1], ch, "once", key)
    assert status == 201, receipt
    assert logged() == 2  # nothing stored again
    for base in c.bases:
        _, got = subscribe(base, [ch], since=start["cursor"], timeout=5)
        assert [m["id"] for m in got["messages"]] == [receipt["id"]]
        assert got["messages"][0]["timestamp"] == receipt["timestamp"]


def test_a_redis_retry_with_the_key_and_another_body_is_422(fresh_cluster, redis_server):
    c = fresh_cluster(2, haproxy=False, engine=redis_server.url)
    ch, key = uniq("reuse"), uniq("key")
    status, first = keyed_publish(c.bases[0], ch, 1, key)
    assert status == 201
    assert keyed_publish(c.bases[1], ch, 1, key) == (201, first)
    status, refused = keyed_publish(c.bases[1], ch, 2, key)
    assert status == 422 and refused["error"]["code"] == "idempotency_key_reused"
    assert list(retained(c.bases[1], [ch])) == [first["id"]]
