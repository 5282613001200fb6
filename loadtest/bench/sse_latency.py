"""Issue 40's front latency: how long one event of an event stream takes to
reach its reader, straight from a node and through each shipped front.

Rule: one node (``deploy.launch.LocalCluster``), and in front of it at once
the shipped HAProxy configuration (plain HTTP/1.1, and its TLS variant with
``alpn h2,http/1.1``) and the shipped nginx TLS site (``deploy/nginx.py``), so
every path is measured against the same process in the same minute. Per
path, one event stream is opened: read as HTTP/1.1 from a raw socket (TLS
where the front is TLS), and through each TLS front also as HTTP/2 by
``curl --http2 -N`` (its output on a pipe: curl's own wake-up is in that
figure); then, one at a time, a message is published straight to the
node over a keep-alive connection of its own (``TCP_NODELAY``, one write per
request, so the publish costs every front the same) and the figure is the
time from the publish's first byte sent to the event's end read.
The pause between two publishes is drawn between 1 and 35 ms: events closer
than a delayed ACK's 40 ms are where Nagle's algorithm on the node, or a
proxy's coalescing (HAProxy's MSG_MORE: 200 ms), would show. The fronts take
turns, event by event, so the machine's load falls on all of them alike.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.launch import LocalCluster, haproxy_config, self_signed_pem
from deploy.nginx import PrivateNginx
from deploy.processes import free_port, wait_healthy

from .scenarios import BenchError, Context, percentile

GAP_S = (0.001, 0.035)  # the pause between two publishes, drawn uniformly
EVENT_END = b"\n\n"  # the blank line that ends an event (one message, one event)
GUARD_S = 10.0  # an event that takes this long is a failure, not a figure
FRONTS = ("straight to the node (HTTP/1.1)", "HAProxy, shipped (HTTP/1.1)",
          "HAProxy TLS, read as HTTP/1.1", "HAProxy TLS, read as h2 (curl)",
          "nginx TLS, read as HTTP/1.1", "nginx TLS, read as h2 (curl)")


@dataclass
class Reader:
    """One front's event stream: ``recv`` what came (b"" at its end), ``close`` it."""

    name: str
    recv: Callable[[], bytes]
    close: Callable[[], None]
    buffered: bytes = b""

    def wait_for(self, marker: bytes) -> None:
        """Read until ``marker`` has come (what came before it is dropped)."""
        while marker not in self.buffered:
            chunk = self.recv()
            if not chunk:
                raise BenchError(f"{self.name}: the event stream ended")
            self.buffered += chunk
        self.buffered = self.buffered.split(marker, 1)[1]

    def wait_open(self) -> Reader:
        self.wait_for(b"event: cursor")  # the stream names its position: it is open
        self.wait_for(EVENT_END)  # (the rest of that event)
        return self


def _connect(port: int, tls: ssl.SSLContext | None) -> socket.socket | ssl.SSLSocket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=GUARD_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls is None:
        return sock
    return tls.wrap_socket(sock, server_hostname="127.0.0.1")


