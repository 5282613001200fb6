"""A tiny SSE reader over a raw socket, for the e2e tests, and the parsing the
in-memory tests share: chunked framing undone, events read line by line as the
SSE spec reads them (comment lines ignored, a blank line dispatches)."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
from collections.abc import Callable


class SSE:
    def __init__(self, host: str, port: int, channels: list[str], last_event_id: str = "",
                 **params: str) -> None:
        query = urllib.parse.urlencode({"channels": ",".join(channels), **params})
        head = (f"GET /subscribe?{query} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n"
                + (f"Last-Event-ID: {last_event_id}\r\n" if last_event_id else "") + "\r\n")
        self.sock = socket.create_connection((host, port), timeout=15)
        self.sock.sendall(head.encode())
        self.buf = b""
        self.head = b""

    def events(self, n: int, guard: float = 15.0) -> list[dict[str, str]]:
        """Read until ``n`` message or gap events have come (hang guard ``guard`` s)."""
        return self._read_until(n, guard, lambda e: e.get("event", "message") in ("message", "gap"))

    def all_events(self, n: int, guard: float = 15.0) -> list[dict[str, str]]:
        """Read until ``n`` events of any kind have come (hang guard ``guard`` s)."""
        return self._read_until(n, guard, lambda e: True)

    def _read_until(self, n: int, guard: float,
                    counted: Callable[[dict[str, str]], bool]) -> list[dict[str, str]]:
        """The events ``counted`` once ``n`` of them have come, or the stream ended."""
        deadline = time.monotonic() + guard
        while True:
            got = [e for e in self._parse() if counted(e)]
            if len(got) >= n:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"hang guard: {len(got)} of {n} events in {guard} s")
            chunk = self.sock.recv(65536)
            if not chunk:
                return got
            self.buf += chunk

    def _parse(self) -> list[dict[str, str]]:
        if not self.head:
            if b"\r\n\r\n" not in self.buf:
                return []
            self.head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        body = self.buf
        if b"transfer-encoding: chunked" in self.head.lower():
            body, _ = dechunk(body)
        return parse_events(body)

    def close(self) -> None:
        self.sock.close()


def dechunk(raw: bytes) -> tuple[bytes, int | None]:
    """The data of the complete chunks in ``raw``, and where the chunked body
    ends in ``raw`` (None until the last chunk has come)."""
    out = []
    at = 0
    while True:
        end = raw.find(b"\r\n", at)
        if end < 0:
            return b"".join(out), None
        size = int(raw[at:end], 16)
        start = end + 2
        if len(raw) < start + size + 2:
            return b"".join(out), None
        assert raw[start + size:start + size + 2] == b"\r\n", raw[at:at + 200]
        at = start + size + 2
        if size == 0:
            return b"".join(out), at
        out.append(raw[start:start + size])


def parse_events(raw: bytes) -> list[dict[str, str]]:
    """The events a complete stream body dispatches, as the SSE spec reads them:
    each a dict of its fields (``data`` lines joined); comments left out."""
    out = []
    event: dict[str, str] = {}
    for line in raw.decode().split("\n")[:-1]:  # the last piece is not a whole line
        if not line:
            if event:
                out.append(event)
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data" and "data" in event:
                value = event["data"] + "\n" + value
            event[name] = value
    return out


def data_of(events: list[dict[str, str]]) -> list[object]:
    """The data of the messages among ``events``."""
    return [json.loads(e["data"])["data"] for e in events
            if e.get("event", "message") == "message" and "data" in e]
