"""HTTP/1.1 on the connection: the only code that reads HTTP bytes, and the
only code that writes to a socket.

One ``HTTPProtocol`` per connection parses with httptools (llhttp, strict:
no leniency flag is ever set) into ``Request`` values, hands them in order
to the handlers and writes their answers: the bytes of a response come from
``exchange.Writer`` (status line, headers, a shared fan-out response), those
of an event stream from ``sse``; this module frames a stream in chunks and
decides keep-alive and close. It owns every limit that lives on a
connection: head and body sizes, head, idle and send timeouts, pipelining
depth, unread output. ``Front`` is the factory: it counts connections and
answers those past the limit with a 503 of its own.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from typing import Any, cast
from typing import Protocol as TypingProtocol

from httptools import (
    HttpParserCallbackError,
    HttpParserError,
    HttpParserUpgrade,
    HttpRequestParser,
    parse_url,
)
from twisted.internet import defer
from twisted.internet.interfaces import IAddress, IProtocol
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http import toChunk

from pushup._twisted import write_now
from pushup.core import errors
from pushup.core.counters import Counters
from pushup.core.errors import PushUpError
from pushup.core.service import Delivery
from pushup.http.exchange import Held, Pending, Request, Response, Writer, error_response

log = Logger()
MAX_HEADER_BYTES = 16 * 1024  # a head's bytes besides its target (as h11 and Twisted)
MAX_HEADERS = 100
PIPELINE_BYTES = 64 * 1024  # requests read ahead of the one being answered
DISCARD_CAP = 16 * 1024 * 1024  # past this much of an oversized body, hang up
REFUSING_AT_ONCE = 1024  # refusals being answered at a time; past that, hang up
REFUSAL_LINGER = 2.0  # seconds a refused client has to read its 503
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# RFC 9112 §3.2 and RFC 3986 §3.2.2: uri-host [ ":" port ], at least one character
_HOST = re.compile(rb"(\[[0-9A-Za-z:._~!$&'()*+,;=-]+\]|[0-9A-Za-z._~%!$&'()*+,;=-]+)(:[0-9]*)?")
_BAD_HOST = error_response(errors.BadRequest(
    "an HTTP/1.1 request needs exactly one valid Host header", code="bad_request"), close=True)
_HEADERS_TOO_LARGE = error_response(errors.HeadersTooLarge(
    f"a request's headers are at most {MAX_HEADER_BYTES} bytes in at most {MAX_HEADERS} "
    "lines; give a large token as token= in the query"), close=True)
# What a closed connection's parser becomes: a live one holds the connection's
# bound methods (its callbacks), a cycle only a full collection would free, and
# with issue 18's GC thresholds that almost never runs (issue 26: ~2.5 KB kept
# per aborted poll). It parses nothing: Twisted feeds no data after the loss.
_CLOSED_PARSER = HttpRequestParser(object())



class Timer(TypingProtocol):
    """What ``clock.callLater`` returns, as far as a connection uses it (Twisted's
    ``IDelayedCall``, spelled as a typing Protocol so that mypyc, which reads zope
    interfaces without mypy-zope, types it the same)."""

    def active(self) -> bool: ...

    def cancel(self) -> None: ...

    def getTime(self) -> float: ...  # noqa: N802 (Twisted's)

class App(TypingProtocol):
    """What the front needs of the handlers (:class:`pushup.http.handlers.Handlers`)."""

    def admit(self, method: bytes, path: bytes, headers: dict[bytes, bytes]) -> int | Response:
        ...

    def too_large(self, path: bytes) -> PushUpError: ...

    def handle(self, request: Request, client: Any) -> Response | Held | Pending: ...

    def upgrade(self, request: Request) -> IProtocol | None:
        """The protocol that takes over the connection for this request to
        upgrade it, or None (the request is answered, then the connection closes)."""


class _Refuse(Exception):
    """Raised from a parser callback: answer ``response`` and close (``None``:
    the answer is queued already)."""

    def __init__(self, response: Response | None) -> None:
        self.response = response


class Upgraded(TypingProtocol):
    """What the front uses of the protocol a connection is upgraded to (a
    Twisted ``IProtocol``; typed here so the compiled build needs no zope)."""

    def makeConnection(self, transport: Any) -> None: ...  # noqa: N802 (Twisted's names)

    def dataReceived(self, data: bytes) -> None: ...  # noqa: N802

    def connectionLost(self, reason: Any) -> None: ...  # noqa: N802


class Connection(TypingProtocol):
    """What the front uses of its TCP transport: Twisted's ``ITCPTransport``,
    as a consumer of our pauses and a push producer we pause."""

    def write(self, data: bytes) -> None: ...

    def loseConnection(self) -> None: ...  # noqa: N802 (Twisted's names)

    def loseWriteConnection(self) -> None: ...  # noqa: N802

    def abortConnection(self) -> None: ...  # noqa: N802

    def registerProducer(self, producer: object, streaming: bool) -> None: ...  # noqa: N802

    def unregisterProducer(self) -> None: ...  # noqa: N802

    def pauseProducing(self) -> None: ...  # noqa: N802

    def resumeProducing(self) -> None: ...  # noqa: N802


class HTTPProtocol(Protocol):
    """One client connection: requests in, answers out, in order.

    What it guarantees:

    - Answers go out in the order the requests came; a held or pending one
      holds back those pipelined behind it (reading pauses once
      ``PIPELINE_BYTES`` are read ahead).
    - A request it refuses (malformed, too large, a bad Host, a head too
      slow) is answered after those before it, and nothing after it is read;
      the refusals that leave the connection in doubt also close it once sent.
    - At most one request is held at a time. ``respond`` answers it, once: it
      returns False and writes nothing when nothing is held or the connection
      is closing. If the client goes first, that request's ``Held.cancel`` is
      called, once, from ``connectionLost``.
    - An event stream (``open_stream``, then ``send_events``,
      ``when_writable``, ``end_stream``) is the last answer on its
      connection: it ends with it.
    - ``close`` is one-way: what was written is sent, nothing more is
      answered; a client that takes none of it for ``send_timeout`` is
      aborted, as it would be before the close.
    - Time: the head comes within ``header_timeout`` (else 408 and close), a
      body stalls no longer than ``keepalive_timeout``, an idle connection
      closes after ``keepalive_timeout``, and one whose client reads nothing
      for ``send_timeout`` is aborted.
    - Nothing is raised into the reactor: an exception from the handlers, or
      from our own parser callbacks, is logged and answered 500.
    """

    def __init__(self, front: Front) -> None:
        self.front = front
        self._parser = HttpRequestParser(self)
        # requests parsed, not yet answered; a Response is a refusal in order
        self._queue: deque[tuple[Request, bool, bool, int] | Response] = deque()
        self._queued_bytes = 0
        self._reading = True
        self._waiting: Callable[[], None] | None = None  # a held request's cancel
        self._busy = False  # a request is being answered (held)
        self._held = False  # a fan-out asked us to answer nothing more for now
        self._blocked_since: float | None = None  # output not taken by the client
        self._broken = False  # nothing more is parsed on this connection
        self._closing = False
        self._timer: Timer | None = None
        self._stamp = 0.0  # last read or answer
        self._keep = (True, False, False)  # keep-alive, HTTP/1.0, HEAD of the current
        self._cors: bytes | None = None  # the current request's CORS lines (Writer.cors_for)
        self._chunked = False  # an event stream's body is framed in chunks
        self._on_writable: Callable[[], None] | None = None  # a stream waits for the client
        self._upgraded_to: Upgraded | None = None  # what reads the connection after a 101
        self._new_message()

    def _new_message(self) -> None:
        self._in_message = False
        self._in_head = False
        self._head_began = 0.0
        self._head_bytes = 0
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._header_bytes = 0
        self._path = b""
        self._query = b""
        self._limit = 0
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._too_large = False
        # a 413 queued before its body came; the body is still read, and dropped
        self._refused_early: Response | None = None
        self._hosts = 0
        self._repeated_key = False  # two Idempotency-Key lines: refused once read
        self._continue = False

    # -- Twisted calls these -------------------------------------------------

    def connectionMade(self) -> None:
        # The one narrowing of Twisted's Optional[ITransport]: a TCP server transport.
        self.conn = cast(Connection, self.transport)
        self.conn.registerProducer(self, True)
        self._stamp = self.front.clock.seconds()
        self._arm(self._stamp + self.front.keepalive_timeout)

    def dataReceived(self, data: bytes) -> None:
        self.front.counters.bytes_in += len(data)
        if self._upgraded_to is not None:
            self._upgraded_to.dataReceived(data)
            return
        if self._broken:
            return
        self._stamp = self.front.clock.seconds()
        if self._in_head:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except HttpParserUpgrade as e:
            if self._upgraded(data[e.args[0]:]):
                return
            # No protocol for it: answer the request, then close.
            self._broken = True
            last = self._queue[-1] if self._queue else None
            if isinstance(last, tuple):
                self._queue[-1] = (last[0], False, last[2], last[3])
        except HttpParserCallbackError as e:
            cause = e.__context__  # what our callback raised
            if not isinstance(cause, _Refuse):
                log.failure("unexpected error parsing a request",
                            failure=Failure(cause))  # type: ignore[no-untyped-call]
                cause = _Refuse(error_response(PushUpError("the server failed reading this")))
            self._refuse(cause.response)
        except HttpParserError:
            self._refuse(error_response(
                errors.BadRequest("malformed HTTP request", code="bad_request"), close=True))
        if self._in_head:
            # a header in the making (a Last-Event-ID has its own allowance)
            if self._head_bytes - len(self._url) > MAX_HEADER_BYTES + self.front.max_event_id:
                self._refuse(_HEADERS_TOO_LARGE)
            elif not self._broken:
                self._arm(self._head_began + self.front.header_timeout)
        self._dispatch()
        if self._queued_bytes > PIPELINE_BYTES and self._reading:
            self._reading = False
            self.conn.pauseProducing()  # read on once the queue is answered

    def _upgraded(self, rest: bytes) -> bool:
        """Hand the connection to the protocol the app gives for the request
        just read (it alone, nothing before it unanswered); ``rest`` is what
        was read past its head. False if the app has none."""
        last = self._queue[-1] if len(self._queue) == 1 and not self._busy else None
        if not isinstance(last, tuple):
            return False
        protocol = self.front.app.upgrade(last[0])
        if protocol is None:
            return False
        self._queue.clear()
        self._queued_bytes = 0
        self._write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + last[0].headers.get(
            b"upgrade", b"") + b"\r\nConnection: Upgrade\r\n\r\n")
        self._closing = True  # this protocol answers nothing more
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        self.conn.unregisterProducer()
        # The connection stays ours, and counted among the front's (the limit
        # holds, a drain closes it): we hand what we read on to the protocol.
        upgraded = self._upgraded_to = cast(Upgraded, protocol)
        assert self.transport is not None
        upgraded.makeConnection(self.transport)
        if rest:
            upgraded.dataReceived(rest)
        return True

    def connectionLost(self, reason: object = None) -> None:
        self._closing = True
        self.front.lost(self)
        if self._upgraded_to is not None:
            self._upgraded_to.connectionLost(reason)
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self._waiting is not None:
            cancel, self._waiting = self._waiting, None
            cancel()
        self._queue.clear()
        self._parser = _CLOSED_PARSER  # freed by reference counting, not the collector

    # IPushProducer: the transport tells us when the client stops reading.

    def pauseProducing(self) -> None:
        if self._blocked_since is None:
            self._blocked_since = self.front.clock.seconds()
            self._arm(self._blocked_since + self.front.send_timeout)

    def resumeProducing(self) -> None:
        # A closing connection's output moved: what is left has send_timeout again.
        self._blocked_since = self.front.clock.seconds() if self._closing else None
        if self._on_writable is not None:  # an event stream's next page
            callback, self._on_writable = self._on_writable, None
            self.front.clock.callLater(0, self._writable, callback)
        self._dispatch()

    def stopProducing(self) -> None:
        pass  # connectionLost follows

    # -- httptools calls these -------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_message = True
        self._in_head = True
        self._head_began = self._stamp

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self.front.max_target:
            raise _Refuse(error_response(errors.TargetTooLong(
                "the request line is longer than any valid request needs"), close=True))

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"last-event-id" and len(value) <= self.front.max_event_id:
            pass  # any id an event stream issued comes back (its size: sse.max_event_id)
        else:
            self._header_bytes += len(name) + len(value) + 4
            if self._header_bytes > MAX_HEADER_BYTES:
                raise _Refuse(_HEADERS_TOO_LARGE)
        if name == b"host":
            self._hosts += 1
        headers = self._headers
        if name in headers:
            if name == b"idempotency-key":
                self._repeated_key = True
            value = headers[name] + b", " + value
        elif len(headers) >= MAX_HEADERS:
            raise _Refuse(_HEADERS_TOO_LARGE)
        headers[name] = value

    def on_headers_complete(self) -> None:
        self._in_head = False
        http10 = self._parser.get_http_version() == "1.0"
        host = self._headers.get(b"host")
        if (self._hosts > 1 or (host is None and not http10)
                or (host is not None and not _HOST.fullmatch(host))):
            raise _Refuse(_BAD_HOST)
        url = self._url
        if url[:1] == b"/":
            path, _, query = url.partition(b"?")
        else:  # absolute form (RFC 9112 §3.2.2), or '*'
            try:
                parsed = parse_url(url)
            except HttpParserError:
                parsed = None
            if parsed is None or not parsed.path:
                raise _Refuse(error_response(errors.NotFound(
                    f"no such path: {url.decode('latin-1')[:100]}")))
            # httptools' stub says `query: bytes`, but it is None when absent: read
            # untyped, or the compiled build checks for bytes and fails
            given: bytes | None = cast(Any, parsed).query
            path, query = parsed.path, (b"" if given is None else given)
        self._path, self._query = path, query
        verdict = self.front.app.admit(self._parser.get_method(), path, self._headers)
        if isinstance(verdict, Response):
            raise _Refuse(verdict)
        self._limit = verdict
        # an HTTP/1.0 client may not know 100 Continue: its expectation is ignored
        expects = (not http10
                   and self._headers.get(b"expect", b"").lower() == b"100-continue")
        length = self._headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > verdict:
            refusal = error_response(self.front.app.too_large(path), close=True)
            if expects:  # the client waits before sending the body: no body comes
                raise _Refuse(refusal)
            # Answer now; the body is still read (and dropped, up to DISCARD_CAP)
            # before the close, as closing on unread bytes would send a reset
            # that can destroy the answer before the client reads it.
            self._too_large = True
            self._refused_early = refusal
            self._queue.append(refusal)
        elif expects:
            if not self._queue and not self._busy:
                self._write(_CONTINUE)
            else:
                self._continue = True  # after the answers before it

    def on_body(self, chunk: bytes) -> None:
        self._body_bytes += len(chunk)
        if not self._too_large:
            if self._body_bytes <= self._limit:
                self._body.append(chunk)
                return
            # A chunked body has no length to refuse it by before it comes:
            # it is answered as soon as it passes the limit, then read and
            # dropped like one announced too large (see on_headers_complete).
            self._too_large = True
            self._body = []
            self._refused_early = error_response(self.front.app.too_large(self._path),
                                                 close=True)
            self._queue.append(self._refused_early)
        if self._body_bytes > DISCARD_CAP:
            if self._refused_early is not None:
                raise _Refuse(None)  # answered already: stop reading
            raise _Refuse(error_response(self.front.app.too_large(self._path), close=True))

    def on_message_complete(self) -> None:
        if self._refused_early is not None:
            self._refused_early = None
            self._broken = True
            self._close_if_answered()
        elif self._repeated_key:
            # The field is a single item (the IETF draft): two lines are not one key.
            self._queue.append(error_response(errors.BadIdempotencyKey(
                "give one Idempotency-Key header, not several")))
            self._broken = True
        else:
            body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
            method = self._parser.get_method()
            request = Request(method, self._path, self._query, self._headers, body)
            size = len(self._url) + len(body)
            self._queue.append((request, self._parser.should_keep_alive(),
                                self._parser.get_http_version() == "1.0", size))
            self._queued_bytes += size
        self._new_message()

    # -- answering -----------------------------------------------------------

    def _dispatch(self) -> None:
        """Answer queued requests in order, until one is held."""
        queue = self._queue
        while queue and not (self._busy or self._held or self._closing
                             or self._blocked_since is not None):
            entry = queue.popleft()
            if isinstance(entry, Response):
                self._keep = (False, False, False)
                self._cors = None
                self._send(entry)
                return
            request, keep_alive, http10, size = entry
            self._queued_bytes -= size
            self._keep = (keep_alive, http10, request.method == b"HEAD")
            self._cors = self.front.writer.cors_for(request.headers.get(b"origin"))
            try:
                result = self.front.app.handle(request, self)
            except Exception:
                log.failure("unexpected error answering {path}", path=request.path[:200])
                result = error_response(PushUpError("the server failed; it keeps serving"))
            if isinstance(result, Held):
                self._busy = True
                self._waiting = result.cancel
                return
            if isinstance(result, Pending):
                self._busy = True
                result.answer.addBoth(self._answer_later)
                return
            self._send(result)
        if not queue and not self._busy:
            if self._continue:
                self._continue = False
                self._write(_CONTINUE)
            if not self._reading and not self._closing:
                self._reading = True
                self.conn.resumeProducing()

    def _send(self, response: Response) -> None:
        keep_alive, http10, head = self._keep
        keep = keep_alive and not response.close and not self.front.draining
        if keep:
            connection = b"keep-alive" if http10 else b""
        else:
            connection = b"close"
        front = self.front
        front.writer.tick(front.clock.seconds())
        self._write(front.writer.render(response, head, connection, self._cors))
        if not keep and response is not self._refused_early:  # else once its body is read
            self.close()

    def _answer_later(self, outcome: Response | Failure) -> None:
        """A ``Pending`` answer is ready: send it and read on."""
        if isinstance(outcome, Failure):
            log.failure("unexpected error answering a request", failure=outcome)
            outcome = error_response(PushUpError("the server failed; it keeps serving"))
        self._busy = False
        if self._closing:
            return
        self._stamp = now = self.front.clock.seconds()
        self._send(outcome)
        if self._timer is None:
            self._arm(now + self.front.keepalive_timeout)
        self._dispatch()

    def respond(self, delivery: Delivery, hold: bool = False) -> bool:
        """Answer the held subscribe with ``delivery`` (see ``service.Subscriber``)."""
        if self._waiting is None or self._closing:
            return False
        self._waiting = None
        self._busy = False
        front = self.front
        self._stamp = now = front.clock.seconds()
        keep_alive, http10, head = self._keep
        front.writer.tick(now)
        if keep_alive and not http10 and not head and not front.draining and self._cors is None:
            self._write(front.writer.shared(delivery))
        else:
            self._send(Response(200, front.writer.shared_body(delivery)))
        if self._timer is None:
            self._arm(now + front.keepalive_timeout)
        if hold:
            self._held = True
            front.held.append(self)
        elif self._queue:
            # not from inside the service's fan-out loop: on the next turn
            front.clock.callLater(0, self._dispatch)
        return True

    # An event stream (pushup.http.sse) writes through these; it ends with the connection.

    def open_stream(self) -> None:
        """Answer 200 text/event-stream: chunked on HTTP/1.1 (each write reaches
        a reader as it comes), delimited by the close on HTTP/1.0."""
        front = self.front
        front.writer.tick(front.clock.seconds())
        self._chunked = not self._keep[1]
        extra = ((b"Transfer-Encoding", b"chunked"),) if self._chunked else ()
        self._write(front.writer.head(200, b"text/event-stream; charset=utf-8", None, extra,
                                      connection=b"close", cors=self._cors))

    def send_events(self, data: bytes) -> bool:
        if self._closing:
            return False
        self._write(b"".join(toChunk(data)) if self._chunked else data)
        return True

    def end_stream(self) -> None:
        if not self._closing:
            if self._chunked:
                self._write(b"".join(toChunk(b"")))
            self.close()

    def when_writable(self, callback: Callable[[], None]) -> None:
        """``callback`` on a later turn, once the transport has taken what was
        written (see ``resumeProducing``); never if the connection goes first."""
        if self._blocked_since is None:
            self.front.clock.callLater(0, self._writable, callback)
        else:
            self._on_writable = callback

    def _writable(self, callback: Callable[[], None]) -> None:
        if not self._closing:
            callback()

    def release(self) -> None:
        """The fan-out that held us is done: answer what is queued."""
        self._held = False
        self._dispatch()

    def _write(self, data: bytes) -> None:
        self.front.counters.bytes_out += len(data)
        write_now(self.transport, data)

    def _refuse(self, response: Response | None) -> None:
        """Stop parsing; answer what came before, then this, then close."""
        self._broken = True
        self._in_head = False
        if response is not None:
            self._queue.append(response)
        elif self._refused_early is not None:
            self._refused_early = None
            self._close_if_answered()

    def _close_if_answered(self) -> None:
        """A body refused before it came is read: close once its 413 is sent."""
        if not self._queue and not self._busy:
            self.close()

    def close(self) -> None:
        """Close once the answers written so far are sent; abort if they are
        not taken within ``send_timeout`` (the transport would wait for good
        on a client that reads nothing, e.g. an event stream ended by its
        token's expiry, and hold its unsent output and a connection slot)."""
        self._closing = True
        self.conn.loseConnection()
        if self._upgraded_to is None:  # an upgraded protocol keeps its own time
            if self._blocked_since is None:
                self._blocked_since = self.front.clock.seconds()
            self._arm(self._blocked_since + self.front.send_timeout)

    # -- time ------------------------------------------------------------------

    def _arm(self, at: float) -> None:
        """Make sure the timer fires no later than ``at``."""
        timer = self._timer
        if timer is not None and timer.active():
            if timer.getTime() <= at:
                return
            timer.cancel()
        clock = self.front.clock
        self._timer = clock.callLater(max(0.0, at - clock.seconds()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        front = self.front
        now = front.clock.seconds()
        if self._blocked_since is not None:  # or closing: output not taken since
            due = self._blocked_since + front.send_timeout
            if now >= due:
                log.info("closing a connection whose client reads nothing")
                self.conn.abortConnection()
                return
        elif self._closing:
            return
        elif self._busy or self._queue:
            return  # being answered: the service's timeout answers a held poll
        elif self._in_message:
            # the head within header_timeout; a body stalls no longer than a keep-alive
            due = (self._head_began + front.header_timeout if self._in_head
                   else self._stamp + front.keepalive_timeout)
            if now >= due and self._refused_early is not None:  # its 413 is sent already
                self.close()
                return
            if now >= due:
                self._broken = True
                self._keep = (False, False, False)
                self._send(error_response(errors.RequestTimeout(
                    f"the request did not arrive within {front.header_timeout:g} s"), True))
                return
        else:
            due = self._stamp + front.keepalive_timeout
            if now >= due:
                self.close()
                return
        self._arm(due)


class _Refusal(Protocol):
    """Past the connection limit: answer 503 at once, let the client read it, close."""

    def __init__(self, front: Front) -> None:
        self.front = front

    def connectionMade(self) -> None:
        self.front.refusing += 1
        self.front.counters.refused += 1
        self.conn = cast(Connection, self.transport)
        self.conn.write(self.front.refusal)
        self.conn.loseWriteConnection()  # FIN after the answer; read until theirs
        self.timer = self.front.clock.callLater(REFUSAL_LINGER, self.conn.abortConnection)

    def dataReceived(self, data: bytes) -> None:
        pass  # their request: read and dropped, so closing sends no RST over the 503

    def connectionLost(self, reason: object = None) -> None:
        self.front.refusing -= 1
        if self.timer.active():
            self.timer.cancel()


class Front(Factory):
    """Builds a protocol per connection, up to ``limit`` open; counts them."""

    noisy = False

    def __init__(self, app: App, writer: Writer, counters: Counters, clock: Any, *,
                 limit: int, max_target: int, header_timeout: float,
                 keepalive_timeout: float, send_timeout: float, max_event_id: int = 0) -> None:
        self.app = app
        self.writer = writer
        self.counters = counters
        self.clock = clock
        self.limit = limit
        self.max_target = max_target
        self.max_event_id = max_event_id  # a Last-Event-ID this long is not counted
        self.header_timeout = header_timeout
        self.keepalive_timeout = keepalive_timeout
        self.send_timeout = send_timeout
        self.draining = False
        self.protocols: set[HTTPProtocol] = set()
        self.held: list[HTTPProtocol] = []  # answered during a fan-out, not read on
        self.refusing = 0
        writer.tick(clock.seconds())
        self.refusal = writer.canned(errors.Unavailable(
            f"this node holds its limit of {limit} connections; retry later"))
        self._on_empty: list[defer.Deferred[None]] = []

    def buildProtocol(self, addr: IAddress | None) -> Protocol | None:
        if len(self.protocols) >= self.limit:
            if self.refusing >= REFUSING_AT_ONCE:
                self.counters.refused += 1
                return None  # Twisted closes the socket at once
            return _Refusal(self)
        protocol = HTTPProtocol(self)
        self.protocols.add(protocol)
        self.counters.connections = len(self.protocols)
        return protocol

    def lost(self, protocol: HTTPProtocol) -> None:
        self.protocols.discard(protocol)
        self.counters.connections = len(self.protocols)
        if not self.protocols:
            waiting, self._on_empty = self._on_empty, []
            for d in waiting:
                d.callback(None)

    def release(self) -> None:
        """A fan-out is done: drop its cached responses; its clients' next
        requests may be answered."""
        self.writer.release_shared()
        held, self.held = self.held, []
        for protocol in held:
            protocol.release()

    def close_all(self, upgraded: bool = True) -> defer.Deferred[None]:
        """Close every connection once its pending output is sent; those
        upgraded to another protocol (a peer's replication stream) only with
        ``upgraded`` (a draining node takes what its peers flush to it first)."""
        self.draining = True
        for protocol in list(self.protocols):
            if upgraded or protocol._upgraded_to is None:
                protocol.close()
        d: defer.Deferred[None] = defer.Deferred()
        if self.protocols:
            self._on_empty.append(d)
        else:
            d.callback(None)
        return d
