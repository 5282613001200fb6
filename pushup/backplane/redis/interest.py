"""Following partitions by interest: which partitions this node follows, and
for how long.

The rule: a node follows a partition (subscribes to its notifications and
reads its log back, ``reader.py``) from the first request that needs it — a
poll or an event stream on one of its channels, a read of one of its
channels — until ``LINGER`` seconds after the last; a node pays nothing for
the partitions none of its clients need. A request for a partition not yet
read waits for one read from Redis (a cold read), then is answered from
memory like every other. A reader of a channel needs its own partition and
those holding its messages published with an earlier channel (``abroad``).
This module never reads a log nor writes to Redis itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

from twisted.internet import defer, task
from twisted.logger import Logger

from pushup.backplane.links import gather
from pushup.backplane.redis.cluster import Shards
from pushup.backplane.redis.following import Partition, Step
from pushup.backplane.redis.parts import EnginePart
from pushup.backplane.redis.reader import LogReader
from pushup.backplane.redis.timer import NodeTimer
from pushup.core import errors
from pushup.core.service import Service

log = Logger()
# A partition is followed for this long after the last request that needed
# it: a long-poll client re-polls within a round trip, and a client hopping
# between nodes comes back to this one within seconds; 30 s keeps a
# channel with steady readers followed, and lets one nobody reads go.
LINGER = 30.0


class Interest(EnginePart):
    """The partitions this node follows (see the module's rule): ``prepare``
    before a request reads; ``start`` the sweep that lets unneeded ones go."""

    def __init__(self, service: Service, shards: Shards, partitions: Sequence[Partition],
                 clock: Any, reader: LogReader, *, timeout: float) -> None:
        super().__init__(service, shards, partitions, clock, timeout=timeout)
        self.reader = reader
        self.linger = LINGER
        self.stopped = False
        self._sweeper: Any = None  # the LoopingCall that lets unneeded partitions go

    def start(self) -> None:
        """Sweep every ``linger`` / 3 s (``let_go_of_unneeded``)."""
        self._sweeper = task.LoopingCall(self.let_go_of_unneeded)
        self._sweeper.clock = self.clock
        self._sweeper.start(self.linger / 3, now=False)

    def stop(self) -> None:
        """Follow nothing more; the requests waiting for a read fail (``ShuttingDown``)."""
        self.stopped = True
        if self._sweeper is not None and self._sweeper.running:
            self._sweeper.stop()
        for p in self.partitions:
            _fail_waiting(p, errors.ShuttingDown("this node is shutting down"))

    def prepare(self, channels: Iterable[str]) -> defer.Deferred[None] | None:
        """Make sure this node holds whatever ``channels`` need: None when it
        does already (a warm request), else a Deferred that fires once it does
        (a cold one: one read from Redis), or fails with ``EngineUnavailable``
        if Redis does not answer within ``timeout``."""
        names = tuple(channels)
        now = self.clock.seconds()
        missing: list[Partition] = []
        for name in names:
            for p in self.needed_for(name):
                p.needed_at = now
                p.needed_by.add(name)
                if not p.ready:
                    missing.append(p)
        if not missing:
            return None
        d: defer.Deferred[Any] = gather([self._when_ready(p) for p in dict.fromkeys(missing)])
        # what is read may name partitions abroad to follow too: ask again
        d.addCallback(lambda _: self.prepare(names))
        return d

    def needed_for(self, name: str) -> list[Partition]:
        """The partitions a reader of channel ``name`` needs: its own, and those
        holding its messages published with an earlier channel (once its own
        is read, this node knows them)."""
        home = self.partition(name)
        return [home, *(self.partitions[i] for i in sorted(home.abroad.get(name, ())))]

    def abroad(self, p: Partition, name: str, other: int) -> None:
        """A log says channel ``name`` of ``p`` has messages in partition
        ``other`` too: a node whose clients read it follows that one as well."""
        if name in p.needed_by:
            q = self.partitions[other]
            q.needed_by.add(name)
            q.needed_at = self.clock.seconds()
            self._follow(q)

    def _when_ready(self, p: Partition) -> defer.Deferred[None]:
        d: defer.Deferred[None] = defer.Deferred()
        p.when_ready.append(d)
        # the node's own time (a busy turn counts once), not a clock its queue eats
        timer = NodeTimer(self.clock, self.timeout, partial(self._too_late, p, d))
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
            p.move(Step.FOLLOW)
            self.shards.subscribe(p.keys.notify, partial(self.reader.notified, p),
                                  partial(self.reader.read_back, p))

    def let_go_of_unneeded(self) -> None:
        """The sweep: stop following each partition no request needed for
        ``linger`` seconds and no client waits on."""
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
            elif now - p.needed_at > self.linger and not p.reads.running and not p.when_ready:
                self._unfollow(p)

    def _unfollow(self, p: Partition) -> None:
        self.shards.unsubscribe(p.keys.notify)
        p.move(Step.LET_GO)
        p.waiting = []
        p.needed_by = set()
        # read again with the log when followed again (and, not followed, it
        # could go stale: a publish here then sends the note again, which
        # Redis appends only once)
        p.abroad = {}
        mine = [name for name in self.store.channel_names()
                if self.partition(name) is p]
        self.service.unfollow(p.origin, mine)
        log.debug("redis {tag}: not needed for {s} s; no longer followed", tag=p.tag,
                  s=self.linger)


def _fail_waiting(p: Partition, error: Exception) -> None:
    waiting, p.when_ready = p.when_ready, []
    for d in waiting:
        d.errback(error)


def _cancel_then(result: Any, timer: Any) -> Any:
    if timer.active():
        timer.cancel()
    return result
