"""MLP: the paper's multithreaded long-polling baseline, on PushUp's own core.

    python -m loadtest.paper.mlp [--host 127.0.0.1] [--port 8090] [--max-timeout 120]

One thread per connection (stdlib ``ThreadingHTTPServer``; with HTTP/1.1
keep-alive a long-polling client holds one connection, so this is one thread
per held poll). Every thread shares one ``pushup.core.store.Store`` behind one
``threading.Condition``: a held ``/subscribe`` waits on the condition and
re-queries the store each time a publish notifies it. Parsing, validation,
cursors, the store, ``Query`` and the response body (``pushup.http.render.poll_body``)
are PushUp's own functions, so a comparison with ``pushup serve`` isolates the
concurrency model: threads + a lock versus one event loop.

Like the paper's baseline (and unlike PushUp) a waiting thread does not notice
that its client went away; it lives until its timeout or the next publish.

Endpoints: ``POST /publish`` (single and batch), ``GET /subscribe``,
``GET /health``, ``GET /stats``. Nothing else of API.md (no channels API, no
cluster, no auth): it is a baseline for the load test, not a product.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from pushup.config import Config
from pushup.core import errors
from pushup.core.errors import PushUpError
from pushup.core.model import (
    Draft,
    Origin,
    Query,
    check_channel_list,
    dumps,
    encode_data,
    format_time,
    loads,
)
from pushup.core.service import Delivery
from pushup.core.store import Retention, Store
from pushup.http.exchange import error_body
from pushup.http.params import query_args, subscribe_query
from pushup.http.render import poll_body

JSON = "application/json; charset=utf-8"


def now_us() -> int:
    return time.time_ns() // 1000


class Core:
    """The shared state: PushUp's Store behind one Condition."""

    def __init__(self, config: Config) -> None:
        self.config = config
        retention = Retention(round(config.message_ttl * 1e6), round(config.channel_ttl * 1e6),
                              config.max_messages_per_channel, config.max_cached_bytes)
        self.store = Store(retention, Origin(config.node_id or "mlp", now_us()))
        self.cond = threading.Condition()
        self.waiting: dict[str, int] = {}  # channel -> held subscriptions
        self.held = 0
        self.published = 0
        self.delivered = 0
        self.requests = 0
        self.started = time.time()

    # -- publish -----------------------------------------------------------

    def publish(self, drafts: list[Draft]) -> list[Any]:
        with self.cond:
            messages = self.store.publish(drafts, now_us())
            self.published += len(messages)
            self.cond.notify_all()  # every held thread wakes and re-queries
        return messages

    # -- subscribe ---------------------------------------------------------

    def subscribe(self, query: Query, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        with self.cond:
            self.store.touch(query.channels, now_us())
            result = self.store.query(query)
            if result.messages or result.gap or timeout <= 0:
                self.delivered += len(result.messages)
                return poll_body(Delivery(query, result))
            self._hold(query.channels, +1)
            try:
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self.cond.wait(left)
                    result = self.store.query(query)
                    if result.messages or result.gap:
                        break
                result = self.store.query(query)  # also the timeout's fresh cursor
                self.delivered += len(result.messages)
                return poll_body(Delivery(query, result))
            finally:
                self._hold(query.channels, -1)

    def _hold(self, channels: tuple[str, ...], d: int) -> None:
        self.held += d
        for name in channels:
            n = self.waiting.get(name, 0) + d
            if n:
                self.waiting[name] = n
            else:
                self.waiting.pop(name, None)

    def expire_forever(self, every: float = 1.0) -> None:
        """Retention, run by one background thread."""
        while True:
            time.sleep(every)
            with self.cond:
                self.store.expire(now_us(), busy=lambda name: self.waiting.get(name, 0) > 0)

    def stats(self) -> dict[str, Any]:
        with self.cond:
            return {
                "node_id": self.store.node_id,
                "uptime_s": round(time.time() - self.started, 3),
                "threads": threading.active_count(),
                "waiting": self.held,
                "channels": self.store.channel_count,
                "messages": self.store.message_count,
                "published": self.published,
                "delivered": self.delivered,
                "requests": self.requests,
                "rss_bytes": _rss(),
            }


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def parse_subscribe(raw_query: str, config: Config) -> tuple[Query, float]:
    """The query string of ``GET /subscribe`` → (Query, timeout), by the node's own parser
    (pushup.http.params)."""
    return subscribe_query(query_args(raw_query.encode("latin-1")), config)


def parse_publish(body: bytes, config: Config) -> tuple[list[Draft], bool]:
    """A ``POST /publish`` body → (drafts, is_batch)."""
    value = loads(body)
    if not isinstance(value, dict):
        raise errors.BadJSON("the body must be a JSON object")
    batch = "messages" in value
    if batch:
        items = value["messages"]
        if not isinstance(items, list) or not items:
            raise errors.BadRequest("messages must be a non-empty list")
    else:
        items = [value]
    drafts = []
    for item in items:
        if not isinstance(item, dict) or "data" not in item:
            raise errors.BadRequest("a message is an object with channels and data")
        channels = check_channel_list(item.get("channels"), config.max_channels)
        drafts.append(Draft(channels, encode_data(item["data"], config.max_message_bytes)))
    return drafts, batch


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one thread per client connection
    disable_nagle_algorithm = True
    server_version = "PushUp-MLP"
    sys_version = ""

    def version_string(self) -> str:
        return self.server_version
    core: Core  # set on the subclass made by make_server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", JSON)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        # Head and body in one write, as PushUp does: two writes would cost a
        # second segment and, with Nagle and delayed ACKs, ~40 ms per answer.
        self._headers_buffer.append(b"\r\n" + body)
        self.flush_headers()

    def _error(self, e: PushUpError) -> None:
        self._send(e.status, error_body(e))

    def do_GET(self) -> None:
        self.core.requests += 1
        url = urlsplit(self.path)
        try:
            if url.path == "/subscribe":
                query, timeout = parse_subscribe(url.query, self.core.config)
                body = self.core.subscribe(query, timeout)
                self._send(200, body)
            elif url.path == "/health":
                self._send(200, dumps({"status": "ok", "node_id": "mlp"}))
            elif url.path == "/stats":
                self._send(200, dumps(self.core.stats()))
            else:
                raise errors.NotFound(f"no such path: {url.path[:100]}")
        except PushUpError as e:
            self._error(e)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def do_POST(self) -> None:
        self.core.requests += 1
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length > self.core.config.max_body_bytes:
                self._send(413, error_body(errors.TooLarge("the request body is too large")),
                           close=True)
                return
            body = self.rfile.read(length)
            if urlsplit(self.path).path != "/publish":
                raise errors.NotFound(f"no such path: {self.path[:100]}")
            drafts, batch = parse_publish(body, self.core.config)
            messages = self.core.publish(drafts)
            receipts = [b'{"id":"%s","timestamp":%s,"channels":%s}'
                        % (m.id.encode(), format_time(m.ts).encode(), dumps(list(m.channels)))
                        for m in messages]
            if batch:
                self._send(201, b'{"messages":[' + b",".join(receipts) + b"]}")
            else:
                self._send(201, receipts[0])
        except PushUpError as e:
            self._error(e)
        except ValueError:
            self._error(errors.BadRequest("bad Content-Length"))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 4096  # the stdlib default (5) drops SYNs under a ramp
    allow_reuse_address = True


def make_server(host: str, port: int, config: Config | None = None) -> Server:
    core = Core(config or Config(node_id="mlp"))
    handler = type("BoundHandler", (Handler,), {"core": core})
    server = Server((host, port), handler)
    server.core = core  # type: ignore[attr-defined]
    threading.Thread(target=core.expire_forever, daemon=True, name="retention").start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="thread-per-request long-polling baseline")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--max-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = make_server(args.host, args.port,
                         Config(node_id="mlp", max_timeout=args.max_timeout))
    print(f"listening on http://{args.host}:{server.server_address[1]}", flush=True)
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever(poll_interval=0.5)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
