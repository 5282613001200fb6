"""Durable Streams over HTTP: ``/v1/stream/{path}`` on the node's own port.

This module maps the protocol's requests (PUT, POST, GET catch-up, long poll
and SSE, HEAD, DELETE) and headers onto :mod:`pushup.core.streams`, which
decides, through the node's ``StreamEngine`` (:mod:`pushup.backplane.stream_engine`:
here, on what a shared store holds, or on the node that serves the stream),
and renders what comes back; it checks every header and query parameter the
protocol names and answers a bad one 400 with PushUp's JSON error body. It
knows no engine's words, parses no HTTP and reads the clock only through the
service (docs/api.md, "Durable Streams"). The header names are
:mod:`pushup.http.stream_headers`'; an SSE read is :mod:`pushup.http.stream_sse`'s.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from twisted.internet import defer
from twisted.python.failure import Failure

from pushup.backplane import Relayed, RelayedStream
from pushup.backplane.stream_engine import LocalStreams, StreamEngine
from pushup.config import Config
from pushup.core import errors
from pushup.core.errors import BadRequest, PushUpError
from pushup.core.service import Service
from pushup.core.stream import Stream
from pushup.core.stream_values import (
    START,
    Append,
    Creation,
    Position,
    Read,
    decimal,
    expiry_of,
    is_media_type,
    parse_offset,
)
from pushup.core.streams import Streams, check_path
from pushup.http import stream_headers as h
from pushup.http.exchange import JSON, Held, Pending, Request, Response, error_body
from pushup.http.params import Args, query_args
from pushup.http.stream_polls import Group, Later, LongPolls
from pushup.http.stream_retention import retention_asked, retention_fields
from pushup.http.stream_sse import EVENT_BOUND_BUDGETS, Feed, WholeEvents
from pushup.http.stream_subscriptions import (
    CONTROL,
    Answer,
    ClusterPart,
    Keeper,
    LocalReach,
    Sender,
    SigningKey,
    StreamNews,
    SubscriptionDesk,
)

PREFIX = b"/v1/stream/"
_CONTROL = PREFIX + CONTROL
# How long a long poll waits for data before its 204, unless it asks (timeout=);
# short because the suite gives a whole long-poll test 5 s.
LONG_POLL_S = 3.0
CURSOR_EPOCH_S = 1728432000  # 2024-10-09T00:00:00Z and 20-second intervals (protocol §10.1)
CURSOR_INTERVAL_S = 20


# a request's headers, by their keys
_FORKED_FROM, _CONTENT_TYPE, _TTL, _EXPIRES_AT = (
    h.key(n) for n in (h.FORKED_FROM, h.CONTENT_TYPE, h.TTL, h.EXPIRES_AT))
_FORK_OFFSET, _FORK_SUB_OFFSET, _CLOSED, _SEQ = (
    h.key(n) for n in (h.FORK_OFFSET, h.FORK_SUB_OFFSET, h.CLOSED, h.SEQ))
_HOST, _IF_NONE_MATCH = h.key(h.HOST), h.key(h.IF_NONE_MATCH)
_PRODUCER = tuple(h.key(n) for n in (h.PRODUCER_ID, h.PRODUCER_EPOCH, h.PRODUCER_SEQ))
Headers = h.Headers


def _name(header: bytes) -> str:
    """A header's name as an error message says it."""
    return header.decode("latin-1")


def new_streams(config: Config) -> Streams:
    """The core's stream service for a node of ``config``: random stream ids,
    ``--max-cached-bytes`` the streams' budget."""
    return Streams(lambda: f"{random.getrandbits(64):016x}", config.max_cached_bytes)