def _open_stream(name: str, port: int, channel: str, tls: ssl.SSLContext | None) -> Reader:
    """An event stream read as HTTP/1.1 from a socket of our own."""
    sock = _connect(port, tls)
    sock.sendall(f"GET /subscribe?channels={channel} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 "Accept: text/event-stream\r\n\r\n".encode())
    return Reader(name, lambda: sock.recv(65536), sock.close).wait_open()


def _open_h2_stream(name: str, port: int, channel: str, cafile: str) -> Reader:
    """An event stream read over HTTP/2, by curl (its body on a pipe, unbuffered)."""
    proc = subprocess.Popen(["curl", "--http2", "-sS", "-N", "--cacert", cafile,
                             "-H", "Accept: text/event-stream",
                             f"https://127.0.0.1:{port}/subscribe?channels={channel}"],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()

    def close() -> None:
        proc.kill()
        proc.wait()

    return Reader(name, lambda: os.read(fd, 65536), close).wait_open()


class Publisher:
    """Publishes on one keep-alive connection, each request in one write."""

    def __init__(self, port: int) -> None:
        self.sock = _connect(port, None)
        self.buffered = b""

    def publish(self, channel: str, data: Any) -> float:
        """Publish; the ``perf_counter`` at its first byte sent."""
        body = json.dumps({"channels": [channel], "data": data}).encode()
        request = (b"POST /publish HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                   b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        sent = time.perf_counter()
        self.sock.sendall(request)
        return sent

    def read_answer(self) -> None:
        while b"\r\n\r\n" not in self.buffered:
            self.buffered += self._recv()
        head, _, rest = self.buffered.partition(b"\r\n\r\n")
        if not head.startswith((b"HTTP/1.1 201", b"HTTP/1.1 202")):
            raise BenchError(f"publish answered {head.splitlines()[0]!r}")
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(rest) < length:
            rest += self._recv()
        self.buffered = rest[length:]

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise BenchError("the node closed the publisher's connection")
        return chunk


def _figures(samples_ms: list[float]) -> dict[str, float]:
    return {"p50_ms": round(percentile(samples_ms, 50), 2),
            "p90_ms": round(percentile(samples_ms, 90), 2),
            "p99_ms": round(percentile(samples_ms, 99), 2),
            "max_ms": round(max(samples_ms), 2), "events": len(samples_ms)}


def _tls_haproxy(workdir: Path, node_port: int, pem: str) -> tuple[subprocess.Popen[bytes], int]:
    """The shipped HAProxy configuration's TLS variant in front of the node."""
    port = free_port()
    config = workdir / "haproxy-tls.cfg"
    config.write_text(haproxy_config(port, [node_port], tls_pem=pem))
    with open(workdir / "haproxy-tls.log", "ab") as log:
        proc = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL)
    return proc, port


def bench_sse_latency(ctx: Context, events: int) -> dict[str, Any]:
    """Per-event latency of an event stream straight from a node, through HAProxy
    (plain, and TLS with h2 offered) and through nginx (TLS): ``events`` each."""
    workdir = Path(tempfile.mkdtemp(prefix="sse-latency-", dir=ctx.out_dir))
    rng = random.Random(40)
    pem = str(self_signed_pem(workdir))
    trusting = ssl.create_default_context(cafile=pem)
    trusting.set_alpn_protocols(["http/1.1"])  # the raw reader speaks HTTP/1.1
    with LocalCluster(1, workdir=str(workdir / "cluster")) as cluster:
        node_port = cluster.node_ports[0]
        haproxy, haproxy_port = _tls_haproxy(workdir, node_port, pem)
        nginx = PrivateNginx(f"127.0.0.1:{free_port()}", [f"127.0.0.1:{node_port}"], pem, pem)
        try:
            nginx.start()
            wait_healthy(f"https://127.0.0.1:{haproxy_port}", time.monotonic() + 30, haproxy,
                         trusting)
            channel = f"latency-{time.time_ns()}"
            nginx_port = int(nginx.listen.rsplit(":", 1)[1])
            readers = [
                _open_stream(FRONTS[0], node_port, channel, None),
                _open_stream(FRONTS[1], cluster.front_port, channel, None),
                _open_stream(FRONTS[2], haproxy_port, channel, trusting),
                _open_h2_stream(FRONTS[3], haproxy_port, channel, pem),
                _open_stream(FRONTS[4], nginx_port, channel, trusting),
                _open_h2_stream(FRONTS[5], nginx_port, channel, pem),
            ]
            publisher = Publisher(node_port)
            samples: dict[str, list[float]] = {r.name: [] for r in readers}
            ctx.log(f"  {events} events per front, one at a time, {GAP_S[0] * 1000:.0f}-"
                    f"{GAP_S[1] * 1000:.0f} ms apart, the fronts taking turns")
            for i in range(events):
                for timed in readers[i % len(readers):] + readers[:i % len(readers)]:
                    sent = publisher.publish(channel, i)
                    timed.wait_for(EVENT_END)  # the one timed is read first
                    samples[timed.name].append((time.perf_counter() - sent) * 1000)
                    for other in readers:  # every stream has the event
                        if other is not timed:
                            other.wait_for(EVENT_END)
                    publisher.read_answer()
                    time.sleep(rng.uniform(*GAP_S))
            for reader in readers:
                reader.close()
            publisher.sock.close()
        finally:
            nginx.stop()
            haproxy.terminate()
            haproxy.wait(10)
    shutil.rmtree(workdir, ignore_errors=True)  # its logs and throwaway key: all went well
    fronts = {name: _figures(s) for name, s in samples.items()}
    return {"events_per_front": events, "gap_ms": [g * 1000 for g in GAP_S], "fronts": fronts}


def table(result: dict[str, Any]) -> str:
    lines = ["SSE, one event's latency (publish sent -> event read), "
             f"{result['events_per_front']} events per path:",
             f"  {'path':<34} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8}"]
    for name, f in result["fronts"].items():
        lines.append(f"  {name:<34} {f['p50_ms']:>6.2f}ms {f['p90_ms']:>6.2f}ms "
                     f"{f['p99_ms']:>6.2f}ms {f['max_ms']:>6.2f}ms")
    return "\n".join(lines)
