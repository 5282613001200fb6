"""Handing a Durable Streams request on to the node that serves the stream,
and its answer back to the client.

This module is the one that talks HTTP to another node for a stream, with
Twisted's own client (``Agent`` on a persistent pool): the request goes as
the client sent it (its headers but those of the connection, and the hop's
signed mark), the answer comes back whole (``Relayed``), or, an event
stream, relayed as it comes (``RelayedStream``), paced by the client's
reading. Where a request goes is :mod:`pushup.backplane.mesh.stream_routes`'
to decide. A node that cannot be reached is 503 ``engine_unavailable`` (the
request never reached it whole: nothing was done); a write it took and never
answered is 504 ``outcome_unknown``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet import defer
from twisted.internet.error import ConnectError
from twisted.internet.interfaces import IConsumer
from twisted.internet.protocol import Protocol as TwistedProtocol
from twisted.python.failure import Failure
from twisted.web.client import RequestTransmissionFailed, readBody
from twisted.web.http_headers import Headers
from twisted.web.iweb import IBodyProducer, IResponse
from zope.interface import implementer

from pushup.backplane import Fields, Relayed, RelayedStream
from pushup.backplane.links import unanswered
from pushup.backplane.mesh.owners import HOP, hop_mark
from pushup.backplane.stream_engine import StreamRequest
from pushup.core import errors

# Not sent on: what belongs to the client's connection to us.
# (Expect too: the body is here whole, nothing waits for a 100 Continue.)
_NOT_SENT = frozenset((b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer",
                       b"upgrade", b"proxy-connection", b"content-length", b"expect", HOP))
# Not given back: what our own front writes (its connection, its date, its CORS).
_NOT_GIVEN = frozenset((b"connection", b"keep-alive", b"transfer-encoding", b"content-length",
                        b"content-type", b"date", b"server", b"x-content-type-options",
                        b"access-control-allow-origin", b"access-control-allow-credentials",
                        b"vary"))
EVENTS = b"text/event-stream"
WRITES = (b"PUT", b"POST", b"DELETE")


class EventClient(Protocol):
    """The client's end of an event stream (the front's ``HTTPProtocol``)."""

    def open_stream(self, content_type: bytes = ..., fields: Fields = ...) -> None: ...

    def send_events(self, data: bytes) -> bool: ...

    def end_stream(self) -> None: ...

    def when_writable(self, callback: Callable[[], None]) -> None: ...


@implementer(IBodyProducer)
class _Body:
    """A request body we hold whole, written at once."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.length = len(data)

    def startProducing(self, consumer: IConsumer) -> defer.Deferred[None]:
        consumer.write(self.data)
        return defer.succeed(None)

    def pauseProducing(self) -> None:  # Twisted's names
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class _EventRelay(TwistedProtocol):
    """An event stream's body from the node that serves it, written to the
    client chunk by chunk: the next is read once the client took the last."""

    def __init__(self, client: EventClient, relays: set[_EventRelay]) -> None:
        self.client = client
        self.relays = relays
        self.ended = False

    def dataReceived(self, data: bytes) -> None:
        if self.ended:
            return
        if not self.client.send_events(data):
            self.cancel()
            return
        assert self.transport is not None
        self.transport.pauseProducing()  # type: ignore[attr-defined]
        self.client.when_writable(self._resume)

    def _resume(self) -> None:
        if not self.ended and self.transport is not None:
            self.transport.resumeProducing()  # type: ignore[attr-defined]

    def connectionLost(self, reason: Any = None) -> None:
        self.relays.discard(self)
        if not self.ended:  # the serving node ended it: the client resumes
            self.ended = True
            self.client.end_stream()

    def cancel(self) -> None:
        """The client went: stop reading the serving node's answer."""
        if not self.ended:
            self.ended = True
            self.relays.discard(self)
            if self.transport is not None:
                self.transport.stopProducing()  # type: ignore[attr-defined]

    def end(self) -> None:
        """This node drains: end the client's stream (it resumes elsewhere)."""
        self.cancel()
        self.client.end_stream()


