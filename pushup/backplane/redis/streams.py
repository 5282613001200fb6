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

Keys, one Cluster slot per stream path (hash tag ``{s:<path hash>}``):
``pushup:{s:H}:at`` the uid of the stream at the path; ``pushup:{s:H}:<uid>:m``
a hash (``v`` version, ``state`` JSON, ``deadline`` microseconds, raised by
reads that renew a TTL without a new version); ``pushup:{s:H}:<uid>:l`` the
appends, one list item each; ``pushup:{s:H}:n`` the sharded channel told the
uid after each write, which wakes the long polls and SSE readers of every
node (they read from the refreshed cache). A fork and its source are two
paths, two slots: on a Redis Cluster a fork's write needs both on one slot
(docs/api.md, "Durable Streams").
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Generator, Sequence
from typing import Any

from twisted.internet import defer, task
from twisted.logger import Logger

from pushup.backplane.redis.client import RedisGone, RedisNotSent
from pushup.backplane.redis.cluster import Shards
from pushup.core import errors
from pushup.core.errors import PushUpError
from pushup.core.stream_values import Entry, Position
from pushup.core.streams import Stream, Streams, entry_of, state_of, stream_of

log = Logger()
EXPIRY_GRACE_MS = 3_600_000  # Redis drops an expired stream nobody asked for after this
ATTEMPTS = 16  # a request is decided this often, on conflicting writes, before a 503
MAX_BACKOFF_S = 0.05  # the most it waits before deciding again (random, doubling)

# The stream at a path (ARGV[2] "") or a given uid: where the path points,
# the uid, its version, state, deadline, then its appends from ARGV[4] on
# (all of them when ARGV[3] is not the uid the cache holds). The state is ""
# when the cache holds this version (ARGV[5]) already.
READ = """
local at = redis.call('GET', KEYS[1]) or ''
local uid = ARGV[2]
if uid == '' then uid = at end
if uid == '' then return {at} end
local m = ARGV[1] .. uid
local meta = redis.call('HMGET', m .. ':m', 'v', 'state', 'deadline')
if not meta[1] then return {at} end
local from = 0
if uid == ARGV[3] then from = tonumber(ARGV[4]) end
local state = meta[2]
if uid == ARGV[3] and meta[1] == ARGV[5] then state = '' end
local out = {at, uid, meta[1], state, meta[3] or ''}
local appends = redis.call('LRANGE', m .. ':l', from, -1)
for i = 1, #appends do out[#out + 1] = appends[i] end
return out
"""
READ_SHA = hashlib.sha1(READ.encode()).hexdigest()

# Every change of one request, or none: ARGV[1] is a JSON list of changes,
# one per stream (KEYS[i]: its path's key), ARGV[2...] their appends in order.
# A change names the version it was decided on; any other version (or, when
# it maps the path, another stream at the path; or, dropping an expired
# stream, a deadline a read has renewed since) refuses them all: {0}.
WRITE = """
local changes = cjson.decode(ARGV[1])
for i, c in ipairs(changes) do
  local m = c.p .. c.u .. ':m'
  if tonumber(redis.call('HGET', m, 'v') or '0') ~= c.v then return {0, i} end
  if c.map == 1 and (redis.call('GET', KEYS[i]) or '') ~= c.at then return {0, i} end
  if c.drop == 1 and c.now ~= '' then
    local deadline = redis.call('HGET', m, 'deadline')
    if deadline and tonumber(deadline) > tonumber(c.now) then return {0, i} end
  end
end
local arg = 2
for i, c in ipairs(changes) do
  local m = c.p .. c.u
  if c.drop == 1 then
    redis.call('DEL', m .. ':m', m .. ':l')
  else
    redis.call('HSET', m .. ':m', 'v', c.v + 1, 'state', c.s)
    if c.d ~= '' then
      local deadline = redis.call('HGET', m .. ':m', 'deadline')
      if not deadline or tonumber(deadline) < tonumber(c.d) then
        redis.call('HSET', m .. ':m', 'deadline', c.d)
      end
    end
    local last = arg + c.n - 1
    while arg <= last do
      local upto = math.min(last, arg + 999)
      redis.call('RPUSH', m .. ':l', unpack(ARGV, arg, upto))
      arg = upto + 1
    end
  end
  if c.map == 1 then
    redis.call('SET', KEYS[i], c.u)
  elseif c.map == 0 and redis.call('GET', KEYS[i]) == c.u then
    redis.call('DEL', KEYS[i])
  end
  if c.drop == 0 then  -- Redis drops what nobody asks for a while after its deadline
    local mapped = redis.call('GET', KEYS[i]) == c.u
    if c.x ~= '' then
      redis.call('PEXPIREAT', m .. ':m', c.x)
      redis.call('PEXPIREAT', m .. ':l', c.x)
      if mapped then redis.call('PEXPIREAT', KEYS[i], c.x) end
    else
      redis.call('PERSIST', m .. ':m')
      redis.call('PERSIST', m .. ':l')
      if mapped then redis.call('PERSIST', KEYS[i]) end
    end
  end
  redis.call('SPUBLISH', c.p .. 'n', c.u)
end
return {1}
"""
WRITE_SHA = hashlib.sha1(WRITE.encode()).hexdigest()

# A read renewed a sliding TTL: the later deadline, kept (no new version).
TOUCH = """
local m = ARGV[1] .. ARGV[2] .. ':m'
local deadline = redis.call('HGET', m, 'deadline')
if redis.call('EXISTS', m) == 1 and (not deadline or tonumber(deadline) < tonumber(ARGV[3])) then
  redis.call('HSET', m, 'deadline', ARGV[3])
  if ARGV[4] ~= '' then
    redis.call('PEXPIREAT', m, ARGV[4])
    redis.call('PEXPIREAT', ARGV[1] .. ARGV[2] .. ':l', ARGV[4])
    if redis.call('GET', KEYS[1]) == ARGV[2] then redis.call('PEXPIREAT', KEYS[1], ARGV[4]) end
  end
end
return 1
"""
TOUCH_SHA = hashlib.sha1(TOUCH.encode()).hexdigest()


