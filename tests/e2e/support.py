"""The end-to-end tests' helpers: real `pushup serve` processes on 127.0.0.1, driven
with the standard library's HTTP client and raw sockets; the fixtures are conftest's.

`spawn(*flags, env=None)` starts a node with `--port 0` through the one toolkit
(tests/toolkit.py's `ServedNode`: the port read from the first stdout line,
`listening on http://HOST:PORT`, then /health waited for, stderr in a log file);
`Nodes` stops the nodes it started with SIGTERM (a node that does not exit 0
within 15 s is killed and the test fails); `serving(*flags)` is one such node for
a module-scoped fixture.
"""
from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.contract import JSON_CT, assert_error
from tests.toolkit import LISTENING, ServedNode, clean_env, free_port, wait_until

__all__ = ["JSON_CT", "LISTEN_RE", "PUSHUP", "ROOT", "Node", "Nodes", "Pending", "Response",
           "assert_error", "assert_json_ok", "clean_env", "free_port", "parse_raw_response",
           "q", "read_many", "response_complete", "run_cli", "serving", "spawn", "stop",
           "uniq", "wait_until"]

ROOT = Path(__file__).resolve().parents[2]
PUSHUP = str(ROOT / ".venv" / "bin" / "pushup")
LISTEN_RE = LISTENING
START_TIMEOUT = 20.0
STOP_TIMEOUT = 15.0


def uniq(prefix: str = "c") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class Response:
    def __init__(self, status: int, reason: str, headers: http.client.HTTPMessage, body: bytes):
        self.status = status
        self.reason = reason
        self.headers = headers
        self.body = body

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    @property
    def json(self):
        return json.loads(self.body.decode("utf-8"))

    def __repr__(self) -> str:
        return f"<Response {self.status} {self.body[:300]!r}>"


def assert_json_ok(resp: Response, status: int = 200) -> dict:
    assert resp.status == status, resp
    ct = (resp.header("Content-Type") or "").lower().replace(" ", "")
    assert ct == JSON_CT.replace(" ", ""), (ct, resp)
    return resp.json


