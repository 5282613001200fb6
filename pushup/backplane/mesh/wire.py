"""What nodes tell each other: message batches, channel operations, snapshots.

A keyed publish's record (:mod:`pushup.core.idempotency`) travels with its last
message, in the same batch, so a retry on any node that holds the message
finds the key.

Pure encoding and decoding of peer payloads; a snapshot is a store's image
(:mod:`pushup.core.image`) on the wire. A message's data travels as the exact
JSON text its origin accepted, so every node serves byte-identical messages.
A batch is MessagePack, on the replication stream and in a repair's answer
(``pack_batch``: its rows, the data as raw bytes, no escaping; msgspec does
both ends in C, about 5x less CPU per batch than the stdlib's JSON). No
sockets, no clock.

A batch is checked before anything in it is applied, whichever way it came:
what a node stores it serves, so each origin must be one a cursor can name
(:func:`pushup.core.model.parse_origin`), each sequence number one a cursor
can hold, and each message's data JSON; a batch that fails is refused whole
(``BadRequest``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Annotated, Any

import msgspec

from pushup.core.channels import ChannelOp
from pushup.core.errors import BadJSON, BadRequest
from pushup.core.follow import Entry, Skip
from pushup.core.idempotency import Remembered, check_key
from pushup.core.image import ChannelImage, StoreImage
from pushup.core.model import Message, check_channel_name, parse_origin
from pushup.core.store import Store


@dataclass(frozen=True, slots=True)
class Batch:
    """Messages of one origin in sequence order, plus that origin's channel ops.

    ``first`` says the origin holds nothing before ``messages[0]`` any more:
    a receiver that lacks the history before it must skip, not wait.
    """

    origin: str
    first: bool
    messages: tuple[Message, ...]
    ops: tuple[ChannelOp, ...]
    # (seq, ts): the origin holds nothing up to seq any more (no messages
    # follow yet); a receiver behind it skips there and reports the gap.
    skip: tuple[int, int] | None = None
    # The records of the keyed publishes whose last message is in ``messages``.
    keys: tuple[Remembered, ...] = ()


    def entries(self) -> list[Entry]:
        """The batch as the core follows it (``Service.follow``): what the
        origin no longer holds, then its messages in order, each channel
        operation before the first message past its ``at_seq`` and each
        keyed publish's record right after its last message."""
        out: list[Entry] = []
        if self.skip is not None:
            out.append(Skip(*self.skip))
        ops = sorted(self.ops, key=attrgetter("at_seq"))
        records = {record.last_seq: record for record in self.keys}
        i = 0
        for n, m in enumerate(self.messages):
            if n == 0 and self.first:
                out.append(Skip(m.seq - 1, m.ts - 1))
            while i < len(ops) and ops[i].at_seq < m.seq:
                out.append(ops[i])
                i += 1
            out.append(m)
            if m.seq in records:
                out.append(records.pop(m.seq))
        out += ops[i:]
        out += records.values()
        return out


BATCH = 1000  # messages per batch at most
PEER_BODY_LIMIT = 16 * 1024 * 1024  # a peer's frame or request body at most (a batch ~4 MiB)
BATCH_BYTES = 4 * 1024 * 1024  # ... and about this many bytes


def backlog(store: Store, origin: str, after: int, end: tuple[int, int]) -> Batch:
    """What ``store`` holds of ``origin`` past ``after``, as one batch: up to
    ``BATCH`` messages and about ``BATCH_BYTES`` (always one), ``first`` when
    it no longer holds the one right after ``after``. When it holds none but
    the origin went on to ``end`` (seq, ts), everything up to there was
    evicted here: the batch says to ``skip`` to it."""
    messages = store.messages_of(origin, after, BATCH)
    total = 0
    for i, m in enumerate(messages):
        total += m.size
        if total > BATCH_BYTES and i:
            messages = messages[:i]
            break
    if messages:
        keys = tuple(r for m in messages if (r := store.keys.ending_at(m.id)) is not None)
        return Batch(origin, messages[0].seq != after + 1, tuple(messages), (), keys=keys)
    return Batch(origin, False, (), (), skip=end if after < end[0] else None)


