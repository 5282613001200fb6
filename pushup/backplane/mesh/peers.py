"""Peers out: one link per peer, ordered, pipelined, authenticated, retried.

A link sends this node's own messages to one peer over one long-lived
connection (the replication stream, :mod:`pushup.backplane.mesh.stream`):
batches in sequence order, up to ``WINDOW`` of them unanswered, each answered
by the peer with an ack (how far it holds us) or a hole (the sequence it
expects: the link rewinds and resends from there). With a batch in flight a
TCP link holds the next back until the turn its answer comes in ends, or
``CORK`` messages wait; to a sibling worker it sends at once, and a frame
wholly in the sibling's Unix socket counts as held (``PeerLink.holds``). Its
queue is the store itself: the link remembers how far the peer has confirmed
(``after``) and how far it has sent (``_next``), so a peer that is down costs
no memory beyond the cache. Channel operations wait in a bounded queue beside
it. Failures are link state, shown in ``/stats``; they never reach a client.
Snapshots and repair, which are rare, stay signed HTTP requests (``request``).
"""

from __future__ import annotations

import hmac
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Protocol
from twisted.logger import Logger

from pushup.backplane import ChannelOp, trouble
from pushup.backplane.mesh.dial import UNIX_SCHEME, Dial, dialer
from pushup.backplane.mesh.stream import PROOF, proof
from pushup.backplane.mesh.wire import backlog, pack_batch, sign
from pushup.core.store import Store

log = Logger()
HEARTBEAT = 2.0  # an idle link checks on its peer this often (seconds)
BACKOFF_MAX = 1.0  # a dead peer costs one connection attempt a second
DOWN_AFTER = 3  # failures in a row before a peer is shown as down
DOWN_LOG_AFTER = 10.0  # seconds unreachable before the log calls a peer down (docs/operations.md)
WINDOW = 8  # batches sent and not yet answered, at most...
WINDOW_BYTES = 4 * 1024 * 1024  # ...and about this many bytes of them (always one)
SIBLING_WINDOW = 64  # ...to a sibling worker
RELAY_WINDOW = 64  # relayed batches (another node's, to a sibling) unanswered, at most
# With a batch in flight, the next leaves at the end of the turn its answer
# comes in, or at once when this many of our messages wait: under load,
# batches grow instead of multiplying (each costs both ends a frame, a
# wake-up and an answer).
CORK = 64

# connecting: not confirmed yet (starting, or failed fewer than DOWN_AFTER times);
# up: the last exchange succeeded; down: DOWN_AFTER failures in a row, or a
# batch unanswered for ``timeout``; refused: the peer does not take our
# handshake (another cluster secret, or not a PushUp node).
LinkState = Literal["connecting", "up", "down", "refused"]


class PeerError(Exception):
    """A peer answered, but not with what the protocol expects."""


class PeerRefused(PeerError):
    """A peer refuses us: another cluster secret, or not a PushUp peer URL."""


class PeerTimeout(PeerError):
    """A peer holds a batch (or our handshake) unanswered for too long."""


@dataclass(frozen=True, slots=True)
class _Sent:
    """A batch on the wire, not yet answered."""

    start: int  # it carries our messages after this sequence...
    seqs: tuple[int, ...]  # ...these ones
    ops: tuple[ChannelOp, ...]
    size: int
    at: float


