"""Sharded pub/sub on one Redis connection: the connection in RESP2 pub/sub mode,
where Redis also sends arrays no command asked for.

``RedisPubSubProtocol`` hands every ``ssubscribe``/``sunsubscribe``/``smessage`` array
to its listener in the order Redis sent it, and fires the commands' Deferreds in
order as ``RedisProtocol`` does; ``PubSubConnection`` is a ``RedisConnection`` whose
every (re)connection is such a protocol (pool.py's subscriber connections). Which
channels are subscribed where is subscriptions.py's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.protocol import connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from pushup.backplane.redis.client import Arg, RedisConnection, RedisProtocol
from pushup.config import RedisURL

log = Logger()

PushHandler = Callable[[bytes, bytes, Any], None]  # (kind, channel, payload or count)
PUSHED_KINDS = frozenset({b"ssubscribe", b"sunsubscribe", b"smessage"})


class RedisPubSubProtocol(RedisProtocol):
    """One connection in RESP2 sharded pub/sub mode (SSUBSCRIBE), where Redis sends
    arrays nobody asked for.

    Every ``ssubscribe``/``sunsubscribe``/``smessage`` array goes to ``on_push(kind,
    channel, payload or count)`` in the order Redis sent it, whether it answers our
    command or Redis pushed it (a ``sunsubscribe`` when the channel's slot moved to
    another node). Any other reply (an error such as ``MOVED`` for SSUBSCRIBE, PING's
    ``pong``) fires the oldest waiting command, as in ``RedisProtocol``.
    """

    def __init__(self, clock: Any, on_push: PushHandler, **handshake: Any) -> None:
        super().__init__(clock, **handshake)
        self._on_push = on_push
        # per waiting command, in the same order: the array that answers it, if any
        self._answers: deque[tuple[bytes, bytes] | None] = deque()

    def execute(self, *args: Arg, timeout: float | None = None) -> Deferred[Any]:
        return self._send(None, args, timeout)

    def ssubscribe(self, channel: bytes) -> Deferred[Any]:
        """SSUBSCRIBE one channel. Fires with Redis's confirmation (which ``on_push``
        also gets), or fails with its error reply (``MOVED``, ``CLUSTERDOWN``)."""
        return self._send((b"ssubscribe", channel), ("SSUBSCRIBE", channel), None)

    def sunsubscribe(self, channel: bytes) -> Deferred[Any]:
        return self._send((b"sunsubscribe", channel), ("SUNSUBSCRIBE", channel), None)

    def _send(self, answer: tuple[bytes, bytes] | None, args: tuple[Arg, ...],
              timeout: float | None) -> Deferred[Any]:
        sent = super().execute(*args, timeout=timeout)
        if not sent.called:  # written: a reply is owed
            self._answers.append(answer)
        return sent

    def _deliver(self, reply: Any) -> bool:
        if isinstance(reply, list) and len(reply) == 3 and reply[0] in PUSHED_KINDS:
            kind, channel = reply[0], reply[1]
            if self._answers and self._answers[0] == (kind, channel):
                self._answers.popleft()
                super()._deliver(reply)
            try:
                self._on_push(kind, channel, reply[2])
            except Exception:
                log.failure("redis: a pub/sub listener failed")
            return True
        if self._answers:
            self._answers.popleft()
        return super()._deliver(reply)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._answers.clear()
        super().connectionLost(reason)


class PubSubConnection(RedisConnection):
    """A ``RedisConnection`` in sharded pub/sub mode: its pushed arrays go to
    ``on_push(kind, channel, payload or count)``, whichever connection brought them."""

    def __init__(self, url: RedisURL | str, reactor: Any, on_push: PushHandler,
                 **options: Any) -> None:
        super().__init__(url, reactor, **options)
        self._on_push = on_push

    @property
    def pubsub(self) -> RedisPubSubProtocol | None:
        """The current connection's protocol, while up."""
        protocol = self.protocol
        return protocol if isinstance(protocol, RedisPubSubProtocol) else None

    def _make_protocol(self, handshake: dict[str, Any]) -> RedisProtocol:
        return RedisPubSubProtocol(self._reactor, self._on_push, **handshake)
