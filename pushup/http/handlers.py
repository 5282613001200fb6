"""The endpoints: request values in, response values out.

Routing is a table over the raw path (no resource traversal). Each handler
takes a ``Request`` and returns a ``Response``, or ``Held`` when a subscribe
waits; behaviour lives in :mod:`pushup.core.service`, parameters are checked in
:mod:`pushup.http.params`. Nothing here reads a socket, the wall clock (the
service's clock is injected) or HTTP framing, so an endpoint can be tested
with plain values (tests/http/test_handlers.py).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from importlib.metadata import version
from importlib.resources import files
from typing import Any, Protocol

from twisted.internet import defer
from twisted.internet.interfaces import IProtocol
from twisted.python.failure import Failure

from pushup.backplane import Backplane, ExternalEngine, Mount, Unconfirmed
from pushup.backplane.stream_engine import StreamEngine
from pushup.config import Config
from pushup.core import errors
from pushup.core.cursor import Cursor
from pushup.core.cursor import decode as decode_cursor
from pushup.core.errors import PushUpError
from pushup.core.idempotency import Idem, check_key, fingerprint
from pushup.core.model import (
    Draft,
    Message,
    Now,
    Query,
    check_channel_list,
    dumps,
    encode_data,
    format_time,
)
from pushup.core.service import Delivery, Service, Subscriber
from pushup.core.store import Channel
from pushup.core.streams import Streams
from pushup.http.exchange import Held, Pending, Request, Response, error_response
from pushup.http.params import (
    Args,
    ParsedQueries,
    json_object,
    path_name,
    query_args,
    subscribe_query,
    ttl_of,
)
from pushup.http.presence import PresenceDesk, presence_query
from pushup.http.presence_followers import Who
from pushup.http.render import poll_body
from pushup.http.sse import EventStream, StreamClient, closed_in
from pushup.http.stream_drain import OpenStreams
from pushup.http.streams import PREFIX as STREAMS_PREFIX
from pushup.http.streams import StreamEndpoints
from pushup.http.tokens import Verifier


class Client(Subscriber, StreamClient, Protocol):
    """The HTTP front's end of one request: a held poll's or an event stream's."""

    def open_stream(self) -> None:
        """Answer 200 ``text/event-stream``; events follow."""

    def answer_held(self, response: Response) -> bool:
        """Answer the held request with ``response``; False if it is gone."""


Outcome = Response | Held | Pending
Handler = Callable[[Request, tuple[str, ...], Client], Outcome]


