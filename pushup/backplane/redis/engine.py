"""The Redis backplane by partitions: K logs in Redis, each its own origin; every
node follows them by notification.

The rule: a channel lives in one partition (its name hashed, or the part of it
in ``{…}``, as Redis Cluster hashes keys), and each partition's log in Redis is
that partition's one order. A publish is one script call per partition it
touches, which appends its messages to that partition's log atomically (the
next sequence numbers, a timestamp that never goes backwards) and notifies
the nodes with a sharded ``SPUBLISH`` of the entries; the 201 is sent once
every partition answered. A node ``SSUBSCRIBE``s each partition's notification
channel, applies what comes in order, and reads the log back (``XRANGE``)
whenever it cannot be sure it saw everything: after (re)subscribing, after a
hole in the sequence, after an entry of another epoch. Held polls are
answered from memory: a held poll costs no Redis round trip.

Every key of partition T carries the hash tag ``{T}``, so on a Redis Cluster
a partition is one slot, its script runs on that slot's primary, and the
partitions spread over the primaries (their tags are chosen so that K
partitions fall in K even slices of the slot space):

- ``pushup:{T}:log``: a stream; entry id ``<seq>-0``; fields ``t`` (µs),
  ``k`` (``m`` a message, ``o`` a channel operation), ``c`` (channels JSON,
  or the channel's name), ``d`` (the message's data JSON exactly as accepted,
  or the operation as JSON);
- ``pushup:{T}:meta``: a hash: ``e`` the log's epoch, ``s`` its last
  sequence number, ``t`` its last timestamp;
- ``pushup:{T}:channels``: a hash of the partition's explicit channels,
  name → JSON ``{"ttl", "expires_at"}``, so they outlive the log's trimming;
- ``pushup:{T}:key:<Idempotency-Key>``: a keyed publish's part in this
  partition, JSON ``{"e", "f", "s", "t", "n"}`` (epoch, the whole body's
  fingerprint, first sequence number and timestamp, count), expiring after
  the idempotency window, checked in the same atomic call as the append;
- ``pushup:{T}:n``: the sharded channel the script notifies on, MessagePack
  ``[epoch, seq, t, k, c, d, seq, t, k, c, d, …]``.

A message goes to the partition of its first channel, whatever its other
channels: one message, one id, listed once by a reader of several of them,
and a publish to channels of one partition is atomic. A batch whose messages
fall in several partitions is one atomic append per partition: if one fails
the publisher gets no 201, and a retry with its ``Idempotency-Key`` appends
only what is missing (each partition checks the key for itself).

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
import secrets
import time
import zlib
from collections.abc import Sequence
from functools import partial
from typing import Any

import msgspec
from twisted.internet import defer, task
from twisted.logger import Logger
from twisted.python.failure import Failure

from pushup.backplane import ChannelOp, OpKind
from pushup.backplane.redis.client import (
    RedisError,
    RedisGone,
    RedisNotSent,
    script_sha,
)
from pushup.backplane.redis.cluster import Shards
from pushup.backplane.redis.slots import SLOTS, key_slot
from pushup.config import Config, parse_seeds
from pushup.core import errors
from pushup.core.channels import Channel, check_ttl
from pushup.core.follow import Entry, Hole, LoggedOp, Skip
from pushup.core.idempotency import Idem, Replayed
from pushup.core.model import Draft, Message, base36, check_channel_name, dumps
from pushup.core.service import Service

log = Logger()
PAGE = 1000  # log entries per XRANGE reply
COMMAND_TIMEOUT = 2.0  # seconds Redis has to answer a publish or a check
RETRY = 0.5  # seconds before a partition's failed read is tried again
PARTITIONS = "pushup:partitions"  # how many partitions the nodes on this Redis use

# Both scripts begin by checking the log against the calling node: KEYS log,
# meta; ARGV the epoch to start, MAXLEN, the epoch the node holds ("" if
# none) and its horizon in it. A log with no meta (Redis restarted empty), or
# with fewer entries than the node already read (a restart with appendfsync
# everysec, a failover to a replica that lagged), starts again under a new
# epoch, so no sequence number is ever reused for another message.
_CHECKED = """
local epoch = redis.call('HGET', KEYS[2], 'e')
local seq = tonumber(redis.call('HGET', KEYS[2], 's') or '0')
if (not epoch) or (epoch == ARGV[3] and seq < tonumber(ARGV[4])) then
  epoch = ARGV[1]
  seq = 0
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[2], 'e', epoch, 's', 0)
  redis.call('HSETNX', KEYS[2], 't', 0)