def prefix_of(path: str) -> str:
    """The keys' common start for ``path``: one hash tag, one slot."""
    digest = hashlib.sha1(path.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return f"pushup:{{s:{digest}}}:"


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
        self.at: dict[str, str] = {}  # path -> the uid Redis maps it to, as last read
        self.sources: dict[str, str] = {}  # fork uid -> its source's uid
        self.followed: set[str] = set()  # paths whose channel this node subscribes to
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
                yield self.shards.evalsha(
                    TOUCH_SHA, TOUCH, (prefix_of(s.path) + "at",),
                    (prefix_of(s.path), s.uid, str(s.deadline), _expiry_ms(s)),
                    timeout=self.timeout)
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
        changes: list[dict[str, Any]] = []
        keys: list[str] = []
        appends: list[bytes] = []
        now = self.now()
        for uid, (stream, entries, mapped) in saved.items():
            prefix = prefix_of(stream.path)
            known = self.at.get(stream.path, "")
            mapping = (-1 if mapped == (known == uid) else 1 if mapped else 0)
            changes.append({"p": prefix, "u": uid, "v": self.versions.get(uid, 0),
                            "s": json.dumps(state_of(stream, mapped)), "n": len(entries),
                            "d": "" if stream.deadline is None else str(stream.deadline),
                            "map": mapping, "at": known, "drop": 0, "now": "",
                            "x": _expiry_ms(stream)})
            keys.append(prefix + "at")
            appends.extend(_packed(e) for e in entries)
        for uid, stream in dropped.items():
            prefix = prefix_of(stream.path)
            expired = stream.deadline is not None and now >= stream.deadline
            changes.append({"p": prefix, "u": uid, "v": self.versions.get(uid, 0),
                            "s": "", "n": 0, "d": "", "map": 0, "at": "", "drop": 1,
                            "now": str(now) if expired else ""})
            keys.append(prefix + "at")
        reply = yield self.shards.evalsha(WRITE_SHA, WRITE, keys,
                                          [json.dumps(changes), *appends], timeout=self.timeout)
        if int(reply[0]) != 1:
            raise Conflict()
        for uid, (stream, _, mapped) in saved.items():
            self.versions[uid] = self.versions.get(uid, 0) + 1
            self.by_uid[uid] = stream
            if stream.source is not None:
                self.sources[uid] = stream.source.uid
            self._follow(stream.path)
            if mapped:
                self.at[stream.path] = uid
            elif self.at.get(stream.path) == uid:
                del self.at[stream.path]
        for uid, stream in dropped.items():
            self.versions.pop(uid, None)
            self.by_uid.pop(uid, None)
            self.sources.pop(uid, None)
            if self.at.get(stream.path) == uid:
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
        """The stream at ``path`` (and a fork's sources) as Redis holds it now."""
        prefix = prefix_of(path)
        cached = self.streams.at(path)
        hint = "" if cached is None else cached.uid
        reply = yield self.shards.evalsha(
            READ_SHA, READ, (prefix + "at",),
            (prefix, "", hint, len(cached.entries) if cached is not None else 0,
             self.versions.get(hint, "")), timeout=self.timeout)
        at = _text(reply[0])
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
        stream = yield self._apply(path, reply)
        if cached is not None and cached is not stream:
            self._unmap(path, cached)
        self.streams.place(path, stream)
        self._follow(path)

    @defer.inlineCallbacks
    def _read_uid(self, path: str, uid: str) -> Generator[Any, Any, Stream | None]:
        prefix = prefix_of(path)
        cached = self.by_uid.get(uid)
        reply = yield self.shards.evalsha(
            READ_SHA, READ, (prefix + "at",),
            (prefix, uid, uid if cached is not None else "",
             len(cached.entries) if cached is not None else 0,
             self.versions.get(uid, "")), timeout=self.timeout)
        if len(reply) == 1:  # gone: nothing more to read of it
            if cached is not None:
                cached.deleted = True
            return cached
        stream: Stream = yield self._apply(path, reply)
        return stream

    @defer.inlineCallbacks
    def _apply(self, path: str, reply: list[Any]) -> Generator[Any, Any, Stream]:
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
        for item in reply[5:]:
            entry = _unpacked(bytes(item))
            stream.entries.append(entry)
            stream.begins.append(entry.begins.size)
        self.versions[uid] = version
        self._involved[uid] = stream
        source_uid = (state["source"] if state is not None else self.sources.get(uid))
        if source_uid is not None and stream.fork_request is not None:
            self.sources[uid] = source_uid
            source = yield self._read_uid(stream.fork_request[0], source_uid)
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
        stream.deleted = True
        stream.wake()

    # -- other nodes' writes ---------------------------------------------------

    def _follow(self, path: str) -> None:
        if path in self.followed:
            return
        self.followed.add(path)
        self.shards.subscribe(prefix_of(path) + "n", lambda _: self._refresh(path),
                              lambda: self._refresh(path))

    def _unfollow(self, path: str) -> None:
        """No stream at ``path`` any more: its channel is not needed here."""
        if path in self.followed:
            self.followed.discard(path)
            self.shards.unsubscribe(prefix_of(path) + "n")

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
        for path in self.followed:
            self.shards.unsubscribe(prefix_of(path) + "n")
        self.followed.clear()


_AGAIN = object()