def cursor_after(given: str | None, now_s: float) -> str:
    """The protocol's collapsing cursor: this 20-second interval's number, or
    past the client's when it already has this one (jittered, §10.1)."""
    current = int((now_s - CURSOR_EPOCH_S) // CURSOR_INTERVAL_S)
    if given is not None and given.isdigit() and len(given) < 19 and int(given) >= current:
        current = int(given) + max(1, random.randint(1, 3600) // CURSOR_INTERVAL_S)
    return str(current)


def _answer(status: int, body: bytes | None = None, content_type: bytes | None = None,
            headers: Headers = ()) -> Response:
    if content_type is None:
        return Response(status, body, headers=headers + h.COMMON)
    return Response(status, body, content_type, headers + h.COMMON)


def _error(e: PushUpError) -> Response:
    return _answer(e.status, error_body(e), headers=h.error_fields(e))


def _closed(stream: Stream) -> Headers:
    return h.closed(stream.closed)


class StreamEndpoints:
    """The endpoints of every stream; ``authorize`` guards writes (the
    publish token, as for /publish) and, with --subscribe-secret too, reads."""

    def __init__(self, service: Service, config: Config,
                 authorize: Callable[[Request], None], streams: Streams | None = None,
                 engine: StreamEngine | None = None) -> None:
        """``streams``: the core's stream service (the composition root's;
        by default one of this node alone); ``engine``: where its decisions
        are made and on what (by default here: ``LocalStreams``)."""
        self.service = service
        self.config = config
        self.streams = streams if streams is not None else new_streams(config)
        self.engine: StreamEngine = engine if engine is not None else LocalStreams()
        self._authorize = authorize
        self.draining = False
        # the held long polls, answered together (pushup.http.stream_polls)
        self.polls = LongPolls(service.clock, self._answer_held, self._timed_out)
        self.feeds: set[Feed] = set()  # the SSE responses served here (ended: pruned)
        self.routes: dict[bytes, Callable[[Request, tuple[str, ...], object], Response | Held
                                          | Pending]] = {
            b"PUT": self.create, b"POST": self.append, b"GET": self.read,
            b"HEAD": self.head, b"DELETE": self.delete}
        # the reserved __ds/ paths (protocol §6-7): served once the node says how
        self.subscriptions: SubscriptionDesk | None = None
        self.news: StreamNews | None = None  # who hears what the streams here do
        self._cluster: ClusterPart | None = None

    def serve_subscriptions(self, key: SigningKey, sender: Sender,
                            keeper: Keeper | None = None,
                            cluster: ClusterPart | None = None) -> None:
        """Serve the subscription APIs (``__ds/``): webhooks signed with
        ``key`` (and the wakes' tokens with its ``token_secret``), sent by
        ``sender``; the subscriptions kept by ``keeper`` (``--data-dir``'s
        file); on a cluster, ``cluster`` reaches the other nodes' streams and
        hears this node's, and serves every client request under ``__ds/``
        on the node that holds them."""
        desk = SubscriptionDesk(
            self.service, cluster or LocalReach(self.streams), PREFIX.decode("latin-1"), key,
            sender, self._authorize, self._authorize_read, keeper)
        self.subscriptions = self.news = desk
        if cluster is not None:
            cluster.desk = desk
            self.news = self._cluster = cluster

    def _authorize_read(self, request: Request) -> None:
        if self.config.subscribers_need_tokens and self.config.publish_token:
            self._authorize(request)

    @property
    def long_polls(self) -> int:
        """Long polls held now (/stats ``stream_long_polls``)."""
        return self.polls.held

    @property
    def sse_readers(self) -> int:
        """SSE responses this node serves now (/stats ``stream_sse_readers``;
        one relayed from another node is that node's)."""
        self.feeds = {feed for feed in self.feeds if not feed.ended}
        return len(self.feeds)

    def drain(self) -> None:
        """The node stops: every held long poll is answered now (204), every
        SSE response ends after its last control event."""
        self.draining = True
        self.streams.wake_all()
        self.engine.drain()

    def answer(self, request: Request, client: object,
               ) -> Response | Held | Pending:
        """``request`` to a stream path, answered (errors included)."""
        if request.method == b"OPTIONS":
            return _answer(204, headers=h.PREFLIGHT)
        if request.path.startswith(_CONTROL):
            return self._control(request, client)
        handler = self.routes.get(request.method)
        try:
            if handler is None:
                raise errors.MethodNotAllowed(
                    f"{request.method.decode('latin-1')} is not allowed on a stream",
                    tuple(m.decode() for m in self.routes))
            if self.engine.internal(request):
                pass  # a node's own question to another: no client's request
            elif request.method in (b"GET", b"HEAD"):
                if self.config.subscribers_need_tokens and self.config.publish_token:
                    self._authorize(request)
            else:
                self._authorize(request)
            if request.path == PREFIX:
                raise errors.NotFound("a stream's URL is /v1/stream/{path}, with a path")
            path = request.path.decode("latin-1")
            if request.method == b"PUT":
                check_path(path)  # before any engine (a store, another node) hears of it
            if not self.engine.shared:  # a shared store expires its own
                self.streams.sweep_due(self.service.now())
            source = request.headers.get(_FORKED_FROM) if request.method == b"PUT" else None
            paths = [path] if source is None else [source.decode("latin-1"), path]
            if request.method == b"GET" and b"live=sse" in request.query:
                # another node's event stream reaches the reader in whole events
                client = WholeEvents(client,  # type: ignore[arg-type]
                                     EVENT_BOUND_BUDGETS * self.config.max_response_bytes)
            return _outcome(self.engine.serve(
                paths, lambda: handler(request, (path,), client), request, client))
        except PushUpError as e:
            return _error(e)

    def _control(self, request: Request, client: object) -> Response | Held | Pending:
        """A request to the reserved ``__ds/`` paths: a node's own question
        answered here, a client's by the node that holds the subscriptions
        (one node: this one)."""
        desk = self.subscriptions
        if desk is None:
            return _error(errors.NotFound("this node does not serve the subscription APIs "
                                          "(docs/api.md, \"Stream subscriptions\")"))
        rest = request.path[len(_CONTROL):]
        try:
            if self._cluster is not None:
                own = self._cluster.internal(request, rest)
                if own is not None:
                    return _relayed(own)
            def here() -> Answer:  # the desk then (on Redis a node may take them meanwhile)
                now_serving = self.subscriptions
                assert now_serving is not None
                return _common(now_serving.answer(request, rest))
            return _outcome(here() if self._cluster is None
                            else self._cluster.serve(here, request, client))
        except PushUpError as e:
            return _error(e)

    # -- create, append, close, delete -----------------------------------------

    def create(self, request: Request, params: tuple[str, ...], _: object) -> Response:
        forked_from = request.headers.get(_FORKED_FROM)
        content_type = request.header(_CONTENT_TYPE)
        if not is_media_type(content_type):
            content_type = "" if forked_from is not None else "application/octet-stream"
        ttl_text = request.headers.get(_TTL)
        expires = request.headers.get(_EXPIRES_AT)
        if ttl_text is not None and expires is not None:
            raise BadRequest("give Stream-TTL or Stream-Expires-At, not both")
        ttl = None if ttl_text is None else decimal(ttl_text.decode("latin-1"), _name(h.TTL))
        expires_at = None if expires is None else expires.decode("latin-1").strip()
        if expires_at is not None:
            expiry_of(expires_at)
        fork_offset = request.headers.get(_FORK_OFFSET)
        sub = request.headers.get(_FORK_SUB_OFFSET)
        if forked_from is None and (fork_offset is not None or sub is not None):
            raise BadRequest("Stream-Fork-Offset and Stream-Fork-Sub-Offset need "
                             "Stream-Forked-From")
        offset = None if fork_offset is None else fork_offset.decode("latin-1")
        if offset is not None:
            parse_offset(offset)
        asked = Creation(
            content_type or None, ttl, expires_at,
            request.header(_CLOSED).lower() == "true", request.body,
            None if forked_from is None else forked_from.decode("latin-1"), offset,
            0 if sub is None else decimal(sub.decode("latin-1"), _name(h.FORK_SUB_OFFSET)),
            *retention_asked(request, self.config, fork=forked_from is not None))
        stream, created = self.streams.create(params[0], asked, self.service.now())
        if self.news is not None:  # a fork's inherited data is no news
            self.news.heard(params[0], stream.tail, created,
                                     START if forked_from is None else stream.tail)
        headers: Headers = ((h.NEXT_OFFSET, stream.tail.offset.encode()),
                            *_closed(stream))
        if created:
            host = request.headers.get(_HOST)
            headers += ((h.LOCATION, request.path if host is None
                         else b"http://" + host + request.path),)
        return _answer(201 if created else 200, b"", stream.content_type.encode(), headers)

    def append(self, request: Request, params: tuple[str, ...], _: object) -> Response:
        producer = _producer(request)
        close = request.header(_CLOSED).lower() == "true"
        if not request.body and not close:
            raise BadRequest("an append needs a body (or Stream-Closed: true to close)")
        content_type = request.headers.get(_CONTENT_TYPE)
        if request.body and (content_type is None
                             or not is_media_type(content_type.decode("latin-1"))):
            raise BadRequest("an append needs its Content-Type")
        seq = request.headers.get(_SEQ)
        done = self.streams.append(params[0], Append(
            None if content_type is None else content_type.decode("latin-1"),
            request.body, close, None if seq is None else seq.decode("latin-1"), producer),
            self.service.now())
        if self.news is not None and request.body:
            self.news.heard(params[0], done.tail)
        headers: Headers = ((h.NEXT_OFFSET, done.tail.offset.encode()),)
        if done.closed:
            headers += ((h.CLOSED, h.TRUE),)
        if producer is not None:
            headers += ((h.PRODUCER_EPOCH, b"%d" % producer[1]),
                        (h.PRODUCER_SEQ, b"%d" % (done.producer_seq or 0)))
        new_data = producer is not None and not done.duplicate and bool(request.body)
        return _answer(200 if new_data else 204, headers=headers)

    def delete(self, request: Request, params: tuple[str, ...], _: object) -> Response:
        self.streams.delete(params[0], self.service.now())
        if self.news is not None:
            self.news.gone(params[0])
        return _answer(204)

    # -- read ------------------------------------------------------------------

    def head(self, request: Request, params: tuple[str, ...], _: object) -> Response:
        stream = self.streams.get(params[0], self.service.now())
        headers: Headers = ((h.NEXT_OFFSET, stream.tail.offset.encode()),
                            *_closed(stream))
        if stream.ttl is not None:
            headers += ((h.TTL, b"%d" % stream.ttl),)
        if stream.expires_at is not None:
            headers += ((h.EXPIRES_AT, stream.expires_at.encode()),)
        return _answer(200, b"", stream.content_type.encode(), headers + retention_fields(stream))

    def read(self, request: Request, params: tuple[str, ...], client: object,
             ) -> Response | Held | Pending:
        now = self.service.now()
        stream = self.streams.get(params[0], now)
        args = query_args(request.query)
        offsets = args.get(b"offset", [])
        if len(offsets) > 1:
            raise BadRequest("give offset once")
        given = offsets[0].decode("latin-1") if offsets else None
        if given == "":
            raise BadRequest("offset is empty")
        live = (args.get(b"live") or [b""])[0].decode("latin-1") or None
        if live not in (None, "long-poll", "sse"):
            raise BadRequest("live is long-poll or sse")
        if live is not None and given is None:
            raise BadRequest(f"live={live} needs an offset")
        cursors = args.get(b"cursor")
        cursor_text = cursors[0].decode("latin-1") if cursors else None
        at = (START if given in (None, "-1") else stream.tail if given == "now"
              else stream.position(given or ""))
        stream.touch(now)
        if live == "sse":
            return self._sse(stream, at, cursor_text, client)
        if given == "now" and live is None:
            return _answer(200, b"[]" if stream.is_json else b"", stream.content_type.encode(),
                           ((h.NEXT_OFFSET, stream.tail.offset.encode()),
                            (h.UP_TO_DATE, h.TRUE), *_closed(stream)))
        read = stream.read(at, self.config.max_response_bytes)
        if live == "long-poll" and not read.data and not read.messages:
            if not stream.closed and not self.draining:
                hold = min(Args(args).number("timeout", LONG_POLL_S), self.config.max_timeout)
                if_none_match = request.headers.get(_IF_NONE_MATCH)
                if self.engine.shared:  # answered after the store: held through a Deferred
                    later = Later()
                    self.polls.hold(later, stream, at, cursor_text, if_none_match, hold)
                    return Pending(later.answer)
                return self.polls.hold(client, stream, at,  # type: ignore[arg-type]
                                       cursor_text, if_none_match, hold)
            return self._caught_up(stream, at, cursor_text)
        return self._data(request.headers.get(_IF_NONE_MATCH), stream, given or "-1", read,
                          live, cursor_text)

    def _data(self, if_none_match: bytes | None, stream: Stream, start: str,
              read: Read, live: str | None, cursor: str | None) -> Response:
        headers: Headers = ((h.NEXT_OFFSET, read.next.offset.encode()),)
        if read.up_to_date:
            headers += ((h.UP_TO_DATE, h.TRUE),)
        final = stream.closed and read.up_to_date and read.next == stream.tail
        if final:
            headers += ((h.CLOSED, h.TRUE),)
        if live is not None:
            headers += ((h.CURSOR, self._cursor(cursor).encode()),)
        etag = b'"%s:%s:%s%s"' % (stream.uid.encode(), start.encode(),
                                  read.next.offset.encode(), b":c" if final else b"")
        headers += ((h.ETAG, etag),)
        if if_none_match == etag:
            return _answer(304, headers=((h.ETAG, etag),))
        body = (b"[" + b",".join(read.messages) + b"]" if read.messages is not None
                else read.data)
        return _answer(200, body, stream.content_type.encode(), headers)

    def _caught_up(self, stream: Stream, at: Position, cursor: str | None) -> Response:
        """A long poll's 204: nothing after ``at`` (yet, or ever: closed)."""
        headers: Headers = ((h.NEXT_OFFSET, at.offset.encode()),
                            (h.UP_TO_DATE, h.TRUE), *_closed(stream))
        if not stream.closed:
            headers += ((h.CURSOR, self._cursor(cursor).encode()),)
        return _answer(204, headers=headers)

    def _cursor(self, given: str | None) -> str:
        return cursor_after(given, self.service.now() / 1e6)

    def _answer_held(self, group: Group) -> Response | None:
        """What the long polls of ``group`` get now that their stream was woken
        (None: nothing yet, they hold on)."""
        stream = group.stream
        try:
            current = self.streams.get(stream.path, self.service.now())
        except PushUpError as e:
            return _error(e)
        if current is not stream:  # deleted, and another created at its path
            return _error(errors.NotFound(f"the stream at {stream.path[:200]} was deleted"))
        read = stream.read(group.at, self.config.max_response_bytes)
        if read.data or read.messages:
            return self._data(group.if_none_match, stream, group.at.offset, read, "long-poll",
                              group.cursor)
        if stream.closed or self.draining:
            return self._caught_up(stream, group.at, group.cursor)
        return None

    def _timed_out(self, group: Group) -> Response:
        return self._caught_up(group.stream, group.at, group.cursor)

    def _sse(self, stream: Stream, at: Position, cursor: str | None,
             client: object) -> Held:
        feed = Feed(stream, at, client,  # type: ignore[arg-type]
                    clock=self.service.clock, budget=self.config.max_response_bytes,
                    cursor=lambda: self._cursor(cursor), draining=lambda: self.draining,
                    fields=h.COMMON)
        feed.start()
        if not feed.ended:
            if len(self.feeds) >= 64:  # pruned as it grows, not only when /stats asks
                self.feeds = {held for held in self.feeds if not held.ended}
            self.feeds.add(feed)
        return Held(feed.stop)


def _relayed(outcome: object) -> Response | Held | Pending:
    """What another node answered (or this one), as the front takes it."""
    if isinstance(outcome, Relayed):
        return Response(outcome.status, outcome.body, outcome.content_type or JSON,
                        outcome.fields)
    if isinstance(outcome, RelayedStream):
        return Held(outcome.cancel)
    assert isinstance(outcome, _ANSWERS), outcome
    return outcome


_ANSWERS = (Response, Held, Pending)  # built once: a union built per call cost ~3 µs a read


def _common(answer: Answer) -> Answer:
    """The desk's answer with the headers of every stream answer."""
    if isinstance(answer, defer.Deferred):
        return answer.addCallback(_common)
    return Response(answer.status, answer.body, answer.content_type, answer.headers + h.COMMON)


def _outcome(outcome: object) -> Response | Held | Pending:
    """A request's outcome through its engine, now or later (``StreamEngine.serve``)."""
    if isinstance(outcome, Response):  # decided here, now: most requests
        return outcome
    if not isinstance(outcome, defer.Deferred):
        return _relayed(outcome)

    def later(value: object) -> object:
        answer = _relayed(value)
        return answer.answer if isinstance(answer, Pending) else answer

    outcome.addCallback(later)
    outcome.addErrback(_refused)
    return Pending(outcome)


def _refused(failure: Failure) -> Response:
    """A later answer that failed: a PushUpError is its answer; anything else
    is a bug, passed on for the front to log and answer 500."""
    if not isinstance(failure.value, PushUpError):
        return failure  # type: ignore[return-value]
    return _error(failure.value)


def _producer(request: Request) -> tuple[str, int, int] | None:
    """The idempotent producer's (id, epoch, seq): all three headers or none."""
    given = [request.headers.get(name) for name in _PRODUCER]
    if all(v is None for v in given):
        return None
    if any(v is None for v in given):
        raise BadRequest("Producer-Id, Producer-Epoch and Producer-Seq go together")
    name, epoch, seq = (v.decode("latin-1") if v is not None else "" for v in given)
    if not name:
        raise BadRequest("Producer-Id is empty")
    return name, decimal(epoch, _name(h.PRODUCER_EPOCH)), decimal(seq, _name(h.PRODUCER_SEQ))
