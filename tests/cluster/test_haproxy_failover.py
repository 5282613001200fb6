"""The shipped HAProxy front keeps the contract when nodes fail.

Real HAProxy (deploy/haproxy.cfg.template via deploy/launch.py) and real
nodes: every answer HAProxy gives itself is PushUp's JSON error body, and a
node SIGKILLed under publish and poll load costs no acknowledged message,
while publishes that meet the dead node are sent to a live one.
"""
from __future__ import annotations

import json
import threading
import time

from tests.cluster.clients import (
    NETWORK_ERRORS,
    Poller,
    check_exactly_once,
    request,
    uniq,
    wait_clients_have,
    wait_until,
)

JSON = "application/json"


def error_code(status: int, headers: dict[str, str], body: bytes) -> str:
    """The ``error.code`` of a JSON error answer (fails on anything else)."""
    assert headers.get("content-type", "").startswith(JSON), (status, headers, body[:200])
    return str(json.loads(body)["error"]["code"])


def test_answers_haproxy_gives_itself_are_the_json_error_body(fresh_cluster):
    # (Malformed HTTP is not among them: HAProxy 2.6 answers it from its H1
    # layer with a built-in HTML page that no errorfile replaces; README.)
    c = fresh_cluster(1, haproxy=True)
    # No node left: HAProxy's 503, for a subscribe and for a publish.
    c.kill(0)
    for method, path, payload in (("GET", "/subscribe?channels=a&timeout=0", None),
                                  ("POST", "/publish", b'{"channels":["a"],"data":1}')):
        status, headers, body = request(method, c.front_url + path, payload)
        assert status == 503
        assert error_code(status, headers, body) == "no_node_available"
        assert headers.get("retry-after") == "1"


class FrontPublisher(threading.Thread):
    """Publishes one message at a time through the front until stopped,
    recording each answer with the moment its request was sent."""

    def __init__(self, url: str, channels: list[str]) -> None:
        super().__init__(daemon=True)
        self.url, self.channels = url, channels
        self.answers: list[tuple[float, int, str, dict]] = []  # sent at, status, type, body
        self.acked: dict[str, set[str]] = {}  # 201: id -> channels
        self.stop_event = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop_event.is_set():
            chans = [self.channels[n % len(self.channels)]]
            sent_at = time.monotonic()
            try:
                status, headers, raw = request("POST", self.url + "/publish", json.dumps(
                    {"channels": chans, "data": n}).encode())
            except NETWORK_ERRORS as e:
                self.answers.append((sent_at, 0, repr(e), {}))
                continue
            kind = headers.get("content-type", "")
            body = json.loads(raw) if kind.startswith(JSON) else {"_raw": raw[:200]}
            self.answers.append((sent_at, status, kind, body))
            if status == 201:
                self.acked[body["id"]] = set(chans)
            n += 1
            time.sleep(0.005)  # bounded load: two cores are shared

    def acked_after(self, moment: float) -> int:
        return sum(1 for sent_at, status, _, _ in self.answers
                   if sent_at > moment and status == 201)


def test_a_node_killed_under_load_loses_no_acknowledged_message_and_no_answer_is_html(
        fresh_cluster):
    c = fresh_cluster(3, haproxy=True)
    channels = [uniq("fo") for _ in range(4)]
    pollers = [Poller(f"poll{k}", [c.front_url], channels[k % 4: k % 4 + 2], timeout=2)
               for k in range(4)]
    publisher = FrontPublisher(c.front_url, channels)
    for t in (*pollers, publisher):
        t.start()
    try:
        wait_until(lambda: len(publisher.acked) >= 50, 30, 0.05, "50 publishes through the front")
        c.kill(1)  # SIGKILL, and reaped: its port is closed from here on
        dead_at = time.monotonic()
        wait_until(lambda: publisher.acked_after(dead_at) >= 100, 60, 0.05,
                   "100 publishes after the kill")
    finally:
        publisher.stop_event.set()
        publisher.join(30)
    assert wait_clients_have(pollers, publisher.acked, 30)
    for p in pollers:
        p.finish()
    check_exactly_once(pollers, publisher.acked, allow_extra=lambda _: True)
    # Not one answer from HAProxy's HTML pages, nor a connection error.
    assert all(kind.startswith(JSON) for _, _, kind, _ in publisher.answers), [
        a for a in publisher.answers if not a[2].startswith(JSON)][:5]
    assert not [f for p in pollers for f in p.failures if "_raw" in f or "Error(" in f]
    # Every publish sent once the node was dead met a closed port at most, was
    # never sent there, and went to a live node.
    after = [(status, body) for sent_at, status, _, body in publisher.answers
             if sent_at > dead_at]
    assert all(status == 201 for status, _ in after), [a for a in after if a[0] != 201][:5]
