"""``--data-dir``: a single node's cache kept on disk, in SQLite (WAL mode).

This module holds the data directory and its channels' file: ``DataDir``
takes the directory's lock, reads a store back at start from
``pushup.sqlite3`` and writes down what the store's ``Changes`` name, all of
one reactor turn in one transaction. ``Durable`` is the single-node
backplane on top of it: a publish or channel operation is acknowledged (its
201 sent) only after the transaction holding it committed. The Durable
Streams' own file beside it, in the directory ``DataDir`` holds locked, is
:mod:`pushup.backplane.disk_streams`'. The store, the service and the hub
never know a data directory exists.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
from collections.abc import Sequence
from typing import IO, Any

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from pushup.backplane import Alone, Unconfirmed
from pushup.core import errors
from pushup.core.changes import NO_CHANGES, Changes
from pushup.core.channels import Channel
from pushup.core.idempotency import Idem, Remembered
from pushup.core.image import ChannelImage, StoreImage
from pushup.core.model import Draft, Message
from pushup.core.service import Service
from pushup.core.store import Store

log = Logger()
SCHEMA_VERSION = 1
# FULL: each commit's WAL frames are fsynced before the 201, so an acknowledged
# publish survives a power cut too, not only a crash of the process (which
# NORMAL would survive). It costs one fsync per reactor turn that changed
# something, however many publishes that turn holds (README, "Data directory").
SYNCHRONOUS = "FULL"
RETRY_WRITE = 1.0  # seconds before writing again after a failed write

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS messages (
    origin TEXT NOT NULL, seq INTEGER NOT NULL, ts INTEGER NOT NULL,
    channels TEXT NOT NULL,  -- JSON list: every channel it was published to
    held TEXT NOT NULL,      -- JSON list: the channels still holding it
    data BLOB NOT NULL,      -- the exact JSON text the publisher's data became
    PRIMARY KEY (origin, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS channels (
    name TEXT PRIMARY KEY, ttl INTEGER NOT NULL, expires_at INTEGER NOT NULL,
    evicted TEXT NOT NULL, evicted_ts INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS keys (  -- keyed publishes (pushup.core.idempotency), in their window
    key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, origin TEXT NOT NULL,
    stamps TEXT NOT NULL,    -- JSON list of [seq, ts]: each message the publish stored
    since INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS origins (
    origin TEXT PRIMARY KEY, horizon INTEGER NOT NULL,
    lost_seq INTEGER, lost_ts INTEGER) WITHOUT ROWID;
"""


class DataDirError(Exception):
    """The data directory cannot be used; the message is one line for the operator."""


