"""The values PushUp passes around: messages, queries and their answers,
channel names, origins.

Everything here is an immutable value or a pure function of its arguments,
except ``Origin``: the one counter, owned by the store, that hands out this
node's sequence numbers and timestamps. Time is always a parameter (integer
microseconds since the Unix epoch), never read from a clock, so the rest of
the core can be tested without one.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Final

import msgspec

from pushup.core.cursor import Cursor
from pushup.core.errors import BadChannelName, BadJSON, BadRequest, TooLarge, TooManyChannels

MAX_CHANNEL_NAME = 200
MAX_TIME_S = 1e11  # year 5138: any time past this is a client's mistake, not a date
# No whitespace (str.isspace covers Unicode spaces), no control characters, no comma.
_BAD_NAME_CHAR = re.compile(r"[\s,\x00-\x1f\x7f-\x9f]")
_NODE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_EPOCH = re.compile(r"[0-9a-z]{1,16}")


def check_channel_name(name: object) -> str:
    """Return ``name`` if it is a valid channel name, else raise BadChannelName."""
    if not isinstance(name, str) or not name:
        raise BadChannelName("a channel name is a non-empty string")
    if len(name) > MAX_CHANNEL_NAME:
        raise BadChannelName(f"a channel name has at most {MAX_CHANNEL_NAME} characters")
    if _BAD_NAME_CHAR.search(name):
        raise BadChannelName(
            f"channel name {name[:40]!r} contains whitespace, a control character or a comma"
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise BadChannelName("a channel name must be valid Unicode") from None
    return name


def check_channel_list(names: object, max_channels: int) -> tuple[str, ...]:
    """Validate a list of channel names; duplicates fold into one, order is kept."""
    if not isinstance(names, list) or not names:
        raise BadRequest("channels must be a non-empty list of channel names")
    unique = tuple(dict.fromkeys(check_channel_name(n) for n in names))
    if len(unique) > max_channels:
        raise TooManyChannels(f"at most {max_channels} channels per request")
    return unique


def check_node_id(node_id: str) -> str:
    if not _NODE_ID.fullmatch(node_id):
        raise ValueError("a node id is 1-64 letters, digits, '_' or '-'")
    return node_id


def parse_origin(name: str) -> tuple[str, int] | None:
    """An origin name's (node id, epoch in ms), or None if it is not one we make."""
    node_id, dot, epoch = name.rpartition(".")
    if not dot or not _NODE_ID.fullmatch(node_id) or not _EPOCH.fullmatch(epoch):
        return None
    return node_id, int(epoch, 36)


def default_node_id(hostname: str, port: int, random_suffix: str) -> str:
    """The node id used when none is configured: the machine's name and the
    port, so a node restarted on the same machine and port keeps its id (and
    its old origin is known as its own, superseded: see ``Store``). With port
    0 there is nothing stable to go by: ``"n" + random_suffix``."""
    if port == 0:
        return "n" + random_suffix
    host = re.sub(r"[^A-Za-z0-9_-]+", "-", hostname).strip("-") or "host"
    suffix = f"-{port}"
    return host[: 61 - len(suffix)] + suffix  # room for a worker's "-63"


def format_time(us: int) -> str:
    """Unix seconds with exactly six decimals: exact, and parses as a float."""
    seconds, fraction = divmod(us, 1_000_000)
    # six digits with their leading zeros: those of 1,000,000 + fraction but
    # its 1 (compiled, a third of formatting with ``:06d``; once per message)
    return str(seconds) + "." + str(fraction + 1_000_000)[1:]


def parse_time(value: str, name: str) -> int:
    """A client-supplied time in seconds → integer microseconds (400 if not finite)."""
    try:
        seconds = float(value)
    except ValueError:
        raise BadRequest(f"{name} must be a number of seconds") from None
    if not math.isfinite(seconds):
        raise BadRequest(f"{name} must be a finite number")
    if abs(seconds) > MAX_TIME_S:
        raise BadRequest(f"{name} is out of range (at most {MAX_TIME_S:.0f} seconds)")
    return round(seconds * 1_000_000)


# msgspec's JSON decoder (C): ~0.5 µs for a small publish body where the stdlib
# takes ~3.5 µs. It accepts exactly what the stdlib did here (strict UTF-8, no
# NaN or Infinity, integers of any size up to the stdlib's 4,300 digits, the
# last of duplicate keys) and the values it gives serialise (encode_data) to the
# same bytes as those the stdlib's decoder gives (tests/core/test_loads.py).
# orjson would not do: it turns an integer past 64 bits into a float.
_decode = msgspec.json.Decoder().decode


