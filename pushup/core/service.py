"""The node's behaviour over time: publish, hold, answer, expire, drain.

``Service`` owns the store, the hub and the counters, and is driven by an
injected clock (``IReactorTime``, typed as :class:`pushup.core.clock.Clock`):
one timer for every subscriber timeout, one for retention. It answers a
subscriber with a ``Delivery``, a value (the query, the store's result, the
channels closed): equal queries in one fan-out share one ``Delivery`` object,
so the HTTP layer, which renders it, renders it once. It parses no HTTP and writes no bytes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from pushup.core.channels import ChannelOp
from pushup.core.clock import Alarm, Clock, DelayedCall, micros
from pushup.core.counters import Counters
from pushup.core.errors import ShuttingDown
from pushup.core.follow import (
    Applied,
    Entry,
    Followed,
    Hole,
    LoggedOp,
    Passed,
    Place,
    Quiet,
    Skip,
    place,
)
from pushup.core.hub import Hub, Waiter
from pushup.core.idempotency import Idem, replay
from pushup.core.model import Draft, Message, Now, Query
from pushup.core.store import Channel, Result, Store

SLICE = 1000  # subscribers answered per reactor turn during a fan-out (~20 ms)
SWEEP_GRAIN = 250_000  # retention runs at most every 0.25 s


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a subscriber is answered with: ``result`` is the store's answer to
    ``query`` (messages, the next cursor, a gap flag); ``closed`` names the
    channels whose closing this answer reports.

    One fan-out makes one ``Delivery`` per distinct (query, closed) and hands
    that same object to every subscriber with that query: whoever renders it
    may cache the rendering by the object's identity.
    """

    query: Query
    result: Result
    closed: tuple[str, ...] = ()


class Subscriber(Protocol):
    """The HTTP layer's end of a held subscription."""

    def respond(self, delivery: Delivery, hold: bool = False) -> bool:
        """Answer with ``delivery`` (a 200); False if the client is gone.

        Called at most once per hold. ``hold``: a fan-out is still under way;
        do not read this client's next request until ``Service.on_fanout_done``
        listeners run (they run at the end of every fan-out, held or not).
        """


