"""What a request and a response are, and how a response becomes bytes.

A ``Request`` is the value the HTTP front hands to the handlers; a
``Response`` is the value they hand back (or ``Held``: answered later, or
``Pending``: a ``Deferred`` fires with it). The ``Writer`` turns responses
into HTTP/1.1 bytes (the status line, our standard headers and a ``Date``
rebuilt once a second), and renders a fan-out's ``Delivery`` once for all
who get it. This module is pure: no sockets, no reactor; the clock's reading
is an argument.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Final

from twisted.internet.defer import Deferred

from pushup.core.errors import MethodNotAllowed, PushUpError, Unavailable
from pushup.core.model import dumps
from pushup.core.service import Delivery
from pushup.http.render import poll_body

JSON = b"application/json; charset=utf-8"
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_SHARED_CACHE = 64  # fan-out deliveries whose whole response is kept for reuse...
_SHARED_BYTES = 16 * 1024 * 1024  # ...and their bytes in all (the newest is always kept)


class Request:
    """One parsed request: raw (still percent-encoded) path and query string,
    headers keyed by lower-case name (repeats joined with ", "), whole body.

    A value (its fields are Final), but not a frozen dataclass: one is made
    per request, and a frozen dataclass's ``__init__`` costs ~0.8 µs of a
    ~25 µs publish, compiled (``object.__setattr__`` per field)."""

    def __init__(self, method: bytes, path: bytes, query: bytes,
                 headers: dict[bytes, bytes], body: bytes = b"") -> None:
        self.method: Final = method
        self.path: Final = path
        self.query: Final = query
        self.headers: Final = headers
        self.body: Final = body

    def _fields(self) -> tuple[bytes, bytes, bytes, dict[bytes, bytes], bytes]:
        return self.method, self.path, self.query, self.headers, self.body

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        return self._fields() == other._fields()

    def __repr__(self) -> str:
        return f"Request{self._fields()!r}"

    def header(self, name: bytes) -> str:
        """A header's value as text ('' when absent)."""
        return self.headers.get(name, b"").decode("latin-1")


class Response:
    """A complete answer. ``close``: the connection ends after it.

    A value with Final fields, not a frozen dataclass, as ``Request``: one is
    made per answer (its ``__init__`` was ~0.6 µs of a publish, compiled)."""

    def __init__(self, status: int, body: bytes | None = None, content_type: bytes = JSON,
                 headers: tuple[tuple[bytes, bytes], ...] = (), close: bool = False) -> None:
        self.status: Final = status
        self.body: Final = body
        self.content_type: Final = content_type
        self.headers: Final = headers
        self.close: Final = close

    def _fields(self) -> tuple[int, bytes | None, bytes, tuple[tuple[bytes, bytes], ...], bool]:
        return self.status, self.body, self.content_type, self.headers, self.close

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Response):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return f"Response{self._fields()!r}"


class Held:
    """The request waits: the client (a ``service.Subscriber``, or an event
    stream's ``StreamClient``) is answered through its own methods later.
    ``cancel`` is called once if the client goes away first (it forgets the
    hold and any timer); never after the answer.

    A value with a Final field, not a frozen dataclass, as ``Response``: one
    is made per poll held (its generated ``__init__`` ran interpreted)."""

    __slots__ = ("cancel",)

    def __init__(self, cancel: Callable[[], None]) -> None:
        self.cancel: Final = cancel

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Held):
            return NotImplemented
        return bool(self.cancel == other.cancel)

    def __hash__(self) -> int:
        return hash(self.cancel)

    def __repr__(self) -> str:
        return f"Held(cancel={self.cancel!r})"


@dataclass(frozen=True, slots=True)
class Pending:
    """The answer comes later: ``answer`` fires with the Response, e.g. a 201
    once the backplane acknowledges a publish, or with a ``Held`` (a poll
    that waited for its channels to be read, then is held); a ``Failure``
    is a bug: the front logs it and answers 500."""

    answer: Deferred[Response | Held]