class Node:
    """A running `pushup serve` driven over HTTP: ``served`` the toolkit's
    ``ServedNode`` that started it (None: started by the test itself, ``proc``)."""

    def __init__(self, proc: subprocess.Popen, host: str, port: int, flags: tuple,
                 served: ServedNode | None = None):
        self.proc = proc
        self.host = "127.0.0.1"
        self.listen_host = host
        self.port = port
        self.flags = flags
        self.served = served
        self.token: str | None = None
        self._stdout_rest: list[str] | None = None

    @property
    def stderr_lines(self) -> list[str]:
        """What the node logged so far, line by line."""
        return self.served.lines() if self.served is not None else []

    @property
    def stdout_lines(self) -> list[str]:
        """Its listening line, then (once it exited) whatever else it printed."""
        if self.served is None:
            return []
        if self._stdout_rest is None and self.proc.poll() is not None and self.proc.stdout:
            self._stdout_rest = self.proc.stdout.read().decode(errors="replace").splitlines()
        return [self.served.listening, *(self._stdout_rest or [])]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---- HTTP -------------------------------------------------------------------------
    def conn(self, timeout: float = 15.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method: str, path: str, body=None, headers: dict | None = None,
                timeout: float = 15.0, token: str | None = None, raw_body: bytes | None = None,
                conn: http.client.HTTPConnection | None = None) -> Response:
        hdrs = dict(headers or {})
        tok = token if token is not None else self.token
        if tok and "Authorization" not in hdrs:
            hdrs["Authorization"] = f"Bearer {tok}"
        data = raw_body
        if body is not None:
            data = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        own = conn is None
        c = conn or self.conn(timeout)
        try:
            c.request(method, path, body=data, headers=hdrs)
            r = c.getresponse()
            payload = r.read()
            return Response(r.status, r.reason, r.headers, payload)
        finally:
            if own:
                c.close()

    def get(self, path: str, **kw) -> Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, body=None, **kw) -> Response:
        return self.request("POST", path, body=body, **kw)

    def publish_raw(self, channels, data, **kw) -> Response:
        return self.post("/publish", {"channels": list(channels), "data": data}, **kw)

    def publish(self, channels, data, **kw) -> dict:
        if isinstance(channels, str):
            channels = [channels]
        return assert_json_ok(self.publish_raw(channels, data, **kw), 201)

    def publish_batch(self, messages, **kw) -> Response:
        return self.post("/publish", {"messages": messages}, **kw)

    @staticmethod
    def sub_path(channels, since=None, until=None, timeout=None, limit=None,
                 extra: str = "") -> str:
        if not isinstance(channels, str):
            channels = ",".join(channels)
        q = [("channels", channels)]
        for k, v in (("since", since), ("until", until), ("timeout", timeout), ("limit", limit)):
            if v is not None:
                text = v if isinstance(v, str) else repr(v) if isinstance(v, float) else str(v)
                q.append((k, text))
        path = "/subscribe?" + urllib.parse.urlencode(q, quote_via=urllib.parse.quote, safe="")
        return path + extra

    def subscribe_raw(self, channels, since=None, until=None, timeout=0, limit=None,
                      http_timeout: float | None = None, **kw) -> Response:
        if http_timeout is None:
            http_timeout = (float(timeout) if timeout not in (None, "") else 0) + 15.0
        return self.get(self.sub_path(channels, since, until, timeout, limit),
                        timeout=http_timeout, **kw)

    def subscribe(self, channels, since=None, until=None, timeout=0, limit=None, **kw) -> dict:
        body = assert_json_ok(self.subscribe_raw(channels, since, until, timeout, limit, **kw))
        assert isinstance(body.get("messages"), list), body
        assert isinstance(body.get("cursor"), str) and body["cursor"], body
        assert isinstance(body.get("closed"), list), body
        return body

    def subscribe_guarded(self, channels, expect: str, timeout=60, guard: float = 30.0,
                          **kw) -> dict:
        """A subscribe that must be answered long before its `timeout` (cached messages, a
        gap, a capped timeout). `guard` is only a hang guard, not a timing assertion: it
        is far below `timeout`, so any answer at all shows the poll was not held to its
        timeout; no answer fails with `expect` (what the node should have done)."""
        held = 50.0 if timeout is None else float(timeout)  # None: the default timeout, 50 s
        assert guard * 2 <= held, "the guard must be well below the poll's timeout"
        try:
            return self.subscribe(channels, timeout=timeout, http_timeout=guard, **kw)
        except TimeoutError:
            raise AssertionError(f"hang guard: no answer within {guard:g} s to a poll with "
                                 f"timeout={timeout}; expected: {expect}") from None

    def subscribe_async(self, channels, **kw) -> Pending:
        return Pending(lambda: self.subscribe_raw(channels, **kw))

    def stats(self) -> dict:
        return assert_json_ok(self.get("/stats"))

    def channel_info(self, name: str) -> Response:
        return self.get("/channels/" + q(name))

    def wait_subscribers(self, channel: str, n: int, timeout: float = 10.0) -> None:
        """Wait until `n` subscriptions are held on `channel` (GET /channels/{name})."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            r = self.channel_info(channel)
            if r.status == 200:
                last = r.json
                if last.get("subscribers") == n:
                    return
            time.sleep(0.02)
        raise AssertionError(f"channel {channel!r} never had {n} subscribers; last={last}")

    def wait_stat(self, key: str, pred, timeout: float = 10.0) -> dict:
        deadline = time.monotonic() + timeout
        st = None
        while time.monotonic() < deadline:
            st = self.stats()
            if pred(st[key]):
                return st
            time.sleep(0.02)
        raise AssertionError(f"/stats {key} never satisfied the condition; last={st}")

    def alive_check(self) -> None:
        """The node still serves a normal publish and subscribe."""
        ch = uniq("alive")
        pub = self.publish([ch], {"ok": True})
        body = self.subscribe([ch], since="0", timeout=0)
        assert [m["id"] for m in body["messages"]] == [pub["id"]], body
        assert body["messages"][0]["data"] == {"ok": True}

    # ---- raw sockets ------------------------------------------------------------------
    def raw_socket(self, timeout: float = 10.0) -> socket.socket:
        s = socket.create_connection((self.host, self.port), timeout=timeout)
        return s

    def raw_exchange(self, data: bytes, timeout: float = 10.0, shut_wr: bool = False) -> bytes:
        """Send bytes, read until the server closes (or `timeout`). Resets count as close."""
        s = self.raw_socket(timeout)
        out = b""
        try:
            try:
                s.sendall(data)
                if shut_wr:
                    s.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError):
                pass
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    chunk = s.recv(65536)
                except ConnectionResetError:
                    break
                except TimeoutError:
                    break
                if not chunk:
                    break
                out += chunk
                if response_complete(out):
                    break
        finally:
            s.close()
        return out


def read_many(socks: list[socket.socket], timeout: float = 60.0,
              done: Callable[[bytes], bool] | None = None) -> list[bytes]:
    """Read every socket until ``done(bytes so far)`` or the server closes it; fail
    (a hang guard) if any is still open after ``timeout`` s. Resets count as close."""
    import selectors

    sel = selectors.DefaultSelector()
    bufs = {s: b"" for s in socks}
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    pending = set(socks)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.5):
            s = key.fileobj
            try:
                chunk = s.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except ConnectionResetError:
                chunk = b""
            bufs[s] += chunk
            if not chunk or (done is not None and done(bufs[s])):
                sel.unregister(s)
                pending.discard(s)
    sel.close()
    assert not pending, f"hang guard: {len(pending)} of {len(socks)} open after {timeout} s"
    return [bufs[s] for s in socks]


def response_complete(buf: bytes) -> bool:
    head, sep, rest = buf.partition(b"\r\n\r\n")
    if not sep:
        return False
    m = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", head)
    if m:
        return len(rest) >= int(m.group(1))
    if re.search(rb"(?im)^transfer-encoding:\s*chunked", head):
        return rest.endswith(b"0\r\n\r\n")
    return False


def parse_raw_response(buf: bytes) -> Response | None:
    """Parse one HTTP response from raw bytes (None if there is no status line)."""
    if not buf.startswith(b"HTTP/"):
        return None
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1])
    msg = http.client.HTTPMessage()
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            msg[k.strip()] = v.strip()
    m = msg.get("Content-Length")
    body = rest[: int(m)] if m is not None else rest
    return Response(status, parts[2] if len(parts) > 2 else "", msg, body)


def q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


class Pending:
    """A request running in a thread; `.result(timeout)` returns its Response."""

    def __init__(self, fn):
        self._res = None
        self._exc = None
        self._done = threading.Event()

        def run():
            try:
                self._res = fn()
            except BaseException as e:
                self._exc = e
            finally:
                self._done.set()

        self._t = threading.Thread(target=run, daemon=True)
        self._t.start()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float = 15.0) -> Response:
        assert self._done.wait(timeout), "request not answered in time"
        if self._exc:
            raise self._exc
        return self._res


def spawn(*flags, env: dict | None = None, port: str = "0") -> Node:
    """Start `pushup serve --port PORT *flags` (0: any); return once it prints its
    listening line and /health answers 200 (a node with peers may catch up first)."""
    served = ServedNode(*flags, port=int(port), env=env, program=[PUSHUP], healthy=True,
                        start_timeout=START_TIMEOUT)
    return Node(served.proc, served.host, served.port, flags, served)


def stop(node: Node, sig=signal.SIGTERM) -> int:
    """SIGTERM, wait; kill and fail if it hangs. Returns the exit code."""
    if node.served is not None:
        return node.served.stop(sig, STOP_TIMEOUT)
    if node.proc.poll() is not None:
        return node.proc.returncode
    node.proc.send_signal(sig)
    try:
        return node.proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        node.proc.kill()
        node.proc.wait(5)
        raise AssertionError(f"node did not exit within {STOP_TIMEOUT}s of {sig!r}") from None


class Nodes:
    """The nodes one fixture starts (`nodes(*flags)`), stopped together by `close()`."""

    def __init__(self):
        self.nodes: list[Node] = []

    def __call__(self, *flags, env: dict | None = None, token: str | None = None) -> Node:
        n = spawn(*flags, env=env)
        n.token = token
        self.nodes.append(n)
        return n

    def close(self) -> None:
        errors = []
        for n in self.nodes:
            try:
                rc = stop(n)
                if rc != 0:
                    errors.append(f"node {n.flags} exited {rc}; stderr tail={n.stderr_lines[-10:]}")
            except AssertionError as e:
                errors.append(str(e))
            if n.served is not None:
                n.served.log.unlink(missing_ok=True)
        if errors:
            pytest.fail("; ".join(errors))


def run_cli(*args, env: dict | None = None, timeout: float = 20.0) -> subprocess.CompletedProcess:
    """Run `pushup *args` expecting it to exit by itself (kill + fail if it starts serving)."""
    proc = subprocess.Popen([PUSHUP, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=clean_env(env), cwd=str(ROOT))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=5)
        raise AssertionError(f"`pushup {' '.join(args)}` did not exit (it should refuse to "
                             f"start); stdout={out[:300]!r} stderr={err[-500:]!r}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def serving(*flags, env: dict | None = None, token: str | None = None) -> Iterator[Node]:
    """One node for a fixture to `yield from`: started with `flags`, stopped after."""
    nodes = Nodes()
    try:
        yield nodes(*flags, env=env, token=token)
    finally:
        nodes.close()
