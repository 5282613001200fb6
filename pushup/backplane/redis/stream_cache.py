"""A node's cache of the Durable Streams Redis holds (``--engine redis``): what
it read of each stream, where each is, and the channel it follows each path on.

The rule: the cache is only ever what Redis held when read. A read asks for the
appends the cache lacks (a log only grows, so the cache's are a prefix of
Redis's) and for the state only when its version and mark are not the cached
ones. A log only grows while Redis keeps what it acknowledged: when it lost
writes (restarted from an older snapshot, a lagging replica promoted), Redis
holds fewer appends, or others where the cache's last is; the cache of that
stream is dropped for what Redis holds (said once), and the stream's next
append starts past every offset this node served of it (``floors``), so that
no offset names two byte ranges from then on. A
path's ``at`` names its stream, or points to the family slot a fork lives in
(pushup/backplane/redis/stream_keys.py); when the cache knows the pointer, the
stream is read there along with the path, in one round trip. Each path read
is followed on its stream's sharded channel, which another node's write is
told on (``written``: the path to read again).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from pushup.backplane.redis.cluster import Shards
from pushup.backplane.redis.stream_keys import (
    GONE,
    READ,
    READ_SHA,
    UNPOINT,
    UNPOINT_SHA,
    channel_of,
    home_of_pointer,
    pointer,
    prefix_of,
)
from pushup.backplane.redis.stream_loss import APPENDS, COUNT, diverged, past, unpacked
from pushup.core.stream import Stream
from pushup.core.stream_state import stream_of
from pushup.core.stream_values import Position
from pushup.core.streams import Streams

log = Logger()
MAX_FLOORS = 10_000  # paths whose lost offsets are remembered, the oldest forgotten first


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class StreamCache:
    """What this node holds of the streams in Redis (``streams``, the core's)."""

    def __init__(self, shards: Shards, streams: Streams, timeout: float,
                 written: Callable[[str, bool], None], now: Callable[[], int]) -> None:
        """``timeout``: seconds a Redis command may take; ``written(path,
        gone)``: another node wrote the stream at ``path`` (gone: dropped
        it); ``now()``: microseconds."""
        self.shards = shards
        self.streams = streams
        self.timeout = timeout
        self.written = written
        self.now = now
        self.versions: dict[str, int] = {}  # uid -> the version the cache holds
        self.marks: dict[str, str] = {}  # uid -> the mark of that version's write
        self.last_marks: dict[str, str] = {}  # uid -> the mark of its last cached append
        self.by_uid: dict[str, Stream] = {}  # every cached stream, mapped or a fork's source
        self.at: dict[str, str] = {}  # path -> its ``at`` (uid or pointer), as last read
        self.homes: dict[str, str] = {}  # uid -> its family's home (a key prefix)
        self.sources: dict[str, str] = {}  # fork uid -> its source's uid
        self.followed: dict[str, str] = {}  # path -> the channel this node follows it on
        self.told_gone: set[str] = set()  # uids another node said it dropped, not yet read
        # path -> past every offset this node served of a stream there that
        # Redis lost (not deleted): the stream's next append starts there
        self.floors: dict[str, Position] = {}
        self._involved: dict[str, Stream] = {}  # uid -> the streams this request read

    # -- where a stream is -----------------------------------------------------

    def _home(self, stream: Stream) -> str:
        """Where ``stream``'s keys are: where it was read or written, else
        (new) its source's home, else its path's own tag (up the family,
        iterated: a chain may be hundreds deep)."""
        while True:
            home = self.homes.get(stream.uid)
            if home is not None:
                return home
            if stream.source is None:
                return prefix_of(stream.path)
            stream = stream.source

    def _place(self, stream: Stream) -> tuple[str, str, str]:
        """``stream``'s home, its path's ``at`` key when in the home's slot
        (else ""), and the value that maps the path to it."""
        home = self._home(stream)
        if home == prefix_of(stream.path):
            return home, home + "at", stream.uid
        return home, "", pointer(home, stream.uid)

    # -- reading Redis into the cache -------------------------------------------

    def _known(self, cached: Stream | None) -> tuple[str, int, Any, str]:
        """What READ is told the cache holds of ``cached`` (None: nothing)."""
        if cached is None:
            return ("", 0, "", "")
        uid = cached.uid
        # appends let go of by retention count: Redis still lists them
        return (uid, len(cached.entries) + cached.dropped, self.versions.get(uid, ""),
                self.marks.get(uid, ""))

    @defer.inlineCallbacks
    def _read_path(self, path: str) -> Generator[Any, Any, None]:
        """The stream at ``path`` (and a fork's sources) as Redis holds it
        now: where the path's ``at`` points, read there."""
        home = prefix_of(path)
        cached = self.streams.at(path)
        known = self._known(cached)
        last = home_of_pointer(self.at.get(path, ""))
        ahead = None if last is None else self.shards.evalsha(  # sent along: one round trip
            READ_SHA, READ, (last[0] + "at",), (last[0], last[1], *known), timeout=self.timeout)
        try:
            reply = yield self.shards.evalsha(READ_SHA, READ, (home + "at",),
                                              (home, "", *known), timeout=self.timeout)
        except Exception:
            if ahead is not None:
                ahead.addErrback(lambda _: None)
            raise
        at = _text(reply[0])
        target = home_of_pointer(at)
        if ahead is not None and (target != last or len(reply) > 1):
            ahead.addErrback(lambda _: None)  # the path points elsewhere now: not needed
            ahead = None
        if len(reply) == 1 and target is not None:  # a fork of another path's family
            home, uid = target
            reply = yield (ahead if ahead is not None else self.shards.evalsha(
                READ_SHA, READ, (home + "at",), (home, uid, *known), timeout=self.timeout))
            if len(reply) == 1 and (yield self._unpoint(path, at)):
                at = ""  # it named a dropped (or in Redis expired) stream: none
        if len(reply) == 1:
            if at:
                self.at[path] = at
            else:
                self.at.pop(path, None)
            if cached is not None:
                self._lost_whole(path, cached)
                self._unmap(path, cached)
            self._unfollow(path)
            return
        self.at[path] = at
        stream = yield self._apply(home, reply, known)
        if cached is not None and cached is not stream:
            if cached.uid != stream.uid:
                self._lost_whole(path, cached)
            self._unmap(path, cached)
        self.streams.place(path, stream)
        self._follow(path, channel_of(path, home))

    @defer.inlineCallbacks
    def _unpoint(self, path: str, value: str) -> Generator[Any, Any, bool]:
        """``path``'s pointer ``value`` names a dropped stream: it goes
        (whether Redis said so)."""
        try:
            yield self.shards.evalsha(UNPOINT_SHA, UNPOINT, (prefix_of(path) + "at",),
                                      (value,), timeout=self.timeout)
        except Exception as e:
            log.warn("redis: pointer of {path} not removed: {why}", path=path[:200],
                     why=str(e))
            return False
        return True

    @defer.inlineCallbacks
    def _read_uid(self, home: str, uid: str) -> Generator[Any, Any, tuple[Stream | None, bool]]:
        """The stream ``uid`` in ``home`` and its sources (or as cached,
        marked deleted, when Redis has it no more) and whether Redis has it."""
        stream, found, woken = yield self._read_one(home, uid)
        if found:
            woken += yield self._read_sources(home, stream)
        for changed in reversed(woken):
            changed.wake()
        return stream, found

    @defer.inlineCallbacks
    def _read_one(self, home: str, uid: str,
                  ) -> Generator[Any, Any, tuple[Stream | None, bool, list[Stream]]]:
        """``uid`` alone (not its sources): as ``_read_uid``, and the streams
        that changed (to wake once the family is read)."""
        cached = self.by_uid.get(uid)
        known = self._known(cached)
        reply = yield self.shards.evalsha(READ_SHA, READ, (home + "at",), (home, uid, *known),
                                          timeout=self.timeout)
        if len(reply) == 1:  # gone: nothing more to read of it
            if cached is not None:
                cached.mark_deleted()
            return cached, False, []
        stream, changed = yield self._adopt(home, reply, known)
        return stream, True, [stream] if changed else []

    @defer.inlineCallbacks
    def _apply(self, home: str, reply: list[Any], known: tuple[str, int, Any, str],
               ) -> Generator[Any, Any, Stream]:
        """READ's ``reply`` into the cache, asked with ``known``, then the
        stream's sources; each stream that changed woken after."""
        adopted: tuple[Stream, bool] = yield self._adopt(home, reply, known)
        stream, changed = adopted
        woken = [stream] if changed else []
        woken += yield self._read_sources(home, stream)
        for each in reversed(woken):  # sources first, as they are read
            each.wake()
        return stream

    @defer.inlineCallbacks
    def _read_sources(self, home: str, fork: Stream) -> Generator[Any, Any, list[Stream]]:
        """Each source up ``fork``'s family read and linked, one after the
        other (a loop, never a call per level: a chain may be hundreds deep);
        the streams that changed."""
        woken: list[Stream] = []
        while fork.fork_request is not None and fork.uid in self.sources:
            source, found, changed = yield self._read_one(home, self.sources[fork.uid])
            fork.link_source(source)
            woken += changed
            if source is None or not found:
                break
            fork = source
        return woken

    @defer.inlineCallbacks
    def _adopt(self, home: str, reply: list[Any], known: tuple[str, int, Any, str],
               ) -> Generator[Any, Any, tuple[Stream, bool]]:
        """READ's ``reply`` (asked with ``known``: the uid the cache held, how
        many of its appends, its version and mark) into the cache, and whether
        it changed. Appends the cached stream holds already (read by uid as a
        source first) are not added twice. A cache Redis does not hold (Redis
        lost writes it had read) is dropped for what Redis holds, once."""
        uid, version, state_text, deadline = (_text(reply[1]), int(reply[2]),
                                              _text(reply[3]), _text(reply[4]))
        stream = self.by_uid.get(uid)
        first = known[1] if uid == known[0] else 0
        if stream is not None and state_text and diverged(
                stream, self.last_marks.get(uid), reply, first):
            self._lost_appends(stream, int(reply[COUNT]))
            self.versions.pop(uid, None)
            self.marks.pop(uid, None)
            self.last_marks.pop(uid, None)
            stream.forget_entries()
            if first:  # all of it, read again
                first = 0
                reply = yield self.shards.evalsha(READ_SHA, READ, (home + "at",),
                                                  (home, uid, "", 0, "", ""),
                                                  timeout=self.timeout)
                if len(reply) == 1:  # gone meanwhile: read as no stream next time
                    stream.mark_deleted()
                    return stream, True
                version, state_text, deadline = int(reply[2]), _text(reply[3]), _text(reply[4])
        changed = stream is None or self.versions.get(uid) != version
        state = json.loads(state_text) if state_text else None
        if state is not None:  # new to the cache, or another version than it holds
            fresh = stream_of(uid, state)
            if stream is None:
                stream = self.by_uid[uid] = fresh
            else:
                stream.take_state(fresh)
        assert stream is not None  # READ sends the state of a stream new to the cache
        if deadline:  # reads renew it in Redis only
            stream.renew_deadline(int(deadline))
        for item in reply[APPENDS + max(0, len(stream.entries) + stream.dropped - first):]:
            entry, mark = unpacked(bytes(item))
            stream.add_entry(entry)
            if mark is not None:
                self.last_marks[uid] = mark
        self.versions[uid] = version
        self.marks[uid] = _text(reply[5])
        self.homes[uid] = home
        self._involved[uid] = stream
        source_uid = (state["source"] if state is not None else self.sources.get(uid))
        if source_uid is not None and stream.fork_request is not None:
            self.sources[uid] = source_uid
        return stream, changed

    def _lost_appends(self, stream: Stream, held: int) -> None:
        """Redis holds fewer (or other) appends of ``stream`` than the cache
        read: said once, and no later append ends at an offset served of it."""
        log.warn("redis: Redis lost appends of stream {path} that this node served "
                 "({cached} cached up to {tail}, Redis holds {held}): serving what Redis "
                 "holds; the stream's next append starts past {tail}",
                 path=stream.path[:200], cached=len(stream.entries), held=held,
                 tail=stream.tail.offset)
        self._floor(stream.path, stream.tail)

    def _lost_whole(self, path: str, cached: Stream) -> None:
        """``cached`` answers at ``path`` no more, and no node said it dropped
        it, nor did it expire: Redis lost it (restarted empty, or from a
        snapshot older than it). A stream created at its path again starts
        past what this node served of it."""
        if (cached.uid in self.told_gone or cached.deleted or not cached.entries
                or (cached.deadline is not None and self.now() >= cached.deadline)):
            return
        log.warn("redis: Redis lost stream {path} that this node served up to {tail}; "
                 "a stream created there again starts past it",
                 path=path[:200], tail=cached.tail.offset)
        self._floor(path, cached.tail)

    def _floor(self, path: str, tail: Position) -> None:
        known = self.floors.pop(path, None)
        self.floors[path] = tail if known is None else past(known, tail)
        while len(self.floors) > MAX_FLOORS:
            del self.floors[next(iter(self.floors))]

    def _unmap(self, path: str, stream: Stream) -> None:
        """``stream`` no longer answers at ``path`` (deleted or expired
        through another node): its readers hear it, and the cache forgets it."""
        if self.streams.at(path) is stream:
            self.streams.place(path, None)
        stream.mark_deleted()
        stream.wake()
        if self.by_uid.get(stream.uid) in (None, stream):
            self._release(stream.uid)

    def _release(self, uid: str) -> None:
        """Forget ``uid`` unless a cached fork reads it or it answers at its
        path; then its source, so, up the family (a loop)."""
        while True:
            stream = self.by_uid.get(uid)
            if uid in self.sources.values() or (
                    stream is not None and self.streams.at(stream.path) is stream):
                return
            for held in (self.by_uid, self.versions, self.marks, self.last_marks, self.homes):
                held.pop(uid, None)
            self.told_gone.discard(uid)
            source = self.sources.pop(uid, None)
            if source is None:
                return
            uid = source

    # -- other nodes' writes ---------------------------------------------------

    def _follow(self, path: str, channel: str) -> None:
        """Hear each write to the stream at ``path``, told on ``channel``."""
        if self.followed.get(path) == channel:
            return
        self._unfollow(path)
        self.followed[path] = channel
        self.shards.subscribe(channel, lambda told: self._told(path, told),
                              lambda: self.written(path, False))

    def _told(self, path: str, told: bytes) -> None:
        """Another node's write to the stream at ``path``: ``told`` its uid,
        or ``GONE`` and the uid of one it dropped (this node's own too: once
        it left the channel, not heard)."""
        if path not in self.followed:
            return
        gone = told.startswith(GONE.encode())
        if gone:
            uid = told[len(GONE):].decode(errors="replace")
            if uid in self.by_uid:
                self.told_gone.add(uid)
        self.written(path, gone)

    def _unfollow(self, path: str) -> None:
        """No stream at ``path`` any more: its channel is not needed here."""
        channel = self.followed.pop(path, None)
        if channel is not None:
            self.shards.unsubscribe(channel)

    def stop(self) -> None:
        for channel in self.followed.values():
            self.shards.unsubscribe(channel)
        self.followed.clear()
