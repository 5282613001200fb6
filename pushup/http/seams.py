"""What the HTTP front is written against, as typing Protocols: the handlers
(``App``), the front as its connections see it (``Host``), and the part of
Twisted's transport a connection uses (its clock and timers are the core's
:mod:`pushup.core.clock`).

Twisted spells its interfaces with zope; mypyc, which compiles the front,
reads them without mypy-zope, so the front names what it uses here and
mypyc types it the same; ``Host`` spares ``protocol`` an import of
``front``, which imports it. Declarations only: nothing here runs.
"""

from __future__ import annotations

from typing import Any
from typing import Protocol as TypingProtocol

from twisted.internet.interfaces import IProtocol

from pushup.core.clock import Clock
from pushup.core.counters import Counters
from pushup.core.errors import PushUpError
from pushup.http.exchange import Held, Pending, Request, Response, Writer


class App(TypingProtocol):
    """What the front needs of the handlers (:class:`pushup.http.handlers.Handlers`)."""

    def admit(self, method: bytes, path: bytes, headers: dict[bytes, bytes]) -> int | Response:
        ...

    def too_large(self, path: bytes) -> PushUpError: ...

    def handle(self, request: Request, client: Any) -> Response | Held | Pending: ...

    def upgrade(self, request: Request) -> IProtocol | None:
        """The protocol that takes over the connection for this request to
        upgrade it, or None (the request is answered, then the connection closes)."""


class Host(TypingProtocol):
    """What a connection uses of the front that made it (``front.Front``)."""

    app: App
    writer: Writer
    counters: Counters
    clock: Clock
    max_target: int
    max_event_id: int
    header_timeout: float
    keepalive_timeout: float
    send_timeout: float
    draining: bool
    held: list[Any]  # the connections a fan-out answered, released at its end

    def lost(self, protocol: Any) -> None: ...


class Connection(TypingProtocol):
    """What the front uses of its TCP transport: Twisted's ``ITCPTransport``,
    as a consumer of our pauses and a push producer we pause."""

    def write(self, data: bytes) -> None: ...

    def loseConnection(self) -> None: ...  # Twisted's names

    def loseWriteConnection(self) -> None: ...

    def abortConnection(self) -> None: ...

    def registerProducer(self, producer: object, streaming: bool) -> None: ...

    def unregisterProducer(self) -> None: ...

    def pauseProducing(self) -> None: ...

    def resumeProducing(self) -> None: ...
