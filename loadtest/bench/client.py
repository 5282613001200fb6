"""A load-generator process: one epoll loop over raw non-blocking sockets.

`pool.WorkerPool` starts several of these with multiprocessing and drives them
with commands over a Pipe (the pipe's fd sits in the same epoll set, so a
command never stalls the sockets). Each connection speaks HTTP/1.1 keep-alive,
one request at a time (no pipelining: a held poll would block what follows),
and is bound to one of several loopback source addresses before connecting, so
the ephemeral-port range is never the limit.

Two kinds of connection:

* subscriber: a long poll held by the server; on each response it records the
  receipt time (`time.time()`, the same clock in every process) of every
  benchmark round it contains and, if re-polling is on, immediately sends the
  next poll from its new position (else it waits for a `repoll_all` command).
* publisher: a publish one after another until a deadline; or (`fetch`) a
  catch-up read one after another, the same request each time.

What the requests and answers look like is the server's `dialect` (PushUp's API
or nchan's), named in each command; everything else here is the same for both.
Responses must carry Content-Length (neither server sends chunked answers);
anything else is counted as a protocol error and the connection dropped.
"""

from __future__ import annotations

import errno
import select
import socket
import time
from array import array
from collections import Counter, defaultdict
from multiprocessing.connection import Connection
from typing import Any

from .dialect import Dialect, dialect
from .server import raise_nofile

SOURCE_ADDRESSES = [f"127.0.0.{i}" for i in range(2, 10)]
IP_BIND_ADDRESS_NO_PORT = 24  # Linux: pick the port at connect(), keyed by the full 4-tuple
MAX_PENDING_CONNECTS = 256  # per process, so a burst never overflows the server's accept queue
RECV_SIZE = 262144

EPOLLIN = select.EPOLLIN
EPOLLOUT = select.EPOLLOUT

CONNECTING, SUBSCRIBER, PUBLISHER = 0, 1, 2


class Conn:
    __slots__ = ("sock", "fd", "kind", "role", "buf", "position", "last_round", "sent_at",
                 "idle")

    def __init__(self, sock: socket.socket, role: int) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.kind = CONNECTING
        self.role = role
        self.buf = b""
        self.position = b""  # the dialect's "where I am" for the next poll
        self.last_round = -1
        self.sent_at = 0.0
        self.idle = False  # a subscriber holding its next poll back (re-poll deferred)


class ProtocolError(Exception):
    pass


def parse_responses(buf: bytes) -> tuple[list[tuple[int, bytes, bytes]], bytes]:
    """Split complete HTTP responses off `buf`: ([(status, head, body)], rest)."""
    out: list[tuple[int, bytes, bytes]] = []
    while True:
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return out, buf
        head = buf[:end]
        i = head.lower().find(b"\r\ncontent-length:")
        if i < 0:
            raise ProtocolError(f"response without Content-Length: {head[:200]!r}")
        j = head.find(b"\r\n", i + 17)
        length = int(head[i + 17 : j if j >= 0 else len(head)])
        total = end + 4 + length
        if len(buf) < total:
            return out, buf
        out.append((int(head[9:12]), head, buf[end + 4 : total]))
        buf = buf[total:]