class PeerLink:
    """This node's link to one peer: sends it our own messages and channel
    operations, in order, and learns how far it holds them.

    - Order: batches in sequence order on one connection, each operation
      after the messages that came before it; a hole at the peer rewinds the
      link to the sequence it expects (operations of unanswered batches go
      back to the queue, in order). A lost connection rewinds to ``after``.
    - Memory: the queue of messages is the store (what it still holds past
      ``after``); at most ``WINDOW`` batches (``SIBLING_WINDOW`` to a
      sibling), and about ``WINDOW_BYTES`` of them, are in flight; operations
      wait in a deque of ``max_ops``, the oldest dropped (and counted) when
      it is full.
    - Failure is state, never an exception to the caller: ``state`` moves
      between connecting, up, down (``DOWN_AFTER`` failures in a row, or a
      batch unanswered for ``timeout``) and refused (the handshake fails:
      another secret, or not a PushUp node), is shown in ``/stats``, and the
      link reconnects with backoff until :meth:`stop`.
    - ``on_change`` is told when ``after`` advances or ``state`` changes.
    - Time: every timer is on the injected ``clock``; ``dial`` (a protocol
      in, a Deferred of its connection out) is the only way out.
    """

    def __init__(self, url: str, store: Store, secret: str, http: Any, clock: IReactorTime,
                 max_ops: int = 10_000, timeout: float = 10.0,
                 dial: Callable[[Protocol], defer.Deferred[Any]] | None = None) -> None:
        self.url = url.rstrip("/")
        self.store = store
        self.secret = secret
        self.http = http
        self.clock = clock
        self.timeout = timeout
        self.dial = dial or dialer(clock, self.url)
        self.state: LinkState = "connecting"
        self.after = 0  # the peer holds our messages up to this sequence number
        # A sibling worker (a Unix socket on this machine): what its socket
        # holds for it counts as held (``holds``).
        self.sibling = self.url.startswith(UNIX_SCHEME + "://")
        self.handed = 0  # ...and its socket took our messages up to this one
        # With a batch in flight, a new one waits for its answer until this
        # many messages wait (CORK). Not to a sibling: its socket answers a
        # publish (``holds``), and a cork would make the publish wait for it.
        self.cork = 0 if self.sibling else CORK
        # Batches unanswered at most: a sibling's socket holds more (its
        # answers come on its next turn; our 201s do not wait for them).
        self.window = SIBLING_WINDOW if self.sibling else WINDOW
        self._answering = False  # the peer has acked a batch on this connection
        self.sent = 0  # our messages the peer accepted
        self.violations = 0  # answers refused as impossible (counted in peer_refused)
        self.unrelayed = 0  # other nodes' batches not relayed to this sibling (repair brings them)
        self.ops: deque[ChannelOp] = deque(maxlen=max_ops)
        self.dropped_ops = 0
        self._failures = 0
        self._reported: str = "connecting"  # the state the log last told
        self._outage_since = clock.seconds()  # unreachable since (starting counts)
        self._retry_now = False
        self._timer: IDelayedCall | None = None
        self._flush_call: IDelayedCall | None = None
        self._stream: Dial | None = None  # the connection, once dialled
        self._open = False  # ...and authenticated both ways
        self._dialled_at = 0.0
        self._dialling: defer.Deferred[Any] | None = None
        self._next = 0  # sent up to this sequence number
        self._window: deque[_Sent] = deque()  # sent, not yet answered, in order
        self._window_bytes = 0
        self._stale = 0  # answers still due to batches sent before a rewind
        self._relays = 0  # relayed batches sent and not yet answered
        self._why: Exception | None = None  # why we closed the connection
        self.stopped = False
        # Told when ``after`` advances or ``state`` changes (the mesh answers
        # publishes waiting for a peer to hold them).
        self.on_change: Callable[[PeerLink], None] | None = None

    # -- what the node calls ----------------------------------------------

    def start(self) -> None:
        self._wake(0)

    def poke(self) -> None:
        """New messages or ops: send them now if nothing is in flight (the
        peer's subscribers hear of them before ours are answered: the local
        fan-out waits for the next turn), else at this turn's end, together
        with whatever else the turn brings."""
        if self._open:
            if not self._window and self._flush_call is None:
                self._flush()
            elif self._flush_call is None:
                self._flush_call = self.clock.callLater(0, self._flush)
        elif self._stream is None and self._failures == 0:
            self._wake(0)

    def add_op(self, op: ChannelOp) -> None:
        if len(self.ops) == self.ops.maxlen:
            self.dropped_ops += 1
            log.warn("peer {url}: channel-op queue full, oldest dropped", url=self.url)
        self.ops.append(op)
        self.poke()

    def relay(self, payload: bytes) -> None:
        """Send the peer (a sibling worker) a batch of another node's, as
        received. At most ``RELAY_WINDOW`` go unanswered; past that, or while
        the stream is not open, it is dropped: repair brings it instead."""
        if self._open and self._stream is not None and self._relays < RELAY_WINDOW:
            self._relays += 1
            self._stream.sendString(b"r" + payload)
        else:
            self.unrelayed += 1

    def stop(self) -> None:
        self.stopped = True
        for call in (self._timer, self._flush_call):
            if call is not None and call.active():
                call.cancel()
        self._timer = self._flush_call = None
        if self._stream is not None and self._stream.transport is not None:
            self._stream.transport.loseConnection()

    @property
    def holds(self) -> int:
        """How far the peer holds our messages, as a 201 counts it.

        A peer's ack, or, for a sibling worker, less: the frame that carried
        them is wholly in its Unix socket, on a connection on which it has
        acked a batch already (so it is past its handshake and catching up,
        and applies what it reads in order). The kernel holds those bytes for
        the sibling process: they outlive the worker that sent them, as
        acked messages do, and the sibling reads them whether or not the
        sender still runs. Neither survives the death of both workers.
        Counting the socket spares a publish the wait for the sibling's turn
        (docs/benchmarks.md, issue 17)."""
        return self.handed if self.handed > self.after else self.after

    @property
    def queued(self) -> int:
        return max(0, self.store.own_seq - self.after) + len(self.ops)

    def stats(self) -> dict[str, Any]:
        return {"url": self.url, "state": self.state, "queued": self.queued, "sent": self.sent}

    @property
    def settled(self) -> bool:
        """The peer has confirmed everything we have for it."""
        return self.queued == 0 and not self._window

    @property
    def failing(self) -> bool:
        return self._failures > 0

    def kick(self) -> None:
        """Try now, whatever the backoff says (draining, or a peer spoke up)."""
        self._retry_now = True  # if an attempt is under way and fails, retry at once
        if self._open:
            self.poke()
        elif self._stream is None:
            if self._timer is not None and self._timer.active():
                self._timer.cancel()
            self._timer = None
            self._wake(0)

    # -- the loop: connect, watch, heartbeat ---------------------------------

    def _wake(self, delay: float) -> None:
        """Run the loop no later than ``delay`` seconds from now."""
        if self.stopped:
            return
        if self._timer is not None and self._timer.active():
            if self._timer.getTime() <= self.clock.seconds() + delay:
                return  # already due no later than asked
            self._timer.cancel()  # e.g. an idle link's heartbeat, seconds away
        self._timer = self.clock.callLater(delay, self._run)

    def _run(self) -> None:
        self._timer = None
        if self.stopped:
            return
        now = self.clock.seconds()
        if self._stream is None:
            self._connect()
            return
        waiting = self._window[0].at if self._window else None if self._open else self._dialled_at
        if waiting is not None and now - waiting >= self.timeout:
            self._drop(PeerTimeout(f"no answer within {self.timeout:g} s"))
            return
        if self._open and not self._window:
            self._flush(hello=True)  # a heartbeat: an empty batch, answered
        self._wake(HEARTBEAT if waiting is None else min(HEARTBEAT, waiting + self.timeout - now))

    def _connect(self) -> None:
        stream = self._stream = Dial(self)
        self._dialled_at = self.clock.seconds()
        self._why = None
        d = self._dialling = self.dial(stream)
        d.addErrback(self._not_connected, stream)
        self._wake(self.timeout)

    def _not_connected(self, failure: Any, stream: Dial) -> None:
        if self._stream is stream:
            self._stream = None
            self._failed(failure.value)

    def _drop(self, why: Exception) -> None:
        """Close the connection; ``stream_lost`` counts the failure."""
        stream = self._stream
        if stream is None:
            return
        self._why = why
        if stream.transport is not None:
            if isinstance(why, PeerTimeout):  # it reads nothing: nothing more to send
                stream.transport.abortConnection()  # type: ignore[attr-defined]
            else:  # what we said last (a refusal) still goes
                stream.transport.loseConnection()
        else:  # still dialling: forget it
            self._stream = None
            if self._dialling is not None:
                self._dialling.cancel()
            self._failed(why)

    # -- the stream, as Dial tells us -----------------------------------------

    def stream_lost(self, stream: Dial, reason: Any) -> None:
        if stream is not self._stream:
            return
        self._stream = None
        self._open = False
        self._answering = False
        ops = [op for sent in self._window for op in sent.ops]
        self.ops.extendleft(reversed(ops))  # they go again, first and in order
        self._window.clear()
        self._window_bytes = 0
        self._stale = 0
        self._relays = 0
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        if not self.stopped:
            self._failed(self._why or PeerError(trouble(reason)))

    def stream_frame(self, stream: Dial, frame: bytes) -> None:
        """A frame from the peer."""
        if stream is not self._stream:
            return
        kind, payload = frame[:1], frame[1:]
        try:
            if kind == b"c" and not self._open:
                self._challenged(stream, payload)
            elif kind in (b"a", b"n") and self._open:
                self._answered(kind, int(payload))
            elif kind == b"r" and self._open and self._relays:
                self._relays -= 1
            elif kind == b"e":
                text = payload.decode(errors="replace")
                error = PeerRefused if not self._open or text == "refused" else PeerError
                raise error(f"it says: {text[:200]}")
            else:
                raise PeerError(f"unexpected frame {frame[:20]!r}")
        except Exception as e:
            self._drop(e)

    def _challenged(self, stream: Dial, payload: bytes) -> None:
        nonce_s, theirs = payload[:-PROOF], payload[-PROOF:]
        if not hmac.compare_digest(theirs, proof(self.secret, b"server", stream.nonce_c, nonce_s)):
            stream.sendString(b"erefused")
            raise PeerRefused("its handshake proof is wrong (another cluster secret?)")
        stream.sendString(b"p" + proof(self.secret, b"client", nonce_s, stream.nonce_c))
        self._open = True
        self._next = self.after
        self._flush(hello=True)  # even an empty batch says who we are (our epoch)

    def _answered(self, kind: bytes, value: int) -> None:
        held = value if kind == b"a" else value - 1  # how far it says it holds us
        if held > self.store.own_seq:
            # Nobody holds what we have not published: a 201 must not count it.
            self.violations += 1
            raise PeerError(f"it claims to hold our messages up to {held}, "
                            f"past the last we have ({self.store.own_seq})")
        if self._stale:  # an answer to a batch sent before a rewind
            self._stale -= 1
            if kind == b"a" and value > self.after:
                self._confirmed(value)
            return
        sent = self._window.popleft()
        self._window_bytes -= sent.size
        # A hole, or an ack short of where the batch started: it lacks what
        # we counted as held (a new process behind the peer's address, empty,
        # answering the hello of a new connection). Resend from what it holds.
        if kind == b"n" or held < sent.start:
            self.handed = 0  # it lacks what its socket took: count only its acks now
            ops = [op for s in (sent, *self._window) for op in s.ops]
            self.ops.extendleft(reversed(ops))  # they go again, first and in order
            if held == sent.start:  # a hole at what we just sent: no progress
                self._window.clear()
                self._window_bytes = 0
                raise PeerError(f"asks again for {value}")
            self._stale = len(self._window)
            self._window.clear()
            self._window_bytes = 0
            self._confirmed(held)
            self._next = self.after
        else:
            self.sent += sum(1 for seq in sent.seqs if self.after < seq <= value)
            self._answering = True
            self._up()
            self._confirmed(value)
            if self.cork and self._waiting() and self._open and self._flush_call is None:
                # The cork comes off at this turn's end, so the batch also
                # takes the publishes the rest of the turn reads.
                self._flush_call = self.clock.callLater(0, self._flush)
                return
        self.poke()

    def _waiting(self) -> bool:
        """Messages or ops of ours wait to be sent."""
        return self.store.own_seq > self._next or bool(self.ops)

    def _flush(self, hello: bool = False) -> None:
        """Send what the window has room for (``hello``: at least one batch)."""
        self._flush_call = None
        stream = self._stream
        if not self._open or stream is None:
            return
        store = self.store
        if self._window and store.own_seq - self._next < self.cork and not hello:
            return  # the answer in flight sends it (``_answered``)
        while len(self._window) < self.window and (self._window_bytes < WINDOW_BYTES
                                               or not self._window):
            if not (self._waiting() or hello):
                break  # sent all we have (an answer's poke, a turn's second flush)
            batch = backlog(store, store.origin_name, self._next,
                            (store.own_seq, store.last_ts))
            messages = batch.messages
            # An op is stamped with our seq when it happened: it travels
            # with (or after) the messages before it.
            upto = messages[-1].seq if messages else self._next
            ops: list[ChannelOp] = []
            while self.ops and self.ops[0].at_seq <= upto and len(ops) < 100:
                ops.append(self.ops.popleft())
            if not (messages or ops or batch.skip or hello):
                break
            hello = False
            body = pack_batch(replace(batch, ops=tuple(ops)) if ops else batch)
            whole = stream.send_frame(b"b" + body)
            self._window.append(_Sent(self._next, tuple(m.seq for m in messages), tuple(ops),
                                      len(body), self.clock.seconds()))
            self._window_bytes += len(body)
            self._next = batch.skip[0] if batch.skip is not None else upto
            if whole and messages and self.sibling and self._answering:
                # Last: the 201s this answers may bring the next publish, and
                # its poke must find the batch sent and counted.
                self._handed(upto)
        if self._window and (self._timer is None or not self._timer.active()
                             or self._timer.getTime() > self.clock.seconds() + self.timeout):
            self._wake(self.timeout)

    def _handed(self, upto: int) -> None:
        """A sibling's socket holds our messages up to ``upto`` (``holds``)."""
        if upto > self.handed:
            moved = upto > self.after
            self.handed = upto
            if moved and self.on_change is not None:
                self.on_change(self)

    def _confirmed(self, after: int) -> None:
        """The peer holds our messages up to ``after``."""
        moved = after > self.after
        self.after = after
        if moved and self.on_change is not None:
            self.on_change(self)

    def set_state(self, state: LinkState, why: object = None) -> None:
        """Show the peer as ``state`` (see ``_report`` for what the log says)."""
        if state != self.state:
            self.state = state
            if self.on_change is not None:
                self.on_change(self)
        self._report(why)

    def _report(self, why: object) -> None:
        """The log follows the state, once per change and never per retry: a
        peer that was up and is lost is "lost; reconnecting" (info), and
        "down" (a warning) only once it has been unreachable for
        ``DOWN_LOG_AFTER`` seconds, so a peer that is starting, or restarting,
        logs nothing alarming; "up" once it answers; "refused" once."""
        state, reported = self.state, self._reported
        if state == reported:
            return
        now = self.clock.seconds()
        if state == "up":
            self._reported = "up"
            if reported == "down":
                log.info("peer {peer} is up again after {seconds:.0f} s", peer=self.url,
                         state="up", seconds=now - self._outage_since)
            else:
                log.info("peer {peer} is up", peer=self.url, state="up")
        elif state == "refused":
            self._reported = "refused"
            log.warn("peer {peer} refused: {why} (another cluster secret, or not a PushUp "
                     "node?); not waiting for it, retrying quietly", peer=self.url,
                     state="refused", why=trouble(why))
        elif reported in ("up", "refused"):
            self._reported, self._outage_since = "connecting", now
            if reported == "up":
                log.info("peer {peer} lost ({why}); reconnecting", peer=self.url,
                         state="connecting", why=trouble(why))
        elif reported == "connecting" and now - self._outage_since >= DOWN_LOG_AFTER:
            self._reported = "down"
            log.warn("peer {peer} is down: unreachable for {seconds:.0f} s ({why}); "
                     "retrying every {retry:g} s, quietly", peer=self.url, state="down",
                     seconds=now - self._outage_since, why=trouble(why), retry=BACKOFF_MAX)

    def _up(self) -> None:
        self.set_state("up")
        self._failures = 0

    def _failed(self, e: BaseException) -> None:
        self._failures += 1
        if isinstance(e, PeerTimeout):  # it holds what we sent: it is not coming back soon
            self._failures = max(self._failures, DOWN_AFTER)
        if isinstance(e, PeerRefused):
            self.set_state("refused", e)
        else:
            self.set_state("down" if self._failures >= DOWN_AFTER else "connecting", e)
        # The first failure after success is often a peer restarting: retry
        # at once; then back off (unless kicked meanwhile).
        quick = self._failures == 1 or self._retry_now
        self._retry_now = False
        self._wake(0 if quick else min(BACKOFF_MAX, 0.1 * 2 ** self._failures))

    @defer.inlineCallbacks
    def request(self, method: str, path: str, body: bytes = b"") -> Any:
        """A signed request to the peer; fires with (status, body bytes)."""
        when = int(time.time())
        headers = {"X-PushUp-Time": [str(when)],
                   "X-PushUp-Signature": [sign(self.secret, method, path, when, body)],
                   "Content-Type": ["application/json"]}
        response = yield self.http.request(method, self.url + path, data=body or None,
                                           headers=headers, timeout=self.timeout,
                                           reactor=self.clock)
        raw = yield response.content()
        return response.code, raw
