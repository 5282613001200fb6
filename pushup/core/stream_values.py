"""Durable Streams' values: offsets, appends as stored, what a request asks and
what it is answered, and the checks of every header value.

Values and pure functions only (pushup/core/streams.py holds the streams and
decides).

An offset is ``"<appends>_<bytes>"``, two 16-digit decimals: how many appends
and how many stored bytes lie before the position. Both only grow, so offsets
sort lexicographically, and both are functions of the stream's content alone:
the same position has the same offset wherever it is computed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime

from pushup.core.errors import BadJSON, BadRequest
from pushup.core.model import loads

JSON_TYPE = "application/json"
MAX_SAFE = 2**53 - 1  # the protocol's bound on producer epochs and sequences
_DECIMAL = re.compile(r"0|[1-9][0-9]*")
_OFFSET = re.compile(r"([0-9]{1,19})_([0-9]{1,19})")
_MEDIA_TYPE = re.compile(r"[\w.+-]+/[\w.+-]+")



@dataclass(frozen=True, slots=True)
class Position:
    """A place in a stream: appends and stored bytes before it."""

    appends: int
    size: int

    @property
    def offset(self) -> str:
        return f"{self.appends:016d}_{self.size:016d}"


START = Position(0, 0)


def parse_offset(text: str) -> Position:
    """An offset we issue; 400 otherwise (``-1`` and ``now`` are the caller's)."""
    match = _OFFSET.fullmatch(text)
    if match is None:
        raise BadRequest(f"offset {text[:80]!r} is not an offset this stream issued")
    return Position(int(match[1]), int(match[2]))


def media_type(content_type: str) -> str:
    """The part of a Content-Type two streams' types are compared by."""
    return content_type.split(";", 1)[0].strip().lower()


def is_media_type(content_type: str) -> bool:
    return _MEDIA_TYPE.match(content_type.strip()) is not None


def decimal(text: str, name: str, most: int = MAX_SAFE) -> int:
    """A non-negative decimal without sign, point or leading zero; 400 otherwise."""
    if _DECIMAL.fullmatch(text) is None or int(text) > most:
        raise BadRequest(f"{name} must be a non-negative integer, in decimal, "
                         f"without sign or leading zeros (got {text[:40]!r})")
    return int(text)


def expiry_of(text: str) -> int:
    """An RFC 3339 time as Unix microseconds; 400 otherwise."""
    try:
        when = datetime.fromisoformat(text.strip().replace("z", "Z"))
    except ValueError:
        raise BadRequest(f"Stream-Expires-At {text[:60]!r} is not an RFC 3339 time") from None
    if when.tzinfo is None:
        raise BadRequest("Stream-Expires-At needs a time zone (Z or +hh:mm)")
    return int(when.timestamp() * 1_000_000)


def json_messages(body: bytes, creating: bool) -> list[bytes]:
    """A JSON body's messages: an array is flattened one level; each message
    is kept in compact form. 400 for bad JSON (as strict as /publish's: no
    NaN, bounded nesting) or an empty array on append."""
    value = loads(body)
    values = value if isinstance(value, list) else [value]
    if not values and not creating:
        raise BadRequest("an append of an empty JSON array adds nothing")
    try:
        return [json.dumps(v, separators=(",", ":"), ensure_ascii=False,
                           allow_nan=False).encode() for v in values]
    except RecursionError:
        raise BadJSON("the JSON body is nested too deeply") from None
    except ValueError as e:
        raise BadJSON(f"the body cannot be kept as JSON: {e}") from None


@dataclass(frozen=True, slots=True)
class Entry:
    """One append as stored: its bytes (JSON: its messages, each with a
    trailing comma) and where it begins."""

    begins: Position
    data: bytes
    messages: tuple[bytes, ...] | None = None

    @property
    def ends(self) -> Position:
        return Position(self.begins.appends + 1, self.begins.size + len(self.data))


def make_entry(begins: Position, body: bytes, messages: list[bytes] | None) -> Entry:
    if messages is None:
        return Entry(begins, body)
    return Entry(begins, b"".join(m + b"," for m in messages), tuple(messages))


@dataclass(frozen=True, slots=True)
class Read:
    """What a read returns: ``data`` (JSON streams: the messages), where the
    next read begins, and whether that is the stream's tail."""

    data: bytes
    messages: tuple[bytes, ...] | None
    next: Position
    up_to_date: bool


@dataclass(slots=True)
class Producer:
    epoch: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class Creation:
    """A PUT's values, checked."""

    content_type: str | None  # None: a fork's, inherited
    ttl: int | None
    expires_at: str | None
    closed: bool
    body: bytes
    forked_from: str | None = None
    fork_offset: str | None = None
    fork_sub_offset: int = 0
    retention_age: int | None = None  # seconds an append is kept (at least)
    retention_bytes: int | None = None  # bytes of appends kept (the newest always)


@dataclass(frozen=True, slots=True)
class Append:
    """A POST's values, checked."""

    content_type: str | None
    body: bytes
    close: bool
    writer_seq: str | None = None
    producer: tuple[str, int, int] | None = None  # id, epoch, seq


@dataclass(frozen=True, slots=True)
class Appended:
    """What an append answers: the tail after it, whether the stream is now
    closed, and for a producer whether it was new (200) or a repeat (204)."""

    tail: Position
    closed: bool
    duplicate: bool = False
    producer_seq: int | None = None