class Worker:
    def __init__(self, pipe: Connection, index: int) -> None:
        self.pipe = pipe
        self.index = index
        self.ep = select.epoll()
        self.conns: dict[int, Conn] = {}
        self.port = 0
        self.running = True
        self.counters: Counter[str] = Counter()
        self.next_source = index
        # Where connections go and come from; loadtest.experiments points them at a veth.
        self.server_host = "127.0.0.1"
        self.source_addresses = SOURCE_ADDRESSES
        # opening connections
        self.to_open = 0
        self.to_open_role = SUBSCRIBER
        self.pending_connects = 0
        self.open_reply_due = False
        # subscribers
        self.sub: Dialect | None = None
        self.repoll = True
        self.received: defaultdict[int, array[float]] = defaultdict(lambda: array("d"))
        self.round_wait: tuple[int, int, float] | None = None
        # publishers
        self.pub_request = b""
        self.pub_ok: frozenset[int] = frozenset()
        self.pub_counter = "publish_ok"  # what an answer in ``pub_ok`` counts as
        self.pub_end = 0.0
        self.pub_active = 0
        self.pub_latencies = array("d")
        self.pub_reply_due = False

    # -- main loop -----------------------------------------------------------------

    def run(self) -> None:
        pipe_fd = self.pipe.fileno()
        self.ep.register(pipe_fd, EPOLLIN)
        conns = self.conns
        while self.running:
            for fd, _ev in self.ep.poll(self.poll_timeout()):
                if fd == pipe_fd:
                    self.command(self.pipe.recv())
                    continue
                c = conns.get(fd)
                if c is None:
                    continue
                if c.kind == CONNECTING:
                    self.connected(c)
                else:
                    self.readable(c)
            self.progress()
            self.tick()

    def poll_timeout(self) -> float:
        """How long one epoll wait may block (a subclass may need to wake sooner)."""
        return 0.05 if (self.round_wait or self.pub_reply_due) else 1.0

    def tick(self) -> None:
        """Called after every loop turn; a hook for subclasses (see experiments.rate)."""

    def reply(self, *msg: Any) -> None:
        self.pipe.send(msg)

    def progress(self) -> None:
        if self.to_open and self.pending_connects < MAX_PENDING_CONNECTS:
            self.open_more()
        if self.open_reply_due and not self.to_open and not self.pending_connects:
            self.open_reply_due = False
            self.reply("opened", self.count(SUBSCRIBER), dict(self.counters))
        if self.round_wait is not None:
            r, expected, deadline = self.round_wait
            got = self.received.get(r)
            if (got is not None and len(got) >= expected) or time.time() > deadline:
                self.round_wait = None
                times = self.received.pop(r, array("d"))
                self.reply("round", r, times.tobytes(), self.count(SUBSCRIBER), dict(self.counters))
        if self.pub_reply_due and (self.pub_active == 0 or time.time() > self.pub_end + 30):
            self.pub_reply_due = False
            lat = self.pub_latencies
            self.pub_latencies = array("d")
            self.reply("published", lat.tobytes(), dict(self.counters))

    def count(self, role: int) -> int:
        return sum(1 for c in self.conns.values() if c.role == role and c.kind != CONNECTING)

    # -- commands --------------------------------------------------------------------

    def command(self, msg: tuple[Any, ...]) -> None:
        op = msg[0]
        if op == "subscribe":
            _, self.port, n, channel, timeout, self.repoll, name = msg
            self.sub = dialect(name, self.port, channel, timeout)
            self.to_open, self.to_open_role, self.open_reply_due = n, SUBSCRIBER, True
        elif op == "await_round":
            _, r, expected, deadline = msg
            self.round_wait = (r, expected, deadline)
        elif op == "repoll_all":
            n = 0
            for c in list(self.conns.values()):
                if c.idle:
                    c.idle = False
                    n += 1
                    self.send_poll(c)
            self.reply("repolled", n)
        elif op == "counters":
            self.reply("counters", self.count(SUBSCRIBER), dict(self.counters))
        elif op == "publish":
            _, self.port, n, duration, channel, name = msg
            pub = dialect(name, self.port, channel, 0)
            self.repeat(pub.publish_request({"bench": "publish", "w": self.index}),
                        pub.publish_ok, "publish_ok", n, duration)
        elif op == "fetch":
            _, self.port, n, duration, channel, count, name = msg
            reader = dialect(name, self.port, channel, 0)
            self.repeat(reader.catch_up_request(count), frozenset({200}), "read_ok", n,
                        duration)
        elif op == "close_all":
            for c in list(self.conns.values()):
                self.drop(c, None)
            self.received.clear()
            self.counters.clear()
            self.reply("closed")
        elif op == "exit":
            self.running = False
        else:
            raise ValueError(f"unknown command {op!r}")

    def repeat(self, request: bytes, ok: frozenset[int], counter: str, n: int,
               duration: float) -> None:
        """Open ``n`` connections, each sending ``request`` one after another
        for ``duration`` s; the reply is "published" (latencies, counters)."""
        self.pub_request, self.pub_ok, self.pub_counter = request, ok, counter
        self.counters.clear()  # the reply's counters are this run's alone
        self.pub_end = time.time() + duration
        self.pub_active = n
        self.to_open, self.to_open_role, self.pub_reply_due = n, PUBLISHER, True

    # -- connections -------------------------------------------------------------------

    def open_more(self) -> None:
        while self.to_open and self.pending_connects < MAX_PENDING_CONNECTS:
            self.to_open -= 1
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
            self.next_source += 1
            sources = self.source_addresses
            sock.bind((sources[self.next_source % len(sources)], 0))
            err = sock.connect_ex((self.server_host, self.port))
            if err not in (0, errno.EINPROGRESS):
                self.counters[f"connect_error_{errno.errorcode.get(err, err)}"] += 1
                sock.close()
                if self.to_open_role == PUBLISHER:
                    self.pub_active -= 1
                continue
            c = Conn(sock, self.to_open_role)
            self.conns[c.fd] = c
            self.ep.register(c.fd, EPOLLOUT)
            self.pending_connects += 1

    def connected(self, c: Conn) -> None:
        self.pending_connects -= 1
        err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self.counters[f"connect_error_{errno.errorcode.get(err, err)}"] += 1
            self.drop(c, None)
            return
        c.kind = c.role
        self.ep.modify(c.fd, EPOLLIN)
        if c.role == SUBSCRIBER:
            self.send_poll(c)
        else:
            self.send_publish(c)

    def drop(self, c: Conn, reason: str | None) -> None:
        if reason:
            self.counters[reason] += 1
        if c.kind == CONNECTING:
            self.pending_connects -= 1
        if c.role == PUBLISHER:
            self.pub_active -= 1
        self.forget(c)

    def forget(self, c: Conn) -> None:
        """Close ``c`` and stop watching it."""
        self.conns.pop(c.fd, None)
        try:
            self.ep.unregister(c.fd)
        except (OSError, ValueError):
            pass
        c.sock.close()

    def send(self, c: Conn, data: bytes) -> None:
        try:
            n = c.sock.send(data)
        except OSError as e:
            self.drop(c, f"send_error_{errno.errorcode.get(e.errno or 0, e.errno)}")
            return
        if n != len(data):  # requests are a few hundred bytes; a fresh socket buffer takes them
            self.drop(c, "short_send")

    def send_poll(self, c: Conn) -> None:
        assert self.sub is not None
        self.send(c, self.sub.poll_request(c.position))

    def send_publish(self, c: Conn) -> None:
        c.sent_at = time.time()
        self.send(c, self.pub_request)

    def readable(self, c: Conn) -> None:
        try:
            data = c.sock.recv(RECV_SIZE)
        except BlockingIOError:
            return
        except OSError as e:
            self.drop(c, f"recv_error_{errno.errorcode.get(e.errno or 0, e.errno)}")
            return
        if not data:
            self.drop(c, "closed_by_server" if not c.buf else "closed_mid_response")
            return
        try:
            responses, c.buf = parse_responses(c.buf + data if c.buf else data)
        except (ProtocolError, ValueError):
            self.drop(c, "protocol_error")
            return
        if not responses:
            return
        now = time.time()
        if c.role == SUBSCRIBER:
            for status, head, body in responses:
                self.on_poll_response(c, status, head, body, now)
        else:
            for status, _head, _body in responses:
                self.on_publish_response(c, status, now)

    def on_poll_response(self, c: Conn, status: int, head: bytes, body: bytes,
                         now: float) -> None:
        counters = self.counters
        if status != 200:
            counters[f"poll_status_{status}"] += 1
            # Do not re-poll into an error (that would spin); the subscriber is lost.
            self.drop(c, None)
            return
        assert self.sub is not None
        try:
            c.position, datas, gap = self.sub.read_poll(head, body)
        except (ValueError, KeyError, TypeError):
            self.drop(c, "bad_poll_body")
            return
        if gap:
            counters["gap"] += 1
        if not datas:
            counters["empty_poll"] += 1
        for data in datas:
            r = data.get("bench_round") if isinstance(data, dict) else None
            if r is None:
                counters["other_message"] += 1
                continue
            if r <= c.last_round:
                counters["duplicate"] += 1
                continue
            c.last_round = r
            self.received[r].append(now)
        counters["poll_responses"] += 1
        if self.repoll:
            self.send_poll(c)
        else:
            c.idle = True

    def on_publish_response(self, c: Conn, status: int, now: float) -> None:
        if status in self.pub_ok:
            self.counters[self.pub_counter] += 1
            self.pub_latencies.append(now - c.sent_at)
        else:
            self.counters[f"publish_status_{status}"] += 1
        if now < self.pub_end:
            self.send_publish(c)
        else:
            self.drop(c, None)


def worker_main(pipe: Connection, index: int, kind: type[Worker] | None = None) -> None:
    """A worker process's life: a ``kind`` (``Worker``) of worker, run until
    its pipe closes."""
    raise_nofile()
    worker = (kind or Worker)(pipe, index)
    try:
        worker.run()
    except (EOFError, KeyboardInterrupt):
        pass
