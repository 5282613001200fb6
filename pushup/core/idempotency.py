"""Idempotency keys: which publish a key named, so that a retry stores nothing new.

A publish that carries an ``Idempotency-Key`` is remembered here as a
``Remembered`` record: the key, a fingerprint of the request's body, and the
(sequence, timestamp) its messages got, for the window after its first
message's timestamp. A retry with the same key and body is answered from the
record (the same ids and times); with another body it is refused. Pure values
and one bounded map; time is a parameter (µs), nothing here does I/O.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from pushup.core.errors import BadIdempotencyKey, KeyReused
from pushup.core.model import Draft, Message

MAX_KEY = 128  # characters
MAX_KEYS = 100_000  # records a node keeps at most; past it the oldest are forgotten first
DEFAULT_WINDOW = 600.0  # seconds a key is remembered (--idempotency-window)


@dataclass(frozen=True, slots=True)
class Idem:
    """What a publish with an ``Idempotency-Key`` asks: its key and body's fingerprint."""

    key: str
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Remembered:
    """A keyed publish as it was stored: enough to answer a retry exactly as
    the first attempt was answered (all its messages are of one origin)."""

    key: str
    fingerprint: str
    origin: str
    stamps: tuple[tuple[int, int], ...]  # (seq, ts) of each message, in order

    @property
    def last_id(self) -> str:
        """The id of the publish's last message: the record travels with it."""
        return f"{self.origin}-{self.stamps[-1][0]}"

    @property
    def since(self) -> int:
        """When the publish was stored (its first message's timestamp, µs)."""
        return self.stamps[0][1]


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
                      tuple((m.seq, m.ts) for m in messages))


def replay(record: Remembered, drafts: Sequence[Draft]) -> Replayed:
    """The messages the first attempt stored, rebuilt for the answer to a
    retry (its drafts are the first attempt's: the fingerprints matched)."""
    return Replayed(Message(record.origin, seq, ts, draft.channels, draft.data)
                    for (seq, ts), draft in zip(record.stamps, drafts, strict=True))


class Keys:
    """The records a node remembers, at most ``most``, each for ``window`` µs."""

    def __init__(self, window: int, most: int = MAX_KEYS) -> None:
        self.window = window
        self.most = most
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
        ``most``."""
        if self.expired(record, now) or record.key in self._by_key:
            return False
        self._by_key[record.key] = record
        self._by_last_id[record.last_id] = record
        by_key = self._by_key
        while by_key:
            oldest = next(iter(by_key.values()))
            if len(by_key) <= self.most and not self.expired(oldest, now):
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