class Handlers:
    """Routes requests to endpoints; answers errors with the JSON body."""

    def __init__(self, service: Service, config: Config,
                 stats: Callable[[], dict[str, Any]],
                 metrics: Callable[[], tuple[bytes, bytes]],
                 backplane: Backplane, mount: Mount | None = None,
                 figures: bool = True, streams: Streams | None = None,
                 stream_engine: StreamEngine | None = None,
                 tokens: Verifier | None = None,
                 presence: PresenceDesk | None = None) -> None:
        """``figures``: answer /stats and /metrics (else they are only on the
        admin port, and 404 here); ``streams`` and ``stream_engine``: the
        Durable Streams' service and engine (by default, this node's alone);
        ``tokens``: the subscriber tokens' verifier (pushup.ops.jwks builds the
        node's; by default, one of --subscribe-secret's, when it is set);
        ``presence``: who subscribes, with ``--presence`` (else nothing is counted)."""
        self.service = service
        self.presence = presence
        self.config = config
        self.backplane = backplane
        # The engine's own endpoints (the mesh's), every path under its prefix.
        self.mount = mount
        self._stats = stats
        self._metrics = metrics
        self._parse_subscribe = _parse_subscribe(config, presence is not None)
        self.parsed_queries: ParsedQueries[Parsed] = ParsedQueries()
        if tokens is None and config.subscribe_jwks:  # never open by omission
            raise ValueError("--subscribe-jwks needs its verifier (pushup.ops.jwks)")
        self._tokens = tokens if tokens is not None else Verifier(
            config.subscribe_secret, config.subscribe_secret_previous,
            issuer=config.subscribe_issuer, audience=config.subscribe_audience,
        ) if config.subscribe_secret else None
        self._routes: dict[tuple[bytes, ...], dict[bytes, Handler]] = {
            (b"publish",): {b"POST": self.publish},
            (b"",): {b"GET": self.index, b"HEAD": self.index},
            (b"subscribe",): {b"GET": self.subscribe, b"HEAD": self.subscribe},
            (b"channels",): {b"POST": self.create_channel},
            (b"channels", b"*"): {b"GET": self.channel_info, b"HEAD": self.channel_info,
                                  b"DELETE": self.delete_channel},
            (b"channels", b"*", b"renew"): {b"POST": self.renew_channel},
            (b"health",): {b"GET": self.health, b"HEAD": self.health},
            (b"stats",): {b"GET": self.stats, b"HEAD": self.stats},
            (b"metrics",): {b"GET": self.metrics, b"HEAD": self.metrics},
            (b"pushup.js",): {b"GET": self.client_js, b"HEAD": self.client_js},
            (b"presence",): {b"GET": self.presence_info},
        }
        if not figures:
            del self._routes[(b"stats",)], self._routes[(b"metrics",)]
        # Durable Streams, /v1/stream/{path}: every method (pushup.http.streams)
        self.streams = StreamEndpoints(service, config, self._authorize, streams, stream_engine)
        # open event streams (/subscribe's SSE): a drain spreads their ends
        self.event_streams = OpenStreams()
        # The routes without a parameter by their whole path (b"/publish"): one
        # lookup for nearly every request, before _route splits the path.
        self._fixed = {b"/" + b"/".join(key): handlers for key, handlers in self._routes.items()
                       if b"*" not in key}
        self._index = _index(figures)

    # -- what the HTTP front calls ------------------------------------------

    def admit(self, method: bytes, path: bytes, headers: dict[bytes, bytes]) -> int | Response:
        """Before the body: the most body bytes this request may bring, or the
        answer that refuses it unread (e.g. an engine's request nobody signed)."""
        mount = self._mount_of(path)
        if mount is not None:
            try:
                return mount.admit(method, path, headers)
            except PushUpError as e:
                return error_response(e, close=True)
        return self.config.max_body_bytes

    def upgrade(self, request: Request) -> IProtocol | None:
        """The protocol that takes over this connection, for a request to
        upgrade it: the engine's, when its mount has one for this path."""
        mount = self._mount_of(request.path)
        return None if mount is None else mount.upgrade(request)

    def too_large(self, path: bytes) -> PushUpError:
        mount = self._mount_of(path)
        limit = self.config.max_body_bytes if mount is None else mount.body_limit
        return errors.TooLarge(f"the request body is over {limit} bytes")

    def _mount_of(self, path: bytes) -> Mount | None:
        """The engine's mount, when ``path`` is one of its endpoints."""
        mount = self.mount
        return mount if mount is not None and path.startswith(mount.prefix) else None

    def handle(self, request: Request, client: Client) -> Outcome:
        """The answer to ``request`` (``client`` is who a held subscribe answers).

        A ``PushUpError`` becomes its JSON answer here; anything else is a bug
        the caller logs and answers 500.
        """
        try:
            if request.path.startswith(STREAMS_PREFIX):
                return self.streams.answer(request, client)
            if request.method == b"OPTIONS" and self.config.cors_origin:
                return _PREFLIGHT
            mount = self._mount_of(request.path)
            if mount is not None:
                answer = mount.answer(request, self.service.now() / 1e6)
                return Response(answer.status, answer.body)
            handlers = self._fixed.get(request.path)
            params: tuple[str, ...] = ()
            if handlers is None:
                handlers, params = self._route(request.path)
            handler = handlers.get(request.method)
            if handler is None:
                allowed = tuple(m.decode() for m in handlers)
                raise errors.MethodNotAllowed(
                    f"{request.method.decode('latin-1')} is not allowed here", allowed)
            return handler(request, params, client)
        except PushUpError as e:
            return error_response(e)

    def _route(self, raw_path: bytes) -> tuple[dict[bytes, Handler], tuple[str, ...]]:
        segments = raw_path.split(b"/")[1:]
        params: tuple[str, ...] = ()
        key = tuple(segments)
        if len(segments) in (2, 3) and segments[0] == b"channels":
            key = (b"channels", b"*", *segments[2:])
            if key in self._routes:
                params = (path_name(segments[1]),)
        handlers = self._routes.get(key)
        if handlers is None:
            raise errors.NotFound(f"no such path: {raw_path.decode('latin-1')[:100]}")
        return handlers, params

    # -- guards --------------------------------------------------------------

    def _authorize(self, request: Request) -> None:
        """Publishing and managing channels: the token when one is set; a
        browser page of a foreign origin is refused unless allowed by
        ``--cors-origin`` or it carries the token."""
        token = self.config.publish_token
        given = request.header(b"authorization")
        if token:
            if not (given.startswith("Bearer ")
                    and hmac.compare_digest(given[7:].encode(), token.encode())):
                raise errors.Unauthorized("this endpoint needs Authorization: Bearer <token>")
            return
        origin = request.headers.get(b"origin")
        if origin is not None and not self._origin_allowed(origin, request):
            raise errors.Forbidden(
                f"a page of origin {origin.decode('latin-1')[:100]} may not publish or "
                "manage channels here (see --cors-origin and --publish-token)")

    def _origin_allowed(self, origin: bytes, request: Request) -> bool:
        allowed = self.config.cors_origin
        if "*" in allowed or origin.decode("latin-1") in allowed:
            return True
        host = request.headers.get(b"host", b"")
        return bool(host) and origin in (b"http://" + host, b"https://" + host)

    def _ready(self) -> None:
        self.backplane.check_ready()

    # -- endpoints -----------------------------------------------------------

    def publish(self, request: Request, _: tuple[str, ...], __: Client,
                ) -> Response | Pending:
        self._authorize(request)
        self._ready()
        self.service.check_open()
        key = check_key(request.headers.get(b"idempotency-key"))
        body = json_object(request.body)
        if "messages" in body:
            items = body["messages"]
            if "channels" in body or "data" in body:
                raise errors.BadRequest("give either messages or channels and data, not both")
            if not isinstance(items, list) or not items:
                raise errors.BadRequest("messages must be a non-empty list")
            drafts = [self._draft(item, f"messages[{i}]") for i, item in enumerate(items)]
        else:
            drafts = [self._draft(body, "")]
        batch = "messages" in body
        idem = None if key is None else Idem(key, fingerprint(drafts, batch))

        def receipts(published: list[Message]) -> Response:
            each = [receipt(m) for m in published]
            # 202: published, but held by this node only (README, "What a 201 means").
            # A retry with the key of a stored publish (Replayed) gets the same
            # receipts, 201 once the first attempt's messages are acknowledged.
            status = 202 if isinstance(published, Unconfirmed) else 201
            if batch:
                return Response(status, b'{"messages":[' + b",".join(each) + b"]}")
            return Response(status, each[0])

        return _when(self.backplane.publish(drafts, idem), receipts)

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

    def subscribe(self, request: Request, _: tuple[str, ...], client: Client,
                  ) -> Response | Held | Pending:
        self._ready()
        cached = self.parsed_queries.get(request.query)
        parsed = cached or self._parse_subscribe(request.query)
        query, timeout, token, marks = parsed
        expires = None
        if self._tokens is not None:
            if token is None:
                bearer = request.header(b"authorization")
                token = bearer[7:] if bearer.startswith("Bearer ") else None
            checked = self._tokens.check(token, query.channels, self.service.now() / 1e6)
            if isinstance(checked, defer.Deferred):  # its key is looked up first (a JWKS URL)
                later = checked.addCallback(lambda expires: _answer_of(
                    self._authorized(request, parsed, cached, client, expires, token)))
                return Pending(later.addErrback(_error_answer))
            expires = checked
        return self._authorized(request, parsed, cached, client, expires, token)

    def _authorized(self, request: Request, parsed: Parsed, cached: object, client: Client,
                    expires: float | None, token: str | None,
                    ) -> Response | Held | Pending:
        """:meth:`subscribe` once its token (if one is needed) is good."""
        query, timeout, _, marks = parsed
        if cached is None:  # kept only once authorised
            self.parsed_queries.put(request.query, parsed)
        cold = self.backplane.prepare(query.channels)
        if cold is not None:  # this node reads the channels first (the Redis engine)
            later: defer.Deferred[Any] = cold.addCallback(
                lambda _: self._subscribe(request, query, timeout, client, expires, token,
                                          marks))
            return Pending(later.addErrback(_error_answer))
        return self._subscribe(request, query, timeout, client, expires, token, marks)

    def _subscribe(self, request: Request, query: Query, timeout: float, client: Client,
                   expires: float | None, token: str | None = None,
                   marks: Marks | None = None) -> Response | Held:
        """:meth:`subscribe` once this node holds what its channels need."""
        if request.method == b"HEAD":
            # the head a GET would get now: never held, nothing counted as
            # delivered, no channel created (HEAD is safe)
            if isinstance(query.since, Now):
                query = replace(query, since=self.service.store.end(query.channels))
            return Response(200, poll_body(Delivery(query, self.service.read(query))))
        if self.presence is not None and marks is not None:
            return self._counted(request, query, timeout, client, expires, token, marks,
                                 self.presence)
        if b"presence" in request.query and Args(query_args(request.query)).get("presence"):
            raise errors.BadRequest("presence is off on this node (pushup serve --presence)")
        if b"text/event-stream" in request.headers.get(b"accept", b""):
            return self._stream(request, query, client, expires)
        outcome = self.service.subscribe(query, timeout, client)
        if isinstance(outcome, Delivery):
            return Response(200, poll_body(outcome))
        return Held(partial(self.service.forget, outcome))

    def _counted(self, request: Request, query: Query, timeout: float, client: Client,
                 expires: float | None, token: str | None, marks: Marks,
                 desk: PresenceDesk) -> Response | Held:
        """:meth:`_subscribe` with ``--presence``: the subscription is
        counted, and with ``presence=1`` it follows membership changes."""
        who, follow = desk.parse(marks, token, query.channels)
        if b"text/event-stream" in request.headers.get(b"accept", b""):
            return self._stream(request, query, client, expires, (desk, who, follow))
        outcome, gone = desk.poll(query, timeout, who, client, follow)
        if isinstance(outcome, bytes):
            return Response(200, outcome)
        if isinstance(outcome, Delivery):
            return Response(200, poll_body(outcome))
        return Held(gone)

    def _stream(self, request: Request, query: Query, client: Client,
                expires: float | None,
                counted: tuple[PresenceDesk, Who, bool] | None = None) -> Response | Held:
        """SSE: a reconnect's Last-Event-ID (an id we issued) wins over since,
        and the channels an id says were closed stay closed. 204 when there is
        nothing to stream (every channel closed, or until past and nothing
        left): that stops an EventSource for good."""
        last = request.header(b"last-event-id")
        if last:
            query = replace(query, since=decode_cursor(last))
        elif isinstance(query.since, Cursor):
            last = Args(query_args(request.query)).get("since") or ""
        if counted is None:
            stream = EventStream(self.service, query, client, closed=closed_in(last),
                                 expires=expires, on_stop=self.event_streams.discard)
            if stream.has_nothing_to_send():
                return _NO_CONTENT
            client.open_stream()
            self.event_streams.add(stream)
            stream.start()
            return Held(stream.stop)
        desk, who, follow = counted
        # a presence position in a cursor is not the store's
        query = replace(query, since=desk.position(query.since)[0])
        watched = desk.stream(who, query.channels, client, follow)
        stream = EventStream(self.service, query, watched, closed=closed_in(last),
                             expires=expires, on_stop=self.event_streams.discard)
        if stream.has_nothing_to_send():
            watched.end()
            return _NO_CONTENT
        client.open_stream()
        self.event_streams.add(stream)
        stream.start()

        def stop() -> None:
            stream.stop()
            watched.end()
        return Held(stop)

    def create_channel(self, request: Request, _: tuple[str, ...], __: Client,
                       ) -> Response | Pending:
        self._authorize(request)
        self._ready()
        body = json_object(request.body, empty_ok=True)
        name = body.get("name")
        if name is not None and not isinstance(name, str):
            raise errors.BadChannelName("name must be a string")
        return _when(self.backplane.create_channel(name, ttl_of(body)),
                     lambda channel: Response(201, _channel_json(channel)))

    def renew_channel(self, request: Request, params: tuple[str, ...], _: Client,
                      ) -> Response | Pending:
        self._authorize(request)
        self._ready()
        body = json_object(request.body, empty_ok=True)
        return _when(self.backplane.renew_channel(params[0], ttl_of(body)),
                     lambda channel: Response(200, _channel_json(channel)))

    def delete_channel(self, request: Request, params: tuple[str, ...], _: Client,
                       ) -> Response | Pending:
        self._authorize(request)
        self._ready()
        return _when(self.backplane.delete_channel(params[0]), lambda _: _NO_CONTENT)

    def channel_info(self, request: Request, params: tuple[str, ...], _: Client,
                     ) -> Response | Pending:
        self._authorize(request)
        self._ready()
        cold = self.backplane.prepare([params[0]])
        if cold is not None:  # this node reads the channel first (the Redis engine)
            later: defer.Deferred[Any] = cold.addCallback(
                lambda _: self._channel_info(params[0]))
            return Pending(later.addErrback(_error_answer))
        return self._channel_info(params[0])

    def _channel_info(self, name: str) -> Response:
        channel = self.service.store.get(name)
        info = {"channel": channel.name, "messages": channel.count,
                "subscribers": self.service.hub.waiting_on(channel.name)}
        return Response(200, _channel_json(channel, info))

    def presence_info(self, request: Request, _: tuple[str, ...], __: Client) -> Response:
        """``GET /presence?channels=A,B[&members=1]``: authorised as a
        subscribe of those channels, or with the publish token."""
        if self.presence is None:
            raise errors.NotFound("presence is off on this node (pushup serve --presence)")
        args = Args(query_args(request.query))
        channels, members = presence_query(args, self.config.max_channels)
        given = request.header(b"authorization")
        token = self.config.publish_token
        publisher = bool(token) and given.startswith("Bearer ") and hmac.compare_digest(
            given[7:].encode(), token.encode())
        if self._tokens is not None and not publisher:
            subscriber = args.get("token") or (given[7:] if given.startswith("Bearer ") else None)
            self._tokens.check(subscriber, channels, self.service.now() / 1e6)
        return self.presence.answer(channels, members)

    def health(self, request: Request, _: tuple[str, ...], __: Client,
               ) -> Response | Pending:
        """200 only when this node can take a publish, on some of its channels
        at least: 503 ``shutting_down`` while draining, ``catching_up`` while
        loading, ``engine_unavailable`` while an outside engine (Redis) can
        serve none of them. The 200's body adds the engine's parts (on Redis,
        each primary's state)."""
        if self.service.draining:
            raise errors.ShuttingDown("the node is draining for shutdown")
        self._ready()
        ok = {"status": "ok", "node_id": self.service.store.node_id}
        if isinstance(self.backplane, ExternalEngine):
            return _when(self.backplane.probe(),
                         lambda parts: Response(200, dumps({**ok, **(parts or {})})))
        return Response(200, dumps(ok))

    def index(self, request: Request, _: tuple[str, ...], __: Client) -> Response:
        """``GET /``: what this is, its version and where its endpoints are
        (those this port serves: not the figures when an admin port has them)."""
        return self._index

    def stats(self, request: Request, _: tuple[str, ...], __: Client) -> Response:
        return Response(200, dumps(self._stats()))

    def metrics(self, request: Request, _: tuple[str, ...], __: Client) -> Response:
        content_type, text = self._metrics()
        return Response(200, text, content_type)

    def client_js(self, request: Request, _: tuple[str, ...], __: Client) -> Response:
        """The browser client (clients/js/ in the repository)."""
        return _CLIENT_JS


