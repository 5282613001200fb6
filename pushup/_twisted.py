"""The one place PushUp reaches into Twisted's private state (tests/test_twisted_reach.py
fails when an upgrade changes what we rely on).

``quiet_pool``: twisted.web's connection pool logs a line for every pooled
connection it opens and closes; its factory class is private, and so is the
pool's attribute that names it.

Twisted queues every ``transport.write`` until the reactor's next turn (ask
for writability, wait, send, stop asking): three system calls and a turn
per response. ``write_now`` sends at once when nothing is queued before the
data, as asyncio does, and hands Twisted only what the socket did not take;
it says whether the socket took it all (the replication stream's 201 between
sibling workers counts on that, :mod:`pushup.backplane.mesh.peers`).
Twisted offers no public way to ask "is your write buffer empty?".

``LeanEPollReactor`` (``--reactor epoll``): Twisted's epoll reactor wraps every
event in ``log.callWithLogger`` (a log context per ``doRead``, ~1.35 µs per
event, issue 18). Ours calls ``doRead`` / ``doWrite`` directly for a plain read
or write event; an error in them is still logged (in the selectable's log
context, as Twisted does) and the selectable is disconnected through the
reactor's ``_disconnectSelectable``, as Twisted does; any other event
(hang-up, error, read and write together) takes Twisted's own path. It reads
the reactor's private ``_poller``, ``_selectables`` and
``_disconnectSelectable``, and stands in for ``doPoll``: tests/test_twisted_reach.py
pins their source.
"""

from __future__ import annotations

import errno
import hashlib
import inspect
import sys
from select import EPOLLIN, EPOLLOUT
from typing import Any

from twisted.internet.epollreactor import EPollReactor
from twisted.internet.error import ConnectionFdescWentAway
from twisted.python import log
from twisted.python.failure import Failure

_NO_FILEDESC = ConnectionFdescWentAway("File descriptor lost")


class LeanEPollReactor(EPollReactor):
    """Twisted's epoll reactor without a log context around each plain event."""

    def doPoll(self, timeout: float | None) -> None:  # Twisted's
        try:
            events = self._poller.poll(-1 if timeout is None else timeout,
                                       len(self._selectables))
        except OSError as err:
            if err.errno == errno.EINTR:
                return
            raise
        selectables = self._selectables
        for fd, event in events:
            selectable = selectables.get(fd)
            if selectable is None:
                continue
            if event != EPOLLIN and event != EPOLLOUT:
                log.callWithLogger(  # type: ignore[no-untyped-call]
                    selectable, self._doReadOrWrite, selectable, fd, event)
                continue
            reading = event == EPOLLIN
            try:
                if selectable.fileno() == -1:
                    why: Any = _NO_FILEDESC
                else:
                    why = selectable.doRead() if reading else selectable.doWrite()
            except BaseException:
                why = sys.exc_info()[1]
                log.callWithLogger(selectable, log.err, Failure())  # type: ignore[no-untyped-call]
            if why:
                self._disconnectSelectable(selectable, why, reading)  # type: ignore[no-untyped-call]

    doIteration = doPoll


# sha256 of the source of what LeanEPollReactor.doPoll stands in for or calls,
# in the Twisted it was checked against (26.10). Checked once at start: a
# Twisted whose source differs runs Twisted's own epoll reactor instead, and
# the log says so; tests/test_twisted_lean_reactor.py fails on it too. After
# a Twisted upgrade: read the new source, bring doPoll in line, update these.
PINNED = {
    "EPollReactor.doPoll":
        "09b62ae68ef01b4bc5eaa170827e2baf0a2a5098e7e7ce7b5e1c80cda187c827",
    "_PollLikeMixin._doReadOrWrite":
        "5ffee55b79492b0037fc7bedacfc3aaa6d1f173122c738f8274b8be12d8d2be3",
    "_DisconnectSelectableMixin._disconnectSelectable":
        "9d6de0e555ea44fe03fc4a1ad58e51749195df9ba9ef3ce879f5ec689d3ac939",
}


def pinned_sources() -> dict[str, Any]:
    """The functions of Twisted's that ``PINNED`` names."""
    from twisted.internet import epollreactor, posixbase

    return {
        "EPollReactor.doPoll": epollreactor.EPollReactor.doPoll,
        "_PollLikeMixin._doReadOrWrite": posixbase._PollLikeMixin._doReadOrWrite,
        "_DisconnectSelectableMixin._disconnectSelectable":
            posixbase._DisconnectSelectableMixin._disconnectSelectable,
    }


def unverified(pinned: dict[str, str] = PINNED) -> list[str]:
    """The pinned functions whose source differs here (or cannot be read)."""
    changed = []
    for name, f in pinned_sources().items():
        try:
            source = inspect.getsource(f)
        except (OSError, TypeError):
            changed.append(name)
            continue
        if hashlib.sha256(source.encode()).hexdigest() != pinned.get(name):
            changed.append(name)
    return changed


def install_lean_epoll(pinned: dict[str, str] = PINNED) -> str | None:
    """Install :class:`LeanEPollReactor` as ``twisted.internet.reactor`` when the
    Twisted here is the one its copy was checked against; else Twisted's own
    epoll reactor. Returns None, or why the lean one was not installed."""
    from twisted.internet.main import installReactor

    changed = unverified(pinned)
    if changed:
        from twisted.internet import epollreactor

        epollreactor.install()  # type: ignore[no-untyped-call]
        return (f"Twisted's epoll reactor, not the lean one: this Twisted's "
                f"{', '.join(changed)} differs from the one it was checked against")
    installReactor(LeanEPollReactor())  # type: ignore[no-untyped-call]
    return None


def write_now(transport: Any, data: bytes) -> bool:
    """Write ``data``: straight to the socket when nothing is queued before it.
    True when the socket took all of it (and so everything written before it):
    the kernel holds it for the other end, and nothing of it waits in Twisted."""
    sock = getattr(transport, "socket", None)
    if not (sock is not None and transport.connected and not transport.disconnecting
            and not transport._tempDataBuffer
            and len(transport.dataBuffer) == transport.offset):
        if data:
            transport.write(data)
        return False  # something waits in Twisted before it (or no socket)
    try:
        data = data[sock.send(data):]
    except OSError:
        pass  # would block, or broken: Twisted's own write path copes
    if data:
        transport.write(data)
        return False
    return True


def quiet_pool(reactor: Any) -> Any:
    """A persistent ``HTTPConnectionPool`` whose connections log nothing."""
    from twisted.web.client import HTTPConnectionPool, _HTTP11ClientFactory

    class QuietFactory(_HTTP11ClientFactory):
        noisy = False  # no log line per pooled connection

    pool = HTTPConnectionPool(reactor, persistent=True)  # type: ignore[no-untyped-call]
    pool._factory = QuietFactory
    return pool
