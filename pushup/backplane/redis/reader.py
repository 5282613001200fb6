"""Reading the partitions' logs: a followed partition's copy in the store is
its log in Redis, in the log's order.

The rule: this node applies each log in order, never skipping and never
twice. A notification is applied if it comes next; otherwise, and whenever
this node cannot be sure it saw everything (once subscribed, at first and
after any reconnection or slot move; after a hole in the sequence; after an
entry of another epoch), the log is read back (``XRANGE``) past what the
store holds. A new epoch means Redis lost what it had acknowledged: the old
origin is marked lost past everything held, so each client behind it gets
``gap: true`` once; a sequence number that jumps in a log read back
(trimmed past a node that was away) is a gap too. This module never decides
which partitions to follow (``interest.py``) and never appends (``publishing.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from pushup.backplane.redis.cluster import Shards
from pushup.backplane.redis.exceptions import RedisError, RedisGone
from pushup.backplane.redis.following import Partition, Step
from pushup.backplane.redis.partitions import CHECK, CHECK_SHA, decode_told, epoch_of
from pushup.backplane.redis.parts import EnginePart
from pushup.core.channels import ChannelOp
from pushup.core.follow import Entry, Hole, LoggedOp, Passed, Skip
from pushup.core.model import Message
from pushup.core.service import Service

log = Logger()
PAGE = 1000  # log entries per XRANGE reply
RETRY = 0.5  # seconds before a partition's failed read is tried again


class LogReader(EnginePart):
    """Keeps each followed partition's copy whole and in order (see the
    module's rule). ``on_abroad(p, name, other)`` is told each time a log
    says that channel ``name`` of ``p`` has messages in partition ``other``."""

    def __init__(self, service: Service, shards: Shards, partitions: Sequence[Partition],
                 clock: Any, *, maxlen: int, timeout: float,
                 on_abroad: Callable[[Partition, str, int], None]) -> None:
        super().__init__(service, shards, partitions, clock, timeout=timeout)
        self.maxlen = maxlen
        self.on_abroad = on_abroad
        self.stopped = False
        self.lost_epochs = 0  # times a log was found to have lost entries we held
        self._gone: list[tuple[str, int]] = []  # (origin, held) found gone, not yet said
        self._retries: dict[int, Any] = {}  # partition index -> its failed read's retry

    def stop(self) -> None:
        """No read starts or is retried from now on (no retry's timer outlives it)."""
        self.stopped = True
        for call in self._retries.values():
            if call.active():
                call.cancel()
        self._retries.clear()

    def held(self, p: Partition) -> tuple[int, int, str, int]:
        """The scripts' first arguments: what the log is checked against."""
        held = self.store.horizon_of(p.origin) if p.epoch and p.ready else 0
        return p.salt, self.maxlen, p.epoch if p.ready else "", held

    def notified(self, p: Partition, payload: bytes) -> None:
        """A partition's script appended entries: apply them if they come next
        (else read the log back); during a read back, after it."""
        if not p.followed:
            return
        if p.reads.running or not p.ready:
            p.waiting.append(payload)
            return
        self._apply(p, payload)

    def read_back(self, p: Partition, why: str = "subscribed") -> None:
        """Check the partition's epoch and read its log past our horizon; the
        notifications that come meanwhile are applied after it. Once read,
        the requests waiting for the partition (``p.when_ready``) go on."""
        if self.stopped or not p.followed:
            return
        if p.ready and not p.reads.running:
            log.debug("redis {tag}: {why}; reading the log back", tag=p.tag, why=why)
        started = p.reads.ask(partial(self._read, p))  # during a read: once more after it
        if started is not None:
            started.addBoth(self._read_done, p)

    def _apply(self, p: Partition, payload: bytes) -> None:
        told = decode_told.decode(payload)
        if told[0] != p.epoch:
            self.read_back(p, f"a notification of epoch {told[0]}")
            return
        run = [self._entry(p, seq, int(ts), kind, c, d)
               for seq, ts, kind, c, d in _fives(told, 1)]
        if isinstance(self.service.follow(p.origin, run, scoped=True), Hole):
            self.read_back(p, "a notification skipped entries")

    def _entry(self, p: Partition, seq: int, ts: int, kind: bytes | str, c: bytes | str,
               d: bytes | str) -> Entry:
        """One log entry as the core takes it (a foreign note is noted here)."""
        kind = kind.decode() if isinstance(kind, bytes) else kind
        c = c.decode() if isinstance(c, bytes) else c
        data = d if isinstance(d, bytes) else d.encode()
        if kind == "m":
            return Message(p.origin, seq, ts, tuple(json.loads(c)), data)
        if kind == "o":
            return logged_op(seq, ts, c, data)
        self._abroad(p, c, int(data))
        return Passed(seq, ts)

    def _abroad(self, p: Partition, name: str, other: int) -> None:
        """Channel ``name`` of ``p`` has messages in partition ``other`` too."""
        p.abroad.setdefault(name, set()).add(other)
        self.on_abroad(p, name, other)

    @defer.inlineCallbacks
    def _read(self, p: Partition) -> Any:
        keys = p.keys
        reply = yield self.shards.evalsha(CHECK_SHA, CHECK, (keys.log, keys.meta),
                                          self.held(p), timeout=self.timeout)
        epoch = epoch_of(reply)
        if epoch != p.epoch or not p.ready:
            if p.epoch and p.ready and epoch != p.epoch:
                self._lost_epoch(p, epoch)
            p.epoch = epoch
            # The store knows the log's epoch even while it holds nothing of
            # it (a cold read of an empty log): a cursor naming an older epoch
            # this node never held is told of the gap (pushup.core.origins).
            self.service.follow(p.origin, [], scoped=True)
            p.abroad = {}  # read again below, as this log has it
            yield self._load_channels(p)
        while True:
            after = self.store.horizon_of(p.origin)
            page = yield self.shards.execute(keys.log, "XRANGE", keys.log, f"({after}-0", "+",
                                             "COUNT", PAGE, timeout=self.timeout)
            if page:
                self._apply_entries(p, page)
            if len(page) < PAGE:
                return

    def _read_done(self, result: Any, p: Partition) -> None:
        waiting, p.waiting = p.waiting, []
        if isinstance(result, Failure):
            if not self.stopped and p.followed:
                if isinstance(result.value, RedisGone | RedisError):
                    log.info("redis {tag}: reading the log failed ({why}); trying again",
                             tag=p.tag, why=result.getErrorMessage())
                else:
                    log.failure("redis {tag}: reading the log failed", result, tag=p.tag)
                if p.index not in self._retries:  # (one armed already reads it again)
                    self._retries[p.index] = self.clock.callLater(RETRY, self._retry, p)
            return
        if not p.followed:  # let go of while it was read
            return
        p.move(Step.READ)
        for payload in waiting:
            self._apply(p, payload)
        if p.reads.take_owed():
            self.read_back(p, "notified during a read")
        else:
            ready, p.when_ready = p.when_ready, []
            for d in ready:
                d.callback(None)
        self._say_gone()

    def _retry(self, p: Partition) -> None:
        self._retries.pop(p.index, None)
        self.read_back(p, "a read failed")

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
        if not self._gone or any(p.reads.running for p in self.partitions):
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
        """The partition's explicit channels, and where its channels have
        messages abroad."""
        keys = p.keys
        raw = yield self.shards.execute(keys.channels, "HGETALL", keys.channels,
                                        timeout=self.timeout)
        now = self.service.now()
        for name, value in zip(raw[::2], raw[1::2], strict=True):
            op = json.loads(value)
            if op["expires_at"] > now:
                self.service.apply_op(
                    ChannelOp("create", name.decode(), 0, op["ttl"], op["expires_at"]), now)
        abroad = yield self.shards.execute(keys.foreign, "HGETALL", keys.foreign,
                                           timeout=self.timeout)
        for name, value in zip(abroad[::2], abroad[1::2], strict=True):
            for other in json.loads(value):
                self._abroad(p, name.decode(), int(other))

    def _apply_entries(self, p: Partition, entries: list[Any]) -> None:
        """Log entries read back, in order, into the store: the log is whole,
        so a jump in sequence is history trimmed before we read it (a gap)."""
        run: list[Entry] = []
        held = self.store.horizon_of(p.origin)
        for ident, fields in entries:
            seq = int(ident[:-2])  # "<seq>-0"
            if seq <= held:  # e.g. our own publish, applied when Redis answered: not parsed
                continue
            f = dict(zip(fields[::2], fields[1::2], strict=True))
            run.append(self._entry(p, seq, int(f[b"t"]), f[b"k"], f[b"c"], f[b"d"]))
        self.service.follow(p.origin, run, trimmed=True, scoped=True)


def _fives(told: list[Any], start: int) -> Iterable[tuple[Any, Any, Any, Any, Any]]:
    """A notification's entries: (seq, t, k, c, d) after its epoch."""
    for i in range(start, len(told), 5):
        yield told[i], told[i + 1], told[i + 2], told[i + 3], told[i + 4]


def logged_op(seq: int, ts: int, name: str, raw: bytes | str) -> LoggedOp:
    """The log's entry ``seq`` is a channel operation: it carries no message."""
    op = json.loads(raw)
    return LoggedOp(seq, ts, ChannelOp(op["op"], name, seq, op["ttl"], op["expires_at"]))