_PREFLIGHT = Response(204, headers=(
    (b"Access-Control-Allow-Methods", b"GET, POST, DELETE, OPTIONS"),
    (b"Access-Control-Allow-Headers", b"Authorization, Content-Type, Idempotency-Key"),
    (b"Access-Control-Max-Age", b"86400")))
_NO_CONTENT = Response(204)


def _index(figures: bool) -> Response:
    """The answer to ``GET /``; ``figures``: this port answers /stats and /metrics."""
    links = {"publish": "/publish", "subscribe": "/subscribe", "channels": "/channels",
             "channel": "/channels/{name}", "health": "/health", "stats": "/stats",
             "metrics": "/metrics", "client": "/pushup.js"}
    if not figures:
        del links["stats"], links["metrics"]
    return Response(200, dumps({"service": "pushup", "version": version("pushup"),
                                "links": links}))


_CLIENT_JS = Response(200, files("pushup.http").joinpath("static/pushup.js").read_bytes(),
                      b"text/javascript; charset=utf-8")


# A subscribe's parameters for presence: presence, client, user (with --presence)
Marks = tuple[str | None, str | None, str | None]
Parsed = tuple[Query, float, str | None, Marks | None]


def _parse_subscribe(config: Config, presence: bool) -> Callable[[bytes], Parsed]:
    def parse(raw: bytes) -> Parsed:
        args = query_args(raw)
        query, timeout = subscribe_query(args, config)
        given = Args(args)
        # (each looked up only when given: most subscribes name none of them)
        marks = (given.get("presence") if b"presence" in args else None,
                 given.get("client") if b"client" in args else None,
                 given.get("user") if b"user" in args else None) if presence else None
        return query, timeout, given.get("token"), marks
    return parse


