"""The Redis backplane: channels in K partitions, each a log in Redis and its
own origin; a node follows only the channels its clients need.

The rule: a partition's log in Redis is that partition's one order, and a
node holds each channel it follows whole, in that order, and no other
channel. ``RedisEngine`` is the ``Backplane`` and puts together what does the
work: ``publishing.py`` appends (one script call per partition a publish
touches), ``interest.py`` decides which channels this node follows and for
how long, and ``reader.py`` keeps each followed channel's copy in the log's
order, gaps included; ``cluster.py`` carries every command to the primary that owns its
key. Cursors keep their format: a partition's origin is ``<tag>.<epoch>``,
scoped (a cursor names it only for the channels holding its messages).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from twisted.internet import defer, task
from twisted.logger import Logger
from twisted.python.failure import Failure

from pushup.backplane.redis.cluster import Shards
from pushup.backplane.redis.exceptions import RedisError, RedisGone
from pushup.backplane.redis.following import Partition
from pushup.backplane.redis.interest import Interest
from pushup.backplane.redis.partitions import partition_tags
from pushup.backplane.redis.parts import EnginePart
from pushup.backplane.redis.publishing import Publisher
from pushup.backplane.redis.reader import RETRY, LogReader
from pushup.config import Config, parse_seeds
from pushup.core import errors
from pushup.core.channels import Channel, check_ttl
from pushup.core.idempotency import Idem
from pushup.core.model import Draft, Message, check_channel_name
from pushup.core.service import Service

log = Logger()
COMMAND_TIMEOUT = 2.0  # seconds Redis has to answer a publish or a check
PARTITIONS = "pushup:partitions"  # how many partitions the nodes on this Redis use


class RedisEngine(EnginePart):
    """The backplane over Redis (see the module's rule)."""

    engine = "redis"

    def __init__(self, service: Service, config: Config, reactor: Any) -> None:
        self.seeds = parse_seeds(config.engine)
        partitions = [Partition(i, tag) for i, tag in
                      enumerate(partition_tags(config.redis_partitions))]
        super().__init__(service, Shards(self.seeds, reactor), partitions, reactor,
                         timeout=COMMAND_TIMEOUT)
        self.ready = False
        self.stopped = False
        self.reader = LogReader(
            service, self.shards, self.partitions, reactor, maxlen=config.redis_maxlen,
            timeout=self.timeout, most=config.max_messages_per_channel,
            # a note read may name a partition to follow: the followed set decides
            on_abroad=lambda p, name, other: self.interest.abroad(p, name, other))
        self.interest = Interest(service, self.shards, self.partitions, reactor, self.reader,
                                 timeout=self.timeout)
        self.publisher = Publisher(service, self.shards, self.partitions, reactor,
                                   self.reader, config, timeout=self.timeout)
        # a partition's lost history is a gap for the readers of its channels only
        self.store.sources_by(lambda name: [p.tag for p in self.interest.needed_for(name)])

    @property
    def lost_epochs(self) -> int:
        """Times a log was found to have lost entries this node held."""
        return self.reader.lost_epochs

    # -- the backplane -------------------------------------------------------

    def check_ready(self) -> None:
        if not self.ready:
            raise errors.CatchingUp("this node is connecting to Redis; retry shortly")

    def probe(self) -> defer.Deferred[dict[str, Any]]:
        """``/health``'s question, what this node can serve: fires with each
        primary's state (``Shards.probe``: up when both its connections are up
        and it answered a PING within ``COMMAND_TIMEOUT``; a paused Redis holds
        the TCP connection open, only an unanswered command shows it) while one
        at least is up; fails with ``EngineUnavailable`` when none is."""
        def judged(primaries: list[dict[str, Any]]) -> dict[str, Any]:
            if not any(primary["state"] == "up" for primary in primaries):
                raise errors.EngineUnavailable(
                    "Redis does not answer (no primary up and answering a PING in "
                    f"{self.timeout:g} s): this node cannot take publishes")
            return {"redis": {"primaries": primaries}}

        def unknown(failure: Failure) -> dict[str, Any]:
            if not isinstance(failure.value, RedisGone | RedisError):
                failure.raiseException()
            raise errors.EngineUnavailable(
                "Redis is unreachable: this node cannot take publishes")

        return self.shards.probe(self.timeout).addCallbacks(judged, unknown)

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
        self.interest.start()
        log.info("redis: {n} partitions; serving (a channel is read when a request "
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
        self.reader.stop()
        self.interest.stop()
        yield self.shards.stop()

    def prepare(self, channels: Iterable[str]) -> defer.Deferred[None] | None:
        """``Interest.prepare``: None when this node holds what ``channels``
        need, else a Deferred that fires once it does (a cold read)."""
        return self.interest.prepare(channels)

    def publish(self, drafts: Sequence[Draft], idem: Idem | None = None,
                ) -> defer.Deferred[list[Message]]:
        return self.publisher.publish(drafts, idem)

    def create_channel(self, name: str | None, ttl: int | None) -> defer.Deferred[Channel]:
        name = self.store.new_name(name)
        ttl = check_ttl(ttl, self.store.retention.channel_ttl)
        return self.publisher.operate("create", name, ttl)

    def renew_channel(self, name: str, ttl: int | None) -> defer.Deferred[Channel]:
        check_channel_name(name)

        def renew(_: object) -> defer.Deferred[Channel]:
            channel = self.store.get(name)
            return self.publisher.operate("renew", name, check_ttl(ttl, channel.ttl))

        return self._then(name, renew)

    def delete_channel(self, name: str) -> defer.Deferred[None]:
        def delete(_: object) -> defer.Deferred[Channel]:
            self.store.get(name)
            return self.publisher.operate("delete", name, 0)

        return self._then(name, delete).addCallback(lambda _: None)

    def _then(self, name: str, action: Callable[[object], defer.Deferred[Channel]],
              ) -> defer.Deferred[Channel]:
        """``action`` once this node holds channel ``name``'s partition."""
        ready = self.prepare([name])
        if ready is None:
            return action(None)
        done: defer.Deferred[Channel] = ready.addCallback(action)
        return done

    def stats(self) -> dict[str, Any]:
        # (partitions with a channel followed: one look each, not a walk of
        # their channels, as /stats is asked often)
        followed = [p for p in self.partitions if p.channels and p.epoch]
        return {"engine": self.engine, "peers": [], "redis": {
            "url": ",".join(str(seed) for seed in self.seeds), "up": self.shards.connected,
            "cluster": self.shards.clustered, "primaries": self.shards.primaries(),
            "partitions": len(self.partitions), "followed": len(followed),
            "channels_followed": self.interest.channels_followed,
            "horizon": sum(self.store.horizon_of(p.origin) for p in followed),
            "lost_epochs": self.lost_epochs, "missed": self.reader.missed,
            "notified": self.reader.notified_count,
            "probes_failed": self.shards.probes_failed}}