class DataDir:
    """An open, locked data directory (one process at a time)."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            os.makedirs(path, exist_ok=True)
            self._lock: IO[str] | None = open(os.path.join(path, "lock"), "a")
        except OSError as e:
            raise DataDirError(f"--data-dir {path}: {e.strerror or e}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            raise DataDirError(f"--data-dir {path} is in use by another pushup process "
                               "(only one may use a data directory)") from None
        file = os.path.join(path, "pushup.sqlite3")
        try:
            self.db = sqlite3.connect(file, isolation_level=None)  # transactions are ours
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute(f"PRAGMA synchronous={SYNCHRONOUS}")
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise DataDirError(f"--data-dir {path} was written by a newer pushup "
                                   f"(schema {version})")
            # Damage anywhere in the file is found now, before the node listens,
            # not when reading it back finds it (quick_check reads every page).
            problem = self.db.execute("PRAGMA quick_check(1)").fetchone()[0]
            if problem != "ok":
                raise sqlite3.DatabaseError(problem)
            self.db.executescript(_SCHEMA)
            self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.Error as e:
            self.close()
            raise DataDirError(_unusable(path, file, e)) from None

    @property
    def node_id(self) -> str | None:
        """The node id this directory was last used with, if any."""
        return self._meta("node_id")

    def begin(self, node_id: str, boot_us: int) -> int:
        """Record that ``node_id`` starts a new origin now; returns its boot
        time (µs), later than any epoch this directory has seen even if the
        clock went back, so the new origin always supersedes the old ones."""
        last = self._meta("epoch_ms")
        boot_ms = max(boot_us // 1000, int(last) + 1 if last else 0)
        try:
            with self.db:
                self.db.execute("BEGIN")
                self._set_meta("node_id", node_id)
                self._set_meta("epoch_ms", str(boot_ms))
        except sqlite3.Error as e:  # a full disk, typically
            raise DataDirError(f"--data-dir {self.path}: {e}") from None
        return boot_ms * 1000 if boot_ms > boot_us // 1000 else boot_us

    def load(self, store: Store, now: int) -> int:
        """Put what the directory holds into an empty store; returns messages read.

        Retention is not applied here: the caller expires what is due now.
        Raises ``DataDirError`` if what it holds cannot be read back.
        """
        try:
            return self._load(store, now)
        except (sqlite3.Error, ValueError, TypeError) as e:
            raise DataDirError(_unusable(self.path, os.path.join(self.path, "pushup.sqlite3"),
                                         e)) from None

    def _load(self, store: Store, now: int) -> int:
        return store.load(self.image(), now)

    def image(self) -> StoreImage:
        """What the directory holds, as a store's image."""
        channels = tuple(
            ChannelImage(name, ttl, expires_at, tuple(json.loads(evicted).items()), evicted_ts)
            for name, ttl, expires_at, evicted, evicted_ts in self.db.execute(
                "SELECT name, ttl, expires_at, evicted, evicted_ts FROM channels"))
        messages = tuple(
            (Message(origin, seq, ts, tuple(json.loads(channels)), bytes(data)),
             tuple(json.loads(held)))
            for origin, seq, ts, channels, held, data in self.db.execute(
                "SELECT origin, seq, ts, channels, held, data FROM messages "
                "ORDER BY ts, origin, seq"))
        horizon, lost = [], []
        for origin, seq, lost_seq, lost_ts in self.db.execute(
                "SELECT origin, horizon, lost_seq, lost_ts FROM origins"):
            horizon.append((origin, seq))
            if lost_seq is not None:
                lost.append((origin, lost_seq, lost_ts))
        keys = tuple(
            Remembered(key, fingerprint, origin,
                       tuple((int(seq), int(ts)) for seq, ts in json.loads(stamps)))
            for key, fingerprint, origin, stamps, _ in self.db.execute(
                "SELECT key, fingerprint, origin, stamps, since FROM keys ORDER BY since"))
        last_ts = self._meta("last_ts")  # our timestamps never go back, across restarts too
        return StoreImage(tuple(horizon), tuple(lost), channels, messages, keys,
                          int(last_ts) if last_ts else 0)

    def write(self, store: Store, changes: Changes) -> None:
        """Write down ``changes`` in one transaction (then clear them); on an
        error nothing is written and the changes are kept for the next try."""
        rows, gone = [], []
        for m in changes.messages.values():
            held = store.holders_of(m)
            if held:
                rows.append((m.origin, m.seq, m.ts, json.dumps(list(m.channels)),
                             json.dumps(held), m.data_json))
            else:
                gone.append((m.origin, m.seq))
        kept, dropped = [], []
        for name in changes.channels:
            c = store.channel(name)
            if c is None:
                dropped.append((name,))
            else:
                kept.append((name, c.ttl, c.expires_at, json.dumps(c.evicted), c.evicted_ts))
        origins = []
        for origin in changes.origins:
            lost = store.lost_of(origin)
            origins.append((origin, store.horizon_of(origin),
                            lost[0] if lost else None, lost[1] if lost else None))
        keys = [(r.key, r.fingerprint, r.origin, json.dumps(r.stamps), r.since)
                for r in changes.keys]
        with self.db:
            self.db.execute("BEGIN")
            if keys:  # with the messages they name: a restart knows both or neither
                self.db.execute("DELETE FROM keys WHERE since <= ?",
                                (store.last_ts - store.keys.window,))
                self.db.executemany("INSERT OR REPLACE INTO keys VALUES (?, ?, ?, ?, ?)", keys)
            self.db.executemany("DELETE FROM messages WHERE origin = ? AND seq = ?", gone)
            self.db.executemany("INSERT OR REPLACE INTO messages VALUES (?, ?, ?, ?, ?, ?)",
                                rows)
            self.db.executemany("DELETE FROM channels WHERE name = ?", dropped)
            self.db.executemany("INSERT OR REPLACE INTO channels VALUES (?, ?, ?, ?, ?)", kept)
            self.db.executemany("INSERT OR REPLACE INTO origins VALUES (?, ?, ?, ?)", origins)
            self._set_meta("last_ts", str(store.last_ts))
        changes.clear()

    def close(self) -> None:
        db = getattr(self, "db", None)
        if db is not None:
            db.close()
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None

    def _meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))


