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
again, :meth:`SharedStreams._undo`), removed after it dropped it. A node
reads a pointer, then the stream where it points.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Generator, Sequence
from functools import partial
from typing import Any

from twisted.internet import defer, task
from twisted.logger import Logger

from pushup.backplane.redis.client import RedisGone, RedisNotSent
from pushup.backplane.redis.cluster import Shards
from pushup.backplane.redis.stream_keys import (
    POINT,
    POINT_SHA,
    READ,
    READ_SHA,
    TOUCH,
    TOUCH_SHA,
    UNPOINT,
    UNPOINT_SHA,
    WRITE,
    WRITE_SHA,
    channel_of,
    home_of_pointer,
    pointer,
    prefix_of,
    uid_in,
)
from pushup.core import errors
from pushup.core.errors import PushUpError
from pushup.core.stream_values import Entry, Position
from pushup.core.streams import Stream, Streams, entry_of, state_of, stream_of

log = Logger()
EXPIRY_GRACE_MS = 3_600_000  # Redis drops an expired stream nobody asked for after this
ATTEMPTS = 16  # a request is decided this often, on conflicting writes, before a 503
MAX_BACKOFF_S = 0.05  # the most it waits before deciding again (random, doubling)

def _packed(entry: Entry) -> bytes:
    lengths = None if entry.messages is None else [len(m) for m in entry.messages]
    head = json.dumps([entry.begins.appends, entry.begins.size, lengths])
    return head.encode() + b"\n" + entry.data


def _unpacked(item: bytes) -> Entry:
    head, _, data = item.partition(b"\n")
    appends, size, lengths = json.loads(head)
    return entry_of(Position(appends, size), data,
                  None if lengths is None else json.dumps(lengths))


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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Conflict(Exception):
    """Another node wrote one of the streams since this node read it."""


class SharedStreams:
    """The streams of every node on this Redis, with ``streams`` this node's
    cache of them (its ``Journal``: the changes the core makes are collected
    here and written by :meth:`serve`)."""

    def __init__(self, shards: Shards, streams: Streams, now: Callable[[], int],
                 timeout: float, clock: Any) -> None:
        """``timeout``: seconds a Redis command may take before the request
        is 503; ``clock``: the reactor (a retry's pause)."""
        self.shards = shards
        self.clock = clock
        self.timeout = timeout
        self.streams = streams
        self.now = now
        streams.journal = self
        self.lock = defer.DeferredLock()  # one request's read-decide-write at a time
        self.versions: dict[str, int] = {}  # uid -> the version the cache holds
        self.by_uid: dict[str, Stream] = {}  # every cached stream, mapped or a fork's source
        self.at: dict[str, str] = {}  # path -> its ``at`` (uid or pointer), as last read
        self.homes: dict[str, str] = {}  # uid -> its family's home (a key prefix)
        self.sources: dict[str, str] = {}  # fork uid -> its source's uid
        self.followed: dict[str, str] = {}  # path -> the channel this node follows it on
        # uid -> (fork, its version) created here whose path another stream took
        # first: it is dropped again before the next request (``_undo``)
        self.orphans: dict[str, tuple[Stream, int]] = {}
        self._involved: dict[str, Stream] = {}  # uid -> the streams this request read
        self._saved: dict[str, tuple[Stream, list[Entry], bool]] = {}
        self._dropped: dict[str, Stream] = {}

    # -- the core's Journal ----------------------------------------------------

    def saved(self, stream: Stream, entries: Sequence[Entry], mapped: bool) -> None:
        before = self._saved.get(stream.uid)
        self._saved[stream.uid] = (stream, (before[1] if before else []) + list(entries), mapped)

    def dropped(self, stream: Stream) -> None:
        self._saved.pop(stream.uid, None)
        self._dropped[stream.uid] = stream

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

    # -- a request -------------------------------------------------------------

    @defer.inlineCallbacks
    def serve(self, paths: Sequence[str], run: Callable[[], Any]) -> Generator[Any, Any, Any]:
        """``run()``'s answer, the core deciding on ``paths`` as Redis holds
        them and its changes written before it is returned (PushUpError:
        the answer is that error's; Redis unreachable: 503)."""
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
        self.streams.held = 0  # Redis holds the bytes: the node's budget caps one write
        involved = self._involved
        deadlines = {uid: s.deadline for uid, s in involved.items() if s.ttl is not None}
        held_back = {uid: s.waiters for uid, s in involved.items()}
        for stream in involved.values():
            stream.waiters = []  # nobody is woken before the write is in Redis
        try:
            result = run()
        except PushUpError as e:
            result = e
        finally:
            for uid, waiters in held_back.items():
                involved[uid].waiters = waiters + involved[uid].waiters
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
        for written in [entry[0] for entry in saved.values()] + list(dropped.values()):
            written.wake()
        if isinstance(result, PushUpError):
            raise result
        return result

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
                            "x": _expiry_ms(stream)})
            appends.extend(_packed(e) for e in entries)
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
        for uid, (stream, _, mapped) in saved.items():
            home, _, value = self._place(stream)
            self.versions[uid] = self.versions.get(uid, 0) + 1
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
            self.versions.pop(uid, None)
            self.by_uid.pop(uid, None)
            self.sources.pop(uid, None)
            self.homes.pop(uid, None)
            if uid_in(self.at.get(stream.path, "")) == uid:
                del self.at[stream.path]
            if stream.path not in self.at:
                self._unfollow(stream.path)

    def _forget(self, refused: Sequence[Stream]) -> None:
        """The cache of ``refused`` holds changes Redis did not take: read
        them whole again (into the same objects, which readers hold)."""
        for stream in refused:
            self.versions.pop(stream.uid, None)
            if stream.uid not in self.by_uid:  # created here and refused: it never was
                if self.streams.at(stream.path) is stream:
                    self.streams.place(stream.path, None)
                continue
            del stream.entries[:], stream.begins[:]

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
        reply = yield self.shards.evalsha(READ_SHA, READ, (home + "at",), (home, "", *known),
                                          timeout=self.timeout)
        at = _text(reply[0])
        target = home_of_pointer(at)
        if len(reply) == 1 and target is not None:  # a fork of another path's family
            home, uid = target
            reply = yield self.shards.evalsha(READ_SHA, READ, (home + "at",),
                                              (home, uid, *known), timeout=self.timeout)
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
            source, found = yield self._read_uid(home, source_uid)  # its family's slot
            legacy = prefix_of(stream.fork_request[0])
            if not found and legacy != home:  # written before families shared a slot
                source, _ = yield self._read_uid(legacy, source_uid)
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
        self.shards.subscribe(channel, lambda _: self._refresh(path),
                              lambda: self._refresh(path))

    def _unfollow(self, path: str) -> None:
        """No stream at ``path`` any more: its channel is not needed here."""
        channel = self.followed.pop(path, None)
        if channel is not None:
            self.shards.unsubscribe(channel)

    def _refresh(self, path: str) -> None:
        """A write to ``path`` (or a resubscription, after which one may have
        been missed): read it again, which wakes its readers, if it has any
        here (a request reads Redis anyway)."""
        held = self.streams.at(path)
        if held is None or not held.waiters:
            return
        d = self.serve([path], lambda: None)
        d.addErrback(lambda f: log.warn("redis: stream {path} not read again: {why}",
                                        path=path[:200], why=f.getErrorMessage()))

    def stop(self) -> None:
        for channel in self.followed.values():
            self.shards.unsubscribe(channel)
        self.followed.clear()


_AGAIN = object()
