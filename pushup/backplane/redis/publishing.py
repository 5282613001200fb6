"""Writing to the partitions' logs: publishes and channel operations.

The rule: every write is one script call per partition it touches
(``partitions.py``'s ``PUBLISH``), which appends atomically and notifies the
partition's followers with a sharded ``SPUBLISH``; the 201 is sent once
every partition answered (with ``--publish-ack peer`` or ``all``, once a
replica of each primary, or every one, holds the append: ``WAIT``). A
message goes to the partition of its first channel, whatever its others:
one message, one id. Before it is appended, each other channel's partition
is told, by a note in its own log, that the channel has messages in the
first one (``abroad``). A batch whose messages fall in several partitions
is one atomic append per partition: if one fails the publisher gets no 201,
and a retry with its ``Idempotency-Key`` appends only what is missing.
This module never reads a log back (``reader.py`` does, when a write finds
the log at another epoch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.internet import defer
from twisted.python.failure import Failure

from pushup.backplane import Unconfirmed
from pushup.backplane.links import gather, unanswered
from pushup.backplane.redis.cluster import Shards
from pushup.backplane.redis.exceptions import (
    ChannelExists,
    KeyReused,
    RedisError,
    RedisGone,
    RedisNotSent,
)
from pushup.backplane.redis.following import Partition
from pushup.backplane.redis.partitions import PUBLISH, PUBLISH_SHA, epoch_of
from pushup.backplane.redis.parts import EnginePart
from pushup.backplane.redis.reader import LogReader, logged_op
from pushup.config import Config
from pushup.core import errors
from pushup.core.channels import Channel, OpKind
from pushup.core.idempotency import Idem, Replayed
from pushup.core.model import Draft, Message, dumps
from pushup.core.service import Service

REPLICAS_TTL = 5.0  # seconds a primary's number of replicas is trusted (--publish-ack)


class Publisher(EnginePart):
    """Appends to the partitions' logs (see the module's rule)."""

    def __init__(self, service: Service, shards: Shards, partitions: Sequence[Partition],
                 clock: Any, reader: LogReader, config: Config, *, timeout: float) -> None:
        super().__init__(service, shards, partitions, clock, timeout=timeout)
        self.reader = reader
        self.key_window_ms = max(1, round(config.idempotency_window * 1000))
        self.publish_ack = config.publish_ack  # local, peer (a replica), all (replicas)
        self.ack_timeout_ms = max(1, round(config.publish_ack_timeout * 1000))
        # a channel's own stream in Redis outlives its last entry by twice the
        # message ttl: a cold read still finds (and lets go of, as too old, with
        # a gap for its readers) what a node away for a while missed
        self.stream_ttl_ms = max(1, round(2 * config.message_ttl * 1000))
        self._replicas: dict[str, tuple[int, float]] = {}  # tag -> (replicas, when asked)

    def publish(self, drafts: Sequence[Draft], idem: Idem | None = None,
                ) -> defer.Deferred[list[Message]]:
        """The backplane's ``publish``: each draft to its first channel's partition."""
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
            noted = gather([self._append(p, entries) for p, entries in notes.items()])
            return noted.addCallback(lambda _: self._publish_parts(drafts, parts, idem))
        return self._publish_parts(drafts, parts, idem)

    def operate(self, kind: OpKind, name: str, ttl: int) -> defer.Deferred[Channel]:
        """Append a channel operation (create, renew, delete) to the channel's
        partition; fires with the channel as the log has it."""
        expires_at = self.service.now() + ttl
        op = dumps({"op": kind, "ttl": ttl, "expires_at": expires_at})
        p = self.partition(name)
        d = self._append(p, ["o", name, op])

        def done(reply: list[Any]) -> Channel:
            epoch, seq = epoch_of(reply), int(reply[1])
            if p.ready and epoch == p.epoch:  # applied now if next, else notified
                self.service.follow(p.origin, [logged_op(seq, 0, name, op)], scoped=True)
            elif p.followed:
                self.reader.read_back(p, f"an operation found the log at epoch {epoch}")
            channel = self.store.channel(name)
            if channel is None:  # deleted, or not applied here yet: as the log has it
                channel = Channel(name, ttl, expires_at - ttl)
            return channel

        d.addCallback(done)
        return d

    def _publish_parts(self, drafts: Sequence[Draft], parts: dict[Partition, list[Draft]],
                       idem: Idem | None) -> defer.Deferred[list[Message]]:
        if len(parts) == 1:
            ((p, mine),) = parts.items()
            return self._publish_to(p, mine, idem)
        calls = [self._publish_to(p, mine, idem) for p, mine in parts.items()]
        d: defer.Deferred[Any] = gather(calls)
        d.addCallback(self._in_draft_order, drafts, parts)
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
            acked = yield self.shards.execute(p.keys.log, "WAIT", need, self.ack_timeout_ms,
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
            role = yield self.shards.execute(p.keys.log, "ROLE", timeout=self.timeout)
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
        epoch, stamps = epoch_of(reply), reply[1:-1] if again else reply[1:]
        origin = f"{p.tag}.{epoch}"
        messages = [Message(origin, int(stamps[2 * i]), int(stamps[2 * i + 1]), d.channels,
                            d.data) for i, d in enumerate(drafts)]
        if again:
            return Replayed(messages)
        # Our publish, if we follow its partition and it comes next there, is
        # held now (the publisher's next poll here sees it); otherwise its
        # notification brings it in order, or a cold read does.
        current = p.ready and epoch == p.epoch
        next_here = bool(messages) and messages[0].seq == self.store.horizon_of(origin) + 1
        messages = self.service.publish_logged(messages, current=current, scoped=True)
        if current and next_here:  # applied now: its notification is no news
            self.reader.held_now(p, messages)
        if p.followed and epoch != p.epoch:
            self.reader.read_back(p, f"a publish found the log at epoch {epoch}")
        return messages

    def _append(self, p: Partition, entries: list[bytes | str], idem: Idem | None = None,
                ) -> defer.Deferred[Any]:
        """Append entries to a partition's log in one script call (all or
        nothing); with ``idem``, once per key within the window. (A command
        connection that is down fails it at once, ``RedisNotSent``: 503.)"""
        named = p.keys
        keys: tuple[str, ...] = (named.log, named.meta, named.channels, named.foreign)
        keyed: tuple[str, int] = ("", 0)
        if idem is not None:
            keys += (named.key + idem.key,)
            keyed = (idem.fingerprint, self.key_window_ms)
        d = self.shards.evalsha(PUBLISH_SHA, PUBLISH, keys,
                                (*self.reader.held(p), *keyed, self.stream_ttl_ms, *entries),
                                timeout=self.timeout)
        d.addErrback(_unavailable)
        return d


def _unavailable(failure: Failure) -> Any:
    """What the publisher is told when Redis did not take it: 503 when the
    command never left this node (nothing can have been stored, retry
    anywhere), 504 when it was sent and no reply came (it may run yet:
    retry with the same Idempotency-Key)."""
    error = failure.value
    if isinstance(error, RedisGone):
        why = failure.getErrorMessage()
        raise unanswered(sent=not isinstance(error, RedisNotSent),
                         never_sent=f"Redis is unreachable ({why}); nothing was acknowledged",
                         no_answer=f"Redis did not answer ({why}); the publish may or may not "
                                   "be stored: retry it with the same Idempotency-Key")
    if isinstance(error, ChannelExists):  # the script refused a create
        raise errors.ChannelExists(f"channel {error.channel!r} exists")
    if isinstance(error, KeyReused):
        raise errors.KeyReused("this Idempotency-Key was used for a publish with another "
                               "body; use a new key for a new publish")
    if isinstance(error, RedisError):
        raise errors.EngineUnavailable(f"Redis refused the publish: {error.message}")
    return failure
