"""The HTTP clients the cluster tests drive real nodes with: one request per fresh
connection (through HAProxy or a SO_REUSEPORT port each may land on another node or
worker), long-polling ``Poller`` threads that always pass back their cursor,
``Publisher`` threads, and the exactly-once check over what they saw.

Standard library only; process helpers (ports, waits) are ``tests/toolkit.py``'s.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import random
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from tests.toolkit import NETWORK_ERRORS, wait_until

__all__ = ["NETWORK_ERRORS", "Poller", "Publisher", "answered", "check_exactly_once",
           "comes_within", "expected_for", "jrequest", "merge_published", "open_held_poll",
           "peers_idle", "polling", "publish", "publish_batch", "published_by", "request",
           "retained", "stats", "subscribe", "uniq", "wait_clients_have", "wait_until",
           "wait_waiting"]


# -- plain HTTP --------------------------------------------------------------

def request(method: str, url: str, body: bytes | None = None,
            headers: dict[str, str] | None = None,
            timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection: (status, headers, body)."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        path = u.path or "/"
        if u.query:
            path += "?" + u.query
        hdrs = {"Connection": "close", **(headers or {})}
        if body is not None:
            hdrs.setdefault("Content-Type", "application/json")
        conn.request(method, path, body=body, headers=hdrs)
        r = conn.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        conn.close()


def jrequest(method: str, url: str, payload=None, headers=None,
             timeout: float = 10.0, raw: bytes | None = None) -> tuple[int, dict]:
    body = raw if raw is not None else (
        None if payload is None else json.dumps(payload).encode())
    status, _, data = request(method, url, body, headers, timeout)
    try:
        return status, json.loads(data) if data else {}
    except ValueError:
        return status, {"_raw": data[:300].decode("latin-1")}


def stats(base: str) -> dict:
    status, body = jrequest("GET", base + "/stats", timeout=5)
    assert status == 200, (base, status, body)
    return body


def publish(base: str, channels: Sequence[str], data) -> dict:
    status, body = jrequest("POST", base + "/publish", {"channels": list(channels), "data": data})
    assert status == 201, (base, status, body)
    return body


def publish_batch(base: str, messages: Sequence[tuple[Sequence[str], object]]) -> list[dict]:
    payload = {"messages": [{"channels": list(c), "data": d} for c, d in messages]}
    status, body = jrequest("POST", base + "/publish", payload)
    assert status == 201, (base, status, body)
    return body["messages"]


def answered(failures: list[str], url: str,
             call: Callable[[], tuple[int, dict[str, Any]]]) -> dict[str, Any] | None:
    """The body of the 200 that ``call()`` (a request to ``url``) got; None, with the
    failure noted in ``failures``, when it got no answer or another status."""
    try:
        status, body = call()
    except NETWORK_ERRORS as e:
        failures.append(f"{url}: {e!r}")
        return None
    if status != 200:
        failures.append(f"{url}: {status} {body}")
        return None
    return body


def subscribe(base: str, channels: Iterable[str], since: str | None = None,
              timeout: float = 0, limit: int | None = None) -> tuple[int, dict]:
    q = {"channels": ",".join(channels), "timeout": str(timeout)}
    if since is not None:
        q["since"] = since
    if limit is not None:
        q["limit"] = str(limit)
    return jrequest("GET", f"{base}/subscribe?{urllib.parse.urlencode(q)}",
                    timeout=timeout + 10)


def retained(base: str, channels: Sequence[str]) -> dict[str, set[str]]:
    """Every message the node holds on these channels, id -> its channels
    (since=0, paged, timeout 0)."""
    out: dict[str, set[str]] = {}
    since = None
    for _ in range(10_000):
        status, body = subscribe(base, channels, since=since, timeout=0, limit=100)
        assert status == 200, (base, status, body)
        if not body["messages"]:
            return out
        for m in body["messages"]:
            assert m["id"] not in out, f"{base} served {m['id']} twice while paging"
            out[m["id"]] = set(m["channels"])
        since = body["cursor"]
    raise AssertionError("paging never ended")


def uniq(prefix: str = "ch") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# -- clients -----------------------------------------------------------------

class Poller(threading.Thread):
    """A long-polling client that always passes back its cursor.

    Each poll goes to the next URL of `urls` (round-robin). A poll that fails
    (connection error or non-200) is retried with the same cursor on the next
    URL, and counted in `failures`; tests decide whether failures are allowed.
    Anything that breaks the contract inside one response (order, channels,
    duplicates within the response) goes to `violations`.
    """

    def __init__(self, name: str, urls: Sequence[str], channels: Sequence[str],
                 timeout: float = 2.0, limit: int = 5) -> None:
        super().__init__(name=name, daemon=True)
        self.urls = list(urls)
        self.channels = list(channels)
        self.poll_timeout = timeout
        self.limit = limit
        self.cursor: str | None = None
        self.received: list[str] = []
        self._ids: set[str] = set()
        self.failures: list[str] = []
        self.violations: list[str] = []
        self.polls = 0
        self.stop_event = threading.Event()
        self.pause_event = threading.Event()  # set: wait before each poll
        self.idle = threading.Event()  # set while paused
        self._next = random.randrange(len(self.urls))
        self.lock = threading.Lock()

    def has(self, ids: set[str]) -> bool:
        with self.lock:
            return ids <= self._ids

    def poll_once(self, url: str, timeout: float) -> int | None:
        """One poll; returns the number of messages, or None on failure."""
        body = answered(self.failures, url, lambda: subscribe(
            url, self.channels, self.cursor, timeout, self.limit))
        if body is None:
            return None
        msgs = body.get("messages", [])
        ids = [m["id"] for m in msgs]
        if len(msgs) > self.limit:
            self.violations.append(f"{url}: {len(msgs)} messages > limit {self.limit}")
        if len(set(ids)) != len(ids):
            self.violations.append(f"{url}: duplicate ids inside one response {ids}")
        stamps = [m["timestamp"] for m in msgs]
        if stamps != sorted(stamps):
            self.violations.append(
                f"{url}: timestamps out of order {list(zip(ids, stamps, strict=True))}")
        mine = set(self.channels)
        for m in msgs:
            if not m.get("channels") or not set(m["channels"]) <= mine:
                self.violations.append(f"{url}: {m['id']} lists channels {m.get('channels')}"
                                       f" not all subscribed ({self.channels})")
        if body.get("gap"):
            self.violations.append(f"{url}: unexpected gap in {body}")
        with self.lock:
            self.received += ids
            self._ids.update(ids)
        self.cursor = body["cursor"]
        self.polls += 1
        return len(msgs)

    def _next_url(self) -> str:
        url = self.urls[self._next % len(self.urls)]
        self._next += 1
        return url

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                if self.pause_event.is_set():
                    self.idle.set()
                    time.sleep(0.02)
                    continue
                self.idle.clear()
                if self.poll_once(self._next_url(), self.poll_timeout) is None:
                    time.sleep(0.05)
            self.drain()
        except BaseException as e:  # reported through violations
            self.violations.append(f"client thread crashed: {e!r}")

    def drain(self, rounds: int = 1) -> None:
        """Poll every URL with timeout 0 until it has nothing more (catches late dups)."""
        for _ in range(rounds):
            for url in self.urls:
                for _ in range(1000):
                    n = self.poll_once(url, 0)
                    if not n:
                        break

    def finish(self, join_timeout: float = 30.0) -> None:
        self.stop_event.set()
        self.join(join_timeout)
        assert not self.is_alive(), f"{self.name} did not stop"


def expected_for(published: dict[str, set[str]], channels: Iterable[str]) -> set[str]:
    """Ids of published messages (id -> its channels) that name any of these channels."""
    mine = set(channels)
    return {mid for mid, chans in published.items() if chans & mine}


class Publisher(threading.Thread):
    """Publishes `count` messages to random channel sets on random URLs,
    sometimes as batches; records id -> channels of every accepted message."""

    def __init__(self, name: str, urls: Sequence[str], channels: Sequence[str],
                 count: int, seed: int, pace: float = 0.0,
                 allow_failures: bool = False) -> None:
        super().__init__(name=name, daemon=True)
        self.urls = list(urls)
        self.channels = list(channels)
        self.count = count
        self.rng = random.Random(seed)
        self.pace = pace
        self.allow_failures = allow_failures
        self.published: dict[str, set[str]] = {}
        self.by_url: dict[str, set[str]] = {}
        self.errors: list[str] = []
        self.failures = 0
        self.failed_urls: list[str] = []
        self.stop_event = threading.Event()

    def _pick(self) -> list[str]:
        return self.rng.sample(self.channels, self.rng.randint(1, 3))

    def run(self) -> None:
        sent = 0
        try:
            while sent < self.count and not self.stop_event.is_set():
                url = self.rng.choice(self.urls)
                n = 1
                if self.rng.random() < 0.25:  # a batch publish
                    n = min(self.count - sent, self.rng.randint(2, 5))
                batch = [(self._pick(), {"by": self.name, "n": sent + k}) for k in range(n)]
                try:
                    if n == 1:
                        status, body = jrequest("POST", url + "/publish",
                                                {"channels": batch[0][0], "data": batch[0][1]})
                        results = [body] if status == 201 else None
                    else:
                        status, body = jrequest("POST", url + "/publish", {"messages": [
                            {"channels": c, "data": d} for c, d in batch]})
                        results = body.get("messages") if status == 201 else None
                except NETWORK_ERRORS as e:
                    status, results, body = None, None, repr(e)
                if results is None:
                    # Unknown outcome (e.g. the node died mid-request): not counted.
                    self.failures += 1
                    self.failed_urls.append(url)
                    if not self.allow_failures:
                        self.errors.append(f"{url}: {status} {body}")
                    time.sleep(0.05)
                    continue
                for r, (chans, _) in zip(results, batch, strict=True):
                    assert set(r["channels"]) == set(chans), (r, chans)
                    assert r["id"] not in self.published, f"id reused: {r['id']}"
                    self.published[r["id"]] = set(chans)
                    self.by_url.setdefault(url, set()).add(r["id"])
                sent += n
                if self.pace:
                    time.sleep(self.pace)
        except BaseException as e:
            self.errors.append(f"publisher crashed: {e!r}")


@contextlib.contextmanager
def polling(clients: Sequence[Poller], drain_rounds: int = 0,
            may_fail: bool = False) -> Iterator[Sequence[Poller]]:
    """The ``clients`` poll while the block runs; after it they are finished, even
    when it failed. When it did not: each polls ``drain_rounds`` more times with
    its final cursor, so that a late duplicate shows, and (unless ``may_fail``, a
    test where a node dies under them) none had a failed poll."""
    for c in clients:
        c.start()
    try:
        yield clients
    finally:
        for c in clients:
            c.finish()
    for c in clients:
        c.drain(rounds=drain_rounds)
    if not may_fail:
        for c in clients:
            assert not c.failures, (c.name, c.failures[:5])


def published_by(publishers: Sequence[Publisher], timeout: float = 60) -> dict[str, set[str]]:
    """Runs the ``publishers`` to their end (each within ``timeout`` s, without an
    error) and returns what they published: id -> its channels."""
    for p in publishers:
        p.start()
    for p in publishers:
        p.join(timeout)
        assert not p.is_alive() and not p.errors, (p.name, p.errors[:3])
    return merge_published(publishers)


def merge_published(publishers: Iterable[Publisher]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for p in publishers:
        for mid, chans in p.published.items():
            assert mid not in out, f"two publishes got the same id {mid}"
            out[mid] = chans
    return out


def check_exactly_once(clients: Sequence[Poller], published: dict[str, set[str]],
                       allow_extra: Callable[[str], bool] = lambda _: False) -> None:
    """Every client got each id of its channels once, and nothing else."""
    problems = []
    for c in clients:
        want = expected_for(published, c.channels)
        got = c.received
        dups = sorted({i for i in got if got.count(i) > 1})
        missing = sorted(want - set(got))
        extra = sorted(i for i in set(got) - want if not allow_extra(i))
        if dups or missing or extra or c.violations:
            problems.append(f"{c.name} channels={c.channels} want={len(want)} got={len(got)}"
                            f" dups={dups[:10]} missing={missing[:10]} ({len(missing)})"
                            f" extra={extra[:10]} violations={c.violations[:5]}")
    assert not problems, "\n".join(problems)


def wait_clients_have(clients: Sequence[Poller], published: dict[str, set[str]],
                      timeout: float) -> bool:
    """Bounded wait until every client holds every id it should (no assert)."""
    return comes_within(
        lambda: all(c.has(expected_for(published, c.channels)) for c in clients), timeout)


def comes_within(done: Callable[[], bool], timeout: float) -> bool:
    """Bounded wait for ``done()``; whether it came. No assert: the exact check that
    follows says what is missing (``wait_until`` is the wait that fails by itself)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.05)
    return False


def peers_idle(bases: Sequence[str]) -> bool:
    """Every link of every node is up with nothing queued."""
    for b in bases:
        for p in stats(b)["peers"]:
            if p["state"] != "up" or p["queued"] != 0:
                return False
    return True


def wait_waiting(bases: Sequence[str], want: int, timeout: float) -> float:
    """Wait until the nodes' `waiting` sum to `want`; returns the time it took."""
    t0 = time.monotonic()
    wait_until(lambda: sum(stats(b)["waiting"] for b in bases) == want, timeout,
               interval=0.02, msg=f"waiting == {want}")
    return time.monotonic() - t0


def open_held_poll(base: str, channels: Sequence[str], timeout: float = 60) -> socket.socket:
    """Send a raw long-poll GET and return the socket (response not read)."""
    u = urllib.parse.urlsplit(base)
    s = socket.create_connection((u.hostname, u.port), timeout=10)
    q = urllib.parse.urlencode({"channels": ",".join(channels), "timeout": str(timeout)})
    s.sendall(f"GET /subscribe?{q} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
              f"Connection: close\r\n\r\n".encode())
    return s
