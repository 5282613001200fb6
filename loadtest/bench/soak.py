"""Soak: steady service for minutes, and the server's RSS over that time.

Rule: a soak measures whether memory stays flat under a load that does not
change, so the load is fixed for the whole run and only time passes. `SUBSCRIBERS`
long polls (keep-alive, each re-polling from its cursor as soon as it is
answered) spread over `CHANNELS` channels, and one publish a second on every
channel, spread evenly over the second; each channel keeps `RETAINED` messages,
so the store is full within the first minute (a store still filling is growth by
design, not a leak). The server's RSS (``/proc``) is sampled
every `SAMPLE_S` seconds; a line is printed per minute, and the record gives the
slope of RSS in MB/min over the last half of the run (least squares: the first
half includes the warm-up of malloc's arenas and the interpreter's caches). Every
message carries its channel's sequence number, so the generator checks that each
subscriber got each publish of its channel exactly once.

The generator is one forked process (an epoll loop over raw sockets, as
`client.py`'s), measured on its own: its CPU next to the server's says whether
the figures are the server's. Issue 26: 5,000 polls on 50 channels grew RSS ~2 MB
a minute in 10 minutes, most of it the store filling its default retention.
"""

from __future__ import annotations

import errno
import json
import multiprocessing as mp
import select
import socket
import time
from multiprocessing.connection import Connection
from typing import Any
from urllib.parse import quote

from . import procfs
from .client import ProtocolError, parse_responses
from .scenarios import Context

SUBSCRIBERS = 5000
CHANNELS = 50
MINUTES = 10.0
SAMPLE_S = 5.0  # seconds between RSS samples
POLL_TIMEOUT = 30  # seconds a poll is held without a publish (one comes every second)
SETTLE_S = 10.0  # after the last publish: time for the last deliveries to arrive
# Messages each channel keeps (--max-messages-per-channel): a minute of them, so the
# store is full before the half the slope is taken over. With the default (1,000, ~600
# B each) 50 channels fill it for 17 minutes, ~1.8 MB a minute that is no leak.
RETAINED = 60
MB = 2**20


def slope_mb_per_min(samples: list[tuple[float, int]]) -> float:
    """Least-squares slope of ``(seconds, rss_bytes)`` samples, in MB per minute."""
    n = len(samples)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in samples) / n
    mean_r = sum(r for _, r in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (r - mean_r) for t, r in samples)
    return cov / var * 60 / MB


# -- the generator (a forked process) ---------------------------------------------------


class _Sub:
    __slots__ = ("sock", "channel", "buf", "position", "last", "received")

    def __init__(self, sock: socket.socket, channel: int) -> None:
        self.sock = sock
        self.channel = channel
        self.buf = b""
        self.position = b"&since=now"
        self.last = 0  # the channel's sequence number last received
        self.received = 0


