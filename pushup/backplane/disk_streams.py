"""``--data-dir``: a node's Durable Streams kept on disk, in their own SQLite file.

This module writes each change :mod:`pushup.core.streams` names (a stream's
state, the appends it gained, a stream gone) in one transaction committed,
and fsynced, before the change is answered, and reads every stream back at
start; on the mesh, also where the forks of paths this node owns live
(``placed``); and the Durable Streams subscriptions' state
(``subscription_kept``). It keeps ``streams.sqlite3`` next to the channels' ``pushup.sqlite3``
in the data directory :class:`pushup.backplane.disk.DataDir` holds locked.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Sequence
from typing import Any

from pushup.core import errors
from pushup.core.stream import Stream
from pushup.core.stream_state import entry_of, state_of, stream_of
from pushup.core.stream_values import Entry, Position

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS streams (
    uid TEXT PRIMARY KEY,
    state TEXT NOT NULL) WITHOUT ROWID;  -- JSON: everything but the appends
CREATE TABLE IF NOT EXISTS entries (
    uid TEXT NOT NULL, appends INTEGER NOT NULL, size INTEGER NOT NULL,
    data BLOB NOT NULL,
    lengths TEXT,  -- JSON streams: each message's length in data (each has a comma after)
    PRIMARY KEY (uid, appends)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS placements (  -- the mesh: forks of paths we own, on another node
    path TEXT PRIMARY KEY,
    node TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS subscriptions (  -- Durable Streams subscriptions (protocol §6-7)
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL) WITHOUT ROWID;  -- JSON: pushup.core.subscriptions.state_of
"""


class StreamsFileError(Exception):
    """streams.sqlite3 cannot be used; the message is one line for the operator."""


class StreamsFile:
    """The streams' file in a data directory (a ``core.streams.Journal``)."""

    def __init__(self, data_dir: str) -> None:
        try:
            self.db = sqlite3.connect(os.path.join(data_dir, "streams.sqlite3"),
                                      isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")  # an answered append survives a power cut
            if self.db.execute("PRAGMA user_version").fetchone()[0] > SCHEMA_VERSION:
                raise StreamsFileError(f"--data-dir {data_dir}: streams.sqlite3 was written by a "
                                   "newer pushup")
            problem = self.db.execute("PRAGMA quick_check(1)").fetchone()[0]
            if problem != "ok":
                raise sqlite3.DatabaseError(problem)
            self.db.executescript(_SCHEMA)
            self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.Error as e:
            raise StreamsFileError(f"--data-dir {data_dir}: streams.sqlite3 is damaged or "
                               f"unwritable ({e}); move it (and its -wal and -shm files) "
                               "away to start without streams") from None

    def load(self) -> list[tuple[Stream, bool]]:
        """Every stream kept, each with whether it answers at its path."""
        states = {uid: json.loads(state) for uid, state in
                  self.db.execute("SELECT uid, state FROM streams")}
        streams = {uid: stream_of(uid, state) for uid, state in states.items()}
        for uid, appends, size, data, lengths in self.db.execute(
                "SELECT uid, appends, size, data, lengths FROM entries ORDER BY uid, appends"):
            stream = streams.get(uid)
            if stream is not None:
                stream.add_entry(entry_of(Position(appends, size), bytes(data), lengths))
        for uid, state in states.items():
            source = state["source"]
            if source is not None:
                streams[uid].link_source(streams[source])
        return [(stream, bool(states[uid]["mapped"])) for uid, stream in streams.items()]

    def saved(self, stream: Stream, entries: Sequence[Entry], mapped: bool) -> None:
        """``stream``'s state and ``entries`` kept; the appends its retention
        let go of (below its earliest offset) gone from the file."""
        self._write([
            ("INSERT OR REPLACE INTO streams (uid, state) VALUES (?, ?)",
             (stream.uid, json.dumps(state_of(stream, mapped)))),
            *((("DELETE FROM entries WHERE uid = ? AND size < ?",
                (stream.uid, stream.earliest.size)),) if stream.earliest.size else ()),
            *(("INSERT OR REPLACE INTO entries (uid, appends, size, data, lengths) "
               "VALUES (?, ?, ?, ?, ?)",
               (stream.uid, e.begins.appends, e.begins.size, e.data,
                None if e.messages is None else json.dumps([len(m) for m in e.messages])))
              for e in entries)])

    def placements(self) -> dict[str, str]:
        """Every placement kept: a path this node owns, and the node its fork is on."""
        return dict(self.db.execute("SELECT path, node FROM placements"))

    def placed(self, path: str, node: str | None) -> None:
        """Keep (None: forget) where the stream at ``path`` lives."""
        if node is None:
            self._write([("DELETE FROM placements WHERE path = ?", (path,))])
        else:
            self._write([("INSERT OR REPLACE INTO placements (path, node) VALUES (?, ?)",
                          (path, node))])

    def subscriptions(self) -> dict[str, dict[str, Any]]:
        """Every subscription kept, by id (its state as ``subscription_kept`` had it)."""
        return {sub_id: json.loads(state) for sub_id, state in
                self.db.execute("SELECT id, state FROM subscriptions")}

    def subscription_kept(self, sub_id: str, state: dict[str, object] | None) -> None:
        """Keep a subscription's state (None: it was deleted)."""
        if state is None:
            self._write([("DELETE FROM subscriptions WHERE id = ?", (sub_id,))])
        else:
            self._write([("INSERT OR REPLACE INTO subscriptions (id, state) VALUES (?, ?)",
                          (sub_id, json.dumps(state, separators=(",", ":"))))])

    def dropped(self, stream: Stream) -> None:
        self._write([("DELETE FROM streams WHERE uid = ?", (stream.uid,)),
                     ("DELETE FROM entries WHERE uid = ?", (stream.uid,))])

    def _write(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        """All of ``statements`` or none; 503 when the disk refuses them (the
        change holds in memory until a restart: docs/api.md)."""
        try:
            self.db.execute("BEGIN")
            for sql, args in statements:
                self.db.execute(sql, args)
            self.db.execute("COMMIT")
        except sqlite3.Error as e:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise errors.Unavailable(f"the data directory could not keep it: {e}") from None

    def close(self) -> None:
        self.db.close()
