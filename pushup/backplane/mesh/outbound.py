"""What a link owes its peer, whatever connection carries it: a position, not a queue.

``Outbound`` remembers how far the peer holds this node's own messages
(``after``; to a sibling worker, also what its socket took: ``handed``), how
far they have been sent (``next``), the batches in flight (at most
``window``, about ``WINDOW_BYTES`` of them), the cork, and the channel
operations waiting in a bounded deque; the messages themselves stay in the
store. It outlives every connection: a lost one rewinds it (``rewind``) and
the next sends from where the peer stands. It holds no socket and reads no
clock (a batch's send time is given to it), and its invariants are checked
in one place, ``check``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Literal

from pushup.backplane.mesh.wire import backlog, pack_batch
from pushup.core.channels import ChannelOp
from pushup.core.store import Store

WINDOW = 8  # batches sent and not yet answered, at most...
WINDOW_BYTES = 4 * 1024 * 1024  # ...and about this many bytes of them (always one)
SIBLING_WINDOW = 64  # ...to a sibling worker
# With a batch in flight, the next leaves at the end of the turn its answer
# comes in, or at once when this many of our messages wait: under load,
# batches grow instead of multiplying (each costs both ends a frame, a
# wake-up and an answer).
CORK = 64
OPS_PER_BATCH = 100

# What an answer did (``Outbound.answer``): it answered a batch sent before a
# rewind, it made us rewind, or it acknowledged the oldest batch in flight.
Answer = Literal["stale", "rewound", "acked"]


class PeerError(Exception):
    """A peer answered, but not with what the protocol expects."""


@dataclass(frozen=True, slots=True)
class Sent:
    """A batch on the wire, not yet answered."""

    start: int  # it carries our messages after this sequence...
    seqs: tuple[int, ...]  # ...these ones
    ops: tuple[ChannelOp, ...]
    size: int
    at: float


class Outbound:
    """This node's own messages and channel operations, as one peer has them.

    Invariants (``check``): nobody holds what we have not published (an
    answer that claims so is a protocol violation: counted in ``violations``
    and raised as :class:`PeerError`); we never send past what we published;
    at most ``window`` batches are in flight, and their byte count is zero
    when none is. Order: batches leave in sequence order, each operation
    with (or after) the messages before it; a rewind puts the operations of
    unanswered batches back at the head of the queue, in order.
    """

    def __init__(self, store: Store, sibling: bool, max_ops: int) -> None:
        self.store = store
        self.after = 0  # the peer holds our messages up to this sequence number
        # A sibling worker (a Unix socket on this machine): what its socket
        # holds for it counts as held (``holds``)...
        self.handed = 0  # ...and its socket took our messages up to this one
        self.next = 0  # sent up to this sequence number (on this connection)
        self.accepted = 0  # our messages the peer accepted (``sent`` in /stats)
        self.violations = 0  # answers refused as impossible (counted in peer_refused)
        self.ops: deque[ChannelOp] = deque(maxlen=max_ops)
        self.dropped_ops = 0
        # With a batch in flight, a new one waits for its answer until this
        # many messages wait (CORK). Not to a sibling: its socket answers a
        # publish (``holds``), and a cork would make the publish wait for it.
        self.cork = 0 if sibling else CORK
        # Batches unanswered at most: a sibling's socket holds more (its
        # answers come on its next turn; our 201s do not wait for them).
        self.window = SIBLING_WINDOW if sibling else WINDOW
        self.in_flight: deque[Sent] = deque()  # sent, not yet answered, in order
        self.in_flight_bytes = 0
        self.stale = 0  # answers still due to batches sent before a rewind

    def check(self, held: int) -> None:
        """Every invariant, in one place. ``held`` is how far an answer says
        the peer holds us: past what we published, it is the peer's fault
        (counted, :class:`PeerError`); any other breach is ours (an
        ``AssertionError``: a bug, never the peer's doing)."""
        published = self.store.own_seq
        if held > published:
            # Nobody holds what we have not published: a 201 must not count it.
            self.violations += 1
            raise PeerError(f"it claims to hold our messages up to {held}, "
                            f"past the last we have ({published})")
        assert self.next <= published, f"sent up to {self.next}, past {published}"
        assert len(self.in_flight) <= self.window, f"{len(self.in_flight)} batches in flight"
        assert self.in_flight or not self.in_flight_bytes, "bytes in flight, no batch"

    # -- what waits -----------------------------------------------------------

    def add_op(self, op: ChannelOp) -> bool:
        """Queue ``op``; True when the queue was full and lost its oldest."""
        full = len(self.ops) == self.ops.maxlen
        if full:
            self.dropped_ops += 1
        self.ops.append(op)
        return full

    @property
    def holds(self) -> int:
        """How far the peer holds our messages, as a 201 counts it (for a
        sibling, what its socket took: ``PeerLink.holds`` says why)."""
        return self.handed if self.handed > self.after else self.after

    @property
    def queued(self) -> int:
        return max(0, self.store.own_seq - self.after) + len(self.ops)

    @property
    def settled(self) -> bool:
        """The peer has confirmed everything we have for it."""
        return self.queued == 0 and not self.in_flight

    def waiting(self) -> bool:
        """Messages or ops of ours wait to be sent."""
        return self.store.own_seq > self.next or bool(self.ops)

    # -- sending ----------------------------------------------------------------

    def corked(self, hello: bool) -> bool:
        """A batch is in flight and too little waits to send another now
        (its answer sends it)."""
        return (bool(self.in_flight) and self.store.own_seq - self.next < self.cork
                and not hello)

    def has_room(self) -> bool:
        """The window takes another batch (always one, however large)."""
        return len(self.in_flight) < self.window and (self.in_flight_bytes < WINDOW_BYTES
                                                      or not self.in_flight)

    def take(self, now: float, hello: bool) -> tuple[bytes, int] | None:
        """The next batch, counted as in flight from ``now``: its body and
        the last of our messages it carries (0 when none). None when nothing
        waits (``hello``: an empty batch all the same)."""
        if not (self.waiting() or hello):
            return None  # sent all we have (an answer's poke, a turn's second flush)
        store = self.store
        batch = backlog(store, store.origin_name, self.next, (store.own_seq, store.last_ts))
        messages = batch.messages
        # An op is stamped with our seq when it happened: it travels with
        # (or after) the messages before it.
        upto = messages[-1].seq if messages else self.next
        ops: list[ChannelOp] = []
        queue = self.ops
        while queue and queue[0].at_seq <= upto and len(ops) < OPS_PER_BATCH:
            ops.append(queue.popleft())
        if not (messages or ops or batch.skip or hello):
            return None
        body = pack_batch(replace(batch, ops=tuple(ops)) if ops else batch)
        self.in_flight.append(Sent(self.next, tuple(m.seq for m in messages), tuple(ops),
                                   len(body), now))
        self.in_flight_bytes += len(body)
        self.next = batch.skip[0] if batch.skip is not None else upto
        self.check(self.after)
        return body, upto if messages else 0

    def hand(self, upto: int) -> bool:
        """A sibling's socket holds our messages up to ``upto``; True when
        that moved ``holds``."""
        if upto <= self.handed:
            return False
        moved = upto > self.after
        self.handed = upto
        return moved

    # -- answers and losses -------------------------------------------------------

    def answer(self, kind: bytes, value: int) -> tuple[Answer, bool]:
        """The peer's answer to the oldest batch in flight: an ack (``a``, how
        far it holds us) or a hole (``n``, the sequence it expects). Returns
        what it did and whether it moved ``after``. Raises :class:`PeerError`
        for an answer that cannot be (``check``), and for a hole at what we
        just sent (no progress: the connection is to be dropped)."""
        held = value if kind == b"a" else value - 1  # how far it says it holds us
        self.check(held)
        after = self.after
        if self.stale:  # an answer to a batch sent before a rewind
            self.stale -= 1
            if kind == b"a" and value > after:
                self.after = value
                return "stale", True
            return "stale", False
        sent = self.in_flight.popleft()
        self.in_flight_bytes -= sent.size
        # A hole, or an ack short of where the batch started: it lacks what
        # we counted as held (a new process behind the peer's address, empty,
        # answering the hello of a new connection). Resend from what it holds.
        if kind == b"n" or held < sent.start:
            self.handed = 0  # it lacks what its socket took: count only its acks now
            ops = [op for s in (sent, *self.in_flight) for op in s.ops]
            self.ops.extendleft(reversed(ops))  # they go again, first and in order
            stale = len(self.in_flight)
            self.in_flight.clear()
            self.in_flight_bytes = 0
            if held == sent.start:  # a hole at what we just sent: no progress
                raise PeerError(f"asks again for {value}")
            self.stale = stale
            self.after = held
            self.next = held
            return "rewound", held > after
        self.accepted += sum(1 for seq in sent.seqs if after < seq <= value)
        self.after = value
        return "acked", value > after

    def rewind(self) -> None:
        """The connection is lost: what was in flight goes again on the next,
        from what the peer holds (its operations first, in order)."""
        ops = [op for sent in self.in_flight for op in sent.ops]
        self.ops.extendleft(reversed(ops))
        self.in_flight.clear()
        self.in_flight_bytes = 0
        self.stale = 0
        self.next = self.after