def _generator(pipe: Connection, port: int, subscribers: int, channels: int) -> None:
    """Open the subscribers, report, then on ("go", seconds) publish for that long and
    report what every subscriber received."""
    counters: dict[str, int] = {"duplicate": 0, "missed": 0, "dropped": 0, "published": 0,
                                "publish_refused": 0}
    host = f"Host: 127.0.0.1:{port}\r\n"
    prefixes = [f"GET /subscribe?channels={quote(f'soak-{c}')}&timeout={POLL_TIMEOUT}".encode()
                for c in range(channels)]
    suffix = f" HTTP/1.1\r\n{host}\r\n".encode()
    ep = select.epoll()
    subs: dict[int, _Sub] = {}
    for i in range(subscribers):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setblocking(False)
        sub = _Sub(sock, i % channels)
        subs[sock.fileno()] = sub
        ep.register(sock.fileno(), select.EPOLLIN)
        sock.send(prefixes[sub.channel] + sub.position + suffix)
    pipe.send(("opened", len(subs)))
    _, seconds = pipe.recv()
    publisher = socket.create_connection(("127.0.0.1", port))
    publisher.setblocking(False)
    ep.register(publisher.fileno(), select.EPOLLIN)
    pub_buf = b""
    pub_waiting = False
    sequence = [0] * channels
    interval = 1.0 / channels  # one publish a second on each channel, spread evenly
    start = time.monotonic()
    end = start + seconds
    next_at = start
    k = 0

    def drop(sub: _Sub) -> None:
        counters["dropped"] += 1
        ep.unregister(sub.sock.fileno())
        del subs[sub.sock.fileno()]
        sub.sock.close()

    while True:
        now = time.monotonic()
        if now >= end + SETTLE_S or (now >= end and not pub_waiting and all(
                s.last == sequence[s.channel] for s in subs.values())):
            break
        if now >= next_at and now < end and not pub_waiting:
            c = k % channels
            k += 1
            sequence[c] += 1
            body = json.dumps({"channels": [f"soak-{c}"], "data": {"soak": sequence[c]}},
                              separators=(",", ":")).encode()
            publisher.send(b"POST /publish HTTP/1.1\r\n" + host.encode()
                           + b"Content-Type: application/json\r\nContent-Length: "
                           + str(len(body)).encode() + b"\r\n\r\n" + body)
            pub_waiting = True
            next_at += interval
        wait = max(0.0, min(next_at - now, 0.05)) if now < end else 0.05
        for fd, _ in ep.poll(wait):
            if fd == publisher.fileno():
                data = publisher.recv(65536)
                if not data:
                    raise ProtocolError("the server closed the publisher's connection")
                answers, pub_buf = parse_responses(pub_buf + data)
                for status, _, _ in answers:
                    counters["published" if status == 201 else "publish_refused"] += 1
                    pub_waiting = False
                continue
            sub = subs[fd]
            try:
                data = sub.sock.recv(262144)
            except BlockingIOError:
                continue
            except OSError:
                drop(sub)
                continue
            if not data:
                drop(sub)
                continue
            answers, sub.buf = parse_responses(sub.buf + data)
            for status, _, body in answers:
                if status != 200:
                    drop(sub)
                    break
                doc = json.loads(body)
                for m in doc["messages"]:
                    n = m["data"]["soak"]
                    if n <= sub.last:
                        counters["duplicate"] += 1
                        continue
                    counters["missed"] += n - sub.last - 1
                    sub.last = n
                    sub.received += 1
                sub.position = b"&since=" + quote(doc["cursor"], safe="").encode()
                try:
                    sub.sock.send(prefixes[sub.channel] + sub.position + suffix)
                except OSError as e:
                    if e.errno not in (errno.EAGAIN, errno.EPIPE, errno.ECONNRESET):
                        raise
                    drop(sub)
                    break
    # every publish of a channel, to every subscriber still connected
    expected = sum(sequence[s.channel] for s in subs.values())
    received = sum(s.received for s in subs.values())
    # the ones that never caught up are missing their tail
    counters["missed"] += sum(sequence[s.channel] - s.last for s in subs.values())
    for sub in subs.values():
        sub.sock.close()
    publisher.close()
    pipe.send(("done", {**counters, "expected": expected, "received": received,
                        "publishes": sum(sequence)}))


# -- the controller ---------------------------------------------------------------------


