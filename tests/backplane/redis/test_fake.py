"""The fake Redis (fake.py, fake_partitions.py) against a real redis-server: the
same script calls answer the same (epochs and timestamps aside, which come from
each one's clock) and leave the same log, meta, channels, notes and channels'
own streams. What the
fake answers is what the engine's tests rely on; this keeps it honest."""

from __future__ import annotations

import json
import re
from typing import Any

import hiredis
from twisted.internet.task import Clock

from pushup.backplane.redis.partitions import (
    CHECK,
    CHECK_SHA,
    PUBLISH,
    PUBLISH_SHA,
    READ_CHANNELS,
    READ_CHANNELS_SHA,
)
from tests.backplane.redis.fake import FakeShards
from tests.conftest import START

TAG = "p0"
LOG, META, CHANNELS, FOREIGN, KEY = (f"pushup:{{{TAG}}}:{k}" for k in
                                     ("log", "meta", "channels", "foreign", "key:"))
STAMP = re.compile(rb"^\d{16}$")  # a timestamp in µs


def message(data: int, *channels: str) -> tuple[str, str, str]:
    return ("m", json.dumps(list(channels or ("a",))), json.dumps(data))


def op(kind: str, name: str) -> tuple[str, str, str]:
    return ("o", name, json.dumps({"op": kind, "ttl": 60, "expires_at": 100}))


# (held epoch: "" none, "old" the epoch before, "now" the current; horizon;
#  entries; Idempotency-Key and fingerprint, or None)
CALLS: list[tuple[str, int, list[tuple[str, str, str]], tuple[str, str] | None]] = [
    ("", 0, [message(1), message(2), op("create", "room")], None),
    ("now", 3, [message(3), op("create", "room")], None),  # EXISTS: nothing written
    ("now", 3, [("f", "b", "4"), ("f", "b", "4"), message(5)], None),  # one note only
    ("now", 5, [message(6)], ("k1", "f1")),
    ("now", 6, [message(6)], ("k1", "f1")),  # the same key again: the first answer
    ("now", 6, [message(7)], ("k1", "f2")),  # REUSED
    ("now", 6, [op("delete", "room")], None),
    ("now", 99, [message(8)], None),  # the node read more than the log holds: a new epoch
]


def normal(value: Any, epochs: list[bytes]) -> Any:
    """A reply with each epoch named by its order of appearance and each timestamp T."""
    if isinstance(value, Exception):
        return ("error", str(value).split()[0])
    if isinstance(value, list):
        return [normal(v, epochs) for v in value]
    if isinstance(value, bytes) and STAMP.match(value):
        return "T"
    if isinstance(value, bytes) and value in epochs:
        return f"E{epochs.index(value)}"
    return value


def run_all(call: Any) -> tuple[list[Any], list[bytes]]:
    """Every call of CALLS through ``call(sha, script, keys, args)``; the replies
    and the epochs seen, in order."""
    replies, epochs = [], []
    for held, horizon, entries, keyed in CALLS:
        epoch = {"": b"", "now": epochs[-1] if epochs else b""}[held]
        keys = [LOG, META, CHANNELS, FOREIGN] + ([KEY + keyed[0]] if keyed else [])
        window = (keyed[1], 60_000) if keyed else ("", 0)
        args = [7, 1000, epoch, horizon, *window, 60_000,
                *(x for entry in entries for x in entry)]
        reply = call(PUBLISH_SHA, PUBLISH, keys, args)
        if isinstance(reply, list) and reply[0] not in epochs:
            epochs.append(reply[0])
        replies.append(reply)
    replies.append(call(CHECK_SHA, CHECK, [LOG, META], [9, 1000, epochs[-1], 1]))
    replies.append(call(READ_CHANNELS_SHA, READ_CHANNELS, [LOG, META, CHANNELS, FOREIGN],
                        [9, 1000, epochs[-1], 1, 2, "a", 0, "b", 0, "room", 0]))
    replies.append(call(READ_CHANNELS_SHA, READ_CHANNELS, [LOG, META, CHANNELS, FOREIGN],
                        [9, 1000, epochs[0], 1, 5, "a", 1, "b", 0]))
    return replies, epochs


def test_the_fake_answers_and_writes_as_the_scripts_do(redis_server):
    def real(sha: str, script: str, keys: list[str], args: list[Any]) -> Any:
        try:
            return redis_server.cli("EVAL", script, len(keys), *keys, *args)
        except hiredis.ReplyError as error:
            return error

    clock = Clock()
    clock.advance(START)
    fake = FakeShards(clock)

    def faked(sha: str, script: str, keys: list[str], args: list[Any]) -> Any:
        return fake.outcome(fake.evalsha(sha, script, keys, args))

    real_replies, real_epochs = run_all(real)
    fake_replies, fake_epochs = run_all(faked)
    assert normal(fake_replies, fake_epochs) == normal(real_replies, real_epochs)
    for command in (("XRANGE", LOG, "-", "+"), ("HGETALL", META), ("HGETALL", CHANNELS),
                    ("HGETALL", FOREIGN)):
        held_real = normal(redis_server.cli(*command), real_epochs)
        held_fake = normal(fake.outcome(fake.execute(command[1], *command)), fake_epochs)
        if command[0] == "HGETALL":  # a hash's order is Redis's own
            held_real = sorted(zip(held_real[::2], held_real[1::2], strict=True))
            held_fake = sorted(zip(held_fake[::2], held_fake[1::2], strict=True))
        assert held_fake == held_real, command