def error_body(e: PushUpError) -> bytes:
    """The contract's one error shape (and what an error says besides, as
    ``fields``: a claimed subscription's holder)."""
    return dumps({"error": {"code": e.code, "message": e.message,
                            **getattr(e, "fields", {})}})


def error_response(e: PushUpError, close: bool = False) -> Response:
    """The one place a ``PushUpError`` becomes an HTTP answer.

    Server faults (5xx other than 503) close the connection: its state is
    not to be trusted after them.
    """
    headers: tuple[tuple[bytes, bytes], ...] = ()
    if isinstance(e, MethodNotAllowed):
        headers = ((b"Allow", ", ".join(e.allowed).encode()),)
    if isinstance(e, Unavailable) and e.retry_after is not None:
        headers = ((b"Retry-After", b"%d" % e.retry_after),)
    if e.status >= 500 and e.status != 503:
        close = True
    return Response(e.status, error_body(e), headers=headers, close=close)


class Writer:
    """Serialises responses with the headers every answer carries."""

    def __init__(self, cors_origins: tuple[str, ...] = ()) -> None:
        # One origin (or *): the same header on every answer. Several: each
        # answer names the request's Origin when it is one of them, and says
        # ``Vary: Origin`` (a cache must not give one page's answer to another).
        self._several = len(cors_origins) > 1
        self.cors = (b"Vary: Origin\r\n" if self._several else
                     b"Access-Control-Allow-Origin: %s\r\n" % cors_origins[0].encode()
                     if cors_origins else b"")
        self._allowed = {o.encode(): b"Access-Control-Allow-Origin: %s\r\nVary: Origin\r\n"
                         % o.encode() for o in cors_origins} if self._several else {}
        self._second = -1
        self._date = b""
        # (status, content type) -> the head's lines up to Content-Length, built
        # once per second (they hold the Date): most answers share a few of them
        self._starts: dict[tuple[int, bytes | None], bytes] = {}
        # id(delivery) -> (the delivery, kept so its id is not reused; its bytes)
        self._bodies: dict[int, tuple[Delivery, bytes]] = {}  # this fan-out's bodies
        self._shared: dict[int, tuple[Delivery, bytes]] = {}  # their whole responses
        self._shared_bytes = 0
        self._answer: tuple[Response, bytes] | None = None  # see ``shared_answer``

    def cors_for(self, origin: bytes | None) -> bytes | None:
        """The CORS lines of an answer to a request from ``origin`` (its
        Origin header); None: the writer's own (``self.cors``), the same for all."""
        return self._allowed.get(origin) if self._several and origin is not None else None

    def tick(self, now: float) -> None:
        """Keep ``Date`` current; call with the clock's reading before writing."""
        second = int(now)
        if second != self._second:
            self._second = second
            self._date = formatdate(second, usegmt=True).encode()
            self._starts.clear()
            self._answer = None

    def head(self, status: int, content_type: bytes | None, length: int | None,
             extra: tuple[tuple[bytes, bytes], ...] = (), connection: bytes = b"",
             cors: bytes | None = None) -> bytes:
        """Status line and headers, ending with the blank line (``cors``: the
        request's, from ``cors_for``; the writer's own when None). A
        ``Cache-Control`` in ``extra`` replaces our ``no-store``."""
        if extra and any(name == b"Cache-Control" for name, _ in extra):
            start = self._start(status, content_type, caching=False)
        else:
            kept = self._starts.get((status, content_type))
            start = self._start(status, content_type) if kept is None else kept
            if length is not None and not extra and not connection and cors is None:
                return start + b"Content-Length: %d\r\n%s\r\n" % (length, self.cors)
        parts = [start]
        if length is not None:
            parts.append(b"Content-Length: %d\r\n" % length)
        for name, value in extra:
            parts.append(name + b": " + value + b"\r\n")
        if connection:
            parts.append(b"Connection: " + connection + b"\r\n")
        parts.append(self.cors if cors is None else cors)
        parts.append(b"\r\n")
        return b"".join(parts)

    def _start(self, status: int, content_type: bytes | None, caching: bool = True) -> bytes:
        """The head's first lines, to its Content-Type, kept for this second
        (``caching`` False: without our ``Cache-Control``, for an answer that
        brings its own, and not kept)."""
        start = (b"HTTP/1.1 %d %s\r\nServer: PushUp\r\nDate: %s\r\n%s"
                 b"X-Content-Type-Options: nosniff\r\n"
                 % (status, _REASONS.get(status, b"Unknown"), self._date,
                    b"Cache-Control: no-store\r\n" if caching else b""))
        if content_type is not None:
            start += b"Content-Type: " + content_type + b"\r\n"
        if caching and len(self._starts) < 64:  # statuses and types are ours; bounded all the same
            self._starts[(status, content_type)] = start
        return start

    def render(self, response: Response, head_only: bool = False,
               connection: bytes = b"", cors: bytes | None = None) -> bytes:
        """The whole response; ``head_only`` for HEAD (length kept, no body)."""
        body = response.body
        if body is None:
            no_length = response.status in (204, 304) or response.status < 200
            return self.head(response.status, None, None if no_length else 0,
                             response.headers, connection, cors)
        head = self.head(response.status, response.content_type, len(body),
                         response.headers, connection, cors)
        return head if head_only else head + body

    def shared_answer(self, response: Response) -> bytes:
        """``render(response)`` for a plain keep-alive answer, kept for the
        next connection it answers: the long polls of a Durable Stream woken
        together are answered in turn with one ``Response``, rendered once
        (the last one is kept, until the ``Date`` changes)."""
        kept = self._answer
        if kept is not None and kept[0] is response:
            return kept[1]
        raw = self.render(response)
        self._answer = (response, raw)
        return raw

    def shared(self, delivery: Delivery) -> bytes:
        """A plain keep-alive 200 answering ``delivery``, built once per delivery.

        A fan-out hands the same ``Delivery`` object to thousands of
        subscribers; each gets the same bytes. Its body is rendered once and
        kept until ``release_shared`` (the fan-out's end); the whole response
        is kept as long, or until the cache of responses is past its count or
        byte bound (then it is rebuilt from the kept body).
        """
        key = id(delivery)
        cached = self._shared.get(key)
        if cached is not None and cached[0] is delivery:
            return cached[1]
        kept = self._bodies.get(key)  # (inlined shared_body: this is the fan-out's path)
        body = kept[1] if kept is not None and kept[0] is delivery else self._render(delivery)
        raw = self.head(200, JSON, len(body)) + body
        if (len(self._shared) >= _SHARED_CACHE
                or self._shared_bytes + len(raw) > _SHARED_BYTES):
            self._shared.clear()
            self._shared_bytes = 0
        self._shared[key] = (delivery, raw)
        self._shared_bytes += len(raw)
        return raw

    def shared_body(self, delivery: Delivery) -> bytes:
        """The body of ``shared(delivery)``, rendered once per delivery (also
        for an answer whose head is not the plain keep-alive one: HTTP/1.0,
        HEAD, a close). Bodies are kept until ``release_shared``: no more of
        them than the deliveries the fan-out holds."""
        cached = self._bodies.get(id(delivery))
        if cached is not None and cached[0] is delivery:
            return cached[1]
        return self._render(delivery)

    def _render(self, delivery: Delivery) -> bytes:
        body = poll_body(delivery)
        self._bodies[id(delivery)] = (delivery, body)
        return body

    @property
    def shared_bytes(self) -> int:
        """Bytes of cached fan-out responses (0 between fan-outs)."""
        return self._shared_bytes

    def release_shared(self) -> None:
        """Forget every cached fan-out body and response: once a fan-out ends
        its deliveries are never answered again, and keeping them would hold
        their bytes (and the deliveries) until the next one."""
        self._shared.clear()
        self._bodies.clear()
        self._shared_bytes = 0

    def canned(self, e: PushUpError) -> bytes:
        """A whole closing error response, for answers outside any request."""
        return self.render(error_response(e), connection=b"close")