def loads(body: bytes) -> object:
    """Parse a request body strictly: UTF-8, no NaN/Infinity, bounded nesting."""
    try:
        return _decode(body)
    except RecursionError:
        raise BadJSON("the JSON body is nested too deeply") from None
    except ValueError as e:  # includes UnicodeDecodeError and msgspec.DecodeError
        raise BadJSON(f"the body is not valid JSON: {e}") from None


def dumps(value: object) -> bytes:
    """Serialise a response value (compact, UTF-8)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def channel_list_json(names: tuple[str, ...]) -> bytes:
    """The JSON list of valid channel names, as ``dumps`` writes it. A valid
    name has no control character, so only a quote or a backslash needs
    escaping; names without either are joined directly (a fifth of the cost,
    once per message on every node that stores it)."""
    if any('"' in name or "\\" in name for name in names):
        return dumps(list(names))
    return ('["' + '","'.join(names) + '"]').encode("utf-8")


# msgspec's JSON encoder (C), built once: ~0.3 µs for a small ``data`` where the
# stdlib's encoder, even built once, took ~2 µs (issue 29), once per published
# message. Compact, non-ASCII written as UTF-8, the same bytes as
# ``json.dumps(data, ensure_ascii=False, separators=(",", ":"))`` but for a
# float's exponent, which is written without ``+`` or leading zeros (``1e100``,
# ``2.5e-7``: the same number; docs/api.md, "Publish").
_encode_data = msgspec.json.Encoder().encode


def encode_data(data: object, max_bytes: int) -> bytes:
    """Serialise a message's ``data`` once; 413 when over ``max_bytes``.

    ``data`` is a value :func:`loads` gave: never a float that is not finite
    (the decoder refuses ``NaN``, ``Infinity`` and ``1e400``; this encoder would
    write ``null`` for one)."""
    try:
        raw = _encode_data(data)
    except RecursionError:
        raise BadJSON("data is nested too deeply") from None
    except ValueError as e:  # UnicodeEncodeError: a lone surrogate
        raise BadJSON(f"data cannot be encoded as JSON: {e}") from None
    if len(raw) > max_bytes:
        raise TooLarge(f"a message's data is {len(raw)} bytes; the limit is {max_bytes}")
    return raw


class Draft:
    """A message as a publisher sent it: validated, not yet given an id.

    A value (its fields are Final), but not a frozen dataclass: one is made per
    message published, and a dataclass's generated ``__init__`` runs
    interpreted even compiled (issue 29), as ``Message``'s."""

    __slots__ = ("channels", "data")

    def __init__(self, channels: tuple[str, ...], data: bytes) -> None:
        self.channels: Final = channels
        self.data: Final = data  # serialised JSON

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Draft):
            return NotImplemented
        return self.channels == other.channels and self.data == other.data

    def __hash__(self) -> int:
        return hash((self.channels, self.data))

    def __repr__(self) -> str:
        return f"Draft(channels={self.channels!r}, data={self.data!r})"