def _when(acknowledged: defer.Deferred[Any], answer: Callable[[Any], Response],
          ) -> Response | Pending:
    """``answer`` once the backplane acknowledges; at once if it already has.

    A ``PushUpError`` on the way (e.g. 503 while Redis is unreachable) is
    answered as itself; anything else is a bug the front logs and answers 500.
    """
    if not acknowledged.called:
        answered: defer.Deferred[Any] = acknowledged.addCallback(answer)
        return Pending(answered.addErrback(_error_answer))
    done: list[Any] = []  # acknowledged already (a single node): answer now
    acknowledged.addBoth(done.append)
    if isinstance(done[0], Failure):
        if isinstance(done[0].value, PushUpError):
            return error_response(done[0].value)
        done[0].raiseException()
    return answer(done[0])


def _answer_of(outcome: Outcome) -> Response | Held | defer.Deferred[Response | Held]:
    """What a Deferred of a ``Pending`` fires with: a later outcome's answer."""
    return outcome.answer if isinstance(outcome, Pending) else outcome


def _error_answer(failure: Failure) -> Response:
    """A ``PushUpError`` is answered as itself; anything else fails on."""
    if isinstance(failure.value, PushUpError):
        return error_response(failure.value)
    failure.raiseException()


def receipt(message: Message) -> bytes:
    """A message's receipt, ``{"id":…,"timestamp":…,"channels":[…]}``: its
    JSON up to the data, which is those fields as the message wrote them
    (``Message.full``). The first ``,"data":`` in it ends them: an id and a
    timestamp have no comma or quote, and in the channel list a comma is
    followed by a quote that opens a name, never by ``data":`` (a quote in a
    name is escaped)."""
    full = message.full
    return full[:full.index(b',"data":')] + b"}"


def _channel_json(channel: Channel, extra: dict[str, Any] | None = None) -> bytes:
    fields = {"channel": channel.name, **(extra or {})}
    text = dumps(fields)[:-1] + b',"expires_at":' + format_time(channel.expires_at).encode()
    return text + b"}"
