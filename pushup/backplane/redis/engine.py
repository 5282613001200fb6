"""The Redis backplane: one ordered log in Redis; every node tails it.

The rule: Redis's log is the cluster's one order, and a node's cache is a copy
of it. A publish is one script call that appends the whole batch to the log
atomically, giving each message the next sequence number and a timestamp that
never goes backwards; the 201 is sent once Redis answered. Each node reads the
log with one blocking ``XREAD`` on a connection of its own into its store, and
the hub answers held polls from memory: a held poll costs no Redis round trip,
and no node talks to another.

Keys, all in one cluster slot (``{p0}``):

- ``pushup:{p0}:log``: a stream; entry id ``<seq>-0``; fields ``t`` (µs),
  ``k`` (``m`` a message, ``o`` a channel operation), ``c`` (channels JSON,
  or the channel's name), ``d`` (the message's data JSON exactly as accepted,
  or the operation as JSON);
- ``pushup:{p0}:meta``: a hash: ``e`` the log's epoch, ``s`` its last
  sequence number, ``t`` its last timestamp;
- ``pushup:{p0}:channels``: a hash of explicit channels, name → JSON
  ``{"ttl", "expires_at"}``, so they outlive the log's trimming;
- ``pushup:{p0}:key:<Idempotency-Key>``: a keyed publish, JSON ``{"e": the
  log's epoch, "f": the body's fingerprint, "s": its first sequence number,
  "t": its first timestamp, "n": its messages}`` (a batch's messages get
  consecutive sequence numbers and timestamps: the record's size does not
  grow with the batch), expiring after the idempotency window. The publish
  script checks it before it appends, in the same atomic call: a retry, on
  any node, even one sent while the first attempt still waited in Redis's
  socket, stores nothing new.

Cursors keep their format: the origin is the log, ``p0.<epoch>``. A new epoch
means Redis lost what it had acknowledged (restarted empty, or failed over
to a replica that lags): the node then marks the old origin lost past
everything it holds, so each client behind it gets ``gap: true`` once, and
reads the new log from its start. A sequence number that jumps (the log was
trimmed past a node that was away) is a gap too. Never silence, never a
duplicate: a node applies the log strictly in order.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from typing import Any

from twisted.internet import defer, task
from twisted.logger import Logger
from twisted.python.failure import Failure

from pushup.backplane import ChannelOp, OpKind
from pushup.backplane.redis.client import (
    RedisConnection,
    RedisError,
    RedisGone,
    RedisNotSent,
    script_sha,
)
from pushup.config import Config, parse_url
from pushup.core import errors
from pushup.core.channels import Channel, check_ttl
from pushup.core.follow import Entry, LoggedOp, Skip
from pushup.core.idempotency import Idem, Replayed
from pushup.core.model import Draft, Message, base36, check_channel_name, dumps
from pushup.core.service import Service

log = Logger()
PARTITION = "p0"
LOG = f"pushup:{{{PARTITION}}}:log"
META = f"pushup:{{{PARTITION}}}:meta"
CHANNELS = f"pushup:{{{PARTITION}}}:channels"
KEY = f"pushup:{{{PARTITION}}}:key:"  # + the Idempotency-Key
PAGE = 1000  # log entries per XRANGE / XREAD reply
BLOCK_MS = 20_000  # an idle tail asks again this often
COMMAND_TIMEOUT = 2.0  # seconds Redis has to answer a publish or a check
# After a reply of several entries (the log is busy), the tail waits this long
# before it reads again, so it reads in batches: each XREAD round trip costs a
# reading node about as much as applying several entries (measured: ~4 entries
# a reply without it at 3,700 publishes/s). After a reply of one entry (a
# quiet log), it reads again at once: no added latency.
TAIL_LINGER = 0.001


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

# KEYS: log, meta, channels, and for a keyed publish its key's entry. ARGV
# after the four above: the body's fingerprint ("" for no key), the window in
# ms; then per entry: kind ("m" message, "o" operation), c, d. An operation's
# d is {"op": "create"|"renew"|"delete", "ttl", "expires_at"}. Appends every
# entry or none; returns {epoch, seq1, ts1, seq2, ts2, ...}, or an error
# before writing anything if a create names an explicit channel that exists.
# A key already used in this epoch appends nothing: it returns the first
# attempt's reply with "again" at its end, or the error REUSED if that
# attempt had another body.
PUBLISH = _CHECKED + """
if ARGV[5] ~= '' then
  local prior = redis.call('GET', KEYS[4])
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
end
redis.call('HSET', KEYS[2], 's', seq, 't', string.format('%d', last))
if ARGV[5] ~= '' then
  -- the batch's seqs and times are consecutive: its first of each and its count
  -- (as strings: cjson writes numbers with 14 digits, a timestamp has 16)
  redis.call('SET', KEYS[4], cjson.encode({e = epoch, f = ARGV[5],
                                           s = string.format('%d', out[2]), t = out[3],
                                           n = string.format('%d', (#out - 1) / 2)}),
             'PX', ARGV[6])
end
return out
"""
_PUBLISH_SHA = script_sha(PUBLISH)
_CHECK_SHA = script_sha(CHECK)


def new_epoch() -> str:
    """Milliseconds now in base 36, plus randomness: distinct per (re)start."""
    return base36(time.time_ns() // 1_000_000 * 1296 + secrets.randbelow(1296))


class RedisEngine:
    """The backplane over Redis (see the module's rule)."""

    engine = "redis"

    def __init__(self, service: Service, config: Config, reactor: Any) -> None:
        self.service = service
        self.store = service.store
        self.clock = reactor
        self.url = parse_url(config.engine)
        self.maxlen = config.redis_maxlen
        self.timeout = COMMAND_TIMEOUT
        self.key_window_ms = max(1, round(config.idempotency_window * 1000))
        self.commands = RedisConnection(self.url, reactor)
        self.tail = RedisConnection(self.url, reactor, quiet=True)  # commands' log tells
        self.tail.on_connect.append(self._tail_connected)
        self.epoch = ""  # the log's epoch this node holds ("": none yet)
        self._spare_epoch = new_epoch()  # the one to start, should the log need one
        self.ready = False
        self.stopped = False
        self._loaded: defer.Deferred[None] = defer.Deferred()
        self.lost_epochs = 0  # times the log was found to have lost what we held

    @property
    def origin(self) -> str:
        return f"{PARTITION}.{self.epoch}"

    # -- the backplane -------------------------------------------------------

    def check_ready(self) -> None:
        if not self.ready:
            raise errors.CatchingUp("this node is loading the log from Redis; retry shortly")

    def probe(self) -> defer.Deferred[None]:
        """``/health``'s question: both connections up and a PING answered
        within ``COMMAND_TIMEOUT`` (a Redis that is paused holds the TCP
        connection open: only an unanswered command shows it; the timeout
        drops the connection, so later probes fail at once)."""
        if not (self.commands.connected and self.tail.connected):
            return defer.fail(errors.EngineUnavailable(
                "Redis is unreachable: this node cannot take publishes"))

        def unanswered(failure: Failure) -> None:
            if not isinstance(failure.value, (RedisGone, RedisError)):
                failure.raiseException()
            raise errors.EngineUnavailable(
                f"Redis did not answer a PING ({failure.getErrorMessage()}): "
                "this node cannot take publishes")

        d = self.commands.execute("PING", timeout=self.timeout)
        d.addCallbacks(lambda _: None, unanswered)
        return d

    def start(self) -> defer.Deferred[None]:
        self.commands.start()
        self.tail.start()
        return self._loaded

    @defer.inlineCallbacks
    def stop(self, grace: float) -> Any:
        """Nothing to hand on: what was acknowledged is in Redis."""
        self.stopped = True
        yield defer.DeferredList([self.commands.stop(), self.tail.stop()])

    def publish(self, drafts: Sequence[Draft], idem: Idem | None = None,
                ) -> defer.Deferred[list[Message]]:
        entries: list[bytes | str] = []
        for draft in drafts:
            entries += ["m", dumps(list(draft.channels)), draft.data]
        d = self._append(entries, idem)
        d.addCallback(self._published, drafts)
        return d

    def _published(self, reply: list[Any], drafts: Sequence[Draft]) -> list[Message]:
        again = reply[-1] == b"again"  # a retry: the first attempt's entries
        epoch, stamps = self._epoch_of(reply), reply[1:-1] if again else reply[1:]
        origin = f"{PARTITION}.{epoch}"
        messages = [Message(origin, int(stamps[2 * i]), int(stamps[2 * i + 1]), d.channels,
                            d.data) for i, d in enumerate(drafts)]
        if again:
            return Replayed(messages)
        # Our publish, if next in the log, is stored now (the publisher's next
        # poll here sees it); otherwise the tail brings it in order.
        messages = self.service.publish_logged(messages, current=epoch == self.epoch)
        if epoch != self.epoch:
            self._resync(f"a publish found the log at epoch {epoch}")
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
        d = self._append(["o", name, op])

        def done(reply: list[Any]) -> Channel:
            epoch, seq = self._epoch_of(reply), int(reply[1])
            if epoch == self.epoch:  # applied now if next, else the tail brings it
                self.service.follow(self.origin, [self._logged_op(seq, 0, name, op)])
            else:
                self._resync(f"an operation found the log at epoch {epoch}")
            channel = self.store.channel(name)
            if channel is None:  # deleted, or not applied here yet: as the log has it
                channel = Channel(name, ttl, expires_at - ttl)
            return channel

        d.addCallback(done)
        return d

    def _append(self, entries: list[bytes | str], idem: Idem | None = None,
                ) -> defer.Deferred[Any]:
        """Append entries to the log in one script call (all or nothing);
        with ``idem``, once per key within the window."""
        if not self.commands.connected:
            return defer.fail(errors.EngineUnavailable("Redis is unreachable; nothing was "
                                                       "acknowledged"))
        keys: tuple[str, ...] = (LOG, META, CHANNELS)
        keyed: tuple[str, int] = ("", 0)
        if idem is not None:
            keys += (KEY + idem.key,)
            keyed = (idem.fingerprint, self.key_window_ms)
        d = self.commands.evalsha(_PUBLISH_SHA, PUBLISH, keys,
                                  (*self._held(), *keyed, *entries), timeout=self.timeout)
        d.addErrback(_unavailable)
        return d

    def _held(self) -> tuple[str, int, str, int]:
        """The scripts' first arguments: what the log is checked against."""
        held = self.store.horizon_of(self.origin) if self.epoch else 0
        return self._spare_epoch, self.maxlen, self.epoch, held

    def _epoch_of(self, reply: list[Any]) -> str:
        """A script's epoch; once the spare one is taken, make another."""
        epoch: str = reply[0].decode()
        if epoch == self._spare_epoch:
            self._spare_epoch = new_epoch()
        return epoch

    def stats(self) -> dict[str, Any]:
        return {"engine": self.engine, "peers": [], "redis": {
            "url": str(self.url), "up": self.commands.connected and self.tail.connected,
            "origin": self.origin if self.epoch else None,
            "horizon": self.store.horizon_of(self.origin),
            "lost_epochs": self.lost_epochs}}

    # -- the tail ------------------------------------------------------------

    def _tail_connected(self) -> None:
        d = self._follow()
        d.addErrback(self._tail_failed)

    def _tail_failed(self, failure: Failure) -> None:
        if self.stopped:
            return
        if isinstance(failure.value, RedisGone):
            log.debug("redis tail: {why}; resuming after reconnecting",
                     why=failure.getErrorMessage())
        else:
            log.failure("redis tail failed; reconnecting", failure=failure)
        self.tail.drop("the tail failed")

    def _resync(self, why: str) -> None:
        """Check the log's epoch again: reconnect the tail (it checks first)."""
        log.info("redis: {why}; checking the log again", why=why)
        self.tail.drop(why)

    @defer.inlineCallbacks
    def _follow(self) -> Any:
        """Check the epoch, load what we lack, then read the log as it grows."""
        reply = yield self.tail.evalsha(_CHECK_SHA, CHECK, (LOG, META), self._held(),
                                        timeout=self.timeout)
        epoch = self._epoch_of(reply)
        if epoch != self.epoch:
            if self.epoch:
                self._lost_epoch(epoch)
            self.epoch = epoch
            yield self._load_channels()
        yield self._catch_up()
        if not self.ready:
            self.ready = True
            log.info("redis: loaded the log ({origin} up to {seq}); serving",
                     origin=self.origin, seq=self.store.horizon_of(self.origin))
            self._loaded.callback(None)
        while not self.stopped:
            after = self.store.horizon_of(self.origin)
            reply = yield self.tail.execute(
                "XREAD", "COUNT", PAGE, "BLOCK", BLOCK_MS, "STREAMS", LOG, f"{after}-0",
                timeout=BLOCK_MS / 1000 + self.timeout)
            if reply:
                entries = reply[0][1]
                self._apply_entries(entries)
                if 1 < len(entries) < PAGE:
                    yield task.deferLater(self.clock, TAIL_LINGER, lambda: None)

    def _lost_epoch(self, epoch: str) -> None:
        """The log we held is gone: everyone behind its end is told of a gap."""
        self.lost_epochs += 1
        old = self.origin
        held = self.store.horizon_of(old)
        if held == 0:
            # We read nothing of it: a cursor naming it is told of the gap as
            # one naming any origin lost with a restart (pushup.core.origins).
            log.warn("redis: the log {old} is gone; now reading {new}", old=old,
                     new=f"{PARTITION}.{epoch}")
            return
        self.service.follow(old, [Skip(held + 1, self.service.now())])
        log.warn("redis: the log {old} is gone (Redis lost what it held: restarted empty, or "
                 "failed over); now reading {new}; readers behind {old}:{seq} get a gap",
                 old=old, new=f"{PARTITION}.{epoch}", seq=held)

    @defer.inlineCallbacks
    def _load_channels(self) -> Any:
        raw = yield self.tail.execute("HGETALL", CHANNELS, timeout=self.timeout)
        now = self.service.now()
        for name, value in zip(raw[::2], raw[1::2], strict=True):
            op = json.loads(value)
            if op["expires_at"] > now:
                self.service.apply_op(
                    ChannelOp("create", name.decode(), 0, op["ttl"], op["expires_at"]), now)

    @defer.inlineCallbacks
    def _catch_up(self) -> Any:
        """Read what the log holds past our horizon, a page at a time."""
        while True:
            after = self.store.horizon_of(self.origin)
            page = yield self.tail.execute("XRANGE", LOG, f"({after}-0", "+", "COUNT", PAGE,
                                           timeout=self.timeout)
            if page:
                self._apply_entries(page)
            if len(page) < PAGE:
                return

    def _apply_entries(self, entries: list[Any]) -> None:
        """Log entries, in order, into the store: the log is whole, so a jump
        in sequence is history trimmed before we read it (a gap)."""
        run: list[Entry] = []
        held = self.store.horizon_of(self.origin)
        for ident, fields in entries:
            seq = int(ident[:-2])  # "<seq>-0"
            if seq <= held:  # e.g. our own publish, applied when Redis answered: not parsed
                continue
            f = dict(zip(fields[::2], fields[1::2], strict=True))
            ts = int(f[b"t"])
            if f[b"k"] == b"m":
                run.append(Message(self.origin, seq, ts, tuple(json.loads(f[b"c"])), f[b"d"]))
            else:
                run.append(self._logged_op(seq, ts, f[b"c"].decode(), f[b"d"]))
        self.service.follow(self.origin, run, trimmed=True)

    @staticmethod
    def _logged_op(seq: int, ts: int, name: str, raw: bytes) -> LoggedOp:
        """The log's entry ``seq`` is a channel operation: it carries no message."""
        op = json.loads(raw)
        return LoggedOp(seq, ts, ChannelOp(op["op"], name, seq, op["ttl"], op["expires_at"]))


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
