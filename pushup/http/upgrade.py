"""A connection handed to another protocol by ``101 Switching Protocols``:
the peers' replication stream (``Upgrade: pushup-peer``).

From the 101 on, HTTP is over on the connection: the HTTP protocol writes and
times nothing more, and relays every byte read, and the loss of the
connection, to the protocol it was handed to, which writes and keeps time for
itself. The connection stays the front's: counted against its limit, closed
by a drain. Which request may upgrade, and to what, the handlers decide
(``App.upgrade``); this module says how the hand-over goes.
"""

from __future__ import annotations

from typing import Any, cast
from typing import Protocol as TypingProtocol

from twisted.internet.interfaces import IProtocol

from pushup.http.exchange import Request


class Upgraded(TypingProtocol):
    """What the front uses of the protocol a connection is upgraded to (a
    Twisted ``IProtocol``; typed here so the compiled build needs no zope)."""

    def makeConnection(self, transport: Any) -> None: ...  # Twisted's names

    def dataReceived(self, data: bytes) -> None: ...

    def connectionLost(self, reason: Any) -> None: ...


def switching_protocols(request: Request) -> bytes:
    """The 101 that answers ``request``, naming the protocol it asked for."""
    return (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: "
            + request.headers.get(b"upgrade", b"") + b"\r\nConnection: Upgrade\r\n\r\n")


def hand_over(protocol: IProtocol, transport: Any, rest: bytes) -> Upgraded:
    """Connect ``protocol`` to ``transport`` (after the 101 is written) and give
    it ``rest``, what was read past the request's head; the caller relays the
    rest of the connection's bytes to what this returns."""
    upgraded = cast(Upgraded, protocol)
    upgraded.makeConnection(transport)
    if rest:
        upgraded.dataReceived(rest)
    return upgraded
