"""A Redis client for Twisted: one connection, pipelined, replies in order.

``RedisProtocol`` writes each command as a RESP array the moment it is issued (any
number in flight) and fires one Deferred per command, in the order sent, from replies
parsed in C by ``hiredis.Reader``. ``RedisConnection`` owns one such protocol for one
URL and replaces it after a loss, with capped exponential backoff; it calls Redis up
only once a PING got its reply (a stopped redis-server's kernel still accepts the TCP
connection). While it has none, ``execute`` fails at once with ``RedisGone`` instead of
queueing: the caller decides (the server answers 503). There are no threads and no
client-side timeouts unless a command asks for one, so a blocking ``XREAD`` may wait as
long as it likes; a timeout is counted in the node's own time (``NodeTimer``), so it
means "Redis did not answer", never "this node was too busy to read the answer".

Errors, by origin: ``RedisError`` is Redis's own error reply (the connection is fine);
``RedisGone`` means no reply will come (the command may or may not have run),
``RedisTimeout`` is the ``RedisGone`` of a command that outlived its ``timeout``, and
``RedisNotSent`` the ``RedisGone`` of a command never written (it cannot have run).

``RedisPubSubProtocol`` is the same connection in sharded pub/sub mode, where Redis
also sends arrays no command asked for (pool.py's subscriber connections).
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import (
    UNIXClientEndpoint,
    connectProtocol,
)
from twisted.internet.protocol import Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from pushup.backplane import client_endpoint, trouble
from pushup.config import RedisURL, parse_url

log = Logger()

Arg = bytes | str | int | float  # what a command's arguments may be (not bool)
MIN_DELAY = 0.1  # seconds before the first reconnect; doubles per failure ...
MAX_DELAY = 1.0  # ... up to this
HANDSHAKE_TIMEOUT = 5.0  # AUTH/SELECT/PING must answer within this, or the connection is dropped
_INCOMPLETE = object()  # hiredis.Reader.gets() result when no whole reply is buffered
SLICES = 8  # a NodeTimer counts its time in this many timed calls, one after the other
# A timed call armed by a timed call runs after the reactor's next I/O pass (Twisted
# inserts it at the next runUntilCurrent, and polls with no wait first): 0 would do on a
# real reactor; 1 ms keeps that order on a task.Clock, which runs a call due now within
# the same advance.
IO_PASS = 0.001


class RedisError(Exception):
    """Redis answered this command with an error reply, e.g. ``NOSCRIPT No matching...``."""

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class RedisGone(Exception):
    """No reply will come: not connected, or the connection went while waiting."""


class RedisTimeout(RedisGone):
    """No reply within the command's ``timeout``; the connection was dropped for it."""


class RedisNotSent(RedisGone):
    """Not connected when the command was issued: it was never written, so never ran."""


def script_sha(script: str | bytes) -> str:
    """The SHA1 Redis names ``script`` by (what EVALSHA takes)."""
    return hashlib.sha1(script.encode() if isinstance(script, str) else script).hexdigest()


def first_failure(failure: Failure) -> Failure:
    """A call over several commands (``gatherResults``) failed: the first one's failure."""
    if isinstance(failure.value, defer.FirstError):
        first: Failure = failure.value.subFailure
        return first
    return failure


def redis_endpoint(reactor: Any, url: RedisURL, timeout: float) -> Any:
    """The client endpoint dialling ``url`` (TCP, or its Unix socket)."""
    if url.path is not None:
        return UNIXClientEndpoint(reactor, url.path,  # type: ignore[no-untyped-call]
                                  timeout=timeout)
    return client_endpoint(reactor, url.host, url.port, timeout=timeout)


# --- time that counts against Redis ------------------------------------------------

