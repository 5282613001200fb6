"""Idempotency keys: which publish a key named, so that a retry stores nothing new.

A publish that carries an ``Idempotency-Key`` is remembered here as a
``Remembered`` record: the key, a fingerprint of the request's body, and the
(sequence, timestamp) its messages got, for the window after its first
message's timestamp. A retry with the same key and body is answered from the
record (the same ids and times); with another body it is refused. Pure values
and one map bounded in records and in bytes; time is a parameter (µs),
nothing here does I/O.

A record's size does not grow with its publish: a publish's messages get
consecutive sequence numbers and timestamps from one origin, so the record
keeps runs of them (first seq, first ts, count), one run for every publish
this code stamps, however many messages it had.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from pushup.core.errors import BadIdempotencyKey, KeyReused
from pushup.core.model import Draft, Message

MAX_KEY = 128  # characters
MAX_KEYS = 100_000  # records a node keeps at most; past it the oldest are forgotten first
MAX_KEY_BYTES = 64 * 1024 * 1024  # ...and their bytes (Remembered.size) at most
DEFAULT_WINDOW = 600.0  # seconds a key is remembered (--idempotency-window)
# What a record costs besides its key's and fingerprint's characters and its
# runs (the record, its strings' headers, its last id, its two map entries),
# and what each run costs: a little over CPython 3.11's measure (~500 and
# ~140; tests/core/test_idempotency.py checks it is not under).
RECORD_BYTES = 450
RUN_BYTES = 140


@dataclass(frozen=True, slots=True)
class Idem:
    """What a publish with an ``Idempotency-Key`` asks: its key and body's fingerprint."""

    key: str
    fingerprint: str


@dataclass(frozen=True, slots=True, init=False)
class Remembered:
    """A keyed publish as it was stored: enough to answer a retry exactly as
    the first attempt was answered (all its messages are of one origin).

    Built from the (seq, ts) of each message, in order; kept as ``runs``."""

    key: str
    fingerprint: str
    origin: str
    runs: tuple[tuple[int, int, int], ...]  # (first seq, first ts, count), consecutive

    def __init__(self, key: str, fingerprint: str, origin: str,
                 stamps: Iterable[tuple[int, int]]) -> None:
        runs: list[tuple[int, int, int]] = []
        for seq, ts in stamps:
            if runs:
                first_seq, first_ts, count = runs[-1]
                if seq == first_seq + count and ts == first_ts + count:
                    runs[-1] = (first_seq, first_ts, count + 1)
                    continue
            runs.append((seq, ts, 1))
        if not runs:
            raise ValueError("a keyed publish stored at least one message")
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "fingerprint", fingerprint)
        object.__setattr__(self, "origin", origin)
        object.__setattr__(self, "runs", tuple(runs))

    @property
    def stamps(self) -> tuple[tuple[int, int], ...]:
        """(seq, ts) of each message, in order (built on each call: its size is
        the publish's; what travels to a peer or to disk)."""
        return tuple(self._stamps())

    def _stamps(self) -> Iterator[tuple[int, int]]:
        for seq, ts, count in self.runs:
            for i in range(count):
                yield seq + i, ts + i

    @property
    def count(self) -> int:
        """Messages the publish stored."""
        return sum(run[2] for run in self.runs)

    @property
    def last_seq(self) -> int:
        """The sequence number of the publish's last message."""
        seq, _, count = self.runs[-1]
        return seq + count - 1

    @property
    def last_id(self) -> str:
        """The id of the publish's last message: the record travels with it."""
        return f"{self.origin}-{self.last_seq}"

    @property
    def since(self) -> int:
        """When the publish was stored (its first message's timestamp, µs)."""
        return self.runs[0][1]

    @property
    def size(self) -> int:
        """Bytes it holds in a node's memory, at most (``Keys.bytes``)."""
        return RECORD_BYTES + len(self.key) + len(self.fingerprint) + RUN_BYTES * len(self.runs)