def _given(headers: Headers, events: bool) -> Fields:
    """The answer's headers a client gets from us (an event stream keeps its
    ``Cache-Control``; a whole answer gets our ``no-store``)."""
    return tuple((name, value) for name, values in headers.getAllRawHeaders()
                 for value in values
                 if name.lower() not in _NOT_GIVEN
                 and (events or name.lower() != b"cache-control"))


class Relay:
    """Requests handed on to other nodes, on one persistent pool."""

    def __init__(self, agent: Any, clock: Any, secret: str, *, answer_s: float) -> None:
        """``agent``: a Twisted ``Agent`` (``dial.http_agent``); ``answer_s``:
        how long an answer's head may take, past a long poll's hold."""
        self.agent = agent
        self.clock = clock
        self.secret = secret
        self.answer_s = answer_s
        self.streams: set[_EventRelay] = set()

    def send(self, node: str, kind: str, method: bytes, path: bytes, query: bytes = b"",
             fields: dict[bytes, bytes] | None = None, body: bytes = b"",
             wait_s: float = 0.0) -> defer.Deferred[IResponse]:
        """The request, marked as a hop of ``kind``; fires with the head of
        its answer, or fails with a ``PushUpError`` (503 or 504)."""
        headers = Headers()
        for name, value in (fields or {}).items():
            if name not in _NOT_SENT:
                headers.addRawHeader(name, value)
        headers.addRawHeader(HOP, hop_mark(self.secret, kind, method, path,
                                           self.clock.seconds()))
        target = node.encode() + path + (b"?" + query if query else b"")
        sent: defer.Deferred[IResponse] = self.agent.request(
            method, target, headers, _Body(body) if body else None)
        sent.addTimeout(wait_s + self.answer_s, self.clock)
        sent.addErrback(_unanswered, node, method)
        return sent

    def hand_on(self, node: str, kind: str, request: StreamRequest, client: EventClient,
                wait_s: float) -> defer.Deferred[Relayed | RelayedStream]:
        """``request`` to ``node``; its answer, or its event stream relayed."""
        sent = self.send(node, kind, request.method, request.path, request.query,
                         request.headers, request.body, wait_s)

        def answered(response: IResponse) -> Any:
            kind_of = (response.headers.getRawHeaders(b"content-type") or [None])[0]
            if response.code == 200 and kind_of is not None and kind_of.startswith(EVENTS):
                client.open_stream(kind_of, _given(response.headers, True))
                relay = _EventRelay(client, self.streams)
                self.streams.add(relay)
                response.deliverBody(relay)  # type: ignore[no-untyped-call]
                return RelayedStream(relay.cancel)
            read: defer.Deferred[bytes] = readBody(response)
            read.addCallback(lambda body: Relayed(response.code, kind_of,
                                                  _given(response.headers, False), body))
            read.addErrback(_unanswered, node, request.method)
            return read

        relayed: defer.Deferred[Relayed | RelayedStream] = sent.addCallback(answered)
        return relayed

    def drain(self) -> None:
        """This node stops: every relayed event stream ends now."""
        for relay in list(self.streams):
            relay.end()


def _unanswered(failure: Failure, node: str, method: bytes) -> Failure:
    """A failed hop as the client's answer: 503 when the request never
    reached the node whole (or only read), 504 when a write may be stored."""
    if isinstance(failure.value, errors.PushUpError):
        return failure
    where = f"the node that holds this stream ({node})"
    # a read that got no answer did nothing either: as if never sent
    sent = method in WRITES and not isinstance(failure.value,
                                               ConnectError | RequestTransmissionFailed)
    raise unanswered(sent=sent, never_sent=f"{where} cannot be reached; retry shortly",
                     no_answer=f"{where} took this request and gave no answer: it may be "
                               "stored; retry it (with the same producer headers)")