end
"""

# Returns {epoch, seq}.
CHECK = _CHECKED + "return {epoch, seq}"

# KEYS: log, meta, channels, the notification channel, and for a keyed
# publish its key's entry. ARGV after the four above: the body's fingerprint
# ("" for no key), the window in ms; then per entry: kind ("m" message, "o"
# operation), c, d. An operation's d is {"op": "create"|"renew"|"delete",
# "ttl", "expires_at"}. Appends every entry or none, then notifies; returns
# {epoch, seq1, ts1, seq2, ts2, ...}, or an error before writing anything if
# a create names an explicit channel that exists. A key already used in this
# epoch appends nothing: it returns the first attempt's reply with "again" at
# its end, or the error REUSED if that attempt had another body.
PUBLISH = _CHECKED + """
if ARGV[5] ~= '' then
  local prior = redis.call('GET', KEYS[5])
  if prior then
    local first = cjson.decode(prior)
    if first['e'] == epoch then
      if first['f'] ~= ARGV[5] then
        return redis.error_reply('REUSED the key was used for another body')
      end
      local out = {epoch}
      if first['r'] then  -- written by an earlier version: every (seq, ts)
        for _, v in ipairs(first['r']) do out[#out + 1] = v end
      else
        local s, t = tonumber(first['s']), tonumber(first['t'])
        for j = 0, tonumber(first['n']) - 1 do
          out[#out + 1] = s + j
          out[#out + 1] = string.format('%d', t + j)
        end
      end
      out[#out + 1] = 'again'
      return out
    end
  end
end
for i = 7, #ARGV, 3 do
  if ARGV[i] == 'o' and cjson.decode(ARGV[i + 2])['op'] == 'create'
      and redis.call('HEXISTS', KEYS[3], ARGV[i + 1]) == 1 then
    return redis.error_reply('EXISTS ' .. ARGV[i + 1])
  end
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local last = tonumber(redis.call('HGET', KEYS[2], 't'))
local out = {epoch}
local told = {epoch}
for i = 7, #ARGV, 3 do
  seq = seq + 1
  if now <= last then now = last + 1 end
  last = now
  local t = string.format('%d', now)
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], string.format('%d-0', seq),
             't', t, 'k', ARGV[i], 'c', ARGV[i + 1], 'd', ARGV[i + 2])
  if ARGV[i] == 'o' then
    local op = cjson.decode(ARGV[i + 2])
    if op['op'] == 'delete' then
      redis.call('HDEL', KEYS[3], ARGV[i + 1])
    else
      redis.call('HSET', KEYS[3], ARGV[i + 1], ARGV[i + 2])
    end
  end
  out[#out + 1] = seq
  out[#out + 1] = t
  told[#told + 1] = seq
  told[#told + 1] = t
  told[#told + 1] = ARGV[i]
  told[#told + 1] = ARGV[i + 1]
  told[#told + 1] = ARGV[i + 2]
end
redis.call('HSET', KEYS[2], 's', seq, 't', string.format('%d', last))
if ARGV[5] ~= '' then
  -- the batch's seqs and times are consecutive: its first of each and its count
  -- (as strings: cjson writes numbers with 14 digits, a timestamp has 16)
  redis.call('SET', KEYS[5], cjson.encode({e = epoch, f = ARGV[5],
                                           s = string.format('%d', out[2]), t = out[3],
                                           n = string.format('%d', (#out - 1) / 2)}),
             'PX', ARGV[6])
end
redis.call('SPUBLISH', KEYS[4], cmsgpack.pack(told))
return out
"""
_PUBLISH_SHA = script_sha(PUBLISH)
_CHECK_SHA = script_sha(CHECK)

_decode_told = msgspec.msgpack.Decoder(list[Any])


def new_epoch() -> str:
    """Milliseconds now in base 36, plus randomness: distinct per (re)start."""
    return base36(time.time_ns() // 1_000_000 * 1296 + secrets.randbelow(1296))


def partition_tags(count: int) -> list[str]:
    """The hash tag of each of ``count`` partitions: ``p<i>``, or ``p<i>-<j>``
    for the first ``j`` whose slot falls in the ``i``-th of ``count`` even
    slices of the slot space, so that partitions spread evenly over the
    primaries of any cluster whose slots are split in even ranges."""
    tags = []
    for i in range(count):
        j = 0
        while True:
            tag = f"p{i}" if j == 0 else f"p{i}-{j}"
            if key_slot(tag) * count // SLOTS == i:
                break
            j += 1
        tags.append(tag)
    return tags


def hash_tag(name: str) -> str:
    """What of a name is hashed, by Redis Cluster's rule: the part between its
    first ``{`` and the next ``}`` if that is not empty, else the whole name."""
    start = name.find("{")
    if start >= 0:
        end = name.find("}", start + 1)
        if end > start + 1:
            return name[start + 1:end]
    return name


def partition_of(channel: str, count: int) -> int:
    """The partition a channel lives in: its hash tag's CRC-32, modulo ``count``."""
    return zlib.crc32(hash_tag(channel).encode()) % count


class Partition:
    """One partition's keys, and how far this node has followed its log."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        prefix = f"pushup:{{{tag}}}:"
        self.log = prefix + "log"
        self.meta = prefix + "meta"
        self.channels = prefix + "channels"
        self.key = prefix + "key:"  # + the Idempotency-Key
        self.notify = prefix + "n"
        self.epoch = ""  # the log's epoch this node holds ("": none yet)
        self.spare = new_epoch()  # the one to start, should the log need one
        self.ready = False  # read once from Redis
        self.reading = False  # a read back is under way ...
        self.again = False  # ... and another must follow it
        self.waiting: list[bytes] = []  # notifications that came during the read

    @property
    def origin(self) -> str:
        return f"{self.tag}.{self.epoch}"

    def epoch_of(self, reply: list[Any]) -> str:
        """A script's epoch; once the spare one is taken, make another."""
        epoch: str = reply[0].decode()
        if epoch == self.spare:
            self.spare = new_epoch()
        return epoch


def keys_of(channel: str, partitions: int | None = None) -> Partition:
    """The keys of the partition ``channel`` lives in, with ``partitions`` of them
    (default: ``--redis-partitions``'s), to look at a channel's log in Redis."""
    count = Config().redis_partitions if partitions is None else partitions
    return Partition(partition_tags(count)[partition_of(channel, count)])


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
        self.key_window_ms = max(1, round(config.idempotency_window * 1000))
        self.shards = Shards(self.seeds, reactor)
        self.partitions = [Partition(tag) for tag in partition_tags(config.redis_partitions)]
        self.ready = False
        self.stopped = False
        self._loaded: defer.Deferred[None] = defer.Deferred()
        self.lost_epochs = 0  # times a log was found to have lost entries we held
        self._gone: list[tuple[str, int]] = []  # (origin, held) found gone, not yet said

    def partition(self, channel: str) -> Partition:
        return self.partitions[partition_of(channel, len(self.partitions))]

    # -- the backplane -------------------------------------------------------

    def check_ready(self) -> None:
        if not self.ready:
            raise errors.CatchingUp("this node is loading the log from Redis; retry shortly")

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

    def start(self) -> defer.Deferred[None]:
        """Check that this Redis's partitions are ours, then follow every
        partition; fires once each was read (fails, and the node never
        serves, if the nodes already on this Redis use another number)."""
        self.shards.start()
        d = self._check_partitions()
        d.addCallbacks(self._follow_all, self._loaded.errback)
        return self._loaded

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

    def _follow_all(self, _: object) -> None:
        for p in self.partitions:
            self.shards.subscribe(p.notify, partial(self._notified, p),
                                  partial(self._read_back, p))

    @defer.inlineCallbacks
    def stop(self, grace: float) -> Any:
        """Nothing to hand on: what was acknowledged is in Redis."""
        self.stopped = True
        yield self.shards.stop()

    def publish(self, drafts: Sequence[Draft], idem: Idem | None = None,
                ) -> defer.Deferred[list[Message]]:
        parts: dict[Partition, list[Draft]] = {}
        for draft in drafts:
            parts.setdefault(self.partition(draft.channels[0]), []).append(draft)
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
        return d

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
        # Our publish, if next in the log, is stored now (the publisher's next
        # poll here sees it); otherwise its notification brings it in order.
        messages = self.service.publish_logged(messages, current=epoch == p.epoch,
                                               scoped=True)
        if epoch != p.epoch:
            self._read_back(p, f"a publish found the log at epoch {epoch}")
        return messages

    def create_channel(self, name: str | None, ttl: int | None) -> defer.Deferred[Channel]:
        name = self.store.new_name(name)
        ttl = check_ttl(ttl, self.store.retention.channel_ttl)
        return self._operate("create", name, ttl)

    def renew_channel(self, name: str, ttl: int | None) -> defer.Deferred[Channel]:
        channel = self.store.get(check_channel_name(name))
        return self._operate("renew", name, check_ttl(ttl, channel.ttl))

    def delete_channel(self, name: str) -> defer.Deferred[None]:
        self.store.get(name)
        return self._operate("delete", name, 0).addCallback(lambda _: None)

    def _operate(self, kind: OpKind, name: str, ttl: int) -> defer.Deferred[Channel]:
        expires_at = self.service.now() + ttl
        op = dumps({"op": kind, "ttl": ttl, "expires_at": expires_at})
        p = self.partition(name)
        d = self._append(p, ["o", name, op])

        def done(reply: list[Any]) -> Channel:
            epoch, seq = p.epoch_of(reply), int(reply[1])
            if epoch == p.epoch:  # applied now if next, else its notification brings it
                self.service.follow(p.origin, [_logged_op(seq, 0, name, op)], scoped=True)
            else:
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
        keys: tuple[str, ...] = (p.log, p.meta, p.channels, p.notify)
        keyed: tuple[str, int] = ("", 0)
        if idem is not None:
            keys += (p.key + idem.key,)
            keyed = (idem.fingerprint, self.key_window_ms)
        d = self.shards.evalsha(_PUBLISH_SHA, PUBLISH, keys,
                                (*self._held(p), *keyed, *entries), timeout=self.timeout)
        d.addErrback(_unavailable)
        return d

    def _held(self, p: Partition) -> tuple[str, int, str, int]:
        """The scripts' first arguments: what the log is checked against."""
        held = self.store.horizon_of(p.origin) if p.epoch else 0
        return p.spare, self.maxlen, p.epoch, held

    def stats(self) -> dict[str, Any]:
        return {"engine": self.engine, "peers": [], "redis": {
            "url": ",".join(str(seed) for seed in self.seeds), "up": self.shards.connected,
            "cluster": self.shards.clustered, "primaries": self.shards.primaries(),
            "partitions": len(self.partitions),
            "horizon": sum(self.store.horizon_of(p.origin) for p in self.partitions
                           if p.epoch),
            "lost_epochs": self.lost_epochs}}

    # -- following the logs --------------------------------------------------

    def _notified(self, p: Partition, payload: bytes) -> None:
        """A partition's script appended entries: apply them if they come next
        (else read the log back); during a read back, after it."""
        if p.reading or not p.ready:
            p.waiting.append(payload)
            return
        self._apply(p, payload)

    def _apply(self, p: Partition, payload: bytes) -> None:
        told = _decode_told.decode(payload)
        if told[0] != p.epoch:
            self._read_back(p, f"a notification of epoch {told[0]}")
            return
        origin = p.origin
        run: list[Entry] = []
        for i in range(1, len(told), 5):
            seq, ts, kind, c, d = told[i:i + 5]
            if kind == "m":
                run.append(Message(origin, seq, int(ts), tuple(json.loads(c)), d.encode()))
            else:
                run.append(_logged_op(seq, int(ts), c, d.encode()))
        if isinstance(self.service.follow(origin, run, scoped=True), Hole):
            self._read_back(p, "a notification skipped entries")

    def _read_back(self, p: Partition, why: str = "subscribed") -> None:
        """Check the partition's epoch and read its log past our horizon; the
        notifications that come meanwhile are applied after it."""
        if self.stopped:
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
        reply = yield self.shards.evalsha(_CHECK_SHA, CHECK, (p.log, p.meta), self._held(p),
                                          timeout=self.timeout)
        epoch = p.epoch_of(reply)
        if epoch != p.epoch:
            if p.epoch:
                self._lost_epoch(p, epoch)
            p.epoch = epoch
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
            if not self.stopped:
                if isinstance(result.value, RedisGone | RedisError):
                    log.info("redis {tag}: reading the log failed ({why}); trying again",
                             tag=p.tag, why=result.getErrorMessage())
                else:
                    log.failure("redis {tag}: reading the log failed", result, tag=p.tag)
                self.clock.callLater(RETRY, self._read_back, p, "a read failed")
            return
        if not p.ready:
            p.ready = True
            self._check_loaded()
        for payload in waiting:
            self._apply(p, payload)
        if p.again:
            p.again = False
            self._read_back(p, "notified during a read")
        self._say_gone()

    def _check_loaded(self) -> None:
        if not self.ready and all(p.ready for p in self.partitions):
            self.ready = True
            log.info("redis: loaded {n} partitions' logs ({held} entries); serving",
                     n=len(self.partitions),
                     held=sum(self.store.horizon_of(p.origin) for p in self.partitions))
            self._loaded.callback(None)

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
        raw = yield self.shards.execute(p.channels, "HGETALL", p.channels,
                                        timeout=self.timeout)
        now = self.service.now()
        for name, value in zip(raw[::2], raw[1::2], strict=True):
            op = json.loads(value)
            if op["expires_at"] > now:
                self.service.apply_op(
                    ChannelOp("create", name.decode(), 0, op["ttl"], op["expires_at"]), now)

    def _apply_entries(self, p: Partition, entries: list[Any]) -> None:
        """Log entries read back, in order, into the store: the log is whole,
        so a jump in sequence is history trimmed before we read it (a gap)."""
        run: list[Entry] = []
        origin = p.origin
        held = self.store.horizon_of(origin)
        for ident, fields in entries:
            seq = int(ident[:-2])  # "<seq>-0"
            if seq <= held:  # e.g. our own publish, applied when Redis answered: not parsed
                continue
            f = dict(zip(fields[::2], fields[1::2], strict=True))
            ts = int(f[b"t"])
            if f[b"k"] == b"m":
                run.append(Message(origin, seq, ts, tuple(json.loads(f[b"c"])), f[b"d"]))
            else:
                run.append(_logged_op(seq, ts, f[b"c"].decode(), f[b"d"]))
        self.service.follow(origin, run, trimmed=True, scoped=True)


def _logged_op(seq: int, ts: int, name: str, raw: bytes | str) -> LoggedOp:
    """The log's entry ``seq`` is a channel operation: it carries no message."""
    op = json.loads(raw)
    return LoggedOp(seq, ts, ChannelOp(op["op"], name, seq, op["ttl"], op["expires_at"]))


def _first_error(failure: Failure) -> Failure:
    """A publish over several partitions failed: the first partition's failure."""
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
