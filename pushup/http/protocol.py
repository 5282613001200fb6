"""HTTP/1.1 on the connection: the only code that reads HTTP bytes, and the
only code that writes HTTP to a socket (but for ``front``'s canned 503; after
a 101, the protocol the connection is handed to writes its own).

One ``HTTPProtocol`` per connection parses with httptools (llhttp, strict:
no leniency flag is ever set) into ``Request`` values, hands them in order
to the handlers and writes their answers: the bytes of a response come from
``exchange.Writer`` (status line, headers, a shared fan-out response), those
of an event stream from its feed (``sse``, ``stream_sse``), framed by
``framing``. It enforces the limits that live on a connection: head and body
sizes, head, idle and send timeouts; how far reading runs ahead of the
answers, whether the client takes what is written, and the one timer are
``flow``'s. It keeps connection state only: the request being read is an
``incoming.Incoming``, one read and not yet answered a ``framing.Queued``;
where the connection is, two phases moved by ``phase``'s tables; after a
101, the protocol it relays to (``upgrade``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final, cast

from httptools import HttpParserCallbackError, HttpParserError, HttpParserUpgrade, HttpRequestParser
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from pushup._twisted import write_now
from pushup.core import errors
from pushup.core.errors import PushUpError
from pushup.core.service import Delivery
from pushup.http import framing, phase
from pushup.http.exchange import Held, Pending, Request, Response, error_response
from pushup.http.flow import PIPELINE_BYTES as PIPELINE_BYTES  # re-exported: the read-ahead
from pushup.http.flow import Flow
from pushup.http.framing import CLOSE, CLOSE_DELIMITED, REFUSAL, Queued, StreamFraming
from pushup.http.incoming import HEADERS_TOO_LARGE, Incoming, Refuse
from pushup.http.phase import Answer, Answering, Read, answering_one, finished
from pushup.http.seams import Connection, Host
from pushup.http.upgrade import Upgraded, hand_over, switching_protocols

log = Logger()
DISCARD_CAP = 16 * 1024 * 1024  # past this much of an oversized body, hang up
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# A closed connection's parser: the live one holds our bound methods, a cycle only
# a full collection frees (issue 26: ~2.5 KB kept per aborted poll). It parses nothing.
_CLOSED_PARSER: Final = HttpRequestParser(object())
READY: Final = phase.READY
HELD: Final = phase.HELD
PAUSED: Final = phase.PAUSED
HEAD: Final = phase.HEAD
BODY: Final = phase.BODY
STOPPED: Final = phase.STOPPED


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

    def __init__(self, front: Host) -> None:
        self.front = front
        # read on every request: fields here, where the front (typed by a seam) is a lookup
        self._app, self._writer, self._counters = front.app, front.writer, front.counters
        self._clock, self._max_event_id = front.clock, front.max_event_id
        self._parser = HttpRequestParser(self)
        self._reading = phase.IDLE  # a phase.Reading, by its number
        self._answering = READY  # a phase.Answering, by its number
        self._incoming = Incoming()
        # requests parsed, not yet answered; a Response is a refusal in order
        self._queue: deque[Queued | Response] = deque()
        self._queued_bytes = 0
        self._waiting: Callable[[], None] | None = None  # a held request's cancel
        # read-ahead, output the client has not taken, the timer (pushup.http.flow)
        self._flow = Flow(self._clock, self._on_timer)
        self._stamp = 0.0  # last read or answer
        self._terms = REFUSAL  # those of the request being answered
        self._cors: bytes | None = None  # the current request's CORS lines (Writer.cors_for)
        self._stream: StreamFraming = CLOSE_DELIMITED  # an event stream's (once open)
        self._upgraded_to: Upgraded | None = None  # what reads the connection after a 101

    # -- Twisted calls these -------------------------------------------------

    def connectionMade(self) -> None:
        # The one narrowing of Twisted's Optional[ITransport]: a TCP server transport.
        self.conn = cast(Connection, self.transport)
        # Each answer and each event is written whole, once: Nagle's algorithm
        # would hold the next one back until the client's (delayed, up to 40 ms)
        # ACK of the last. (A worker's private Unix socket has no such option.)
        no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if no_delay is not None:
            no_delay(True)
        self.conn.registerProducer(self, True)
        self._stamp = self._clock.seconds()
        self._flow.arm(self._stamp + self.front.keepalive_timeout)

    def dataReceived(self, data: bytes) -> None:
        self._counters.bytes_in += len(data)
        if self._upgraded_to is not None:
            self._upgraded_to.dataReceived(data)
            return
        if self._reading == STOPPED:
            return
        self._stamp = self._clock.seconds()
        if self._reading == HEAD:
            self._incoming.head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except HttpParserUpgrade as e:
            if self._upgraded(data[e.args[0]:]):
                return
            # No protocol for it: answer the request, then close.
            self._reading = phase.read_after(self._reading, Read.STOP)
            last = self._queue[-1] if self._queue else None
            if isinstance(last, Queued):
                self._queue[-1] = last.closing()
        except HttpParserCallbackError as e:
            cause = e.__context__  # what our callback raised
            if not isinstance(cause, Refuse):
                log.failure("unexpected error parsing a request",
                            failure=Failure(cause))  # type: ignore[no-untyped-call]
                cause = Refuse(error_response(PushUpError("the server failed reading this")))
            self._refuse(cause.response)
        except HttpParserError:
            self._refuse(error_response(
                errors.BadRequest("malformed HTTP request", code="bad_request"), close=True))
        if self._reading == HEAD:
            if self._incoming.head_too_large(self._max_event_id):
                self._refuse(HEADERS_TOO_LARGE)
            else:
                self._flow.arm(self._incoming.head_began + self.front.header_timeout)
        self._dispatch()
        self._flow.read_ahead(self._queued_bytes, self.conn)

    def _upgraded(self, rest: bytes) -> bool:
        """Hand the connection to the protocol the app gives for the request
        just read (it alone, nothing before it unanswered); ``rest`` is what
        was read past its head. False if the app has none."""
        last = self._queue[-1] if len(self._queue) == 1 else None
        if not isinstance(last, Queued) or self._answering not in (READY, PAUSED):
            return False
        protocol = self._app.upgrade(last.request)
        if protocol is None:
            return False
        self._queue.clear()
        self._queued_bytes = 0
        self._write(switching_protocols(last.request))
        # this protocol answers nothing more
        self._answering = phase.answer_after(self._answering, Answer.UPGRADE)
        self._flow.stop()
        self.conn.unregisterProducer()
        # The connection stays ours, and counted among the front's (the limit
        # holds, a drain closes it): we hand what we read on to the protocol.
        assert self.transport is not None
        self._upgraded_to = hand_over(protocol, self.transport, rest)
        return True

    def connectionLost(self, reason: object = None) -> None:
        self._answering = phase.answer_after(self._answering, Answer.LOST)
        self.front.lost(self)
        if self._upgraded_to is not None:
            self._upgraded_to.connectionLost(reason)
        self._flow.lost()
        if self._waiting is not None:
            cancel, self._waiting = self._waiting, None
            cancel()
        self._queue.clear()
        self._parser = _CLOSED_PARSER  # freed by reference counting, not the collector

    # IPushProducer: the transport tells us when the client stops reading.

    def pauseProducing(self) -> None:
        self._flow.output_blocked(self.front.send_timeout)

    def resumeProducing(self) -> None:
        self._flow.output_taken(finished(self._answering), self._writable)
        self._dispatch()

    def stopProducing(self) -> None:
        pass  # connectionLost follows

    # -- httptools calls these -------------------------------------------------

    def on_message_begin(self) -> None:
        self._reading = phase.read_after(self._reading, Read.BEGIN)
        self._incoming.head_began = self._stamp

    def on_url(self, url: bytes) -> None:
        self._incoming.add_url(url, self.front.max_target)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._incoming.add_header(name.lower(), value, self._max_event_id)

    def on_headers_complete(self) -> None:
        self._reading = phase.read_after(self._reading, Read.HEAD_DONE)
        incoming = self._incoming
        http10 = self._parser.get_http_version() == "1.0"
        incoming.check_head(http10)
        path = incoming.path
        verdict = self._app.admit(self._parser.get_method(), path, incoming.headers)
        if isinstance(verdict, Response):
            raise Refuse(verdict)
        incoming.limit = verdict
        # an HTTP/1.0 client may not know 100 Continue: its expectation is ignored
        expects = (not http10
                   and incoming.headers.get(b"expect", b"").lower() == b"100-continue")
        length = incoming.headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > verdict:
            refusal = error_response(self._app.too_large(path), close=True)
            if expects:  # the client waits before sending the body: no body comes
                raise Refuse(refusal)
            # Answer now; the body is still read (and dropped, up to DISCARD_CAP)
            # before the close, as closing on unread bytes would send a reset
            # that can destroy the answer before the client reads it.
            incoming.too_large = True
            incoming.refused_early = refusal
            self._queue.append(refusal)
        elif expects:
            if not self._queue and (self._answering == READY or self._answering == PAUSED):
                self._write(_CONTINUE)
            else:
                incoming.expects_continue = True  # after the answers before it

    def on_body(self, chunk: bytes) -> None:
        incoming = self._incoming
        if incoming.take(chunk):
            return
        if incoming.refused_early is None:
            # A chunked body has no length to refuse it by before it comes:
            # it is answered as soon as it passes the limit, then read and
            # dropped like one announced too large (see on_headers_complete).
            incoming.refused_early = error_response(self._app.too_large(incoming.path),
                                                    close=True)
            self._queue.append(incoming.refused_early)
        if incoming.body_bytes > DISCARD_CAP:
            raise Refuse(None)  # answered already: stop reading

    def on_message_complete(self) -> None:
        incoming = self._incoming
        self._incoming = Incoming()  # the next message's
        if incoming.refused_early is not None:
            self._reading = phase.read_after(self._reading, Read.STOP)
            self._close_if_answered()
        elif incoming.repeated_key:
            # The field is a single item (the IETF draft): two lines are not one key.
            self._queue.append(error_response(errors.BadIdempotencyKey(
                "give one Idempotency-Key header, not several")))
            self._reading = phase.read_after(self._reading, Read.STOP)
        else:
            self._reading = phase.read_after(self._reading, Read.DONE)
            body = incoming.whole_body()
            parser = self._parser
            method = parser.get_method()
            request = Request(method, incoming.path, incoming.query, incoming.headers, body)
            size = len(incoming.url) + len(body)
            self._queue.append(Queued(request, framing.terms(
                parser.should_keep_alive(), incoming.http10, method == b"HEAD"), size))
            self._queued_bytes += size

    # -- answering -----------------------------------------------------------

    def _dispatch(self) -> None:
        """Answer queued requests in order, until one is held."""
        queue = self._queue
        flow = self._flow
        while queue and self._answering == READY and flow.blocked_since is None:
            entry = queue.popleft()
            if isinstance(entry, Response):
                self._terms = REFUSAL
                self._cors = None
                self._send(entry)
                return
            request = entry.request
            self._queued_bytes -= entry.size
            self._terms = entry.terms
            self._cors = self._writer.cors_for(request.headers.get(b"origin"))
            try:
                result = self._app.handle(request, self)
            except Exception:
                log.failure("unexpected error answering {path}", path=request.path[:200])
                result = error_response(PushUpError("the server failed; it keeps serving"))
            if isinstance(result, Held):
                self._answering = phase.answer_after(self._answering, Answer.HOLD)
                self._waiting = result.cancel
                return
            if isinstance(result, Pending):
                self._answering = phase.answer_after(self._answering, Answer.PEND)
                result.answer.addBoth(self._answer_later)
                return
            self._send(result)
        if not queue and (self._answering == READY or self._answering == PAUSED):
            if self._incoming.expects_continue:
                self._incoming.expects_continue = False
                self._write(_CONTINUE)
            flow.read_on(self.conn)

    def _send(self, response: Response) -> None:
        header = framing.connection(self._terms, response.close, self.front.draining)
        self._writer.tick(self._clock.seconds())
        self._write(self._writer.render(response, self._terms.head, header, self._cors))
        # a refusal sent before its body came closes once that body is read
        if header == CLOSE and response is not self._incoming.refused_early:
            self.close()

    def _answer_later(self, outcome: Response | Held | Failure) -> None:
        """A ``Pending`` answer is ready: send it and read on (or hold: a poll
        that waited for its channels to be read, or an event stream)."""
        if isinstance(outcome, Held):
            self._answering = phase.answer_after(self._answering, Answer.HOLD)
            if finished(self._answering):  # the client left meanwhile
                outcome.cancel()
            else:
                self._waiting = outcome.cancel
            return
        if isinstance(outcome, Failure):
            log.failure("unexpected error answering a request", failure=outcome)
            outcome = error_response(PushUpError("the server failed; it keeps serving"))
        self._answering = phase.answer_after(self._answering, Answer.ANSWER)
        if finished(self._answering):
            return
        self._stamp = now = self._clock.seconds()
        self._send(outcome)
        self._flow.arm_unless_armed(now + self.front.keepalive_timeout)
        self._dispatch()

    def respond(self, delivery: Delivery, hold: bool = False) -> bool:
        """Answer the held subscribe with ``delivery`` (see ``service.Subscriber``)."""
        if self._answering != HELD:
            return False
        if self._unhold(close=False):
            self._write(self._writer.shared(delivery))
        else:
            self._send(Response(200, self._writer.shared_body(delivery)))
        self._read_on_after_held(hold)
        return True

    def answer_held(self, response: Response) -> bool:
        """Answer the held request with ``response`` (a Durable Stream's long
        poll: ``pushup.http.stream_polls``); False if it is not held any more.
        The polls woken together get the same bytes, rendered once."""
        if self._answering != HELD:
            return False
        if self._unhold(response.close):
            self._write(self._writer.shared_answer(response))
        else:
            self._send(response)
        self._read_on_after_held(False)
        return True

    def _unhold(self, close: bool) -> bool:
        """The held request is being answered: whether with the bytes shared
        by every connection answered alike (a plain keep-alive answer)."""
        self._waiting = None
        self._answering = phase.answer_after(self._answering, Answer.ANSWER)
        self._stamp = now = self._clock.seconds()
        self._writer.tick(now)
        return (self._terms.shareable() and not self.front.draining and self._cors is None
                and not close)

    def _read_on_after_held(self, hold: bool) -> None:
        """After a held answer: keep-alive from now, and the requests queued
        behind it answered on the next turn (not from inside the fan-out's or
        the wake-up's loop), or, with ``hold``, once the fan-out releases us."""
        self._flow.arm_unless_armed(self._stamp + self.front.keepalive_timeout)
        if hold:
            self._answering = phase.answer_after(self._answering, Answer.PAUSE)
            self.front.held.append(self)
        elif self._queue:
            self._clock.callLater(0, self._dispatch)

    # An event stream (pushup.http.sse) writes through these; it ends with the connection.

    def open_stream(self, content_type: bytes = framing.STREAM_TYPE,
                    fields: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        """Answer 200 text/event-stream, framed by ``framing.stream_framing``
        (``content_type`` and ``fields``: a Durable Stream's SSE head)."""
        self._writer.tick(self._clock.seconds())
        self._answering = phase.answer_after(self._answering, Answer.STREAM)
        stream = self._stream = framing.stream_framing(self._terms)
        self._write(self._writer.head(200, content_type, None, stream.head_fields() + fields,
                                      connection=CLOSE, cors=self._cors))

    def send_events(self, data: bytes) -> bool:
        if finished(self._answering):
            return False
        self._write(self._stream.frame(data))
        return True

    def end_stream(self) -> None:
        if not finished(self._answering):
            tail = self._stream.end()
            if tail:
                self._write(tail)
            self.close()

    def when_writable(self, callback: Callable[[], None]) -> None:
        """``callback`` on a later turn, once the transport has taken what was
        written (see ``resumeProducing``); never if the connection goes first."""
        self._flow.when_writable(callback, self._writable)

    def _writable(self, callback: Callable[[], None]) -> None:
        if not finished(self._answering):
            callback()

    def release(self) -> None:
        """The fan-out that held us is done: answer what is queued."""
        self._answering = phase.answer_after(self._answering, Answer.RELEASE)
        self._dispatch()

    def _write(self, data: bytes) -> None:
        self._counters.bytes_out += len(data)
        write_now(self.transport, data)

    def _refuse(self, response: Response | None) -> None:
        """Stop parsing; answer what came before, then this, then close."""
        self._reading = phase.read_after(self._reading, Read.STOP)
        if response is not None:
            self._queue.append(response)
        elif self._incoming.refused_early is not None:
            self._incoming.refused_early = None
            self._close_if_answered()

    def _close_if_answered(self) -> None:
        """A body refused before it came is read: close once its 413 is sent."""
        if not self._queue and not answering_one(self._answering):
            self.close()

    def close(self) -> None:
        """Close once the answers written so far are sent; abort if they are
        not taken within ``send_timeout`` (the transport would wait for good
        on a client that reads nothing, e.g. an event stream ended by its
        token's expiry, and hold its unsent output and a connection slot)."""
        self._answering = phase.answer_after(self._answering, Answer.CLOSE)
        self.conn.loseConnection()
        if self._upgraded_to is None:  # an upgraded protocol keeps its own time
            self._flow.closing(self.front.send_timeout)

    # -- time ------------------------------------------------------------------

    def _on_timer(self) -> None:
        """A deadline armed in ``self._flow`` is due (or one before it was)."""
        front = self.front
        now = self._clock.seconds()
        reading = self._reading
        blocked_since = self._flow.blocked_since
        if blocked_since is not None:  # or closing: output not taken since
            due = blocked_since + front.send_timeout
            if now >= due:
                log.info("closing a connection whose client reads nothing")
                self.conn.abortConnection()
                return
        elif finished(self._answering):
            return
        elif answering_one(self._answering) or self._queue:
            return  # being answered: the service's timeout answers a held poll
        elif reading == HEAD or reading == BODY:
            # the head within header_timeout; a body stalls no longer than a keep-alive
            incoming = self._incoming
            due = (incoming.head_began + front.header_timeout if reading == HEAD
                   else self._stamp + front.keepalive_timeout)
            if now >= due and incoming.refused_early is not None:  # its 413 is sent already
                self.close()
                return
            if now >= due:
                self._reading = phase.read_after(self._reading, Read.STOP)
                self._terms = REFUSAL
                self._send(error_response(errors.RequestTimeout(
                    f"the request did not arrive within {front.header_timeout:g} s"), True))
                return
        else:
            due = self._stamp + front.keepalive_timeout
            if now >= due:
                self.close()
                return
        self._flow.arm(due)

    @property
    def answering(self) -> Answering:
        """Where the connection is in answering its requests (see ``phase``)."""
        return Answering(self._answering)
