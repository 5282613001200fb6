"""Following channels by interest: which channels of which partitions this
node follows, and for how long.

The rule: a node follows a channel (subscribes to its own notifications in
its partition and reads its stream, ``reader.py``) from the first request
that needs it — a poll or an event stream on it, a read of it — until
``LINGER`` seconds after the last; it hears nothing of the channels none of
its clients need, whatever partition they share with its own. A request for
a channel not yet read waits for one read from Redis (a cold read), then is
answered from memory like every other. A reader of a channel needs it in its
own partition and in those holding its messages published with an earlier
channel (``abroad``). This module never reads a log nor writes to Redis itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

from twisted.internet import defer, task
from twisted.logger import Logger

from pushup.backplane.links import gather
from pushup.backplane.redis.cluster import Shards
from pushup.backplane.redis.following import FollowedChannel, Partition
from pushup.backplane.redis.parts import EnginePart
from pushup.backplane.redis.reader import LogReader
from pushup.backplane.redis.timer import NodeTimer
from pushup.core import errors
from pushup.core.service import Service

log = Logger()
# A channel is followed for this long after the last request that needed it:
# a long-poll client re-polls within a round trip, and a client hopping
# between nodes comes back to this one within seconds; 30 s keeps a channel
# with steady readers followed, and lets one nobody reads go.
LINGER = 30.0


class Interest(EnginePart):
    """The channels this node follows (see the module's rule): ``prepare``
    before a request reads; ``start`` the sweep that lets unneeded ones go."""

    def __init__(self, service: Service, shards: Shards, partitions: Sequence[Partition],
                 clock: Any, reader: LogReader, *, timeout: float) -> None:
        super().__init__(service, shards, partitions, clock, timeout=timeout)
        self.reader = reader
        self.linger = LINGER
        self.stopped = False
        self._sweeper: Any = None  # the LoopingCall that lets unneeded channels go

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

    @property
    def channels_followed(self) -> int:
        """(partition, channel) pairs followed."""
        return sum(len(p.channels) for p in self.partitions)

    def prepare(self, channels: Iterable[str]) -> defer.Deferred[None] | None:
        """Make sure this node holds whatever ``channels`` need: None when it
        does already (a warm request), else a Deferred that fires once it does
        (a cold one: one read from Redis), or fails with ``EngineUnavailable``
        if Redis does not answer within ``timeout``."""
        names = tuple(channels)
        now = self.clock.seconds()
        missing: dict[Partition, list[str]] = {}
        for name in names:
            for p in self.needed_for(name):
                followed = self._follow(p, name, now)
                if followed is not None and not followed.served:
                    missing.setdefault(p, []).append(name)
        if not missing:
            return None
        d: defer.Deferred[Any] = gather([self._when_ready(p, tuple(mine))
                                         for p, mine in missing.items()])
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
        ``other`` too: a node whose clients read it follows it there as well."""
        if name in p.channels:
            q = self.partitions[other]
            fresh = name not in q.channels
            followed = self._follow(q, name, self.clock.seconds())
            if fresh and followed is not None and p.serves(name):
                followed.holds_back = True

    def _when_ready(self, p: Partition, names: tuple[str, ...]) -> defer.Deferred[None]:
        d: defer.Deferred[None] = defer.Deferred()
        p.when_ready.append((d, names))
        # the node's own time (a busy turn counts once), not a clock its queue eats
        timer = NodeTimer(self.clock, self.timeout, partial(self._too_late, p, d))
        d.addBoth(_cancel_then, timer)
        return d

    def _too_late(self, p: Partition, d: defer.Deferred[None]) -> None:
        for i, (waiting, _) in enumerate(p.when_ready):
            if waiting is d:
                del p.when_ready[i]
                d.errback(errors.EngineUnavailable(
                    "this node could not read the channel from Redis in time (Redis slow or "
                    "unreachable, or this node too busy); retry shortly"))
                return

    def _follow(self, p: Partition, name: str, now: float) -> FollowedChannel | None:
        """Channel ``name`` of ``p``, needed now: subscribed to its
        notifications if it was not (its read follows their confirmation)."""
        followed = p.channels.get(name)
        if followed is None:
            if self.stopped:
                return None
            followed = p.channels[name] = FollowedChannel(now)
            reader = self.reader
            self.shards.subscribe(p.keys.notify_of(name), partial(reader.notified, p, name),
                                  partial(reader.synced, p, name), partial(reader.lost, p, name))
        followed.needed_at = now
        return followed

    def let_go_of_unneeded(self) -> None:
        """The sweep: stop following each channel no request needed for
        ``linger`` seconds and no client waits on."""
        now = self.clock.seconds()
        hub = self.service.hub
        dropped: set[str] = set()
        for p in self.partitions:
            if not p.channels:
                continue
            waited = {name for _, names in p.when_ready for name in names}
            for name, followed in list(p.channels.items()):
                if hub.waiting_on(name) or name in waited:
                    followed.needed_at = now
                elif now - followed.needed_at > self.linger:
                    self._unfollow(p, name)
                    dropped.add(name)
        gone = [name for name in dropped
                if not any(name in p.channels for p in self.needed_for(name))]
        if gone:
            self.service.unfollow_channels(gone)
            log.debug("redis: {n} channels not needed for {s} s; no longer followed",
                      n=len(gone), s=self.linger)

    def _unfollow(self, p: Partition, name: str) -> None:
        self.shards.unsubscribe(p.keys.notify_of(name))
        del p.channels[name]
        p.waiting = [(each, told) for each, told in p.waiting if each != name]
        if p.channels:
            return
        # The last of its channels: the partition is read again from scratch when
        # followed again (and, not followed, what this node knows of where its
        # channels have messages could go stale: a publish here then sends the
        # note again, which Redis appends only once).
        p.abroad = {}
        p.waiting = []
        mine = [each for each in self.store.channel_names() if self.partition(each) is p]
        self.service.unfollow(p.origin, mine)
        p.epoch = ""


def _fail_waiting(p: Partition, error: Exception) -> None:
    waiting, p.when_ready = p.when_ready, []
    for d, _ in waiting:
        d.errback(error)


def _cancel_then(result: Any, timer: Any) -> Any:
    if timer.active():
        timer.cancel()
    return result