# A cursor holds a position of at most 18 digits (pushup.core.cursor): a
# sequence number past it would make every cursor that names it refused.
MAX_SEQ = 10**18 - 1
# Skips a JSON value, checking its syntax, without building it (C; about a
# quarter of a full decode's cost).
_json_value = msgspec.json.Decoder(msgspec.Raw).decode


def check_origin(origin: str) -> str:
    if parse_origin(origin) is None:
        raise BadRequest(f"a peer batch names an origin no cursor can hold: {origin[:80]!r}")
    return origin


def check_data(data: bytes) -> bytes:
    """``data`` if it is one JSON value in UTF-8 (as its origin accepted it)."""
    try:
        _json_value(data)
        data.decode()
    except (msgspec.DecodeError, UnicodeDecodeError):
        raise BadRequest("a peer batch holds a message whose data is not JSON") from None
    return data


def _wire(m: Message) -> list[Any]:
    return [m.seq, m.ts, list(m.channels), m.data_json.decode()]


def _message(origin: str, row: Any) -> Message:
    seq, ts, channels, data = row
    if not (isinstance(seq, int) and isinstance(ts, int) and isinstance(data, str)
            and isinstance(channels, list) and channels and 0 < seq <= MAX_SEQ):
        raise BadRequest("malformed message row")
    names = tuple(check_channel_name(c) for c in channels)
    return Message(check_origin(origin), seq, ts, names, check_data(data.encode()))


_packer = msgspec.msgpack.Encoder()
# The batch's shape is checked by msgspec as it decodes, in C: a message row is
# (seq, ts, channels, data) with at least one channel; channel names, ops and
# keys are checked here.
_Seq = Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]
_Row = tuple[Annotated[int, msgspec.Meta(ge=1, le=MAX_SEQ)], int,
             Annotated[list[str], msgspec.Meta(min_length=1)], bytes]
_unpacker = msgspec.msgpack.Decoder(
    tuple[str, bool, list[_Row], list[Any], tuple[_Seq, int] | None, list[Any]])


def pack_batch(batch: Batch) -> bytes:
    """A batch as it travels (the replication stream, a repair's answer): one
    MessagePack array of its rows, each message's data as bytes."""
    return _packer.encode([
        batch.origin, batch.first,
        [[m.seq, m.ts, m.channels, m.data_json] for m in batch.messages],
        [_wire_op(op) for op in batch.ops],
        batch.skip, [_wire_key(r) for r in batch.keys]])


def unpack_batch(body: bytes) -> Batch:
    """A batch as it travels, checked whole before anything in it is applied."""
    try:
        origin, first, rows, ops, skip, keys = _unpacker.decode(body)
        check_origin(origin)
        messages = tuple([
            Message(origin, seq, ts, tuple([check_channel_name(c) for c in channels]),
                    check_data(data))
            for seq, ts, channels, data in rows])
        return Batch(origin, first, messages, tuple(ops_of(ops)), skip,
                     tuple(_key(origin, row) for row in keys))
    except (msgspec.DecodeError, ValueError, KeyError, TypeError, IndexError) as e:
        raise BadJSON(f"malformed peer batch: {e}") from None


def encode_repair(asker: str, horizon: dict[str, int],
                  want: Sequence[str] | None = None) -> bytes:
    """A repair request: who asks, how far it holds each origin, and (``want``)
    which of those it asks for (when absent: all); an origin it does not
    list at all, it asks for too. Never the asker's own, nor the peer's."""
    raw: dict[str, Any] = {"origin": asker, "horizon": horizon}
    if want is not None:
        raw["want"] = list(want)
    return json.dumps(raw, separators=(",", ":")).encode()


def decode_repair(body: bytes) -> tuple[str, dict[str, int], frozenset[str] | None]:
    try:
        raw = json.loads(body)
        horizon = {str(o): int(seq) for o, seq in raw["horizon"].items()}
        want = raw.get("want")
        wanted = None if want is None else frozenset(str(o) for o in want)
        return str(raw["origin"]), horizon, wanted
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise BadJSON(f"malformed repair request: {e}") from None


