"""The one place PushUp reaches into Twisted's private state (tests/test_twisted_reach.py
fails when an upgrade changes what we rely on).

``quiet_pool``: twisted.web's connection pool logs a line for every pooled
connection it opens and closes; its factory class is private, and so is the
pool's attribute that names it.

Twisted queues every ``transport.write`` until the reactor's next turn (ask
for writability, wait, send, stop asking): three system calls and a turn
per response. ``write_now`` sends at once when nothing is queued before the
data, as asyncio does, and hands Twisted only what the socket did not take.
Twisted offers no public way to ask "is your write buffer empty?".
"""

from __future__ import annotations

from typing import Any


def write_now(transport: Any, data: bytes) -> None:
    """Write ``data``: straight to the socket when nothing is queued before it."""
    sock = getattr(transport, "socket", None)
    if (sock is not None and transport.connected and not transport.disconnecting
            and not transport._tempDataBuffer
            and len(transport.dataBuffer) == transport.offset):
        try:
            data = data[sock.send(data):]
        except OSError:
            pass  # would block, or broken: Twisted's own write path copes
    if data:
        transport.write(data)


def quiet_pool(reactor: Any) -> Any:
    """A persistent ``HTTPConnectionPool`` whose connections log nothing."""
    from twisted.web.client import HTTPConnectionPool, _HTTP11ClientFactory

    class QuietFactory(_HTTP11ClientFactory):
        noisy = False  # no log line per pooled connection

    pool = HTTPConnectionPool(reactor, persistent=True)  # type: ignore[no-untyped-call]
    pool._factory = QuietFactory
    return pool
