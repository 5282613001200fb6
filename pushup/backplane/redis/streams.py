"""Durable Streams shared by every node on one Redis (``--engine redis``).

Redis holds each stream; a node's :class:`pushup.core.streams.Streams` is a
cache of it that the core decides on. Every request to a stream runs
(:meth:`SharedStreams.serve`) as: read the streams it names from Redis (only
the appends the cache lacks: a log only grows), let the core answer from the
cache, then write what the core changed (its ``Journal`` calls) in one Lua
script that checks each stream's version is still the one read; another
node's write in between makes it a conflict, and the request runs again on a
fresh read. The answer waits for that script: an acknowledged append is in
Redis, whichever node dies. Offsets are the core's, a function of a stream's
content, so identical on every node.

Where each stream is (pushup/backplane/redis/stream_keys.py): every stream of
one fork family in one Cluster slot, its family's home, so that a write is one
script on one slot; a fork's path holds a pointer to it, set after the
family's script created the fork (a refused pointer: the fork is dropped
again, :meth:`SharedStreams._undo`), removed after it dropped it. What a
node holds of Redis, and how it reads it in: pushup/backplane/redis/stream_cache.py.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Generator, Sequence
from functools import partial
from typing import Any

from twisted.internet import defer, task
from twisted.logger import Logger

from pushup.backplane.redis.client import RedisGone, RedisNotSent
from pushup.backplane.redis.cluster import Shards
from pushup.backplane.redis.stream_cache import StreamCache
from pushup.backplane.redis.stream_keys import (
    POINT,
    POINT_SHA,
    TOUCH,
    TOUCH_SHA,
    UNPOINT,
    UNPOINT_SHA,
    WRITE,
    WRITE_SHA,
    channel_of,
    prefix_of,
    uid_in,
)
from pushup.core import errors
from pushup.core.errors import PushUpError
from pushup.core.stream import Stream
from pushup.core.stream_state import state_of
from pushup.core.stream_values import Entry
from pushup.core.streams import Streams

log = Logger()
EXPIRY_GRACE_MS = 3_600_000  # Redis drops an expired stream nobody asked for after this
ATTEMPTS = 16  # a request is decided this often, on conflicting writes, before a 503
MAX_BACKOFF_S = 0.05  # the most it waits before deciding again (random, doubling)


def _packed(entry: Entry, mark: str) -> bytes:
    """An append as Redis holds it (``stream_cache.unpacked``): its head
    names its write's ``mark``."""
    lengths = None if entry.messages is None else [len(m) for m in entry.messages]
    head = json.dumps([entry.begins.appends, entry.begins.size, lengths, mark])
    return head.encode() + b"\n" + entry.data


def _mark() -> str:
    """A write's mark: never the same twice (random)."""
    return os.urandom(8).hex()


