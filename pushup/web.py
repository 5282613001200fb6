"""HTTP in: twisted.web requests ↔ core values, and errors → JSON.

The one place HTTP is parsed and written. Routing is a small table over the
raw path (no resource traversal); bodies are capped while they arrive and
never spooled to disk; ``error_response`` is the only function that turns a
``PushUpError`` into the JSON error body. Behaviour lives in
:mod:`pushup.service`; this module only translates.
"""

from __future__ import annotations

import hmac
import re
import time
from collections.abc import Callable
from io import BytesIO
from typing import Any
from urllib.parse import unquote_to_bytes

from twisted.logger import Logger
from twisted.web import http, server

from pushup import errors
from pushup.config import Config
from pushup.cursor import PREFIX as CURSOR_PREFIX
from pushup.cursor import decode as decode_cursor
from pushup.errors import PushUpError
from pushup.model import (
    Draft,
    Query,
    check_channel_list,
    check_channel_name,
    dumps,
    encode_data,
    format_time,
    loads,
    parse_time,
)
from pushup.replica import decode_batch, verify
from pushup.service import Service

log = Logger()
_WHOLE = re.compile(r"[0-9]+")
JSON = b"application/json; charset=utf-8"
DEFAULT_TIMEOUT = 50.0
DEFAULT_LIMIT = 100
MAX_TTL_S = 366 * 86400
DISCARD_CAP = 16 * 1024 * 1024  # past this much of an oversized body, hang up
PEER_BODY_LIMIT = 16 * 1024 * 1024  # peers batch at most 4 MiB (see peers.BATCH_BYTES)


def error_body(e: PushUpError) -> bytes:
    return dumps({"error": {"code": e.code, "message": e.message}})


