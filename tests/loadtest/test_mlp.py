"""The MLP baseline (loadtest/paper/mlp.py) over real HTTP on a real loopback port."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from loadtest.paper.mlp import make_server


@pytest.fixture
def base() -> Iterator[str]:
    server = make_server("127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def call(url: str, body: Any = None, timeout: float = 10) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def sub(base: str, channels: str, since: str = "0", timeout: float = 0) -> dict[str, Any]:
    status, body = call(f"{base}/subscribe?channels={quote(channels)}&since={quote(since)}"
                        f"&timeout={timeout:g}", timeout=timeout + 10)
    assert status == 200, body
    return body


def waiting(base: str) -> int:
    status, body = call(f"{base}/stats")
    assert status == 200, body
    return int(body["waiting"])


def wait_waiting(base: str, n: int, timeout: float = 10) -> None:
    """Poll /stats until `waiting` is `n`; fail loudly at the deadline."""
    deadline = time.monotonic() + timeout
    while (last := waiting(base)) != n:
        assert time.monotonic() < deadline, f"/stats waiting never reached {n} (last {last})"
        time.sleep(0.01)


def test_publish_then_subscribe(base: str) -> None:
    status, receipt = call(f"{base}/publish", {"channels": ["a", "b"], "data": {"n": 1}})
    assert status == 201
    assert receipt["channels"] == ["a", "b"] and receipt["id"] and receipt["timestamp"] > 0
    body = sub(base, "b")
    assert [m["data"] for m in body["messages"]] == [{"n": 1}]
    assert body["messages"][0]["id"] == receipt["id"]
    assert body["messages"][0]["channels"] == ["b"]
    assert body["cursor"].startswith("c1.") and body["closed"] == []


def test_batch_publish(base: str) -> None:
    status, out = call(f"{base}/publish", {"messages": [{"channels": ["a"], "data": 1},
                                                        {"channels": ["a"], "data": 2}]})
    assert status == 201 and len(out["messages"]) == 2
    assert [m["data"] for m in sub(base, "a")["messages"]] == [1, 2]


def test_held_poll_is_answered_by_a_publish(base: str) -> None:
    cursor = sub(base, "held")["cursor"]
    got: dict[str, Any] = {}

    def poll() -> None:
        try:
            got["body"] = sub(base, "held", cursor, timeout=60)
        except BaseException as e:  # reported below
            got["error"] = e

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    wait_waiting(base, 1)  # the poll is held
    assert "body" not in got and "error" not in got, got
    status, _ = call(f"{base}/publish", {"channels": ["held"], "data": "hello"})
    assert status == 201
    t.join(30)
    assert not t.is_alive(), "hang guard: the held poll (timeout 60 s) was not answered " \
                             "within 30 s of the publish"
    assert "error" not in got, got
    assert [m["data"] for m in got["body"]["messages"]] == ["hello"]
    assert waiting(base) == 0


def test_held_poll_times_out_with_a_working_cursor(base: str) -> None:
    got: dict[str, Any] = {}

    def poll() -> None:
        try:
            started = time.monotonic()
            got["body"] = sub(base, "quiet", timeout=1)
            got["held"] = time.monotonic() - started
        except BaseException as e:  # reported below
            got["error"] = e

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "hang guard: a poll with timeout=1 not answered within 30 s"
    assert "error" not in got, got
    body = got["body"]
    # Held for its whole timeout: a lower bound only (the server waits on a monotonic
    # deadline), which a busy machine can only make longer, never break.
    assert got["held"] >= 1, got
    # A timeout answer: nothing, no gap, a cursor that works.
    assert body["messages"] == [] and not body.get("gap", False) and body["closed"] == []
    call(f"{base}/publish", {"channels": ["quiet"], "data": 7})
    assert [m["data"] for m in sub(base, "quiet", body["cursor"])["messages"]] == [7]


def test_cursor_gives_every_message_exactly_once(base: str) -> None:
    """A poller passing its cursor back sees each message once while others publish."""
    seen: list[int] = []
    stop = threading.Event()

    def poller() -> None:
        cursor = "0"
        while not stop.is_set() or len(seen) < 60:
            body = sub(base, "x,y", cursor, timeout=1)
            seen.extend(m["data"] for m in body["messages"])
            cursor = body["cursor"]
            if stop.is_set() and not body["messages"]:
                break

    t = threading.Thread(target=poller)
    t.start()
    for i in range(30):  # 60 messages, some on both channels (delivered once)
        call(f"{base}/publish", {"messages": [{"channels": ["x", "y"], "data": 2 * i},
                                              {"channels": ["y"], "data": 2 * i + 1}]})
        if i % 7 == 0:
            time.sleep(0.05)
    stop.set()
    t.join(30)
    assert seen == list(range(60))


def test_errors_are_json(base: str) -> None:
    status, body = call(f"{base}/subscribe?channels=a&since=nonsense")
    assert status == 400 and body["error"]["code"] == "bad_parameter"
    status, body = call(f"{base}/subscribe?since=0")
    assert status == 400
    status, body = call(f"{base}/publish", {"channels": [], "data": 1})
    assert status == 400
    status, body = call(f"{base}/nowhere")
    assert status == 404 and body["error"]["code"] == "not_found"
