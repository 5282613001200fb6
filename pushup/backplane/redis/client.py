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

Errors are exceptions.py's (``RedisError`` typed by its reply's first word,
``RedisGone``, ``RedisTimeout``, ``RedisNotSent``); the same connection in sharded
pub/sub mode is pubsub.py's.
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
from pushup.backplane.links import SaidOnce, backoff, gather
from pushup.backplane.redis.exceptions import NoScript, reply_error

# Re-exported under their old home: redis/streams.py and the tests import them from here.
from pushup.backplane.redis.exceptions import RedisError as RedisError
from pushup.backplane.redis.exceptions import RedisGone as RedisGone
from pushup.backplane.redis.exceptions import RedisNotSent as RedisNotSent
from pushup.backplane.redis.exceptions import RedisTimeout as RedisTimeout
from pushup.backplane.redis.timer import NodeTimer as NodeTimer
from pushup.config import RedisURL, parse_url

log = Logger()

Arg = bytes | str | int | float  # what a command's arguments may be (not bool)
MIN_DELAY = 0.1  # seconds before the first reconnect; doubles per failure ...
MAX_DELAY = 1.0  # ... up to this
HANDSHAKE_TIMEOUT = 5.0  # AUTH/SELECT/PING must answer within this, or the connection is dropped
_INCOMPLETE = object()  # hiredis.Reader.gets() result when no whole reply is buffered


def script_sha(script: str | bytes) -> str:
    """The SHA1 Redis names ``script`` by (what EVALSHA takes)."""
    return hashlib.sha1(script.encode() if isinstance(script, str) else script).hexdigest()


def redis_endpoint(reactor: Any, url: RedisURL, timeout: float) -> Any:
    """The client endpoint dialling ``url`` (TCP, or its Unix socket)."""
    if url.path is not None:
        return UNIXClientEndpoint(reactor, url.path,  # type: ignore[no-untyped-call]
                                  timeout=timeout)
    return client_endpoint(reactor, url.host, url.port, timeout=timeout)


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
        # every error reply, one inside an array too, typed by its first word (exceptions.py)
        self._reader = hiredis.Reader(replyError=reply_error,
                                      notEnoughData=_INCOMPLETE)
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
        gather(steps).addCallbacks(lambda _: self.ready.callback(self), self._handshake_failed)

    def _handshake_failed(self, failure: Failure) -> None:
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
                 connect_timeout: float = HANDSHAKE_TIMEOUT, quiet: bool = False) -> None:
        """``reactor`` provides IReactorTime and IReactorTCP (IReactorUNIX for unix://).

        The log tells each change of state once (up, lost, unreachable and why);
        ``quiet``: at debug level only (a second connection to the same Redis,
        whose changes the first one tells already).
        """
        self.url = parse_url(url) if isinstance(url, str) else url
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
        self._failures = 0  # reconnects in a row since it was last up (``backoff``)
        self._said = SaidOnce()  # why it is unreachable, as last logged
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
    def protocol(self) -> RedisProtocol | None:
        """The current connection's protocol, while up."""
        return self._protocol if self.connected else None

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
            if not isinstance(error, NoScript):
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
        protocol = self._make_protocol(handshake)
        endpoint = redis_endpoint(self._reactor, url, self._connect_timeout)
        attempt: Deferred[Any] = connectProtocol(endpoint, protocol)  # type: ignore[no-untyped-call]
        self._attempt = attempt
        attempt.addCallback(self._made)
        attempt.addCallbacks(self._ready, self._failed)

    def _make_protocol(self, handshake: dict[str, Any]) -> RedisProtocol:
        """A new connection's protocol (pubsub.py's ``PubSubConnection`` makes its own)."""
        return RedisProtocol(self._reactor, **handshake)

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
        self._failures = 0
        self._said.clear()
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
        if self._said.new(why):
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
        self._failures += 1

    @property
    def _delay(self) -> float:
        """Seconds before the next reconnect: MIN_DELAY, doubled per failure up to
        MAX_DELAY (no jitter: the reconnects of one node's connections are few)."""
        return backoff(self._failures, base=MIN_DELAY, cap=MAX_DELAY)

    def _tell(self, listeners: list[Callable[[], object]]) -> None:
        for listener in list(listeners):
            try:
                listener()
            except Exception:
                log.failure("redis {url}: a connection listener failed", url=str(self.url))