class Replayed(list[Message]):
    """A publish's messages as a retry is answered: nothing was stored again."""


def check_key(raw: bytes | None) -> str | None:
    """The ``Idempotency-Key`` header's value, None when absent; 400 when it
    is not 1 to ``MAX_KEY`` printable ASCII characters."""
    if raw is None:
        return None
    if not 1 <= len(raw) <= MAX_KEY or any(not 0x20 <= b <= 0x7E for b in raw):
        raise BadIdempotencyKey(f"Idempotency-Key must be 1 to {MAX_KEY} printable ASCII "
                                "characters")
    return raw.decode("ascii")


def fingerprint(drafts: Sequence[Draft], batch: bool) -> str:
    """A digest of what a publish asks to store (its channels, data and form):
    equal for a faithful retry, different for any other body."""
    digest = hashlib.sha256(b"b" if batch else b"s")
    for draft in drafts:
        for name in draft.channels:
            digest.update(b"\x00c" + name.encode())
        digest.update(b"\x00d%d:" % len(draft.data) + draft.data)
    return digest.hexdigest()[:32]


def record_of(idem: Idem, messages: Sequence[Message]) -> Remembered:
    """The record of a keyed publish just stored as ``messages``."""
    return Remembered(idem.key, idem.fingerprint, messages[0].origin,
                      ((m.seq, m.ts) for m in messages))


def replay(record: Remembered, drafts: Sequence[Draft]) -> Replayed:
    """The messages the first attempt stored, rebuilt for the answer to a
    retry (its drafts are the first attempt's: the fingerprints matched)."""
    return Replayed(Message(record.origin, seq, ts, draft.channels, draft.data)
                    for (seq, ts), draft in zip(record._stamps(), drafts, strict=True))


class Keys:
    """The records a node remembers, at most ``most`` of them and ``most_bytes``
    of their ``size``, each for ``window`` µs."""

    def __init__(self, window: int, most: int = MAX_KEYS,
                 most_bytes: int = MAX_KEY_BYTES) -> None:
        self.window = window
        self.most = most
        self.most_bytes = most_bytes
        self.bytes = 0  # the records' sizes, summed
        self._by_key: OrderedDict[str, Remembered] = OrderedDict()  # oldest first
        self._by_last_id: dict[str, Remembered] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def recall(self, idem: Idem, now: int) -> Remembered | None:
        """The record of ``idem.key`` if it is remembered; raises ``KeyReused``
        when that key was used for another body."""
        record = self._by_key.get(idem.key)
        if record is None or self.expired(record, now):
            return None
        if record.fingerprint != idem.fingerprint:
            raise KeyReused("this Idempotency-Key was used for a publish with another body; "
                            "use a new key for a new publish")
        return record

    def remember(self, record: Remembered, now: int) -> bool:
        """Keep ``record`` (a key already held keeps its first record);
        returns whether it is new. Forgets what expired, and the oldest past
        ``most`` records or ``most_bytes``."""
        if self.expired(record, now) or record.key in self._by_key:
            return False
        self._by_key[record.key] = record
        self._by_last_id[record.last_id] = record
        self.bytes += record.size
        by_key = self._by_key
        while by_key:
            oldest = next(iter(by_key.values()))
            if (len(by_key) <= self.most and self.bytes <= self.most_bytes
                    and not self.expired(oldest, now)):
                break
            self._forget(oldest)
        return True

    def ending_at(self, message_id: str) -> Remembered | None:
        """The record of the publish whose last message is ``message_id``."""
        return self._by_last_id.get(message_id)

    def records(self) -> list[Remembered]:
        """Every record kept (some may have expired since), oldest first."""
        return list(self._by_key.values())

    def expired(self, record: Remembered, now: int) -> bool:
        return record.since + self.window <= now

    def _forget(self, record: Remembered) -> None:
        del self._by_key[record.key]
        self._by_last_id.pop(record.last_id, None)
        self.bytes -= record.size
