"""Peers out: one link per peer, ordered, pipelined, authenticated, retried.

A link sends this node's own messages to one peer over one long-lived
connection at a time (the replication stream, :mod:`pushup.backplane.mesh.replication`):
batches in sequence order, up to a window of them unanswered, each answered
by the peer with an ack (how far it holds us) or a hole (the sequence it
expects: the link rewinds and resends from there). With a batch in flight a
TCP link holds the next back until the turn its answer comes in ends, or
``CORK`` messages wait; to a sibling worker it sends at once, and a frame
wholly in the sibling's Unix socket counts as held (``PeerLink.holds``).
This module is the loop that connects, watches and retries, and moves
batches and answers between the parts of a link: what outlives a
connection is its ``Outbound``
(:mod:`~pushup.backplane.mesh.outbound`: positions, window, cork, ops queue),
one connection and its handshake are a ``Dial``
(:mod:`~pushup.backplane.mesh.dial`), dropped whole when it is lost, and
what the link shows (state, /stats, log lines) is its ``PeerStatus``
(:mod:`~pushup.backplane.mesh.status`). Failures are link state, shown in
``/stats``; they never reach a client. Snapshots and repair, which are rare,
stay signed HTTP requests (``request``), stamped by the link's clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Protocol

from pushup.backplane import trouble
from pushup.backplane.links import backoff
from pushup.backplane.mesh.dial import UNIX_SCHEME, Dial, PeerRefused, dialer
from pushup.backplane.mesh.outbound import Outbound, PeerError
from pushup.backplane.mesh.phases import DiallingPhase
from pushup.backplane.mesh.status import BACKOFF_MAX, LinkState, PeerStatus
from pushup.backplane.mesh.wire import sign
from pushup.core.channels import ChannelOp
from pushup.core.store import Store

HEARTBEAT = 2.0  # an idle link checks on its peer this often (seconds)
DOWN_AFTER = 3  # failures in a row before a peer is shown as down
JITTER = 0.2  # a retry comes up to this share of its backoff early (BACKOFF_MAX: the cap)
RELAY_WINDOW = 64  # relayed batches (another node's, to a sibling) unanswered, at most


def retry_after(failures: int, draw: float) -> float:
    """Seconds to wait before the next attempt after ``failures`` failures in a
    row (2 or more: the first retries at once): 0.4, 0.8, 1.6, ... doubling up
    to ``BACKOFF_MAX``, and from then on ``BACKOFF_MAX`` for as long as it
    fails, each shortened by ``JITTER * draw`` (``draw`` in [0, 1)) so nodes
    that lost the same peer do not dial it in step. Defined for any count:
    the doubling stops at the cap (``0.1 * 2 ** 1024`` overflowed a float, and
    the link stopped retrying)."""
    return backoff(failures, cap=BACKOFF_MAX, jitter=JITTER, draw=draw)


class PeerTimeout(PeerError):
    """A peer holds a batch (or our handshake) unanswered for too long."""


class PeerLink:
    """This node's link to one peer: sends it our own messages and channel
    operations, in order, and learns how far it holds them.

    - Order and memory are the ``outbound``'s (:class:`Outbound`): batches
      in sequence order, a window of them in flight, the store as the queue,
      operations in a bounded deque; a lost connection rewinds it to what
      the peer holds.
    - Failure is state, never an exception to the caller: ``state`` moves
      between connecting, up, down (``DOWN_AFTER`` failures in a row, or a
      batch unanswered for ``timeout``) and refused (the handshake fails:
      another secret, or not a PushUp node), is shown in ``/stats``, and the
      link reconnects with backoff (``retry_after``: doubling up to
      ``BACKOFF_MAX``, then at it, however long the peer fails) until
      :meth:`stop`. A failing link is dialled by its own timer: neither
      our publishes nor other peers' batches dial it, only a :meth:`kick`
      (a node starting, or this one draining).
    - ``on_change`` is told when ``holds`` advances or ``state`` changes.
    - Time: every timer, and the stamp of a signed request, is on the
      injected ``clock``; ``dial`` (a protocol in, a Deferred of its
      connection out) is the only way out, besides ``http`` for requests.
    """

    def __init__(self, url: str, store: Store, secret: str, http: Any, clock: IReactorTime,
                 max_ops: int = 10_000, timeout: float = 10.0,
                 dial: Callable[[Protocol], defer.Deferred[Any]] | None = None,
                 draw: Callable[[], float] = random.random) -> None:
        self.url = url.rstrip("/")
        self.store = store
        self.secret = secret
        self.http = http
        self.clock = clock
        self.timeout = timeout
        self.dial = dial or dialer(clock, self.url)
        self.draw = draw  # the jitter of each retry (``retry_after``)
        # A sibling worker (a Unix socket on this machine): what its socket
        # holds for it counts as held (``holds``).
        self.sibling = self.url.startswith(UNIX_SCHEME + "://")
        self.outbound = Outbound(store, self.sibling, max_ops)
        self.status = PeerStatus(self.url, clock)
        self.unrelayed = 0  # other nodes' batches not relayed to this sibling (repair brings them)
        self._failures = 0
        self._retry_now = False
        self._timer: IDelayedCall | None = None
        self._stream: Dial | None = None  # the connection, once dialled
        self.stopped = False
        # Told when ``holds`` advances or ``state`` changes (the mesh answers
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
        stream = self._stream
        if stream is not None and stream.open:
            if not stream.flush_due:
                if not self.outbound.in_flight:
                    self._flush()
                else:
                    stream.flush_at_turn_end(self.clock, self._flush)
        elif stream is None and self._failures == 0:
            self._wake(0)

    def add_op(self, op: ChannelOp) -> None:
        if self.outbound.add_op(op):
            self.status.op_dropped()
        self.poke()

    def relay(self, payload: bytes) -> None:
        """Send the peer (a sibling worker) a batch of another node's, as
        received. At most ``RELAY_WINDOW`` go unanswered; past that, or while
        the stream is not open, it is dropped: repair brings it instead."""
        stream = self._stream
        if stream is None or not stream.relay(payload, RELAY_WINDOW):
            self.unrelayed += 1

    def stop(self) -> None:
        self.stopped = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        stream = self._stream
        if stream is not None:
            stream.cancel_flush()
            stream.close()

    @property
    def state(self) -> LinkState:
        return self.status.state

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
        return self.outbound.holds

    @property
    def after(self) -> int:
        """How far the peer says it holds our messages."""
        return self.outbound.after

    @property
    def queued(self) -> int:
        return self.outbound.queued

    @property
    def violations(self) -> int:
        """Answers refused as impossible (counted in ``peer_refused``)."""
        return self.outbound.violations

    def stats(self) -> dict[str, Any]:
        return self.status.stats(self.outbound.queued, self.outbound.accepted)

    @property
    def settled(self) -> bool:
        """The peer has confirmed everything we have for it."""
        return self.outbound.settled

    @property
    def failing(self) -> bool:
        return self._failures > 0

    def kick(self) -> None:
        """Try once now, whatever the backoff says (draining, or a node
        started: ``Mesh._started``); a failure then backs off as usual."""
        stream = self._stream
        if stream is not None and stream.open:
            self.poke()
        elif stream is not None:
            self._retry_now = True  # an attempt is under way: if it fails, retry at once
        else:
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
        stream = self._stream
        if stream is None:
            self._connect()
            return
        in_flight = self.outbound.in_flight
        waiting = in_flight[0].at if in_flight else None if stream.open else stream.dialled_at
        if waiting is not None and now - waiting >= self.timeout:
            self._drop(PeerTimeout(f"no answer within {self.timeout:g} s"))
            return
        if stream.open and not in_flight:
            self._flush(hello=True)  # a heartbeat: an empty batch, answered
        self._wake(HEARTBEAT if waiting is None else min(HEARTBEAT, waiting + self.timeout - now))

    def _connect(self) -> None:
        stream = self._stream = Dial(self, self.secret, self.clock.seconds())
        self.status.dials += 1
        stream.connect(self.dial).addErrback(self._not_connected, stream)
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
        if stream.phase is not DiallingPhase.CONNECTING:
            # A peer that times out reads nothing: nothing more to send. Else
            # what we said last (a refusal) still goes.
            stream.close(why, abort=isinstance(why, PeerTimeout))
        else:  # still dialling: forget it
            self._stream = None
            stream.abandon()
            self._failed(why)

    # -- the stream, as Dial tells us -----------------------------------------

    def stream_opened(self, stream: Dial) -> None:
        """The handshake is done both ways: say who we are (our epoch), even
        with an empty batch."""
        if stream is self._stream:
            self._flush(hello=True)

    def stream_failed(self, stream: Dial, why: Exception) -> None:
        if stream is self._stream:
            self._drop(why)

    def stream_lost(self, stream: Dial, reason: Any) -> None:
        """The connection is gone, and with it all that held for it alone;
        what was in flight goes again on the next."""
        if stream is not self._stream:
            return
        self._stream = None
        self.outbound.rewind()
        if not self.stopped:
            self._failed(stream.why or PeerError(trouble(reason)))

    def stream_frame(self, stream: Dial, frame: bytes) -> None:
        """A frame from the peer, once the handshake is done."""
        if stream is not self._stream:
            return
        kind, payload = frame[:1], frame[1:]
        try:
            if kind == b"a" or kind == b"n":
                self._answered(stream, kind, int(payload))
            elif kind == b"r" and stream.relay_answered():
                pass  # a relayed batch answered: the window has room for one more
            elif kind == b"e":
                text = payload.decode(errors="replace")
                error = PeerRefused if text == "refused" else PeerError
                raise error(f"it says: {text[:200]}")
            else:
                raise PeerError(f"unexpected frame {frame[:20]!r}")
        except Exception as e:
            self._drop(e)

    def _answered(self, stream: Dial, kind: bytes, value: int) -> None:
        outbound = self.outbound
        what, moved = outbound.answer(kind, value)
        if what == "acked":
            stream.acked()
            self._up()
        if moved and self.on_change is not None:
            self.on_change(self)
        if what == "stale":
            return
        if (what == "acked" and outbound.cork and outbound.waiting() and stream is self._stream
                and not stream.flush_due):
            # The cork comes off at this turn's end, so the batch also
            # takes the publishes the rest of the turn reads.
            stream.flush_at_turn_end(self.clock, self._flush)
            return
        self.poke()

    def _flush(self, hello: bool = False) -> None:
        """Send what the window has room for (``hello``: at least one batch)."""
        stream = self._stream
        if stream is None or not stream.open:
            return
        stream.flushing()
        outbound = self.outbound
        if outbound.corked(hello):
            return  # the answer in flight sends it (``_answered``)
        while outbound.has_room():
            batch = outbound.take(self.clock.seconds(), hello)
            if batch is None:
                break
            hello = False
            body, carried = batch
            whole = stream.send_frame(b"b" + body)
            if whole and carried and self.sibling and stream.answering:
                # Last: the 201s this answers may bring the next publish, and
                # its poke must find the batch sent and counted.
                if outbound.hand(carried) and self.on_change is not None:
                    self.on_change(self)
        if outbound.in_flight and (self._timer is None or not self._timer.active()
                                   or self._timer.getTime() > self.clock.seconds()
                                   + self.timeout):
            self._wake(self.timeout)

    def set_state(self, state: LinkState, why: object = None) -> None:
        """Show the peer as ``state`` (``PeerStatus.report`` says what the log says)."""
        if self.status.show(state) and self.on_change is not None:
            self.on_change(self)
        self.status.report(why)

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
        self._wake(0 if quick else retry_after(self._failures, self.draw()))

    @defer.inlineCallbacks
    def request(self, method: str, path: str, body: bytes = b"") -> Any:
        """A signed request to the peer; fires with (status, body bytes). It
        is stamped with the link's clock, as the peer checks it with its own."""
        when = int(self.clock.seconds())
        headers = {"X-PushUp-Time": [str(when)],
                   "X-PushUp-Signature": [sign(self.secret, method, path, when, body)],
                   "Content-Type": ["application/json"]}
        response = yield self.http.request(method, self.url + path, data=body or None,
                                           headers=headers, timeout=self.timeout,
                                           reactor=self.clock)
        raw = yield response.content()
        return response.code, raw