def _expiry_ms(stream: Stream) -> str:
    """When Redis may drop ``stream``'s keys by itself ("": never): a
    while after its deadline, so that nodes see it expire first; never
    while forks read it."""
    if stream.deadline is None or stream.forks:
        return ""
    return str(stream.deadline // 1000 + EXPIRY_GRACE_MS)


def _unwritten(e: Exception) -> PushUpError:
    """What the writer is told when Redis did not take a write: 503 when the
    script never left this node (nothing was stored), 504 when it was sent
    and no reply came (it may run yet: retried with the producer headers it
    is then a duplicate), as for a publish."""
    if isinstance(e, RedisNotSent):
        return errors.EngineUnavailable(f"Redis is unreachable ({e}); nothing was stored")
    if isinstance(e, RedisGone):
        return errors.OutcomeUnknown(f"Redis did not answer ({e}); the write may or may not "
                                     "be stored: retry it with the same producer headers")
    return errors.EngineUnavailable(f"Redis refused the write: {e}")


class Conflict(Exception):
    """Another node wrote one of the streams since this node read it."""


class SharedStreams(StreamCache):
    """The streams of every node on this Redis, with ``streams`` this node's
    cache of them (its ``Journal``: the changes the core makes are collected
    here and written by :meth:`serve`); the Redis engine's ``StreamEngine``."""

    shared = True

    def __init__(self, shards: Shards, streams: Streams, now: Callable[[], int],
                 timeout: float, clock: Any) -> None:
        """``timeout``: seconds a Redis command may take before the request
        is 503; ``clock``: the reactor (a retry's pause)."""
        super().__init__(shards, streams, timeout, self._refresh, now)
        self.clock = clock
        streams.keep_with(self)
        self.lock = defer.DeferredLock()  # one request's read-decide-write at a time
        # uid -> (fork, its version) created here whose path another stream took
        # first: it is dropped again before the next request (``_undo``)
        self.orphans: dict[str, tuple[Stream, int]] = {}
        self._saved: dict[str, tuple[Stream, list[Entry], bool]] = {}
        self._dropped: dict[str, Stream] = {}

    # -- the core's Journal ----------------------------------------------------

    def saved(self, stream: Stream, entries: Sequence[Entry], mapped: bool) -> None:
        before = self._saved.get(stream.uid)
        self._saved[stream.uid] = (stream, (before[1] if before else []) + list(entries), mapped)

    def dropped(self, stream: Stream) -> None:
        self._saved.pop(stream.uid, None)
        self._dropped[stream.uid] = stream

    # -- a request -------------------------------------------------------------

    def internal(self, request: object) -> bool:
        return False  # every request is a client's: nodes talk through Redis

    def drain(self) -> None:
        pass  # nothing held open: a request's answer waits for Redis only

    @defer.inlineCallbacks
    def serve(self, paths: Sequence[str], run: Callable[[], Any], request: object = None,
              client: object = None) -> Generator[Any, Any, Any]:
        """``run()``'s answer, the core deciding on ``paths`` as Redis holds
        them and its changes written before it is returned (PushUpError:
        the answer is that error's; Redis unreachable: 503); a Deferred
        always. ``request`` and ``client`` are not needed: every node
        serves every stream."""
        for attempt in range(ATTEMPTS):
            if attempt:  # lost a race: let the other writer finish, unlocked meanwhile
                pause = random.uniform(0, min(MAX_BACKOFF_S, 0.001 * 2 ** attempt))
                yield task.deferLater(self.clock, pause, lambda: None)
            yield self.lock.acquire()
            try:
                if self.orphans:
                    yield self._undo()
                result = yield self._attempt(paths, run)
            finally:
                self.lock.release()
            if result is not _AGAIN:
                return result
        raise errors.Unavailable("the stream is written by other nodes too often; try again")

    @defer.inlineCallbacks
    def _attempt(self, paths: Sequence[str], run: Callable[[], Any],
                 ) -> Generator[Any, Any, Any]:
        self._involved = {}
        try:
            for path in paths:
                yield self._read_path(path)
        except PushUpError:
            raise
        except Exception as e:
            raise errors.EngineUnavailable(
                f"Redis could not be read ({e}); nothing was changed") from None
        result = yield self._decide(run)
        return result

    @defer.inlineCallbacks
    def _undo(self) -> Generator[Any, Any, None]:
        """Drop again each fork created here whose path another stream took
        first (its source counts it no more), unless its path points to it
        after all or it was written since (then it is a stream like any)."""
        for uid, (orphan, version) in list(self.orphans.items()):
            assert orphan.fork_request is not None
            self._involved = {}
            try:
                yield self._read_path(orphan.fork_request[0])
                yield self._read_path(orphan.path)
                fork, found = yield self._read_uid(self._home(orphan), uid)
                if (not found or self.versions.get(uid) != version
                        or uid_in(self.at.get(orphan.path, "")) == uid):
                    del self.orphans[uid]
                    continue
                if (yield self._decide(partial(self.streams.drop, fork))) is not _AGAIN:
                    del self.orphans[uid]
            except Exception as e:  # kept: tried again before the next request
                log.warn("redis: fork {uid} not dropped yet: {why}", uid=uid, why=str(e))

    @defer.inlineCallbacks
    def _decide(self, run: Callable[[], Any]) -> Generator[Any, Any, Any]:
        self._saved, self._dropped = {}, {}
        self.streams.charge_afresh()  # Redis holds the bytes: the node's budget caps one write
        involved = self._involved
        deadlines = {uid: s.deadline for uid, s in involved.items() if s.ttl is not None}
        raised = self._raise_floors(involved)
        with self.streams.wakes_held(involved.values()):  # woken once the write is in Redis
            try:
                result = run()
            except PushUpError as e:
                result = e
        saved, dropped = self._saved, self._dropped
        self._saved, self._dropped = {}, {}
        try:
            if saved or dropped:
                yield self._write(saved, dropped)
            touched = [s for uid, s in involved.items() if s.ttl is not None
                       and uid not in saved and s.deadline != deadlines.get(uid, s.deadline)]
            for s in touched:
                home, key, _ = self._place(s)
                yield self.shards.evalsha(
                    TOUCH_SHA, TOUCH, (key or home + "at",),
                    (home, s.uid, str(s.deadline), _expiry_ms(s)), timeout=self.timeout)
        except Conflict:
            self._forget([entry[0] for entry in saved.values()] + list(dropped.values()))
            return _AGAIN
        except Exception as e:
            self._forget([entry[0] for entry in saved.values()] + list(dropped.values()))
            raise _unwritten(e) from None
        for path in raised:
            self.floors.pop(path, None)
        for written in [entry[0] for entry in saved.values()] + list(dropped.values()):
            written.wake()
        if isinstance(result, PushUpError):
            raise result
        return result

    def _raise_floors(self, involved: dict[str, Stream]) -> list[str]:
        """Each involved stream at a path where Redis lost what this node
        served (``floors``) made to go on past it: its tail raised, to be
        written with the request's changes (the paths, whose floors go once
        written). A closed or deleted stream takes no append: nothing to raise."""
        raised = []
        for stream in involved.values():
            floor = self.floors.get(stream.path)
            if floor is None or not self.streams.mapped(stream):
                continue
            tail = stream.tail
            if stream.closed or stream.deleted or (
                    floor.appends <= tail.appends and floor.size <= tail.size):
                del self.floors[stream.path]
                continue
            stream.raise_tail(floor)
            self.saved(stream, [], True)
            raised.append(stream.path)
        return raised

    @defer.inlineCallbacks
    def _write(self, saved: dict[str, tuple[Stream, list[Entry], bool]],
               dropped: dict[str, Stream]) -> Generator[Any, Any, None]:
        """The changes, one script on their family's slot; then a new fork's
        pointer (another stream took its path first: Conflict, the fork an
        orphan) and a dropped fork's pointer removed."""
        changes: list[dict[str, Any]] = []
        appends: list[bytes] = []
        points: list[tuple[Stream, str, str]] = []  # (fork, what its path held, pointer)
        unpoints: list[tuple[str, str]] = []  # (a path's at key, the pointer it loses)
        now = self.now()
        mark = _mark()
        for uid, (stream, entries, mapped) in saved.items():
            home, key, value = self._place(stream)
            known = self.at.get(stream.path, "")
            mapping = (-1 if mapped == (known == value) else 1 if mapped else 0)
            if not key and mapping == 1:
                points.append((stream, known, value))
            elif not key and mapping == 0:
                unpoints.append((prefix_of(stream.path) + "at", value))
            changes.append({"p": home, "u": uid, "v": self.versions.get(uid, 0),
                            "s": json.dumps(state_of(stream, mapped)), "n": len(entries),
                            "d": "" if stream.deadline is None else str(stream.deadline),
                            "map": mapping if key else -1, "k": key, "at": known,
                            "ch": channel_of(stream.path, home), "drop": 0, "now": "",
                            "x": _expiry_ms(stream), "w": mark,
                            # the appends retention let go of: their bytes freed in Redis
                            "t": stream.earliest.appends if stream.retains else 0})
            appends.extend(_packed(e, mark) for e in entries)
        for uid, stream in dropped.items():
            home, key, value = self._place(stream)
            expired = stream.deadline is not None and now >= stream.deadline
            if not key:
                unpoints.append((prefix_of(stream.path) + "at", value))
            changes.append({"p": home, "u": uid, "v": self.versions.get(uid, 0),
                            "s": "", "n": 0, "d": "", "map": 0, "k": key, "at": "",
                            "ch": channel_of(stream.path, home), "drop": 1,
                            "now": str(now) if expired else ""})
        reply = yield self.shards.evalsha(WRITE_SHA, WRITE, (changes[0]["p"] + "at",),
                                          [json.dumps(changes), *appends], timeout=self.timeout)
        if int(reply[0]) != 1:
            raise Conflict()
        for fork, known, value in points:
            try:
                pointed = yield self.shards.evalsha(
                    POINT_SHA, POINT, (prefix_of(fork.path) + "at",), (known, value),
                    timeout=self.timeout)
            except Exception:
                self.orphans[fork.uid] = (fork, self.versions.get(fork.uid, 0) + 1)
                raise
            if int(pointed) != 1:
                self.orphans[fork.uid] = (fork, self.versions.get(fork.uid, 0) + 1)
                raise Conflict()
        for key, value in unpoints:  # a pointer left behind reads as no stream
            try:
                yield self.shards.evalsha(UNPOINT_SHA, UNPOINT, (key,), (value,),
                                          timeout=self.timeout)
            except Exception as e:
                log.warn("redis: pointer {key} not removed: {why}", key=key, why=str(e))
        for uid, (stream, entries, mapped) in saved.items():
            home, _, value = self._place(stream)
            self.versions[uid] = self.versions.get(uid, 0) + 1
            self.marks[uid] = mark
            if entries and stream.entries and stream.entries[-1] is entries[-1]:
                self.last_marks[uid] = mark
            self.by_uid[uid] = stream
            self.homes[uid] = home
            if stream.source is not None:
                self.sources[uid] = stream.source.uid
            if mapped:
                self.at[stream.path] = value
                self._follow(stream.path, channel_of(stream.path, home))
            elif uid_in(self.at.get(stream.path, "")) == uid:
                del self.at[stream.path]
        for uid, stream in dropped.items():
            for held in (self.versions, self.marks, self.last_marks, self.by_uid,
                         self.sources, self.homes):
                held.pop(uid, None)
            self.told_gone.discard(uid)
            if uid_in(self.at.get(stream.path, "")) == uid:
                del self.at[stream.path]
            if stream.path not in self.at:
                self._unfollow(stream.path)

    def _forget(self, refused: Sequence[Stream]) -> None:
        """The cache of ``refused`` holds changes Redis did not take: read
        them whole again (into the same objects, which readers hold)."""
        for stream in refused:
            self.versions.pop(stream.uid, None)
            self.marks.pop(stream.uid, None)
            self.last_marks.pop(stream.uid, None)
            if stream.uid not in self.by_uid:  # created here and refused: it never was
                if self.streams.at(stream.path) is stream:
                    self.streams.place(stream.path, None)
                continue
            stream.forget_entries()

    def _refresh(self, path: str, gone: bool) -> None:
        """A write to ``path`` (or a resubscription, after which one may have
        been missed): read it again, which wakes its readers, if it has any
        here, or may have: a request in flight (the lock held) may have read
        the stream before this write and go on to hold a poll on that. A
        write that dropped it (``gone``): read it again always, which forgets
        it here and leaves its channel."""
        held = self.streams.at(path)
        if not gone and (held is None or not (held.waited_on or self.lock.locked)):
            return
        d = self.serve([path], lambda: None)
        d.addErrback(lambda f: log.warn("redis: stream {path} not read again: {why}",
                                        path=path[:200], why=f.getErrorMessage()))

_AGAIN = object()
