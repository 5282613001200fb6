"""The Redis backplane: channels in K partitions, each a log in Redis and its
own origin; a node follows only the partitions its clients need.

The rule: a partition's log in Redis is that partition's one order, and a
node holds a partition whole or not at all. A publish is one script call
per partition it touches (``partitions.py``), which appends atomically and
notifies the partition's followers with a sharded ``SPUBLISH``; the 201 is
sent once every partition answered. A node follows a partition (subscribes
to its notifications and reads its log back) from the first request that
needs it — a poll or an event stream on one of its channels, a read of one
of its channels — until ``LINGER`` seconds after the last: a request for a
partition the node does not follow waits for one read from Redis (a cold
poll), then is answered from memory like every other; a node pays nothing
for the partitions none of its clients need. It reads a followed
partition's log back (``XRANGE``) whenever it cannot be sure it saw
everything: once subscribed (at first and after any reconnection or slot
move), after a hole in the sequence, after an entry of another epoch.

A message goes to the partition of its first channel, whatever its others:
one message, one id, listed once by a reader of several of its channels.
Before it is appended, each other channel's partition is told, by a note in
its own log, that the channel has messages in the first one (``abroad``):
a node that follows a channel follows those partitions too. A batch whose
messages fall in several partitions is one atomic append per partition: if
one fails the publisher gets no 201, and a retry with its
``Idempotency-Key`` appends only what is missing.

Cursors keep their format: a partition's origin is ``<tag>.<epoch>``, scoped
(a cursor names it only for the channels holding its messages). A new epoch
means Redis lost what it had acknowledged (restarted empty, or failed over to
a replica that lags): the node marks the old origin lost past everything it
holds, so each client behind it gets ``gap: true`` once. A sequence number
that jumps in a log read back (trimmed past a node that was away) is a gap
too. Never silence, never a duplicate: a node applies each log in order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from twisted.internet import defer, task
from twisted.logger import Logger
from twisted.python.failure import Failure

from pushup.backplane import ChannelOp, OpKind, Unconfirmed
from pushup.backplane.redis.client import RedisError, RedisGone, RedisNotSent
from pushup.backplane.redis.cluster import Shards
from pushup.backplane.redis.partitions import (
    CHECK,
    CHECK_SHA,
    PUBLISH,
    PUBLISH_SHA,
    Partition,
    decode_told,
    partition_of,
    partition_tags,
)
from pushup.config import Config, parse_seeds
from pushup.core import errors
from pushup.core.channels import Channel, check_ttl
from pushup.core.follow import Entry, Hole, LoggedOp, Passed, Skip
from pushup.core.idempotency import Idem, Replayed
from pushup.core.model import Draft, Message, check_channel_name, dumps
from pushup.core.service import Service

log = Logger()
PAGE = 1000  # log entries per XRANGE reply
COMMAND_TIMEOUT = 2.0  # seconds Redis has to answer a publish or a check
RETRY = 0.5  # seconds before a partition's failed read is tried again
PARTITIONS = "pushup:partitions"  # how many partitions the nodes on this Redis use
# A partition is followed for this long after the last request that needed
# it: a long-poll client re-polls within a round trip, and a client hopping
# between nodes comes back to this one within seconds; 30 s keeps a
# channel with steady readers followed, and lets one nobody reads go.
LINGER = 30.0
REPLICAS_TTL = 5.0  # seconds a primary's number of replicas is trusted (--publish-ack)


class RedisEngine:
    """The backplane over Redis (see the module's rule)."""

    engine = "redis"

    def __init__(self, service: Service, config: Config, reactor: Any) -> None:
        self.service = service
        self.store = service.store
        self.clock = reactor
        self.seeds = parse_seeds(config.engine)
        self.maxlen = config.redis_maxlen
        self.timeout = COMMAND_TIMEOUT
        self.linger = LINGER
        self.key_window_ms = max(1, round(config.idempotency_window * 1000))
        self.publish_ack = config.publish_ack  # local, peer (a replica), all (replicas)
        self.ack_timeout_ms = max(1, round(config.publish_ack_timeout * 1000))
        self._replicas: dict[str, tuple[int, float]] = {}  # tag -> (replicas, when asked)
        self.shards = Shards(self.seeds, reactor)
        self.partitions = [Partition(i, tag) for i, tag in
                           enumerate(partition_tags(config.redis_partitions))]
        self.ready = False
        self.stopped = False
        self.lost_epochs = 0  # times a log was found to have lost entries we held
        self._gone: list[tuple[str, int]] = []  # (origin, held) found gone, not yet said
        self._sweeper: Any = None  # the LoopingCall that lets unneeded partitions go
        # a partition's lost history is a gap for the readers of its channels only
        self.store.sources_by(lambda name: [p.tag for p in self._needed_for(name)])

    def partition(self, channel: str) -> Partition:
        return self.partitions[partition_of(channel, len(self.partitions))]

    # -- the backplane -------------------------------------------------------

    def check_ready(self) -> None:
        if not self.ready:
            raise errors.CatchingUp("this node is connecting to Redis; retry shortly")

    def probe(self) -> defer.Deferred[None]:
        """``/health``'s question: every connection up and a PING answered by
        every primary within ``COMMAND_TIMEOUT`` (a Redis that is paused holds
        the TCP connection open: only an unanswered command shows it)."""
        if not self.shards.connected:
            return defer.fail(errors.EngineUnavailable(
                "Redis is unreachable: this node cannot take publishes"))

        def unanswered(failure: Failure) -> None:
            if not isinstance(failure.value, (RedisGone, RedisError)):
                failure.raiseException()
            raise errors.EngineUnavailable(
                f"Redis did not answer a PING ({failure.getErrorMessage()}): "
                "this node cannot take publishes")

        d = self.shards.probe(self.timeout)
        d.addErrback(unanswered)
        return d

    @defer.inlineCallbacks
    def start(self) -> Any:
        """Reach Redis and check that its partitions are ours: the node
        serves then, following partitions as requests need them (fails, and
        the node never serves, if the nodes already on this Redis use
        another number of partitions)."""
        self.shards.start()
        yield self.shards.topology_read()
        yield self._check_partitions()
        self.ready = True
        self._sweeper = task.LoopingCall(self._let_go_of_unneeded)
        self._sweeper.clock = self.clock
        self._sweeper.start(self.linger / 3, now=False)
        log.info("redis: {n} partitions; serving (a partition is read when a request "
                 "first needs it)", n=len(self.partitions))

    @defer.inlineCallbacks
    def _check_partitions(self) -> Any:
        """The first node on a Redis records its number of partitions; every
        later node must say the same (with another, two nodes would put one
        channel in two logs). Retried while Redis is unreachable."""
        count = len(self.partitions)
        while not self.stopped:
            try:
                before = yield self.shards.execute(PARTITIONS, "SET", PARTITIONS, count, "NX",
                                                   "GET", timeout=self.timeout)
            except (RedisGone, RedisError):
                yield task.deferLater(self.clock, RETRY, lambda: None)
                continue
            if before is not None and int(before) != count:
                log.error("redis: this node has --redis-partitions {count}, but the nodes "
                          "on this Redis use {theirs}; every node must use the same number. "
                          "Not serving.", count=count, theirs=int(before))
                raise errors.EngineUnavailable(
                    f"--redis-partitions {count} differs from this Redis's {int(before)}")
            return

    @defer.inlineCallbacks
    def stop(self, grace: float) -> Any:
        """Nothing to hand on: what was acknowledged is in Redis."""
        self.stopped = True
        if self._sweeper is not None and self._sweeper.running:
            self._sweeper.stop()
        for p in self.partitions:
            self._fail_waiting(p, errors.ShuttingDown("this node is shutting down"))
        yield self.shards.stop()

    # -- following by interest -----------------------------------------------

    def prepare(self, channels: Iterable[str]) -> defer.Deferred[None] | None:
        """Make sure this node holds whatever ``channels`` need: None when it
        does already (a warm request), else a Deferred that fires once it does
        (a cold one: one read from Redis), or fails with ``EngineUnavailable``
        if Redis does not answer within ``COMMAND_TIMEOUT``."""
        names = tuple(channels)
        now = self.clock.seconds()
        missing: list[Partition] = []
        for name in names:
            for p in self._needed_for(name):
                p.needed_at = now
                p.needed_by.add(name)
                if not p.ready:
                    missing.append(p)
        if not missing:
            return None
        d: defer.Deferred[Any] = defer.gatherResults(
            [self._when_ready(p) for p in dict.fromkeys(missing)], consumeErrors=True)
        d.addErrback(_first_error)
        # what is read may name partitions abroad to follow too: ask again
        d.addCallback(lambda _: self.prepare(names))
        return d

    def _needed_for(self, name: str) -> list[Partition]:
        """The partitions a reader of channel ``name`` needs: its own, and those
        holding its messages published with an earlier channel (once its own
        is read, this node knows them)."""
        home = self.partition(name)
        return [home, *(self.partitions[i] for i in sorted(home.abroad.get(name, ())))]

    def _when_ready(self, p: Partition) -> defer.Deferred[None]:
        d: defer.Deferred[None] = defer.Deferred()
        p.when_ready.append(d)
        timer = self.clock.callLater(self.timeout, self._too_late, p, d)
        d.addBoth(_cancel_then, timer)
        self._follow(p)
        return d

    def _too_late(self, p: Partition, d: defer.Deferred[None]) -> None:
        if d in p.when_ready:
            p.when_ready.remove(d)
            d.errback(errors.EngineUnavailable(
                "this node could not read the channel from Redis in time (Redis slow or "
                "unreachable, or this node too busy); retry shortly"))

    def _follow(self, p: Partition) -> None:
        """Subscribe to the partition's notifications (its read back follows)."""
        if not p.followed and not self.stopped:
            p.followed = True
            self.shards.subscribe(p.notify, partial(self._notified, p),
                                  partial(self._read_back, p))

    def _let_go_of_unneeded(self) -> None:
        """Every ``linger`` / 3 s: stop following each partition no request
        needed for ``linger`` seconds and no client waits on."""
        now = self.clock.seconds()
        hub = self.service.hub
        for p in self.partitions:
            if not p.followed:
                continue
            # (only the channels clients wait on now: a poll that comes back
            # names its channel again, so the set does not grow with every
            # channel ever read)
            p.needed_by = {name for name in p.needed_by if hub.waiting_on(name)}
            if p.needed_by:
                p.needed_at = now
            elif now - p.needed_at > self.linger and not p.reading and not p.when_ready:
                self._unfollow(p)

    def _unfollow(self, p: Partition) -> None:
        self.shards.unsubscribe(p.notify)
        p.followed = p.ready = False
        p.waiting = []
        p.needed_by = set()
        mine = [name for name in self.store.channel_names()
                if self.partition(name) is p]
        self.service.unfollow(p.origin, mine)
        log.debug("redis {tag}: not needed for {s} s; no longer followed", tag=p.tag,
                  s=self.linger)

    def _fail_waiting(self, p: Partition, error: Exception) -> None:
        waiting, p.when_ready = p.when_ready, []
        for d in waiting:
            d.errback(error)

    # -- publishing ------------------------------------------------------------

    def publish(self, drafts: Sequence[Draft], idem: Idem | None = None,
                ) -> defer.Deferred[list[Message]]:
        parts: dict[Partition, list[Draft]] = {}
        notes: dict[Partition, list[bytes | str]] = {}
        for draft in drafts:
            home = self.partition(draft.channels[0])
            parts.setdefault(home, []).append(draft)
            for name in draft.channels[1:]:
                there = self.partition(name)
                if there is not home and home.index not in there.abroad.get(name, ()):
                    notes.setdefault(there, []).extend(("f", name, str(home.index)))
        if notes:  # before the messages: a follower of those channels learns where
            noted = defer.gatherResults([self._append(p, entries)
                                         for p, entries in notes.items()], consumeErrors=True)
            noted.addErrback(_first_error)
            return noted.addCallback(lambda _: self._publish_parts(drafts, parts, idem))
        return self._publish_parts(drafts, parts, idem)

    def _publish_parts(self, drafts: Sequence[Draft], parts: dict[Partition, list[Draft]],
                       idem: Idem | None) -> defer.Deferred[list[Message]]:
        if len(parts) == 1:
            ((p, mine),) = parts.items()
            return self._publish_to(p, mine, idem)
        calls = [self._publish_to(p, mine, idem) for p, mine in parts.items()]
        d: defer.Deferred[Any] = defer.gatherResults(calls, consumeErrors=True)
        d.addCallbacks(self._in_draft_order, _first_error, callbackArgs=(drafts, parts))
        return d

    def _publish_to(self, p: Partition, drafts: Sequence[Draft], idem: Idem | None,
                    ) -> defer.Deferred[list[Message]]:
        entries: list[bytes | str] = []
        for draft in drafts:
            entries += ["m", dumps(list(draft.channels)), draft.data]
        d = self._append(p, entries, idem)
        d.addCallback(self._published, p, drafts)
        if self.publish_ack != "local" and not self._alone(p):
            d.addCallback(self._copied, p)
        return d

    def _alone(self, p: Partition) -> bool:
        """The primary of ``p`` is known, lately, to have no replica: nothing to wait for."""
        known = self._replicas.get(p.tag)
        return (known is not None and known[0] == 0
                and self.clock.seconds() - known[1] < REPLICAS_TTL)

    @defer.inlineCallbacks
    def _copied(self, messages: list[Message], p: Partition) -> Any:
        """``--publish-ack peer`` or ``all`` on Redis: the 201 once a replica
        of the partition's primary (or every one) holds the append (``WAIT``
        on the connection that sent it), 202 ``Unconfirmed`` if none did in
        ``--publish-ack-timeout``; at once where the primary has no replica."""
        replicas = yield self._replicas_of(p)
        if replicas == 0 or isinstance(messages, Replayed):
            return messages
        need = 1 if self.publish_ack == "peer" else replicas
        try:
            acked = yield self.shards.execute(p.log, "WAIT", need, self.ack_timeout_ms,
                                              timeout=self.ack_timeout_ms / 1000 + self.timeout)
        except (RedisGone, RedisError):
            acked = 0
        return messages if acked >= need else Unconfirmed(messages)

    @defer.inlineCallbacks
    def _replicas_of(self, p: Partition) -> Any:
        """How many replicas the primary of ``p`` has (``ROLE``; asked at most
        every ``REPLICAS_TTL`` seconds per partition)."""
        now = self.clock.seconds()
        known = self._replicas.get(p.tag)
        if known is not None and now - known[1] < REPLICAS_TTL:
            return known[0]
        try:
            role = yield self.shards.execute(p.log, "ROLE", timeout=self.timeout)
            count = len(role[2]) if role[0] == b"master" else 0
        except (RedisGone, RedisError):
            count = 0
        self._replicas[p.tag] = (count, now)
        return count

    @staticmethod
    def _in_draft_order(results: list[list[Message]], drafts: Sequence[Draft],
                        parts: dict[Partition, list[Draft]]) -> list[Message]:
        """One publish's messages from several partitions, in the order of its drafts
        (a retry that found every part appended already is a replay)."""
        by_draft = {id(d): m for mine, got in zip(parts.values(), results, strict=True)
                    for d, m in zip(mine, got, strict=True)}
        messages = [by_draft[id(d)] for d in drafts]
        if all(isinstance(got, Replayed) for got in results):
            return Replayed(messages)
        if any(isinstance(got, Unconfirmed) for got in results):
            return Unconfirmed(messages)
        return messages

    def _published(self, reply: list[Any], p: Partition, drafts: Sequence[Draft],
                   ) -> list[Message]:
        again = reply[-1] == b"again"  # a retry: the first attempt's entries
        epoch, stamps = p.epoch_of(reply), reply[1:-1] if again else reply[1:]
        origin = f"{p.tag}.{epoch}"
        messages = [Message(origin, int(stamps[2 * i]), int(stamps[2 * i + 1]), d.channels,
                            d.data) for i, d in enumerate(drafts)]
        if again:
            return Replayed(messages)
        # Our publish, if we follow its partition and it comes next there, is
        # held now (the publisher's next poll here sees it); otherwise its
        # notification brings it in order, or a cold read does.
        messages = self.service.publish_logged(
            messages, current=p.ready and epoch == p.epoch, scoped=True)
        if p.followed and epoch != p.epoch:
            self._read_back(p, f"a publish found the log at epoch {epoch}")
        return messages

    def create_channel(self, name: str | None, ttl: int | None) -> defer.Deferred[Channel]:
        name = self.store.new_name(name)
        ttl = check_ttl(ttl, self.store.retention.channel_ttl)
        return self._operate("create", name, ttl)

    def renew_channel(self, name: str, ttl: int | None) -> defer.Deferred[Channel]:
        check_channel_name(name)

        def renew(_: object) -> defer.Deferred[Channel]:
            channel = self.store.get(name)
            return self._operate("renew", name, check_ttl(ttl, channel.ttl))

        return self._then(name, renew)

    def delete_channel(self, name: str) -> defer.Deferred[None]:
        def delete(_: object) -> defer.Deferred[Channel]:
            self.store.get(name)
            return self._operate("delete", name, 0)

        return self._then(name, delete).addCallback(lambda _: None)

    def _then(self, name: str, action: Callable[[object], defer.Deferred[Channel]],
              ) -> defer.Deferred[Channel]:
        """``action`` once this node holds channel ``name``'s partition."""
        ready = self.prepare([name])
        if ready is None:
            return action(None)
        done: defer.Deferred[Channel] = ready.addCallback(action)
        return done

    def _operate(self, kind: OpKind, name: str, ttl: int) -> defer.Deferred[Channel]:
        expires_at = self.service.now() + ttl
        op = dumps({"op": kind, "ttl": ttl, "expires_at": expires_at})
        p = self.partition(name)
        d = self._append(p, ["o", name, op])

        def done(reply: list[Any]) -> Channel:
            epoch, seq = p.epoch_of(reply), int(reply[1])
            if p.ready and epoch == p.epoch:  # applied now if next, else notified
                self.service.follow(p.origin, [_logged_op(seq, 0, name, op)], scoped=True)
            elif p.followed:
                self._read_back(p, f"an operation found the log at epoch {epoch}")
            channel = self.store.channel(name)
            if channel is None:  # deleted, or not applied here yet: as the log has it
                channel = Channel(name, ttl, expires_at - ttl)
            return channel

        d.addCallback(done)
        return d

    def _append(self, p: Partition, entries: list[bytes | str], idem: Idem | None = None,
                ) -> defer.Deferred[Any]:
        """Append entries to a partition's log in one script call (all or
        nothing); with ``idem``, once per key within the window. (A command
        connection that is down fails it at once, ``RedisNotSent``: 503.)"""
        keys: tuple[str, ...] = (p.log, p.meta, p.channels, p.notify, p.foreign)
        keyed: tuple[str, int] = ("", 0)
        if idem is not None:
            keys += (p.key + idem.key,)
            keyed = (idem.fingerprint, self.key_window_ms)
        d = self.shards.evalsha(PUBLISH_SHA, PUBLISH, keys,
                                (*self._held(p), *keyed, *entries), timeout=self.timeout)
        d.addErrback(_unavailable)
        return d

    def _held(self, p: Partition) -> tuple[str, int, str, int]:
        """The scripts' first arguments: what the log is checked against."""
        held = self.store.horizon_of(p.origin) if p.epoch and p.ready else 0
        return p.spare, self.maxlen, p.epoch if p.ready else "", held

    def stats(self) -> dict[str, Any]:
        followed = [p for p in self.partitions if p.ready]
        return {"engine": self.engine, "peers": [], "redis": {
            "url": ",".join(str(seed) for seed in self.seeds), "up": self.shards.connected,
            "cluster": self.shards.clustered, "primaries": self.shards.primaries(),
            "partitions": len(self.partitions), "followed": len(followed),
            "horizon": sum(self.store.horizon_of(p.origin) for p in followed),
            "lost_epochs": self.lost_epochs}}

    # -- reading the logs ----------------------------------------------------

    def _notified(self, p: Partition, payload: bytes) -> None:
        """A partition's script appended entries: apply them if they come next
        (else read the log back); during a read back, after it."""
        if not p.followed:
            return
        if p.reading or not p.ready:
            p.waiting.append(payload)
            return
        self._apply(p, payload)

    def _apply(self, p: Partition, payload: bytes) -> None:
        told = decode_told.decode(payload)
        if told[0] != p.epoch:
            self._read_back(p, f"a notification of epoch {told[0]}")
            return
        run = [self._entry(p, seq, int(ts), kind, c, d)
               for seq, ts, kind, c, d in _fives(told, 1)]
        if isinstance(self.service.follow(p.origin, run, scoped=True), Hole):
            self._read_back(p, "a notification skipped entries")

    def _entry(self, p: Partition, seq: int, ts: int, kind: bytes | str, c: bytes | str,
               d: bytes | str) -> Entry:
        """One log entry as the core takes it (a foreign note is noted here)."""
        kind = kind.decode() if isinstance(kind, bytes) else kind
        c = c.decode() if isinstance(c, bytes) else c
        data = d if isinstance(d, bytes) else d.encode()
        if kind == "m":
            return Message(p.origin, seq, ts, tuple(json.loads(c)), data)
        if kind == "o":
            return _logged_op(seq, ts, c, data)
        self._abroad(p, c, int(data))
        return Passed(seq, ts)

    def _abroad(self, p: Partition, name: str, other: int) -> None:
        """Channel ``name`` of ``p`` has messages in partition ``other`` too: a
        node whose clients read it follows that one as well."""
        p.abroad.setdefault(name, set()).add(other)
        if name in p.needed_by:
            q = self.partitions[other]
            q.needed_by.add(name)
            q.needed_at = self.clock.seconds()
            self._follow(q)

    def _read_back(self, p: Partition, why: str = "subscribed") -> None:
        """Check the partition's epoch and read its log past our horizon; the
        notifications that come meanwhile are applied after it."""
        if self.stopped or not p.followed:
            return
        if p.reading:
            p.again = True
            return
        if p.ready:
            log.debug("redis {tag}: {why}; reading the log back", tag=p.tag, why=why)
        p.reading = True
        d = self._read(p)
        d.addBoth(self._read_done, p)

    @defer.inlineCallbacks
    def _read(self, p: Partition) -> Any:
        reply = yield self.shards.evalsha(CHECK_SHA, CHECK, (p.log, p.meta), self._held(p),
                                          timeout=self.timeout)
        epoch = p.epoch_of(reply)
        if epoch != p.epoch or not p.ready:
            if p.epoch and p.ready and epoch != p.epoch:
                self._lost_epoch(p, epoch)
            p.epoch = epoch
            p.abroad = {}  # read again below, as this log has it
            yield self._load_channels(p)
        while True:
            after = self.store.horizon_of(p.origin)
            page = yield self.shards.execute(p.log, "XRANGE", p.log, f"({after}-0", "+",
                                             "COUNT", PAGE, timeout=self.timeout)
            if page:
                self._apply_entries(p, page)
            if len(page) < PAGE:
                return

    def _read_done(self, result: Any, p: Partition) -> None:
        p.reading = False
        waiting, p.waiting = p.waiting, []
        if isinstance(result, Failure):
            if not self.stopped and p.followed:
                if isinstance(result.value, RedisGone | RedisError):
                    log.info("redis {tag}: reading the log failed ({why}); trying again",
                             tag=p.tag, why=result.getErrorMessage())
                else:
                    log.failure("redis {tag}: reading the log failed", result, tag=p.tag)
                self.clock.callLater(RETRY, self._read_back, p, "a read failed")
            return
        if not p.followed:  # let go of while it was read
            return
        p.ready = True
        for payload in waiting:
            self._apply(p, payload)
        if p.again:
            p.again = False
            self._read_back(p, "notified during a read")
        else:
            ready, p.when_ready = p.when_ready, []
            for d in ready:
                d.callback(None)
        self._say_gone()

    def _lost_epoch(self, p: Partition, epoch: str) -> None:
        """The log we held is gone: everyone behind its end is told of a gap
        (logged once for every partition found so in one round of reads)."""
        old = p.origin
        held = self.store.horizon_of(old)
        self._gone.append((old, held))
        if held == 0:
            # We read nothing of it: a cursor naming it is told of the gap as
            # one naming any origin lost with a restart (pushup.core.origins).
            return
        self.lost_epochs += 1
        self.service.follow(old, [Skip(held + 1, self.service.now())], scoped=True)

    def _say_gone(self) -> None:
        """Once no partition is being read: one line for the logs found gone."""
        if not self._gone or any(p.reading for p in self.partitions):
            return
        gone, self._gone = self._gone, []
        behind = [f"{origin}:{held}" for origin, held in gone if held]
        log.warn("redis: the log of {n} partitions is gone; Redis lost what it held "
                 "(restarted empty, or failed over); now reading new epochs; "
                 "{readers}", n=len(gone),
                 readers=f"readers behind {', '.join(behind)} get a gap" if behind
                 else "this node had read nothing of them: no reader has a gap")

    @defer.inlineCallbacks
    def _load_channels(self, p: Partition) -> Any:
        """The partition's explicit channels, and where its channels have
        messages abroad."""
        raw = yield self.shards.execute(p.channels, "HGETALL", p.channels,
                                        timeout=self.timeout)
        now = self.service.now()
        for name, value in zip(raw[::2], raw[1::2], strict=True):
            op = json.loads(value)
            if op["expires_at"] > now:
                self.service.apply_op(
                    ChannelOp("create", name.decode(), 0, op["ttl"], op["expires_at"]), now)
        abroad = yield self.shards.execute(p.foreign, "HGETALL", p.foreign,
                                           timeout=self.timeout)
        for name, value in zip(abroad[::2], abroad[1::2], strict=True):
            for other in json.loads(value):
                self._abroad(p, name.decode(), int(other))

    def _apply_entries(self, p: Partition, entries: list[Any]) -> None:
        """Log entries read back, in order, into the store: the log is whole,
        so a jump in sequence is history trimmed before we read it (a gap)."""
        run: list[Entry] = []
        held = self.store.horizon_of(p.origin)
        for ident, fields in entries:
            seq = int(ident[:-2])  # "<seq>-0"
            if seq <= held:  # e.g. our own publish, applied when Redis answered: not parsed
                continue
            f = dict(zip(fields[::2], fields[1::2], strict=True))
            run.append(self._entry(p, seq, int(f[b"t"]), f[b"k"], f[b"c"], f[b"d"]))
        self.service.follow(p.origin, run, trimmed=True, scoped=True)


def _fives(told: list[Any], start: int) -> Iterable[tuple[Any, Any, Any, Any, Any]]:
    """A notification's entries: (seq, t, k, c, d) after its epoch."""
    for i in range(start, len(told), 5):
        yield told[i], told[i + 1], told[i + 2], told[i + 3], told[i + 4]


def _logged_op(seq: int, ts: int, name: str, raw: bytes | str) -> LoggedOp:
    """The log's entry ``seq`` is a channel operation: it carries no message."""
    op = json.loads(raw)
    return LoggedOp(seq, ts, ChannelOp(op["op"], name, seq, op["ttl"], op["expires_at"]))


def _cancel_then(result: Any, timer: Any) -> Any:
    if timer.active():
        timer.cancel()
    return result


def _first_error(failure: Failure) -> Failure:
    """A call over several partitions failed: the first partition's failure."""
    if isinstance(failure.value, defer.FirstError):
        sub: Failure = failure.value.subFailure
        return sub
    return failure


def _unavailable(failure: Failure) -> Any:
    """What the publisher is told when Redis did not take it: 503 when the
    command never left this node (nothing can have been stored, retry
    anywhere), 504 when it was sent and no reply came (it may run yet:
    retry with the same Idempotency-Key)."""
    if isinstance(failure.value, RedisNotSent):
        raise errors.EngineUnavailable(f"Redis is unreachable ({failure.getErrorMessage()}); "
                                       "nothing was acknowledged")
    if isinstance(failure.value, RedisGone):
        raise errors.OutcomeUnknown(f"Redis did not answer ({failure.getErrorMessage()}); "
                                    "the publish may or may not be stored: retry it with "
                                    "the same Idempotency-Key")
    if isinstance(failure.value, RedisError):
        message = str(failure.value)
        if message.startswith("EXISTS "):  # the script refused a create
            raise errors.ChannelExists(f"channel {message[7:]!r} exists")
        if message.startswith("REUSED "):
            raise errors.KeyReused("this Idempotency-Key was used for a publish with another "
                                   "body; use a new key for a new publish")
        raise errors.EngineUnavailable(f"Redis refused the publish: {message}")
    return failure
