"""A tiny SSE reader over a raw socket, for the e2e tests."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse


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
        deadline = time.monotonic() + guard
        while True:
            got = self._parse()
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
        return parse_events(self.buf)

    def close(self) -> None:
        self.sock.close()


def parse_events(raw: bytes) -> list[dict[str, str]]:
    """The complete events in a stream's body (heartbeat comments left out)."""
    out = []
    for block in raw.decode().split("\n\n")[:-1]:
        if block.startswith(":"):
            continue
        event: dict[str, str] = {}
        for line in block.split("\n"):
            name, _, value = line.partition(": ")
            event[name] = value
        out.append(event)
    return out


def data_of(events: list[dict[str, str]]) -> list[object]:
    return [json.loads(e["data"])["data"] for e in events if "id" in e]