class NodeTimer:
    """Call ``expire()`` after ``seconds`` of this node's own time, and after one more
    I/O pass: what a deadline on Redis's answer must count.

    The time is counted in ``SLICES`` timed calls, each armed when the one before ran,
    so a reactor turn in which the node was behind (its own queue of work, its CPU
    budget spent) counts as one slice however long it lasted. When the last slice has
    run, the reactor reads its sockets once more before ``expire``: Twisted runs the
    timed calls of a turn before it polls, so an answer that came while the node was
    busy sits unread when the timer is due. ``progress()``, if given, is sampled before
    that pass: while it changes over a pass (bytes from Redis are still coming in),
    another pass is granted, ``SLICES`` at most. ``active()``/``cancel()`` as an
    ``IDelayedCall``'s; ``cancel`` is a no-op once it has expired.
    """

    def __init__(self, clock: Any, seconds: float, expire: Callable[[], object], *,
                 progress: Callable[[], object] | None = None) -> None:
        self._clock = clock
        self._slice = seconds / SLICES
        self._slices_left = SLICES
        self._passes_left = SLICES
        self._expire = expire
        self._progress = progress
        self._seen: object = None
        self._call: Any = clock.callLater(self._slice, self._tick)

    def active(self) -> bool:
        return self._call is not None

    def cancel(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None

    def _tick(self) -> None:
        self._slices_left -= 1
        if self._slices_left > 0:
            self._call = self._clock.callLater(self._slice, self._tick)
            return
        self._seen = self._progress() if self._progress is not None else None
        self._call = self._clock.callLater(IO_PASS, self._after_pass)

    def _after_pass(self) -> None:
        self._passes_left -= 1
        if self._progress is not None and self._passes_left > 0:
            now = self._progress()
            if now != self._seen:
                self._seen = now
                self._call = self._clock.callLater(IO_PASS, self._after_pass)
                return
        self._call = None
        self._expire()


# --- one connection -----------------------------------------------------------------

class RedisProtocol(Protocol):
    """One connection: commands written at once, one Deferred each, fired in order.

    ``ready`` fires with the protocol once AUTH (if ``password``) and SELECT (if ``db``)
    have succeeded, or fails with their error (the connection is then dropped).
    ``lost`` fires with None when the connection has closed and every command still
    waiting has failed with ``RedisGone``.
    """

    def __init__(self, clock: Any, *, password: str | None = None, db: int = 0,
                 username: str | None = None,
                 handshake_timeout: float | None = HANDSHAKE_TIMEOUT) -> None:
        self._clock = clock
        self._password = password
        self._username = username
        self._db = db
        self._handshake_timeout = handshake_timeout
        self._reader = hiredis.Reader(replyError=RedisError, notEnoughData=_INCOMPLETE)
        self._waiting: deque[Deferred[Any]] = deque()
        self._gone: str | None = None  # why commands now fail, once the connection is going
        self._closed = False
        self._transport: Any = None
        self._bytes_read = 0  # a timed-out command's last pass looks for more
        self.ready: Deferred[RedisProtocol] = Deferred()
        self.lost: Deferred[None] = Deferred()

    def connectionMade(self) -> None:
        self._transport = self.transport  # typed Any: Twisted's interfaces confuse mypy
        set_no_delay = getattr(self._transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            set_no_delay(True)  # pipelined small writes must not wait for ACKs (Nagle)
        steps: list[Deferred[Any]] = []
        if self._password is not None:
            credentials = (self._username, self._password) if self._username else (
                self._password,)
            steps.append(self.execute("AUTH", *credentials, timeout=self._handshake_timeout))
        if self._db:
            steps.append(self.execute("SELECT", self._db, timeout=self._handshake_timeout))
        defer.gatherResults(steps, consumeErrors=True).addCallbacks(
            lambda _: self.ready.callback(self), self._handshake_failed)

    def _handshake_failed(self, failure: Failure) -> None:
        failure = first_failure(failure)
        self.abort(f"handshake failed: {trouble(failure)}")
        self.ready.errback(failure)

    def execute(self, *args: Arg, timeout: float | None = None) -> Deferred[Any]:
        """Send one command; its Deferred fires with the reply (bytes, int, list, None;
        an error inside an array reply, as EXEC may give, is a ``RedisError`` value in it).

        Fails with ``RedisError`` for an error reply, ``RedisGone`` if the connection
        is (or goes) down first, and ``RedisTimeout`` after ``timeout`` seconds without
        a reply (dropping the connection: on a half-open TCP connection nothing else
        would ever fail); those seconds are the node's own (``NodeTimer``): a turn in
        which the node was behind counts as one slice, and a reply that reached the
        socket by then is read before the command is failed. Raises TypeError at once
        for an argument that is not bytes, str, int or float, and ValueError for no
        arguments.
        """
        if not args:
            raise ValueError("a Redis command needs at least its name")
        # TypeError for a bad argument, before sending. (hiredis's stub types the tuple
        # as having one element.)
        command = hiredis.pack_command(args)  # type: ignore[arg-type]
        if self._gone is not None or self._transport is None:
            return defer.fail(RedisNotSent(self._gone or "not connected yet"))
        waiting: Deferred[Any] = Deferred()
        self._waiting.append(waiting)
        self._transport.write(command)  # queued to the turn's end: a pipeline is one send()
        if timeout is not None:
            self._expire_after(waiting, timeout, args[0])
        return waiting

    def _expire_after(self, waiting: Deferred[Any], timeout: float, name: Arg) -> None:
        def expire() -> None:
            label = name.decode(errors="replace") if isinstance(name, bytes) else name
            why = f"no reply to {label} within {timeout:g} s"
            if self._gone is None:
                self._gone = why  # commands issued by the errback below fail at once
            waiting.errback(RedisTimeout(why + "; connection dropped"))
            self.abort(why)

        def cancel(result: object) -> object:
            if call.active():
                call.cancel()
            return result

        call = NodeTimer(self._clock, timeout, expire, progress=lambda: self._bytes_read)
        waiting.addBoth(cancel)

    def abort(self, why: str) -> None:
        """Drop the connection now; waiting commands fail with ``RedisGone(why)``."""
        if self._gone is None:
            self._gone = why
        if self._transport is not None and not self._closed:
            self._transport.abortConnection()

    def close(self) -> None:
        """Close once what is written has been sent; ``lost`` fires when closed."""
        if self._transport is not None and not self._closed:
            self._transport.loseConnection()

    def dataReceived(self, data: bytes) -> None:
        self._bytes_read += len(data)
        reader = self._reader
        reader.feed(data)
        while True:
            try:
                reply = reader.gets()
            except hiredis.ProtocolError as error:
                self.abort(f"unreadable reply from Redis: {error}")
                return
            if reply is _INCOMPLETE:
                return
            if not self._deliver(reply):
                return

    def _deliver(self, reply: Any) -> bool:
        """Fire the oldest waiting command with ``reply``; False if the connection is
        being dropped for it (no command asked for it)."""
        if not self._waiting:
            self.abort("a reply from Redis that no command asked for")
            return False
        waiting = self._waiting.popleft()
        if waiting.called:
            return True  # it timed out; the connection is being dropped anyway
        if isinstance(reply, RedisError):
            waiting.errback(reply)
        else:
            waiting.callback(reply)
        return True

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._closed = True
        why = self._gone or f"connection lost: {trouble(reason)}"
        self._gone = why
        waiting, self._waiting = self._waiting, deque()
        for command in waiting:
            if not command.called:
                command.errback(RedisGone(why))
        self.lost.callback(None)


# --- one connection in sharded pub/sub mode -----------------------------------------

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


# --- a connection that comes back ---------------------------------------------------

class RedisConnection:
    """One connection to ``url``, reconnected after a loss until ``stop()``.

    ``connected`` is True from the moment AUTH/SELECT succeeded and a PING was
    answered until the connection is lost; ``on_connect`` listeners are called then
    (after every reconnect too), ``on_lost`` listeners when a connection that was up
    goes. ``execute`` never queues: while not connected it fails at once with
    ``RedisGone``.
    """

    def __init__(self, url: RedisURL | str, reactor: Any, *,
                 connect_timeout: float = HANDSHAKE_TIMEOUT, quiet: bool = False,
                 on_push: PushHandler | None = None) -> None:
        """``reactor`` provides IReactorTime and IReactorTCP (IReactorUNIX for unix://).

        ``on_push``: a pub/sub connection (``RedisPubSubProtocol``, see ``pubsub``)
        whose pushed arrays go to ``on_push``.

        The log tells each change of state once (up, lost, unreachable and why);
        ``quiet``: at debug level only (a second connection to the same Redis,
        whose changes the first one tells already).
        """
        self.url = parse_url(url) if isinstance(url, str) else url
        self._on_push = on_push
        self._say = log.debug if quiet else None
        self.connected = False
        self.on_connect: list[Callable[[], object]] = []
        self.on_lost: list[Callable[[], object]] = []
        self._reactor = reactor
        self._connect_timeout = connect_timeout
        self._running = False
        self._protocol: RedisProtocol | None = None  # from TCP connect until lost
        self._attempt: Deferred[Any] | None = None
        self._retry: Any = None  # the reconnect's IDelayedCall
        self._delay = MIN_DELAY
        self._last_complaint = ""
        self._stop_waiters: list[Deferred[None]] = []
        self._scripts: dict[str, str | bytes] = {}  # loaded again on every reconnect

    def start(self) -> None:
        """Connect, and keep reconnecting after losses until ``stop()``."""
        if not self._running:
            self._running = True
            if self._protocol is None and self._attempt is None:  # else _lost reconnects
                self._connect()

    def stop(self) -> Deferred[None]:
        """No more reconnects; close the connection. Fires once the socket is closed."""
        self._running = False
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        if self._protocol is None:
            if self._attempt is not None:
                self._attempt.cancel()  # a TCP connect in progress
            return defer.succeed(None)
        closed: Deferred[None] = Deferred()
        self._stop_waiters.append(closed)
        self._protocol.close()
        return closed

    def drop(self, why: str) -> None:
        """Abort the current connection (it is reconnected as after any loss):
        e.g. to stop a blocking read whose answer is no longer wanted."""
        if self._protocol is not None:
            self._protocol.abort(why)

    def execute(self, *args: Arg, timeout: float | None = None) -> Deferred[Any]:
        """``RedisProtocol.execute`` on the current connection, or ``RedisGone`` now."""
        if not self.connected or self._protocol is None:
            return defer.fail(RedisNotSent(f"not connected to {self.url}"))
        return self._protocol.execute(*args, timeout=timeout)

    @property
    def pubsub(self) -> RedisPubSubProtocol | None:
        """The current connection's protocol, when up and made with ``on_push``."""
        protocol = self._protocol if self.connected else None
        return protocol if isinstance(protocol, RedisPubSubProtocol) else None

    def evalsha(self, sha: str, script: str | bytes, keys: Sequence[Arg], args: Sequence[Arg],
                *, timeout: float | None = None) -> Deferred[Any]:
        """EVALSHA ``sha``; if Redis lacks the script (restarted empty, or SCRIPT FLUSH),
        EVAL ``script`` instead, which also caches it. ``sha`` is ``script_sha(script)``.

        The script is also loaded on every reconnect, ahead of any command, so the
        fallback (which runs after commands pipelined behind the EVALSHA) stays rare.
        """
        self._scripts.setdefault(sha, script)
        numkeys = len(keys)

        def fallback(failure: Failure) -> Any:
            error = failure.value
            if not isinstance(error, RedisError) or not error.message.startswith("NOSCRIPT"):
                return failure
            return self.execute("EVAL", script, numkeys, *keys, *args, timeout=timeout)

        return self.execute("EVALSHA", sha, numkeys, *keys, *args,
                            timeout=timeout).addErrback(fallback)

    def _connect(self) -> None:
        self._retry = None
        url = self.url
        handshake: dict[str, Any] = dict(password=url.password, db=url.db,
                                         username=url.username,
                                         handshake_timeout=self._connect_timeout)
        protocol = (RedisProtocol(self._reactor, **handshake) if self._on_push is None
                    else RedisPubSubProtocol(self._reactor, self._on_push, **handshake))
        endpoint = redis_endpoint(self._reactor, url, self._connect_timeout)
        attempt: Deferred[Any] = connectProtocol(endpoint, protocol)  # type: ignore[no-untyped-call]
        self._attempt = attempt
        attempt.addCallback(self._made)
        attempt.addCallbacks(self._ready, self._failed)

    def _made(self, protocol: RedisProtocol) -> Deferred[RedisProtocol]:
        self._attempt = None
        self._protocol = protocol
        protocol.lost.addCallback(lambda _: self._lost(protocol))
        return protocol.ready

    def _ready(self, protocol: RedisProtocol) -> None:
        """Connected and past AUTH/SELECT: up once Redis answers a PING (the kernel
        of a stopped redis-server accepts a connection that nothing will answer)."""
        if protocol is not self._protocol or not self._running:
            return
        for script in self._scripts.values():
            # Pipelined ahead of the PING, so loaded before any command of ours.
            protocol.execute("SCRIPT", "LOAD", script).addErrback(self._load_failed)
        answered = protocol.execute("PING", timeout=self._connect_timeout)
        answered.addCallbacks(lambda _: self._answered(protocol),
                              lambda failure: self._unanswered(protocol, failure))

    def _load_failed(self, failure: Failure) -> None:
        """A script Redis refused is worth a line; a connection gone is told as such."""
        if isinstance(failure.value, RedisError):
            log.warn("redis {url}: SCRIPT LOAD failed: {why}", url=str(self.url),
                     why=trouble(failure))

    def _answered(self, protocol: RedisProtocol) -> None:
        if protocol is not self._protocol or not self._running:
            return
        self.connected = True
        self._delay = MIN_DELAY
        self._last_complaint = ""
        (self._say or log.info)("redis {redis} is up", redis=str(self.url), state="up")
        self._tell(self.on_connect)

    def _unanswered(self, protocol: RedisProtocol, failure: Failure) -> None:
        """The PING after connecting got no reply (the connection was dropped for
        it), or an error (``LOADING``): not up; ``_lost`` retries."""
        if protocol is not self._protocol or not self._running:
            return
        why = (f"no reply to PING within {self._connect_timeout:g} s"
               if isinstance(failure.value, RedisTimeout) else trouble(failure))
        self._complain(why)
        protocol.abort(f"PING failed: {why}")

    def _failed(self, failure: Failure) -> None:
        """The TCP connect or the handshake failed."""
        self._attempt = None
        if not self._running:
            return
        self._complain(trouble(failure))
        if self._protocol is None:  # no connection was made, so no _lost will follow
            self._retry_later()

    def _complain(self, why: str) -> None:
        """Redis cannot be used: said once per reason, until it is up again."""
        if why != self._last_complaint:
            self._last_complaint = why
            (self._say or log.warn)("redis {redis} unreachable ({why}); retrying every {retry:g} s,"
                                    " quietly", redis=str(self.url), state="unreachable",
                                    why=why, retry=MAX_DELAY)

    def _lost(self, protocol: RedisProtocol) -> None:
        if protocol is not self._protocol:
            return
        self._protocol = None
        was_up, self.connected = self.connected, False
        waiters, self._stop_waiters = self._stop_waiters, []
        for closed in waiters:
            closed.callback(None)
        if was_up:
            if self._running:
                (self._say or log.warn)("redis {redis} lost; reconnecting", redis=str(self.url),
                                        state="lost")
            self._tell(self.on_lost)
        if self._running:
            self._retry_later()

    def _retry_later(self) -> None:
        self._retry = self._reactor.callLater(self._delay, self._connect)
        self._delay = min(self._delay * 2, MAX_DELAY)

    def _tell(self, listeners: list[Callable[[], object]]) -> None:
        for listener in list(listeners):
            try:
                listener()
            except Exception:
                log.failure("redis {url}: a connection listener failed", url=str(self.url))