def bench_soak(ctx: Context, subscribers: int = SUBSCRIBERS, channels: int = CHANNELS,
               minutes: float = MINUTES) -> dict[str, Any]:
    seconds = minutes * 60
    report_every = min(60.0, seconds / 4)  # a line a minute (more often on a short run)
    with ctx.server("soak", flags=("--max-messages-per-channel", str(RETAINED))) as srv:
        srv.warm_up()
        parent, child = mp.get_context("fork").Pipe()
        gen = mp.get_context("fork").Process(
            target=_generator, args=(child, srv.port, subscribers, channels), daemon=True)
        gen.start()
        child.close()
        try:
            if not parent.poll(180):
                raise RuntimeError("the soak generator did not open its subscribers")
            _, opened = parent.recv()
            srv.wait_for(f"{opened} held polls", lambda s: s["waiting"] >= opened, 120)
            assert gen.pid is not None
            rss0 = srv.rss()
            cpu0 = (srv.cpu(), procfs.cpu_seconds(gen.pid))
            t0 = time.monotonic()
            parent.send(("go", seconds))
            samples: list[tuple[float, int]] = [(0.0, rss0)]
            lines: list[dict[str, Any]] = []
            ctx.log(f"    soak: {opened} polls on {channels} channels, a publish per channel "
                    f"a second, {minutes:g} min; RSS {rss0 / MB:.1f} MB at start")
            next_line = report_every
            last_cpu, last_t = cpu0, 0.0
            every = min(SAMPLE_S, seconds / 12)  # a short run gets samples enough for a slope
            while not parent.poll(min(every, max(0.1, seconds - samples[-1][0]))):
                t = time.monotonic() - t0
                if t <= seconds:
                    samples.append((t, srv.rss()))
                if t >= next_line and t <= seconds + every:
                    cpu = (srv.cpu(), procfs.cpu_seconds(gen.pid))
                    span = t - last_t
                    line = {"minute": round(t / 60, 2), "rss_mb": round(samples[-1][1] / MB, 1),
                            "server_cpu_pct": round(100 * (cpu[0] - last_cpu[0]) / span, 1),
                            "generator_cpu_pct": round(100 * (cpu[1] - last_cpu[1]) / span, 1)}
                    lines.append(line)
                    ctx.log(f"    {line['minute']:6.2f} min  RSS {line['rss_mb']:7.1f} MB  "
                            f"server {line['server_cpu_pct']:5.1f} % CPU  generator "
                            f"{line['generator_cpu_pct']:5.1f} % CPU")
                    last_cpu, last_t = cpu, t
                    next_line += report_every
                if time.monotonic() - t0 > seconds + SETTLE_S + 60:
                    raise RuntimeError("the soak generator did not finish")
            _, deliveries = parent.recv()
            wall = time.monotonic() - t0
            cpu1 = (srv.cpu(), procfs.cpu_seconds(gen.pid))
        finally:
            gen.join(10)
            if gen.is_alive():
                gen.terminate()
        stats = srv.stats()
    half = [s for s in samples if s[0] >= seconds / 2]
    slope = slope_mb_per_min(half)
    delivered_pct = 100.0 * deliveries["received"] / deliveries["expected"] \
        if deliveries["expected"] else 0.0
    ctx.log(f"    soak: RSS {rss0 / MB:.1f} -> {samples[-1][1] / MB:.1f} MB, slope over the last "
            f"half {slope:+.2f} MB/min; {deliveries['received']:,} of "
            f"{deliveries['expected']:,} deliveries ({delivered_pct:.2f} %), "
            f"{deliveries['duplicate']} duplicates; generator "
            f"{100 * (cpu1[1] - cpu0[1]) / wall:.0f} % CPU, server "
            f"{100 * (cpu1[0] - cpu0[0]) / wall:.0f} % CPU")
    return {
        "subscribers": opened, "channels": channels, "minutes": minutes,
        "retained_per_channel": RETAINED,
        "rss_start_mb": round(rss0 / MB, 1), "rss_end_mb": round(samples[-1][1] / MB, 1),
        "slope_last_half_mb_per_min": round(slope, 3),
        "delivered_pct": round(delivered_pct, 3), "deliveries": deliveries,
        "server_cpu_pct": round(100 * (cpu1[0] - cpu0[0]) / wall, 1),
        "generator_cpu_pct": round(100 * (cpu1[1] - cpu0[1]) / wall, 1),
        "lines": lines, "samples": [(round(t, 1), r) for t, r in samples],
        "server_connections_at_end": stats.get("connections"),
    }