def _unusable(path: str, file: str, e: Exception) -> str:
    """The one line telling the operator why the directory cannot be used."""
    why = " ".join(str(e).split())  # quick_check's report spans lines
    if isinstance(e, sqlite3.OperationalError):  # the disk is full, unreadable...
        return f"--data-dir {path}: {why}"
    return (f"--data-dir {path}: the database is damaged ({why}); move {file} (and its "
            "-wal and -shm files) away to start empty, or restore it from a backup")


class Durable(Alone):
    """One node with a data directory: what it accepts is acknowledged once
    the transaction holding it committed (at the end of the reactor turn)."""

    def __init__(self, service: Service, data: DataDir, clock: Any) -> None:
        super().__init__(service)
        self.data = data
        self.clock = clock
        self.store = service.store
        self.ready = False
        self._waiting: list[defer.Deferred[None]] = []
        self._writing: Any = None  # the clock's delayed call of the next write
        self.changes = Changes(self._schedule)  # what the store changed, not yet written

    def check_ready(self) -> None:
        if not self.ready:
            raise errors.CatchingUp("this node is loading its data directory; retry shortly")

    def start(self) -> defer.Deferred[None]:
        """Load the directory, apply retention as of now, start journaling."""
        now = self.service.now()
        count = self.data.load(self.store, now)
        self.store.journal_to(self.changes)
        self.store.expire(now, busy=lambda name: False)  # what expired while we were down
        self.service.rearm()
        self._write()
        self.ready = True
        log.info("data directory {path}: {n} messages read back, {kept} retained",
                 path=self.data.path, n=count, kept=self.store.message_count)
        return defer.succeed(None)

    def publish(self, drafts: Sequence[Draft], idem: Idem | None = None,
                ) -> defer.Deferred[list[Message]]:
        # A retry (Replayed) waits for the same commit as its first attempt.
        messages = self.service.publish(drafts, idem)

        def not_on_disk(failure: Failure) -> list[Message] | Failure:
            # Stored and delivered, but not durable: 202, as a mesh publish no
            # peer holds (a 5xx would invite a republish, a duplicate).
            if isinstance(failure.value, errors.Unavailable):
                return Unconfirmed(messages)
            return failure

        return self._written().addCallbacks(lambda _: messages, not_on_disk)

    def create_channel(self, name: str | None, ttl: int | None) -> defer.Deferred[Channel]:
        channel = self.service.create_channel(name, ttl)
        return self._written().addCallback(lambda _: channel)

    def renew_channel(self, name: str, ttl: int | None) -> defer.Deferred[Channel]:
        channel = self.service.renew_channel(name, ttl)
        return self._written().addCallback(lambda _: channel)

    def delete_channel(self, name: str) -> defer.Deferred[None]:
        self.service.delete_channel(name)
        return self._written()

    def stop(self, grace: float) -> defer.Deferred[None]:
        if self._writing is not None and self._writing.active():
            self._writing.cancel()
        if self.changes:
            self._write()
        self.store.journal_to(NO_CHANGES)
        self.data.close()
        return defer.succeed(None)

    def _written(self) -> defer.Deferred[None]:
        """Fires once everything changed so far is on disk."""
        if not self.changes:
            return defer.succeed(None)
        d: defer.Deferred[None] = defer.Deferred()
        self._waiting.append(d)
        return d

    def _schedule(self) -> None:
        # The first change of a turn: write everything the turn changes once.
        if self._writing is None:
            self._writing = self.clock.callLater(0, self._write)

    def _write(self) -> None:
        self._writing = None
        changes = self.changes
        waiting, self._waiting = self._waiting, []
        try:
            if changes:
                self.data.write(self.store, changes)
        except sqlite3.Error as e:
            log.error("cannot write to the data directory {path}: {e}", path=self.data.path,
                      e=e)
            self._writing = self.clock.callLater(RETRY_WRITE, self._write)
            for d in waiting:
                d.errback(errors.Unavailable("the node cannot write to its data directory"))
            return
        for d in waiting:
            d.callback(None)