class Message:
    """One published message, stored once however many channels it is on.

    ``seq`` counts up from 1 per origin with no holes; ``ts`` (microseconds)
    strictly increases with ``seq`` within an origin. The message's JSON is
    serialised once, at construction, into ``full``; a response that lists
    only some of its channels splices a new channel list into those bytes.

    A value (its fields are Final; equal only to itself), not a frozen
    dataclass: one is made per message published or applied, and a
    dataclass's generated ``__init__`` runs interpreted even compiled, ~1 µs
    of a publish with its ``object.__setattr__`` per field (issue 29).
    """

    __slots__ = ("_split", "channels", "full", "id", "origin", "seq", "ts")

    def __init__(self, origin: str, seq: int, ts: int, channels: tuple[str, ...],
                 data: bytes) -> None:
        """``data``: the serialised JSON of the publisher's ``data``."""
        ident = f"{origin}-{seq}"
        head = f'{{"id":"{ident}","timestamp":{format_time(ts)},"channels":'.encode()
        listed = channel_list_json(channels)
        self.origin: Final = origin
        self.seq: Final = seq
        self.ts: Final = ts
        self.channels: Final = channels
        self.id: Final = ident
        self.full: Final = head + listed + b',"data":' + data + b"}"
        self._split: Final = (len(head), len(head) + len(listed))

    def __repr__(self) -> str:
        return (f"Message(origin={self.origin!r}, seq={self.seq!r}, ts={self.ts!r}, "
                f"channels={self.channels!r}, id={self.id!r})")

    @property
    def data_json(self) -> bytes:
        """The serialised ``data`` (a slice of ``full``: one copy is stored)."""
        return self.full[self._split[1] + len(b',"data":') : -1]

    @property
    def channels_json(self) -> bytes:
        """The JSON list of all the message's channels (a slice of ``full``)."""
        start, end = self._split
        return self.full[start:end]

    @property
    def size(self) -> int:
        """Bytes this message accounts for in the cache."""
        return len(self.full)

    @property
    def sort_key(self) -> tuple[int, str]:
        return (self.ts, self.id)

    def json_for(self, channels: frozenset[str] | None) -> bytes:
        """The message's JSON listing only those of its channels in ``channels``."""
        if channels is None or channels.issuperset(self.channels):
            return self.full
        start, end = self._split
        listed = channel_list_json(tuple(c for c in self.channels if c in channels))
        return self.full[:start] + listed + self.full[end:]


class Origin:
    """Hands out (seq, ts) for messages accepted on this node.

    An origin is a node id plus a boot epoch (``<node_id>.<boot ms in base
    36>``), so a restarted node never reuses a sequence number, and a newer
    epoch of the same node id supersedes the older ones (:func:`parse_origin`).
    Timestamps never go backwards, even if the wall clock does: each is at
    least one microsecond after the last. Not a value: a counter that only
    its store moves (:meth:`next`, :meth:`resume`).
    """

    def __init__(self, node_id: str, boot_us: int) -> None:
        self.node_id = check_node_id(node_id)
        self.name = f"{node_id}.{base36(boot_us // 1000)}"
        self.epoch = boot_us // 1000
        self.seq = 0
        self.last_ts = 0

    def next(self, now_us: int) -> tuple[int, int]:
        """The (seq, ts) of the next message this node accepts at ``now_us``."""
        self.seq += 1
        self.last_ts = max(now_us, self.last_ts + 1)
        return self.seq, self.last_ts

    def resume(self, last_ts: int) -> None:
        """This node id handed out ``last_ts`` before a restart: never go back past it."""
        self.last_ts = max(self.last_ts, last_ts)


def base36(n: int) -> str:
    """``n`` (>= 0) in base 36, lower case: the epoch part of an origin's name."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


class Now:
    """``since=now``: the current end of the channels, resolved by the service
    to a cursor when the subscribe arrives (so it is valid on every node)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NOW"


NOW = Now()


@dataclass(frozen=True, slots=True)
class Query:
    """What a subscriber asks for; hashable, so equal queries share one answer.

    ``since`` is a cursor (per-origin positions) or a time in microseconds
    (messages strictly after it). ``until`` bounds timestamps from above.
    """

    channels: tuple[str, ...]
    since: Cursor | int | Now
    until: int | None
    limit: int
    max_bytes: int | None = None  # of message JSON in one answer (a cut like ``limit``)

    def wants(self, message: Message) -> bool:
        """Whether ``message`` (on one of our channels) belongs in an answer."""
        if self.until is not None and message.ts > self.until:
            return False
        if isinstance(self.since, Cursor):
            return message.seq > self.since.position(message.origin)
        if isinstance(self.since, Now):
            raise TypeError("resolve since=now before matching")
        return message.ts > self.since


class Result:
    """An answer to a Query: messages in order, the next cursor, a gap flag.

    A value (its fields are Final), but not a frozen dataclass: one is made
    per poll answered or held, and a dataclass's generated ``__init__`` runs
    interpreted even in the compiled core (5 % of a delivery and its
    re-poll, issue 29's profile)."""

    __slots__ = ("cursor", "gap", "messages")

    def __init__(self, messages: tuple[Message, ...], cursor: Cursor, gap: bool) -> None:
        self.messages: Final = messages
        self.cursor: Final = cursor
        self.gap: Final = gap

    def _fields(self) -> tuple[tuple[Message, ...], Cursor, bool]:
        return self.messages, self.cursor, self.gap

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Result):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return f"Result{self._fields()!r}"