def export_snapshot(store: Store) -> bytes:
    """Everything a new node needs to serve like this one (one JSON document)."""
    return encode_snapshot(store.image())


def encode_snapshot(image: StoreImage) -> bytes:
    """A store's image as a snapshot. Messages travel with all their channels
    and this node's last timestamp does not travel (the format predates both)."""
    channels = [{"name": c.name, "ttl": c.ttl, "expires_at": c.expires_at,
                 "evicted": dict(c.evicted), "evicted_ts": c.evicted_ts}
                for c in image.channels]
    messages = [[m.origin, *_wire(m)] for m, _ in image.messages]
    keys = [[r.origin, *_wire_key(r)] for r in image.keys]
    return json.dumps({"horizon": dict(image.horizon),
                       "lost": {o: (seq, ts) for o, seq, ts in image.lost},
                       "channels": channels, "messages": messages, "keys": keys},
                      separators=(",", ":")).encode()


def decode_snapshot(body: bytes) -> StoreImage:
    """A peer's snapshot as an image: each message held by all its channels."""
    raw = json.loads(body)
    channels = tuple(ChannelImage(c["name"], c["ttl"], c["expires_at"],
                                  tuple(dict(c["evicted"]).items()), c["evicted_ts"])
                     for c in raw["channels"])
    messages = []
    for row in raw["messages"]:
        m = _message(row[0], row[1:])
        messages.append((m, m.channels))
    return StoreImage(
        horizon=tuple(raw["horizon"].items()),
        lost=tuple((origin, seq, ts) for origin, (seq, ts) in raw["lost"].items()),
        channels=channels, messages=tuple(messages),
        keys=tuple(_key(row[0], row[1:]) for row in raw.get("keys", ())))


# On the wire a keyed publish's record is [key, fingerprint, [[seq, ts], ...]]
# (its origin is the batch's, or the first item of a snapshot's row).
def _wire_key(record: Remembered) -> list[Any]:
    return [record.key, record.fingerprint, [list(stamp) for stamp in record.stamps]]


def _key(origin: str, row: Any) -> Remembered:
    key, fingerprint, stamps = row
    if not (isinstance(key, str) and isinstance(fingerprint, str) and isinstance(stamps, list)
            and stamps):
        raise BadRequest("malformed idempotency key row")
    check_key(key.encode("ascii"))
    return Remembered(key, fingerprint, origin,
                      tuple((int(seq), int(ts)) for seq, ts in stamps))


def sign(secret: str, method: str, path: str, when: int, body: bytes) -> str:
    """HMAC-SHA256 over what a peer request says; the secret never travels."""
    text = f"{method}\n{path}\n{when}\n".encode() + body
    return hmac.new(secret.encode(), text, hashlib.sha256).hexdigest()


def verify(secret: str, method: str, path: str, when: str, body: bytes, signature: str,
           now_s: float, window: float = 300.0) -> bool:
    try:
        stamp = int(when)
    except ValueError:
        return False
    if abs(now_s - stamp) > window:
        return False
    return hmac.compare_digest(sign(secret, method, path, stamp, body), signature)


# On the wire an op is ["create"|"renew", at_seq, name, ttl, expires_at] or
# ["delete", at_seq, name].
def _wire_op(op: ChannelOp) -> list[Any]:
    if op.kind == "delete":
        return [op.kind, op.at_seq, op.name]
    return [op.kind, op.at_seq, op.name, op.ttl, op.expires_at]


def ops_of(ops: Sequence[Any]) -> list[ChannelOp]:
    """Validated channel operations from a peer."""
    valid: list[ChannelOp] = []
    for op in ops:
        if isinstance(op, list) and op and op[0] in ("create", "renew") and len(op) == 5:
            valid.append(ChannelOp(op[0], check_channel_name(op[2]), int(op[1]), int(op[3]),
                                   int(op[4])))
        elif isinstance(op, list) and op and op[0] == "delete" and len(op) == 3:
            valid.append(ChannelOp("delete", check_channel_name(op[2]), int(op[1])))
        else:
            raise BadRequest(f"unknown channel operation {op!r:.60}")
    return valid
