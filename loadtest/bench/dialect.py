"""How the load client speaks to each server: request bytes in, positions and data out.

Rule: a dialect is the only place that knows a server's URLs, headers and body
shapes. The load client (`client.Worker`) keeps everything else — connections,
timing, round counting, duplicate detection — identical for every server, so a
figure differs between servers only by what the server does.

* `pushup`: `GET /subscribe?channels=C&timeout=T[&since=CURSOR]`, answered with
  `{"messages": [{"data": ...}, ...], "cursor": ...}`; `POST /publish` with
  `{"channels": [C], "data": D}`, answered `201` (see docs/api.md).
* `stream`: the channel is a Durable Stream at `/v1/stream/C` (created by the
  scenario first, `application/json`): a long poll is
  `GET /v1/stream/C?live=long-poll&timeout=T&offset=O[&cursor=K]`, first from
  `offset=now`, then from the answer's `Stream-Next-Offset`, sending back its
  `Stream-Cursor` as the protocol's clients do; the body is a JSON array of the
  values appended. `POST /v1/stream/C` appends a value, answered `204`.
* `nchan`: `GET /sub?channel=C`, answered with one message's body; the place in
  the channel's queue is the response's `Last-Modified` and `Etag`, sent back as
  `If-Modified-Since` and `If-None-Match` on the next poll (nchan's documented
  long-poll protocol). `POST /pub?channel=C` with the message as the body,
  answered `201` (subscribers present) or `202` (none).

A position is the bytes a dialect adds to the next poll (`b""` for the first).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar
from urllib.parse import quote


class Dialect:
    """One server's long-poll protocol, for one channel and one server port."""

    name: ClassVar[str]
    publish_ok: ClassVar[frozenset[int]]

    def __init__(self, port: int, channel: str, timeout: int) -> None:
        self.host = f"127.0.0.1:{port}"
        self.channel = channel
        self.timeout = timeout

    def poll_request(self, position: bytes) -> bytes:
        raise NotImplementedError

    def read_poll(self, head: bytes, body: bytes) -> tuple[bytes, list[Any], bool]:
        """A 200 poll answer -> (next position, message data values, gap reported).

        Raises ValueError, KeyError or TypeError on a body it cannot read."""
        raise NotImplementedError

    def publish_request(self, data: Any) -> bytes:
        raise NotImplementedError

    def catch_up_request(self, count: int) -> bytes:
        """A read of the first ``count`` messages the channel holds, answered at once."""
        raise NotImplementedError

    def _post(self, target: str, body: bytes) -> bytes:
        return (f"POST {target} HTTP/1.1\r\nHost: {self.host}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                ).encode() + body


class PushUp(Dialect):
    name = "pushup"
    publish_ok = frozenset({201})

    def __init__(self, port: int, channel: str, timeout: int) -> None:
        super().__init__(port, channel, timeout)
        self._prefix = (
            f"GET /subscribe?channels={quote(channel, safe='')}&timeout={timeout}".encode())
        self._suffix = f" HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode()

    def poll_request(self, position: bytes) -> bytes:
        return self._prefix + position + self._suffix

    def read_poll(self, head: bytes, body: bytes) -> tuple[bytes, list[Any], bool]:
        doc = json.loads(body)
        position = b"&since=" + quote(doc["cursor"], safe="").encode()
        datas = [m.get("data") if isinstance(m, dict) else None for m in doc["messages"]]
        return position, datas, bool(doc.get("gap"))

    def publish_request(self, data: Any) -> bytes:
        body = json.dumps({"channels": [self.channel], "data": data}).encode()
        return self._post("/publish", body)

    def catch_up_request(self, count: int) -> bytes:
        # since=0: from the oldest message held (a time before any), not held (timeout=0)
        return (f"GET /subscribe?channels={quote(self.channel, safe='')}&since=0&timeout=0"
                f"&limit={count} HTTP/1.1\r\nHost: {self.host}\r\n\r\n").encode()


class Stream(Dialect):
    name = "stream"
    publish_ok = frozenset({204})

    def __init__(self, port: int, channel: str, timeout: int) -> None:
        super().__init__(port, channel, timeout)
        self.path = "/v1/stream/" + quote(channel, safe="")
        self._prefix = f"GET {self.path}?live=long-poll&timeout={timeout}&offset=".encode()
        self._suffix = f" HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode()

    def poll_request(self, position: bytes) -> bytes:
        return self._prefix + (position or b"now") + self._suffix

    def read_poll(self, head: bytes, body: bytes) -> tuple[bytes, list[Any], bool]:
        lower = head.lower()
        position = (_header(head, lower, b"stream-next-offset") + b"&cursor="
                    + _header(head, lower, b"stream-cursor"))
        datas = json.loads(body)
        if not isinstance(datas, list):
            raise TypeError("a JSON stream's read is an array")
        return position, datas, False

    def publish_request(self, data: Any) -> bytes:
        return self._post(self.path, json.dumps(data).encode())

    def catch_up_request(self, count: int) -> bytes:
        # offset=-1: from the stream's start; the scenario stores exactly ``count``
        return f"GET {self.path}?offset=-1 HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode()


class Nchan(Dialect):
    name = "nchan"
    publish_ok = frozenset({201, 202})

    def __init__(self, port: int, channel: str, timeout: int) -> None:
        # The hold time is the server's (nchan_subscriber_timeout), not the client's.
        super().__init__(port, channel, timeout)
        self._prefix = (f"GET /sub?channel={quote(channel, safe='')} HTTP/1.1\r\n"
                        f"Host: {self.host}\r\n").encode()

    def poll_request(self, position: bytes) -> bytes:
        return self._prefix + position + b"\r\n"

    def read_poll(self, head: bytes, body: bytes) -> tuple[bytes, list[Any], bool]:
        lower = head.lower()
        position = (b"If-Modified-Since: " + _header(head, lower, b"last-modified")
                    + b"\r\nIf-None-Match: " + _header(head, lower, b"etag") + b"\r\n")
        # nchan logs, but does not tell the client, when a message was missed; the
        # client's duplicate and round counters are what catch it.
        return position, [json.loads(body)], False

    def publish_request(self, data: Any) -> bytes:
        return self._post(f"/pub?channel={quote(self.channel, safe='')}",
                          json.dumps(data).encode())


def _header(head: bytes, lower: bytes, name: bytes) -> bytes:
    """The value of header `name` (lower case) in a response head; KeyError if absent."""
    i = lower.find(b"\r\n" + name + b":")
    if i < 0:
        raise KeyError(name.decode())
    start = i + len(name) + 3
    end = head.find(b"\r\n", start)
    return head[start : end if end >= 0 else len(head)].strip()


DIALECTS: dict[str, type[Dialect]] = {d.name: d for d in (PushUp, Stream, Nchan)}


def dialect(name: str, port: int, channel: str, timeout: int) -> Dialect:
    return DIALECTS[name](port, channel, timeout)
