"""Reading the partitions' logs channel by channel: what this node holds of each
channel it follows is that channel's entries in the log, in the log's order.

The rule: this node hears only of the channels it follows (each on its own
sharded channel, all of a partition's on one connection, in the log's order),
so a notification of entry ``seq`` says that nothing before it concerns a
followed channel: the horizon moves up to it (``Quiet``) and the entry is
applied. Whenever this node cannot be sure it saw everything (a channel's
subscription confirmed, at first and after any reconnection or slot move; a
notification whose previous entry of its channel was never seen; an entry of
another epoch), the partition is read back: one script call reads every
confirmed channel's own stream past what this node holds of it, all of one
moment, so the horizon moves to the log's end then. A channel read for the
first time joins behind the horizon (``Service.backfill``); entries of a
channel this node held but missed, or history trimmed before it read it, are
a gap for its readers behind them, never silence. A new epoch means Redis
lost what it had acknowledged: the old origin is marked lost past everything
held, so each client behind it gets ``gap: true`` once. This module never
decides which channels to follow (``interest.py``) and never appends
(``publishing.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from pushup.backplane.links import SaidOnce
from pushup.backplane.redis.cluster import Shards
from pushup.backplane.redis.exceptions import RedisError, RedisGone, RedisNotSent
from pushup.backplane.redis.following import (
    READABLE,
    Follow,
    FollowedChannel,
    Partition,
    Step,
)
from pushup.backplane.redis.partitions import READ_CHANNELS, READ_CHANNELS_SHA, decode_told
from pushup.backplane.redis.parts import EnginePart
from pushup.core.channels import ChannelOp
from pushup.core.follow import Entry, LoggedOp, Passed, Quiet, Skip
from pushup.core.model import Message
from pushup.core.service import Service

log = Logger()
RETRY = 0.5  # seconds before a partition's failed read is tried again


class LogReader(EnginePart):
    """Keeps each followed channel's copy whole and in order (see the module's
    rule). ``on_abroad(p, name, other)`` is told each time a log says that
    channel ``name`` of ``p`` has messages in partition ``other``; ``most`` is
    how many entries of one channel a read brings at most (the store keeps no
    more of a channel)."""

    def __init__(self, service: Service, shards: Shards, partitions: Sequence[Partition],
                 clock: Any, *, maxlen: int, timeout: float, most: int,
                 on_abroad: Callable[[Partition, str, int], None]) -> None:
        super().__init__(service, shards, partitions, clock, timeout=timeout)
        self.maxlen = maxlen
        self.most = most
        self.on_abroad = on_abroad
        self.stopped = False
        self.lost_epochs = 0  # times a log was found to have lost entries we held
        self.missed = 0  # times a notification showed an entry this node never heard of
        self.notified_count = 0  # notifications received (of the channels followed)
        self._gone: list[tuple[str, int]] = []  # (origin, held) found gone, not yet said
        self._retries: dict[int, Any] = {}  # partition index -> its failed read's retry
        self._failing = SaidOnce()  # the last read failure logged (cleared by a read done)

    def stop(self) -> None:
        """No read starts or is retried from now on (no retry's timer outlives it)."""
        self.stopped = True
        for call in self._retries.values():
            if call.active():
                call.cancel()
        self._retries.clear()

    def held(self, p: Partition) -> tuple[int, int, str, int]:
        """The scripts' first arguments: what the log is checked against."""
        held = self.store.horizon_of(p.origin) if p.epoch else 0
        return p.salt, self.maxlen, p.epoch, held

    # -- a channel's subscription --------------------------------------------

    def synced(self, p: Partition, name: str) -> None:
        """Redis confirmed channel ``name``'s subscription: read it (what was
        published before is not held, or may have been missed)."""
        followed = p.channels.get(name)
        if followed is not None:
            followed.move(Step.CONFIRMED)
            self.read_back(p, "subscribed")

    def lost(self, p: Partition, name: str) -> None:
        """Channel ``name``'s subscription went (a connection, a slot move)."""
        followed = p.channels.get(name)
        if followed is not None:
            followed.move(Step.LOST)

    def notified(self, p: Partition, name: str, payload: bytes) -> None:
        """Entries of channel ``name``: applied if the partition is steady and
        the channel held whole; else kept until a read makes it so."""
        self.notified_count += 1
        self._offer(p, name, payload, read=False)

    def _offer(self, p: Partition, name: str, payload: bytes, read: bool) -> None:
        """``notified``'s work, and a kept notification's once a read is done
        (``read``: one was just taken)."""
        followed = p.channels.get(name)
        if followed is None:
            return
        if (p.reads.running or followed.phase is not Follow.READY or followed.missed
                or not p.steady):
            p.waiting.append((name, payload))
            return
        self._apply(p, name, payload, read)

    def read_back(self, p: Partition, why: str = "subscribed") -> None:
        """Read every confirmed channel of the partition past what this node
        holds of it; the notifications that come meanwhile are applied after
        it. Once read, the requests waiting for its channels go on."""
        if self.stopped or not p.followed:
            return
        if p.ready and not p.reads.running and why != "subscribed":
            log.debug("redis {tag}: {why}; reading its channels back", tag=p.tag, why=why)
        started = p.reads.ask(partial(self._read, p))  # during a read: once more after it
        if started is not None:
            started.addBoth(self._read_done, p)

    # -- notifications ---------------------------------------------------------

    def _apply(self, p: Partition, name: str, payload: bytes, read: bool = False) -> None:
        told = decode_told.decode(payload)
        if told[0] != p.epoch:
            self.read_back(p, f"a notification of epoch {told[0]}")
            return
        followed = p.channels[name]
        horizon = self.store.horizon_of(p.origin)
        run: list[Entry] = []
        missed = False
        for seq, ts, kind, c, d, prev in _sixes(told, 1):
            # An entry of it never seen: the one before this (its notification
            # lost), or this one, behind the horizon (it came late).
            if prev > followed.last or horizon >= seq > followed.last:
                missed = True
                break
            if seq <= horizon:  # applied already (through another of its channels)
                continue
            entry = self._entry(p, seq, int(ts), kind, c, d)
            if seq - 1 > horizon:
                run.append(Quiet(seq - 1))
            run.append(entry)
            horizon = seq
            self._saw(p, entry, name, seq)
        if run:
            self.service.follow(p.origin, run, scoped=True)
        if missed and read:
            # Kept during a read that found no such entry: Redis lost it (a
            # replica that lagged, promoted, numbering on from where it was),
            # and no node can serve it; a number it uses again is another entry.
            return
        if missed:  # read it back, then this again (what it applied is passed over)
            followed.missed = True
            self.missed += 1
            p.waiting.append((name, payload))
            self.read_back(p, f"a notification of {name!r} showed an entry never heard of")

    def held_now(self, p: Partition, messages: Iterable[Message]) -> None:
        """This node's own publish, applied as the log stamped it: its followed
        channels hold it (their notification of it is no news)."""
        for m in messages:
            self._saw(p, m, "", m.seq)

    def _saw(self, p: Partition, entry: Entry, name: str, seq: int) -> None:
        """This node holds entry ``seq`` of every channel it concerns that it
        holds whole (one not read yet is read from where its read says)."""
        names: Iterable[str] = entry.channels if isinstance(entry, Message) else (name,)
        for each in names:
            followed = p.channels.get(each)
            if followed is not None and followed.served and seq > followed.last:
                followed.last = seq

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

    # -- reads -----------------------------------------------------------------

    @defer.inlineCallbacks
    def _read(self, p: Partition) -> Any:
        """One script call: the partition's epoch and end, and each confirmed
        channel's entries past what this node holds of it (None: nothing to
        read now, or a channel is adrift and its return reads again)."""
        names = p.readable()
        if not names or not _complete(p, names):
            return None
        # these, as subscribed now: not a later follow's, nor after a loss since
        followed = [(p.channels[name], p.channels[name].moves) for name in names]
        afters = [each.last for each, _ in followed]
        keys = p.keys
        args: list[Any] = [*self.held(p), self.most]
        for name, after in zip(names, afters, strict=True):
            args += [name, after]
        reply = yield self.shards.evalsha(
            READ_CHANNELS_SHA, READ_CHANNELS, (keys.log, keys.meta, keys.channels, keys.foreign),
            args, timeout=self.timeout)
        return names, followed, afters, reply

    def _read_done(self, result: Any, p: Partition) -> None:
        if isinstance(result, Failure):
            if not self.stopped and p.followed:
                if isinstance(result.value, RedisNotSent):
                    pass  # not connected: the connection says so itself, once
                elif isinstance(result.value, RedisGone | RedisError):
                    why = result.getErrorMessage()
                    if self._failing.new(why):  # once, not once a partition and retry
                        log.info("redis: reading channels failed ({why}); trying again every "
                                 "{retry} s", why=why, retry=RETRY)
                else:
                    log.failure("redis {tag}: reading its channels failed", result, tag=p.tag)
                if p.index not in self._retries:  # (one armed already reads it again)
                    self._retries[p.index] = self.clock.callLater(RETRY, self._retry, p)
            return
        # what a read tells of a channel holds only if its subscription did
        # not change meanwhile
        self._failing.clear()
        taken = result is not None and p.followed and _complete(p, [
            name for name, (then, moves) in zip(result[0], result[1], strict=True)
            if _unchanged(p, name, then, moves)])
        if taken:
            self._take(p, *result)
        waiting, p.waiting = p.waiting, []
        for name, payload in waiting:
            self._offer(p, name, payload, read=taken)
        if p.reads.take_owed():
            self.read_back(p, "notified during a read")
        self._answer_waiting(p)
        self._say_gone()

    def _take(self, p: Partition, names: list[str], read: list[tuple[FollowedChannel, int]],
              afters: list[int], reply: list[Any]) -> None:
        """A read's reply: new channels join behind the horizon, what lies past
        it is applied in the log's order, and the horizon moves to the log's end."""
        epoch, end = reply[0].decode(), int(reply[1])
        fresh = epoch != p.epoch
        if fresh:
            if p.epoch:
                self._lost_epoch(p, epoch)
            p.epoch = epoch
            # The store knows the log's epoch even while it holds nothing of
            # it (a cold read of an empty log): a cursor naming an older epoch
            # this node never held is told of the gap (pushup.core.origins).
            self.service.follow(p.origin, [], scoped=True)
            p.abroad = {}
            for each in p.channels.values():
                each.last = 0
        origin = p.origin
        horizon = self.store.horizon_of(origin)
        later: dict[int, Entry] = {}
        now = self.service.now()
        for name, was, after, (explicit, foreign, entries) in zip(names, read, afters,
                                                                   reply[2:], strict=True):
            followed = p.channels[name] if name in p.channels else None
            if followed is None or not _unchanged(p, name, *was):
                continue  # let go of, or its subscription lost, while it was read
            # new here: no reader of it can hold a cursor past what is read
            new = fresh or followed.phase is Follow.SUBSCRIBED and not followed.holds_back
            if explicit is not None and new:
                op = json.loads(explicit)
                if op["expires_at"] > now:
                    self.service.apply_op(
                        ChannelOp("create", name, 0, op["ttl"], op["expires_at"]), now)
            if foreign is not None:
                for other in json.loads(foreign):
                    self._abroad(p, name, int(other))
            behind = self._sort(p, name, 0 if fresh else after, horizon, entries, later)
            if behind and self.service.backfill(origin, behind, (name,)) and not new:
                # entries this node lacked, behind what its readers may have read
                self.store.mark_gap(name, origin, horizon, behind[-1].ts, now)
            followed.missed = False
            followed.holds_back = False
            followed.last = max(followed.last, end)  # held whole up to the log's end
            if followed.phase in READABLE:  # (not if its subscription went meanwhile)
                followed.move(Step.READ)
        run: list[Entry] = []
        at = horizon
        for seq in sorted(later):
            if seq - 1 > at:
                run.append(Quiet(seq - 1))
            run.append(later[seq])
            at = seq
        if end > at:
            run.append(Quiet(end))
        self.service.follow(origin, run, scoped=True)

    def _sort(self, p: Partition, name: str, after: int, horizon: int,
              entries: list[Any], later: dict[int, Entry]) -> list[Message]:
        """One channel's entries read (newest first): its messages at or behind
        the horizon are returned, the entries past it go into ``later``; a
        first entry whose previous one is past ``after`` was trimmed or is
        older than a read brings: a gap for its readers behind it."""
        behind: list[Message] = []
        followed = p.channels[name]
        for i, (ident, fields) in enumerate(reversed(entries)):
            seq = int(ident[:-2])  # "<seq>-0"
            f = dict(zip(fields[::2], fields[1::2], strict=True))
            ts = int(f[b"t"])
            if i == 0 and int(f[b"p"]) > after:
                self.store.mark_gap(name, p.origin, int(f[b"p"]), ts - 1, self.service.now())
            followed.last = max(followed.last, seq)
            if seq in later:
                continue  # a message of several channels, read with another
            if seq <= horizon:
                if f[b"k"] == b"m":
                    m = self._entry(p, seq, ts, b"m", f[b"c"], f[b"d"])
                    assert isinstance(m, Message)
                    behind.append(m)
                elif f[b"k"] == b"o" and json.loads(f[b"d"])["op"] == "delete":
                    behind = []  # what came before its deletion is not served
                continue
            later[seq] = self._entry(p, seq, ts, f[b"k"], f[b"c"], f[b"d"])
        return behind

    def _answer_waiting(self, p: Partition) -> None:
        """The requests waiting for channels of ``p`` that it now serves go on."""
        if not p.when_ready:
            return
        still: list[tuple[Any, tuple[str, ...]]] = []
        for d, names in p.when_ready:
            if all(p.serves(name) for name in names):
                d.callback(None)
            else:
                still.append((d, names))
        p.when_ready = still

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


def _unchanged(p: Partition, name: str, then: FollowedChannel, moves: int) -> bool:
    """Channel ``name`` is still followed as ``then``, its subscription as it was."""
    return p.channels.get(name) is then and then.moves == moves


def _complete(p: Partition, names: Iterable[str]) -> bool:
    """Whether a read of ``names`` makes the partition whole: none of its
    channels adrift, and every one unsure or holding it back among them."""
    read = set(names)
    for name, followed in p.channels.items():
        if followed.phase is Follow.ADRIFT:
            return False
        if name not in read and (followed.phase is Follow.REJOINED or followed.holds_back
                                 and followed.phase is not Follow.READY):
            return False
    return True


def _sixes(told: list[Any], start: int) -> Iterable[tuple[Any, Any, Any, Any, Any, int]]:
    """A notification's entries: (seq, t, k, c, d, p) after its epoch."""
    for i in range(start, len(told), 6):
        yield told[i], told[i + 1], told[i + 2], told[i + 3], told[i + 4], told[i + 5]


def logged_op(seq: int, ts: int, name: str, raw: bytes | str) -> LoggedOp:
    """The log's entry ``seq`` is a channel operation: it carries no message."""
    op = json.loads(raw)
    return LoggedOp(seq, ts, ChannelOp(op["op"], name, seq, op["ttl"], op["expires_at"]))