def canned_response(e: PushUpError, cors_origin: str) -> bytes:
    """A complete HTTP response for errors answered outside a Request."""
    body = error_body(e)
    lines = [f"HTTP/1.1 {e.status} {http.RESPONSES[e.status].decode()}",
             "Content-Type: application/json; charset=utf-8",
             f"Content-Length: {len(body)}", "Connection: close", "Server: PushUp"]
    if cors_origin:
        lines.append(f"Access-Control-Allow-Origin: {cors_origin}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class PushUpRequest(server.Request):
    """A request whose body is capped as it arrives and that a Service can answer."""

    waiter: Any = None
    too_large = False
    hung_up = False
    extra_headers = False  # a header beyond our standard ones was set
    body_limit = 0  # 0: the configured --max-body-bytes

    def gotLength(self, length: int | None) -> None:
        self.content = BytesIO()  # never a temporary file, whatever the length
        if getattr(self.channel, "_path", b"").startswith(b"/peer/"):
            self.body_limit = PEER_BODY_LIMIT
        limit = self.body_limit or self.channel.site.web.config.max_body_bytes
        if length is not None and length > limit:
            self._overflow()
            if (self.requestHeaders.getRawHeaders(b"expect") or [b""])[0].lower() \
                    == b"100-continue":
                # The client waits before sending the body: answer now instead.
                self.requestHeaders.removeHeader(b"expect")
                self._hang_up()

    def handleContentChunk(self, data: bytes) -> None:
        if not self.too_large:
            limit = self.body_limit or self.channel.site.web.config.max_body_bytes
            if self.content.tell() + len(data) <= limit:
                self.content.write(data)
                return
            self._overflow()
        self.content.write(data)
        if self.content.tell() > DISCARD_CAP:
            self._hang_up()

    def _overflow(self) -> None:
        self.too_large = True
        self.content = _Discard()

    def _hang_up(self) -> None:
        if self.hung_up:
            return
        self.hung_up = True
        site = self.channel.site
        limit = self.body_limit or site.web.config.max_body_bytes
        e = errors.TooLarge(f"the request body is over {limit} bytes")
        self.channel.transport.write(canned_response(e, site.web.config.cors_origin))
        self.channel.transport.loseConnection()

    def process(self) -> None:
        self.site = self.channel.site
        self.site.web.handle(self)

    def respond(self, body: bytes, hold: bool = False) -> bool:
        """Answer a held subscribe with ``body``; False if the client left."""
        self.waiter = None
        if self._disconnected or self.finished:
            return False
        channel = self.channel
        if self.plain():
            # Fan-out: every subscriber of a group gets the same bytes, so
            # the whole response is built once (Web.wire).
            self.write_response(self.site.web.wire(body), 200, len(body))
        else:
            self.site.web.send(self, 200, body)
        if hold and channel.transport is not None:
            self.site.web.hold(channel.transport)
        return True

    def plain(self) -> bool:
        """Whether our prebuilt HTTP/1.1 keep-alive response bytes fit this request."""
        return (self.clientproto == b"HTTP/1.1" and self.channel.persistent
                and self.method != b"HEAD" and not self.extra_headers)

    def write_response(self, raw: bytes, status: int, body_length: int) -> None:
        """Send a complete response (head and body) built by ``Web``; then finish.

        Twisted would build the head header by header for every request;
        finish() still does its bookkeeping (keep-alive, timeouts).
        """
        self.code = status
        self.startedWriting = 1
        self.sentLength = body_length
        write_now = getattr(self.channel.transport, "write_now", None)
        if write_now is not None:
            write_now(raw)
        else:
            self.channel.write(raw)
        self.finish()

    def connectionLost(self, reason: Any) -> None:
        super().connectionLost(reason)
        if self.waiter is not None:
            self.site.web.service.forget(self.waiter)
            self.waiter = None


class _Discard:
    """Counts the bytes of a body we will not keep."""

    def __init__(self) -> None:
        self.n = 0

    def write(self, data: bytes) -> None:
        self.n += len(data)

    def tell(self) -> int:
        return self.n

    def seek(self, *args: object) -> None:
        pass

    def read(self, *args: object) -> bytes:
        return b""

    def close(self) -> None:
        pass


class PushUpChannel(http.HTTPChannel):
    """Twisted's HTTP channel, answering malformed HTTP with our JSON 400."""

    def _respondToBadRequestAndDisconnect(self) -> None:
        e = errors.BadRequest("malformed HTTP request", code="bad_request")
        self.transport.write(canned_response(e, self.site.web.config.cors_origin))
        self.loseConnection()


class PushUpSite(server.Site):
    """A Site that routes to ``web``, with no access log and no form parsing."""

    noisy = False

    def __init__(self, web: Web, reactor: Any = None) -> None:
        super().__init__(None, requestFactory=PushUpRequest, parsePOSTFormSubmission=False,
                         timeout=60, reactor=reactor)
        self.web = web

    def protocol(self) -> Any:  # type: ignore[override]
        return http._GenericHTTPChannelProtocol(PushUpChannel())

    def log(self, request: object) -> None:
        pass  # no line per request: a long-poll server would log itself to death

    def startFactory(self) -> None:
        pass  # no access log, so no once-a-second timer to keep its date current

    def stopFactory(self) -> None:
        pass


Handler = Callable[[PushUpRequest, tuple[str, ...]], Any]


class Web:
    """Routes requests to handlers and writes their answers."""

    def __init__(self, service: Service, config: Config,
                 stats: Callable[[], dict[str, Any]],
                 metrics: Callable[[], tuple[bytes, bytes]]) -> None:
        self.service = service
        self.config = config
        self._stats = stats
        self._metrics = metrics
        self._cors = config.cors_origin.encode()
        self.cluster: Any = None  # set by the node when it has peers or a secret
        self._wire: dict[int, tuple[bytes, bytes]] = {}  # id(body) -> (body, response)
        self._held: list[Any] = []  # transports paused until a fan-out is done
        service.on_fanout_done.append(self.release)
        self._routes: dict[tuple[str, ...], dict[bytes, Handler]] = {
            ("publish",): {b"POST": self.publish},
            ("subscribe",): {b"GET": self.subscribe},
            ("channels",): {b"POST": self.create_channel},
            ("channels", "*"): {b"GET": self.channel_info, b"HEAD": self.channel_info,
                                b"DELETE": self.delete_channel},
            ("channels", "*", "renew"): {b"POST": self.renew_channel},
            ("health",): {b"GET": self.health, b"HEAD": self.health},
            ("stats",): {b"GET": self.stats, b"HEAD": self.stats},
            ("metrics",): {b"GET": self.metrics, b"HEAD": self.metrics},
            ("peer", "messages"): {b"POST": self.peer_messages},
            ("peer", "snapshot"): {b"GET": self.peer_snapshot},
        }

    # -- plumbing ----------------------------------------------------------

    def handle(self, request: PushUpRequest) -> None:
        try:
            if request.too_large:
                _close_after(request)
                limit = request.body_limit or self.config.max_body_bytes
                raise errors.TooLarge(f"the request body is over {limit} bytes")
            if request.method == b"OPTIONS" and self._cors:
                return self._preflight(request)
            handlers, params = self._route(request.path)
            handler = handlers.get(request.method)
            if handler is None:
                allowed = tuple(m.decode() for m in handlers)
                raise errors.MethodNotAllowed(
                    f"{request.method.decode('latin-1')} is not allowed here", allowed)
            result = handler(request, params)
            if result is not server.NOT_DONE_YET:
                status, body = result
                self.send(request, status, body)
        except PushUpError as e:
            self.error_response(request, e)
        except Exception:
            log.failure("unexpected error answering {uri}", uri=request.uri)
            self.error_response(request, PushUpError("the server failed; it keeps serving"))

    def _route(self, raw_path: bytes) -> tuple[dict[bytes, Handler], tuple[str, ...]]:
        segments = raw_path.split(b"/")[1:]
        key: tuple[str, ...]
        if segments and segments[0] == b"channels" and len(segments) in (2, 3):
            key = ("channels", "*") + tuple(s.decode("latin-1") for s in segments[2:])
            params = (_path_name(segments[1]),) if key in self._routes else ()
        else:
            key = tuple(s.decode("latin-1") for s in segments)
            params = ()
        handlers = self._routes.get(key)
        if handlers is None:
            raise errors.NotFound(f"no such path: {raw_path.decode('latin-1')[:100]}")
        return handlers, params

    def hold(self, transport: Any) -> None:
        """Read nothing more from ``transport`` until the fan-out is done."""
        transport.pauseProducing()
        self._held.append(transport)

    def release(self) -> None:
        held, self._held = self._held, []
        for transport in held:
            transport.resumeProducing()

    def wire(self, body: bytes) -> bytes:
        """A complete HTTP/1.1 200 response carrying ``body``, built once per body."""
        cached = self._wire.get(id(body))
        if cached is not None and cached[0] is body:
            return cached[1]
        if len(self._wire) >= 64:
            self._wire.clear()
        raw = self._response(200, JSON, body)
        self._wire[id(body)] = (body, raw)
        return raw

    def _response(self, status: int, content_type: bytes, body: bytes) -> bytes:
        """Status line, our standard headers and ``body``, as bytes for the wire."""
        head = [b"HTTP/1.1 %d %s" % (status, http.RESPONSES.get(status, b"")),
                b"Server: PushUp", b"Date: " + http.datetimeToString(),
                b"Cache-Control: no-store", b"Content-Type: " + content_type,
                b"Content-Length: %d" % len(body)]
        if self._cors:
            head.append(b"Access-Control-Allow-Origin: " + self._cors)
        return b"\r\n".join(head) + b"\r\n\r\n" + body

    def send(self, request: PushUpRequest, status: int, body: bytes | None,
             content_type: bytes = JSON) -> None:
        if body is not None and request.plain():
            request.write_response(self._response(status, content_type, body), status, len(body))
            return
        request.setResponseCode(status)
        headers = request.responseHeaders
        headers.setRawHeaders(b"server", [b"PushUp"])
        headers.setRawHeaders(b"cache-control", [b"no-store"])
        if self._cors:
            headers.setRawHeaders(b"access-control-allow-origin", [self._cors])
        if body is not None:
            headers.setRawHeaders(b"content-type", [content_type])
            headers.setRawHeaders(b"content-length", [b"%d" % len(body)])
            request.write(body)
        request.finish()

    def error_response(self, request: PushUpRequest, e: PushUpError) -> None:
        """The one place a PushUpError becomes an HTTP answer."""
        if isinstance(e, errors.MethodNotAllowed):
            request.setHeader(b"allow", ", ".join(e.allowed).encode())
            request.extra_headers = True
        if e.status >= 500 and not isinstance(e, errors.Unavailable):
            _close_after(request)
        self.send(request, e.status, error_body(e))

    def _preflight(self, request: PushUpRequest) -> None:
        request.extra_headers = True
        request.setHeader(b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS")
        request.setHeader(b"access-control-allow-headers", b"Authorization, Content-Type")
        request.setHeader(b"access-control-max-age", b"86400")
        self.send(request, 204, None)

    def _authorize(self, request: PushUpRequest) -> None:
        token = self.config.publish_token
        if not token:
            return
        given = _header(request, b"authorization")
        if not (given.startswith("Bearer ")
                and hmac.compare_digest(given[7:].encode(), token.encode())):
            raise errors.Unauthorized("this endpoint needs Authorization: Bearer <token>")

    def _body(self, request: PushUpRequest, empty_ok: bool = False) -> dict[str, Any]:
        raw = request.content.getvalue()
        if not raw.strip() and empty_ok:
            return {}
        value = loads(raw)
        if not isinstance(value, dict):
            raise errors.BadJSON("the body must be a JSON object")
        return value

    # -- endpoints ---------------------------------------------------------

    def publish(self, request: PushUpRequest, _: tuple[str, ...]) -> tuple[int, bytes]:
        self._authorize(request)
        self._ready()
        body = self._body(request)
        if "messages" in body:
            items = body["messages"]
            if "channels" in body or "data" in body:
                raise errors.BadRequest("give either messages or channels and data, not both")
            if not isinstance(items, list) or not items:
                raise errors.BadRequest("messages must be a non-empty list")
            drafts = [self._draft(item, f"messages[{i}]") for i, item in enumerate(items)]
        else:
            drafts = [self._draft(body, "")]
        published = self.service.publish(drafts)
        receipts = [b'{"id":"%s","timestamp":%s,"channels":%s}'
                    % (m.id.encode(), format_time(m.ts).encode(), m.channels_json)
                    for m in published]
        if "messages" in body:
            return 201, b'{"messages":[' + b",".join(receipts) + b"]}"
        return 201, receipts[0]

    def _draft(self, item: object, where: str) -> Draft:
        prefix = f"{where}: " if where else ""
        if not isinstance(item, dict):
            raise errors.BadRequest(f"{prefix}a message is an object with channels and data")
        if "data" not in item:
            raise errors.BadRequest(f"{prefix}data is required")
        try:
            channels = check_channel_list(item.get("channels"), self.config.max_channels)
            data = encode_data(item["data"], self.config.max_message_bytes)
        except PushUpError as e:
            e.message = prefix + e.message
            raise
        return Draft(channels, data)

    def subscribe(self, request: PushUpRequest, _: tuple[str, ...]) -> Any:
        self._ready()
        query, timeout = subscribe_query(request.args, self.config)
        outcome = self.service.subscribe(query, timeout, request)
        if isinstance(outcome, bytes):
            return 200, outcome
        request.waiter = outcome
        return server.NOT_DONE_YET

    def create_channel(self, request: PushUpRequest, _: tuple[str, ...]) -> tuple[int, bytes]:
        self._authorize(request)
        self._ready()
        body = self._body(request, empty_ok=True)
        name = body.get("name")
        if name is not None and not isinstance(name, str):
            raise errors.BadChannelName("name must be a string")
        channel = self.service.create_channel(name, _ttl(body))
        return 201, self._channel_json(channel)

    def renew_channel(self, request: PushUpRequest, params: tuple[str, ...]) -> tuple[int, bytes]:
        self._authorize(request)
        self._ready()
        body = self._body(request, empty_ok=True)
        channel = self.service.renew_channel(params[0], _ttl(body))
        return 200, self._channel_json(channel)

    def delete_channel(self, request: PushUpRequest, params: tuple[str, ...]) -> tuple[int, None]:
        self._authorize(request)
        self._ready()
        self.service.delete_channel(params[0])
        return 204, None

    def channel_info(self, request: PushUpRequest, params: tuple[str, ...]) -> tuple[int, bytes]:
        self._authorize(request)
        self._ready()
        channel = self.service.store.get(params[0])
        info = {"channel": channel.name, "messages": channel.count,
                "subscribers": self.service.hub.waiting_on(channel.name)}
        return 200, self._channel_json(channel, info)

    def _channel_json(self, channel: Any, extra: dict[str, Any] | None = None) -> bytes:
        fields = {"channel": channel.name, **(extra or {})}
        text = dumps(fields)[:-1] + b',"expires_at":' + format_time(channel.expires_at).encode()
        return text + b"}"

    def _ready(self) -> None:
        if self.cluster is not None:
            self.cluster.check_ready()

    def health(self, request: PushUpRequest, _: tuple[str, ...]) -> tuple[int, bytes]:
        if self.service.draining:
            raise errors.ShuttingDown("the node is draining for shutdown")
        self._ready()
        return 200, dumps({"status": "ok", "node_id": self.service.store.origin.node_id})

    def stats(self, request: PushUpRequest, _: tuple[str, ...]) -> tuple[int, bytes]:
        return 200, dumps(self._stats())

    def _peer(self, request: PushUpRequest) -> Any:
        """The cluster, if this request is signed with its secret; else 401."""
        cluster = self.cluster
        ok = cluster is not None and bool(cluster.secret) and verify(
            cluster.secret, request.method.decode(), request.path.decode("latin-1"),
            _header(request, b"x-pushup-time"), request.content.getvalue(),
            _header(request, b"x-pushup-signature"), time.time())
        if not ok:
            if cluster is not None:
                cluster.refused += 1
            raise errors.Unauthorized("peer requests must be signed with the cluster secret")
        return cluster

    def peer_messages(self, request: PushUpRequest, _: tuple[str, ...]) -> tuple[int, bytes]:
        cluster = self._peer(request)
        return cluster.receive(decode_batch(request.content.getvalue()))  # type: ignore

    def peer_snapshot(self, request: PushUpRequest, _: tuple[str, ...]) -> tuple[int, bytes]:
        return 200, self._peer(request).snapshot()

    def metrics(self, request: PushUpRequest, _: tuple[str, ...]) -> tuple[int, bytes]:
        content_type, text = self._metrics()
        self.send(request, 200, text, content_type)
        return server.NOT_DONE_YET  # type: ignore[return-value]


def subscribe_query(raw: dict[bytes, list[bytes]], config: Config) -> tuple[Query, float]:
    """``GET /subscribe`` parameters (parsed query string) → (Query, timeout s)."""
    args = _Args(raw)
    names = args.get("channels")
    if names is None:
        raise errors.BadRequest("channels is required: ?channels=a,b")
    channels = check_channel_list(names.split(","), config.max_channels)
    since_text = args.get("since")
    since: Any = 0
    if since_text is not None:
        if since_text.startswith(CURSOR_PREFIX):
            since = decode_cursor(since_text)
        else:
            try:
                float(since_text)
            except ValueError:
                since = decode_cursor(since_text)  # 400: neither time nor cursor
            else:
                since = parse_time(since_text, "since")
    until_text = args.get("until")
    until = None if until_text is None else parse_time(until_text, "until")
    timeout = min(args.number("timeout", DEFAULT_TIMEOUT), config.max_timeout)
    limit = min(args.integer("limit", DEFAULT_LIMIT), config.max_limit)
    return Query(channels, since, until, limit), timeout


def _header(request: PushUpRequest, name: bytes) -> str:
    return (request.getHeader(name) or b"").decode("latin-1")


def _close_after(request: PushUpRequest) -> None:
    request.extra_headers = True
    request.setHeader(b"connection", b"close")
    request.channel.persistent = False


def _path_name(segment: bytes) -> str:
    try:
        return check_channel_name(unquote_to_bytes(segment).decode("utf-8"))
    except UnicodeDecodeError:
        raise errors.BadChannelName("a channel name must be UTF-8") from None


def _ttl(body: dict[str, Any]) -> int | None:
    ttl = body.get("ttl")
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= MAX_TTL_S:
        raise errors.BadRequest(f"ttl must be a number of seconds, more than 0, "
                                f"at most {MAX_TTL_S}")
    return round(ttl * 1_000_000)


class _Args:
    """Query-string parameters: UTF-8, each at most once."""

    def __init__(self, raw: dict[bytes, list[bytes]]) -> None:
        self._raw = raw

    def get(self, name: str) -> str | None:
        values = self._raw.get(name.encode())
        if not values:
            return None
        if len(values) > 1:
            raise errors.BadRequest(f"{name} is given more than once")
        try:
            return values[0].decode("utf-8")
        except UnicodeDecodeError:
            raise errors.BadRequest(f"{name} is not valid UTF-8") from None

    def number(self, name: str, default: float) -> float:
        text = self.get(name)
        if text is None:
            return default
        try:
            value = float(text)
        except ValueError:
            raise errors.BadRequest(f"{name} must be a number of seconds") from None
        if not value >= 0 or value == float("inf"):
            raise errors.BadRequest(f"{name} must be a finite number, 0 or more")
        return value

    def integer(self, name: str, default: int) -> int:
        text = self.get(name)
        if text is None:
            return default
        digits = text.lstrip("0")
        if not _WHOLE.fullmatch(text) or not digits:
            raise errors.BadRequest(f"{name} must be a whole number, 1 or more")
        return int(digits) if len(digits) < 19 else 10**18  # the caller caps it anyway
