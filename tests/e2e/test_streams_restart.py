"""Durable Streams with --data-dir: what a node answered survives a SIGKILL and a
restart (data, offsets, closure, forks, producers' state)."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import tempfile

from tests.toolkit import ServedNode, clean_env, free_port

JSON = {"Content-Type": "application/json"}


def ask(port: int, method: str, path: str, body: bytes = b"",
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        answer = conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        conn.close()


def read(port: int, path: str) -> tuple[int, str | None, str | None, bytes]:
    status, headers, body = ask(port, "GET", path)
    return status, headers.get("stream-next-offset"), headers.get("stream-closed"), body


def test_answered_streams_survive_a_sigkill_and_a_restart():
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="pushup-streams-")
    flags = ("--host", "127.0.0.1", "--data-dir", data_dir)
    node = ServedNode(*flags, port=port)
    try:
        assert ask(port, "PUT", "/v1/stream/r", b'[{"a":1}]', JSON)[0] == 201
        assert ask(port, "POST", "/v1/stream/r", b'[{"b":2},{"c":3}]', JSON)[0] == 204
        assert ask(port, "PUT", "/v1/stream/f", b"",
                   {"Stream-Forked-From": "/v1/stream/r"})[0] == 201
        producer = {**JSON, "Producer-Id": "q", "Producer-Epoch": "0", "Producer-Seq": "0"}
        assert ask(port, "POST", "/v1/stream/f", b'{"d":4}', producer)[0] == 200
        assert ask(port, "POST", "/v1/stream/r", b"", {"Stream-Closed": "true"})[0] == 204
        before = [read(port, "/v1/stream/r"), read(port, "/v1/stream/f")]
    finally:
        node.kill()  # SIGKILL: nothing is written at exit
    node = ServedNode(*flags, port=port)
    try:
        assert [read(port, "/v1/stream/r"), read(port, "/v1/stream/f")] == before
        assert before[0][2] == "true" and before[1][3] == b'[{"a":1},{"b":2},{"c":3},{"d":4}]'
        assert ask(port, "POST", "/v1/stream/f", b'{"d":4}', producer)[0] == 204  # a repeat
        assert ask(port, "POST", "/v1/stream/f", b'{"e":5}',
                   {**producer, "Producer-Seq": "1"})[0] == 200
        assert ask(port, "DELETE", "/v1/stream/f")[0] == 204
    finally:
        assert node.stop() == 0


def test_a_damaged_streams_file_is_refused_in_one_line():
    data_dir = tempfile.mkdtemp(prefix="pushup-streams-")
    with open(os.path.join(data_dir, "streams.sqlite3"), "wb") as damaged:
        damaged.write(b"not a database" * 500)
    done = subprocess.run([sys.executable, "-m", "pushup", "serve", "--host", "127.0.0.1",
                           "--port", "0", "--data-dir", data_dir],
                          capture_output=True, text=True, timeout=60, env=clean_env(None))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"pushup: error: --data-dir {data_dir}: streams.sqlite3 is damaged or unwritable "
        "(file is not a database); move it (and its -wal and -shm files) away to start "
        "without streams"]
