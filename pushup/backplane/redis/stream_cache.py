"""A node's cache of the Durable Streams Redis holds (``--engine redis``): what
it read of each stream, where each is, and the channel it follows each path on.

The rule: the cache is only ever what Redis held when read. A read asks for the
appends the cache lacks (a log only grows, so the cache's are a prefix of
Redis's) and for the state only when its version is not the cached one. A
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
    READ,
    READ_SHA,
    UNPOINT,
    UNPOINT_SHA,
    channel_of,
    home_of_pointer,
    pointer,
    prefix_of,
)
from pushup.core.stream_values import Entry, Position
from pushup.core.streams import Stream, Streams, entry_of, stream_of

log = Logger()


def _unpacked(item: bytes) -> Entry:
    """An append as Redis holds it (``streams._packed``)."""
    head, _, data = item.partition(b"\n")
    appends, size, lengths = json.loads(head)
    return entry_of(Position(appends, size), data,
                  None if lengths is None else json.dumps(lengths))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class StreamCache:
    """What this node holds of the streams in Redis (``streams``, the core's)."""

    def __init__(self, shards: Shards, streams: Streams, timeout: float,
                 written: Callable[[str], None]) -> None:
        """``timeout``: seconds a Redis command may take; ``written(path)``:
        another node wrote the stream at ``path``."""
        self.shards = shards
        self.streams = streams
        self.timeout = timeout
        self.written = written
        self.versions: dict[str, int] = {}  # uid -> the version the cache holds
        self.by_uid: dict[str, Stream] = {}  # every cached stream, mapped or a fork's source
        self.at: dict[str, str] = {}  # path -> its ``at`` (uid or pointer), as last read
        self.homes: dict[str, str] = {}  # uid -> its family's home (a key prefix)
        self.sources: dict[str, str] = {}  # fork uid -> its source's uid
        self.followed: dict[str, str] = {}  # path -> the channel this node follows it on
        self._involved: dict[str, Stream] = {}  # uid -> the streams this request read

    # -- where a stream is -----------------------------------------------------

    def _home(self, stream: Stream) -> str:
        """Where ``stream``'s keys are: where it was read or written, else
        (new) its source's home, else its path's own tag."""
        home = self.homes.get(stream.uid)
        if home is not None:
            return home
        if stream.source is not None:
            return self._home(stream.source)
        return prefix_of(stream.path)

    def _place(self, stream: Stream) -> tuple[str, str, str]:
        """``stream``'s home, its path's ``at`` key when in the home's slot
        (else ""), and the value that maps the path to it."""
        home = self._home(stream)
        if home == prefix_of(stream.path):
            return home, home + "at", stream.uid
        return home, "", pointer(home, stream.uid)

    # -- reading Redis into the cache -------------------------------------------

    @defer.inlineCallbacks
    def _read_path(self, path: str) -> Generator[Any, Any, None]:
        """The stream at ``path`` (and a fork's sources) as Redis holds it
        now: where the path's ``at`` points, read there."""
        home = prefix_of(path)
        cached = self.streams.at(path)
        hint = "" if cached is None else cached.uid
        known = (hint, len(cached.entries) if cached is not None else 0,
                 self.versions.get(hint, ""))
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
                self._unmap(path, cached)
            self._unfollow(path)
            return
        self.at[path] = at
        stream = yield self._apply(home, reply, known)
        if cached is not None and cached is not stream:
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
        """The stream ``uid`` in ``home`` (or as cached, marked deleted, when
        Redis has it no more) and whether Redis has it."""
        cached = self.by_uid.get(uid)
        known = (uid if cached is not None else "",
                 len(cached.entries) if cached is not None else 0, self.versions.get(uid, ""))
        reply = yield self.shards.evalsha(READ_SHA, READ, (home + "at",), (home, uid, *known),
                                          timeout=self.timeout)
        if len(reply) == 1:  # gone: nothing more to read of it
            if cached is not None:
                cached.deleted = True
            return cached, False
        stream: Stream = yield self._apply(home, reply, known)
        return stream, True

    @defer.inlineCallbacks
    def _apply(self, home: str, reply: list[Any], known: tuple[str, int, Any],
               ) -> Generator[Any, Any, Stream]:
        """READ's ``reply`` into the cache, asked with ``known`` (the uid the
        cache held, how many of its appends, its version). Appends the cached
        stream holds already (read by uid as a source first) are not added
        twice."""
        uid, version, state_text, deadline = (_text(reply[1]), int(reply[2]),
                                              _text(reply[3]), _text(reply[4]))
        stream = self.by_uid.get(uid)
        changed = stream is None or self.versions.get(uid) != version
        state = json.loads(state_text) if state_text else None
        if state is not None:  # new to the cache, or another version than it holds
            fresh = stream_of(uid, state)
            if stream is None:
                stream = self.by_uid[uid] = fresh
            else:
                for name in ("content_type", "ttl", "expires_at", "deadline", "closed",
                             "closed_by", "forked_at", "fork_request", "tail", "forks",
                             "deleted", "producers", "writer_seq", "charged"):
                    setattr(stream, name, getattr(fresh, name))
        assert stream is not None  # READ sends the state of a stream new to the cache
        if deadline and stream.deadline is not None:  # reads renew it in Redis only
            stream.deadline = max(stream.deadline, int(deadline))
        first = known[1] if uid == known[0] else 0
        for item in reply[5 + max(0, len(stream.entries) - first):]:
            entry = _unpacked(bytes(item))
            stream.entries.append(entry)
            stream.begins.append(entry.begins.size)
        self.versions[uid] = version
        self.homes[uid] = home
        self._involved[uid] = stream
        source_uid = (state["source"] if state is not None else self.sources.get(uid))
        if source_uid is not None and stream.fork_request is not None:
            self.sources[uid] = source_uid
            source, _ = yield self._read_uid(home, source_uid)  # its family's slot
            stream.source = source
        if changed:
            stream.wake()
        return stream

    def _unmap(self, path: str, stream: Stream) -> None:
        """``stream`` no longer answers at ``path`` (deleted or expired
        through another node): its readers hear it."""
        if self.streams.at(path) is stream:
            self.streams.place(path, None)
        if stream.uid not in self.sources.values():
            self.by_uid.pop(stream.uid, None)
            self.versions.pop(stream.uid, None)
            self.homes.pop(stream.uid, None)
        stream.deleted = True
        stream.wake()

    # -- other nodes' writes ---------------------------------------------------

    def _follow(self, path: str, channel: str) -> None:
        """Hear each write to the stream at ``path``, told on ``channel``."""
        if self.followed.get(path) == channel:
            return
        self._unfollow(path)
        self.followed[path] = channel
        self.shards.subscribe(channel, lambda _: self.written(path),
                              lambda: self.written(path))

    def _unfollow(self, path: str) -> None:
        """No stream at ``path`` any more: its channel is not needed here."""
        channel = self.followed.pop(path, None)
        if channel is not None:
            self.shards.unsubscribe(channel)

    def stop(self) -> None:
        for channel in self.followed.values():
            self.shards.unsubscribe(channel)
        self.followed.clear()