class Service:
    """This node's behaviour: the one way into its store, and its held subscribers.

    Every backplane enters the core here: this node's own publishes through
    :meth:`publish` (or :meth:`publish_logged`, when the cluster's log
    stamped them), everything another origin ordered — its messages, its
    channel operations, what of it is gone — through :meth:`follow`. Whoever
    changes what the store holds calls :meth:`arrived` (both do), so held
    subscribers are answered on the reactor's next turn, a slice of
    ``SLICE`` at a time.

    A draining node (:meth:`drain`) answers every held subscriber at once
    and refuses new publishes: :meth:`check_open` is that rule, checked once
    per publish by the caller (the HTTP handler, before it reads the body).
    The clock is injected; nothing here touches a socket.
    """

    def __init__(self, store: Store, clock: Clock, max_timeout: float) -> None:
        self.store = store
        self.hub = Hub()
        self.counters = Counters()
        self.clock = clock
        self.max_timeout = max_timeout
        self.started = clock.seconds()
        self.draining = False
        self.on_fanout_done: list[Callable[[], None]] = []
        # told (delivery, subscribers) as a fan-out writes a delivery to a run of
        # subscribers (the node's delivery-lag histogram)
        self.on_answered: Callable[[Delivery, int], None] | None = None
        self._timeouts = Alarm(clock, self._on_timeout)
        self._sweeper = Alarm(clock, self._on_sweep)
        # when retention next has something to do (µs, not rounded to the
        # sweep's grain): a subscribe past it sweeps first, so no message is
        # served past its ttl while the sweep's timer is still to come
        self._retain_at: int | None = None
        self._backlog: deque[tuple[Subscriber, Delivery, int]] = deque()
        self._flushing: DelayedCall | None = None
        self._arrivals: list[Message] = []  # stored, waiters not yet woken
        self._arriving: DelayedCall | None = None

    def now(self) -> int:
        return micros(self.clock.seconds())

    # -- publishing --------------------------------------------------------

    def publish(self, drafts: Sequence[Draft], idem: Idem | None = None) -> list[Message]:
        """This node's own publish, all drafts validated and stamped by this
        node's origin: counts it, stores it and answers its subscribers. (The
        backplane decides when the publisher hears back and tells the
        cluster; the caller checked :meth:`check_open`.)

        With ``idem``, a key this node remembers (from any node of the
        cluster) stores nothing: the answer is the first attempt's messages,
        as ``Replayed``; the key with another body raises ``KeyReused``.
        """
        now = self.now()
        if idem is not None:
            record = self.store.keys.recall(idem, now)
            if record is not None:
                return replay(record, drafts)
        messages = self.store.publish(drafts, now, idem)
        self.counters.published += len(messages)
        self.arrived(messages, now)
        return messages

    def publish_logged(self, messages: Sequence[Message], current: bool,
                       scoped: bool = False) -> list[Message]:
        """This node's own publish as the cluster's log stamped it (the Redis
        engine): counted, and followed now if the log is still the ``current``
        one and they come next in its origin (else the log's tail brings them,
        in order)."""
        self.counters.published += len(messages)
        if current and messages:
            self.follow(messages[0].origin, messages, scoped=scoped)
        return list(messages)

    def follow(self, origin: str, entries: Iterable[Entry], *, trimmed: bool = False,
               scoped: bool = False) -> Followed:
        """Another origin's entries, in its order: the one way into the store
        for what this node did not stamp itself (:mod:`pushup.core.follow`).

        Each numbered entry (a message, a logged operation) is applied only
        when it is the next of its origin; one held already is passed over;
        one further on is a hole: nothing after it is applied and the answer
        is ``Hole`` (send again from there), unless ``trimmed`` (the entries
        are read from the origin's whole log: what lies between was trimmed
        from it, a gap readers are told of). A ``ChannelOp`` applies once the
        origin is held up to its ``at_seq`` (else a hole too); a ``Skip``
        moves the horizon past history gone everywhere, a ``Quiet`` past
        entries of channels this node does not follow; a ``Remembered`` is
        kept once its last message is held. Held subscribers are answered
        on the reactor's next turn, as after a publish. A ``scoped`` origin
        is named by a cursor only for the channels holding its messages
        (``Store.know``).
        """
        store = self.store
        now = self.now()
        store.know(origin, scoped)
        arrived: list[Message] = []
        hole = False
        for entry in entries:
            horizon = store.horizon_of(origin)
            if isinstance(entry, Message | LoggedOp | Passed):
                where = place(entry.seq, horizon)
                if where is Place.HELD:
                    continue
                if where is Place.AHEAD:
                    if not trimmed:
                        hole = True
                        break
                    store.skip_to(origin, entry.seq - 1, entry.ts - 1)
                if isinstance(entry, Message):
                    store.apply(entry, now)
                    arrived.append(entry)
                else:
                    store.pass_over(origin, entry.seq)
                    if isinstance(entry, LoggedOp):
                        self.apply_op(entry.op, now)
            elif isinstance(entry, ChannelOp):
                if entry.at_seq > horizon:
                    hole = True
                    break
                if entry.at_seq < horizon:
                    # applied already (a message after it is held): a link's
                    # resend from further back must not roll the channel back
                    continue
                self.apply_op(entry, now)
            elif isinstance(entry, Quiet):
                store.pass_to(origin, entry.seq)
            elif isinstance(entry, Skip):
                store.skip_to(origin, entry.seq, entry.ts)
            elif entry.last_seq <= horizon:  # a keyed publish we hold all of
                store.remember(entry, now)
        if arrived:
            self.arrived(arrived, now)
        horizon = store.horizon_of(origin)
        return Hole(horizon + 1) if hole else Applied(horizon)

    def unfollow(self, origin: str, channels: Iterable[str]) -> None:
        """This node stops following ``origin`` (a Redis partition none of its
        clients needs any more) and the ``channels`` that live in it: they and
        its messages leave the store, untold (nothing was lost: following it
        again reads them again). No client waits on them (the caller's rule)."""
        self.store.let_go(origin, channels)

    def backfill(self, origin: str, messages: Iterable[Message], channels: Iterable[str],
                 ) -> int:
        """Messages of ``origin`` at or behind its horizon, read for ``channels``
        only (a channel this node starts following in a partition it follows
        already, ``Store.backfill``): no subscriber is answered, as none of this
        node's could have waited on those channels yet. Returns how many a
        channel lacked."""
        return self.store.backfill(origin, messages, tuple(channels), self.now())

    def unfollow_channels(self, channels: Iterable[str]) -> None:
        """This node stops following ``channels`` (it keeps following the
        origins they live in for its other channels): they and their messages
        leave the store, untold (``Store.drop_channels``). No client waits on
        them (the caller's rule)."""
        self.store.drop_channels(channels)

    def check_open(self) -> None:
        """``ShuttingDown`` (503) once the node drains: no new publish."""
        if self.draining:
            raise ShuttingDown("the node is shutting down; publish to another node")

    def arrived(self, messages: Iterable[Message], now: int) -> None:
        """New messages are in the store: answer everyone they are for, on the
        reactor's next turn, so whoever brought them (a publisher, a peer) is
        answered first. Nothing is missed meanwhile: a subscribe that comes in
        between reads the store, which already holds them."""
        self._arrivals.extend(messages)
        if self._arriving is None:
            self._arriving = self.clock.callLater(0, self._deliver_arrivals)

    def _deliver_arrivals(self) -> None:
        self._arriving = None
        messages, self._arrivals = self._arrivals, []
        waiters: dict[Waiter, None] = {}
        for m in messages:
            waiters.update(dict.fromkeys(self.hub.take_matching(m)))
        self._answer(waiters, at_once=True)
        now = self.now()
        self._timeouts.set(self.hub.next_deadline(), now)
        self._sweeper.set(self._next_sweep(), now)

    # -- subscribing -------------------------------------------------------

    def subscribe(self, query: Query, timeout: float, who: Subscriber,
                  through_drain: bool = False) -> Delivery | Waiter:
        """Answer now (returns the ``Delivery``; ``who`` is not called) or hold
        (returns the Waiter to ``forget``; ``who.respond`` is called later).
        A draining node answers at once, unless ``through_drain`` (an event
        stream the drain lets live a while, see :meth:`drain`)."""
        now = self.now()
        self._retain(now)
        if isinstance(query.since, Now):
            query = replace(query, since=self.store.end(query.channels))
        if self.store.touch(query.channels, now):
            # New channels expire one ttl from now even if nothing else
            # happens: a pull answered below arms no other timer.
            self._sweeper.set(self._next_sweep(), now)
        result = self.store.query(query)
        past_until = query.until is not None and query.until < now
        draining = self.draining and not through_drain
        if result.messages or result.gap or timeout <= 0 or draining or past_until:
            self.counters.delivered += len(result.messages)
            return Delivery(query, result)
        waiter = Waiter(query, now + micros(min(timeout, self.max_timeout)), who)
        self.hub.add(waiter)
        # (Retention's timer needs nothing here: holding changes no store deadline,
        # and a channel this poll created armed it above.)
        self._timeouts.set(waiter.deadline, now)
        return waiter

    def read(self, query: Query) -> Result:
        """What ``query`` reads now, never a message past its ttl (a read that
        holds no one: an event stream's page, a HEAD); counts nothing."""
        self._retain(self.now())
        return self.store.query(query)

    def _retain(self, now: int) -> None:
        """Sweep first when retention is due: its timer keeps the sweep's
        grain, a read must not serve what it is about to let go."""
        if self._retain_at is not None and self._retain_at <= now:
            self._on_sweep(now)

    def rearm(self) -> None:
        """Channels were created or renewed: make sure retention runs in time."""
        self._sweeper.set(self._next_sweep(), self.now())

    def forget(self, waiter: Waiter) -> None:
        """The subscriber went away: drop every trace of it."""
        if self.hub.discard(waiter):
            self._timeouts.set(self.hub.next_deadline(), self.now())

    def create_channel(self, name: str | None, ttl: int | None) -> Channel:
        channel = self.store.create(name, ttl, self.now())
        self.rearm()
        return channel

    def renew_channel(self, name: str, ttl: int | None) -> Channel:
        channel = self.store.renew(name, ttl, self.now())
        self.rearm()
        return channel

    def delete_channel(self, name: str) -> None:
        self.close_channel(name)

    def apply_op(self, op: ChannelOp, now: int) -> None:
        """Another node's channel operation (the mesh's, or the Redis log's):
        the channel as that node left it; a delete answers its subscribers."""
        if op.kind == "delete":
            if self.store.channel(op.name) is not None:
                self.close_channel(op.name)
            return
        self.store.apply_op(op, now)
        self.rearm()

    def close_channel(self, name: str) -> None:
        """Delete the channel (404 if there is none) and answer its subscribers."""
        self.store.delete(name)
        self._answer(dict.fromkeys(self.hub.take_channel(name)), closed=name)
        self._timeouts.set(self.hub.next_deadline(), self.now())

    # -- answering ---------------------------------------------------------

    def _answer(self, waiters: Iterable[Waiter], closed: str | None = None,
                at_once: bool = False) -> None:
        """Queue an answer for each waiter; equal queries share one ``Delivery``.

        The first slice goes out ``at_once`` or on the reactor's next turn.
        """
        shut = (closed,) if closed else ()
        deliveries: dict[Query, tuple[Delivery, int]] = {}
        backlog = self._backlog
        # Waiters of one query mostly share its object (the HTTP front caches
        # parsed queries): a run of them looks it up, and hashes it, once.
        last: Query | None = None
        for waiter in waiters:
            query = waiter.query
            if query is not last:
                last = query
                entry = deliveries.get(query)
                if entry is None:
                    result = self.store.query(query)
                    entry = (Delivery(query, result, shut), len(result.messages))
                    deliveries[query] = entry
                delivery, count = entry
            backlog.append((waiter.target, delivery, count))  # type: ignore[arg-type]
        if at_once:
            self._flush()
        elif self._backlog and self._flushing is None:
            # e.g. a channel closed by a request: that request is answered first
            self._flushing = self.clock.callLater(0, self._flush)

    def _flush(self, everything: bool = False) -> None:
        """Answer a slice of the backlog now and yield the reactor for the rest."""
        if self._flushing is not None and self._flushing.active():
            self._flushing.cancel()
        self._flushing = None
        backlog = self._backlog
        n = len(backlog) if everything else min(SLICE, len(backlog))
        # Between slices the reactor serves other clients, but not the next
        # requests of those already answered: everyone gets this message
        # before anyone's re-poll costs the fan-out time.
        hold = n < len(backlog)
        delivered = 0
        answered = self.on_answered
        last, run = None, 0  # a run of subscribers answered with one delivery
        for _ in range(n):
            who, delivery, count = backlog.popleft()
            if who.respond(delivery, hold):
                delivered += count
                if delivery is not last:
                    if run and answered is not None:
                        answered(last, run)  # type: ignore[arg-type]
                    last, run = delivery, 0
                run += 1
        if run and answered is not None:
            answered(last, run)  # type: ignore[arg-type]
        self.counters.delivered += delivered
        if backlog:
            if self._flushing is None:
                self._flushing = self.clock.callLater(0, self._flush)
        else:  # the fan-out is over: held clients read on, its renderings can go
            for listener in self.on_fanout_done:
                listener()

    @property
    def backlog(self) -> int:
        return len(self._backlog)

    # -- timers ------------------------------------------------------------

    def _on_timeout(self, deadline: int) -> None:
        now = max(self.now(), deadline)
        self._answer(self.hub.take_expired(now), at_once=True)
        self._timeouts.set(self.hub.next_deadline(), now)

    def _next_sweep(self) -> int | None:
        deadline = self._retain_at = self.store.next_deadline()
        if deadline is None:
            return None
        return deadline + (-deadline % SWEEP_GRAIN)

    def _on_sweep(self, deadline: int) -> None:
        now = max(self.now(), deadline)
        self.store.expire(now, busy=lambda name: self.hub.waiting_on(name) > 0)
        self._sweeper.set(self._next_sweep(), now)

    # -- shutting down -----------------------------------------------------

    def drain(self, keep: Callable[[object], bool] | None = None) -> None:
        """Refuse new work and answer every held subscriber now, but those
        whose target ``keep`` names (event streams ended later, spread over
        the drain window): they stay held, are answered as before, and may
        hold again (``subscribe(..., through_drain=True)``)."""
        self.draining = True
        answered: list[Waiter] = []
        kept: list[Waiter] = []
        for waiter in self.hub.take_all():
            (kept if keep is not None and keep(waiter.target) else answered).append(waiter)
        if kept:  # held on: arrivals on their way still wake them, next turn
            for waiter in kept:
                self.hub.add(waiter)
        else:
            if self._arriving is not None and self._arriving.active():
                self._arriving.cancel()  # everyone is answered below, with the store as it is
            self._arriving, self._arrivals = None, []
        self._answer(answered)
        self._flush(everything=True)
        self._timeouts.set(self.hub.next_deadline(), self.now())
        self._sweeper.set(None, self.now())

    # -- figures -----------------------------------------------------------

    def snapshot(self, rss: int) -> dict[str, object]:
        c = self.counters
        return {
            "node_id": self.store.node_id,
            "origin": self.store.origin_name,
            "uptime_s": round(self.clock.seconds() - self.started, 3),
            "connections": c.connections,
            "waiting": len(self.hub),
            "channels": self.store.channel_count,
            "messages": self.store.message_count,
            "cached_bytes": self.store.bytes,
            "idempotency_keys": len(self.store.keys),
            "idempotency_bytes": self.store.keys.bytes,
            "published": c.published,
            "delivered": c.delivered,
            "bytes_in": c.bytes_in,
            "bytes_out": c.bytes_out,
            "refused": c.refused,
            "rss_bytes": rss,
        }

