"""The Redis engine's scripts of pushup/backplane/redis/partitions.py as the fake
Redis (fake.py) runs them: ``CHECK`` and ``PUBLISH``, each answering what its
Lua returns (an epoch, then a seq and a timestamp per entry appended, or
"again" for a key used already) and making its writes on the fake's keyspace:
the log, its meta, the channels and foreign hashes, a keyed publish's entry and
the notification (``SPUBLISH``) a follower reads.

``READ_CHANNELS`` answers some channels' own streams, as log_channels.lua
does. The rule: what the scripts do, nothing more (``MAXLEN ~`` trims exactly, a
key's window expires on the fake's clock); the scripts themselves are proved
on a real redis-server (test_scripts.py).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from pushup.backplane.redis.exceptions import reply_error
from pushup.core.model import base36


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

def checked(fake: Any, keys: list[str], argv: list[Any]) -> tuple[str, int]:
    """``_CHECKED``: the log's epoch and last seq, a new epoch if Redis lost it."""
    log, meta_key = keys[0], keys[1]
    salt, held_epoch, horizon = int(argv[0]), _text(argv[2]), int(argv[3])
    meta = fake.data.hashes.get(meta_key, {})
    epoch = _text(meta[b"e"]) if b"e" in meta else None
    seq = int(meta.get(b"s", b"0"))
    if epoch is None or (epoch == held_epoch and seq < horizon):
        n = (fake._now_us() // 1000) * 1296 + salt
        try:
            held = int(held_epoch, 36)
        except ValueError:
            held = None
        if held is not None and n <= held:
            n = held + 1
        epoch, seq = base36(n), 0
        fake.data.streams.pop(log, None)
        meta = fake.data.hashes.setdefault(meta_key, {})
        meta.update({b"e": epoch.encode(), b"s": b"0"})
        meta.setdefault(b"t", b"0")
    return epoch, seq

def check(fake: Any, keys: list[str], argv: list[Any]) -> list[Any]:
    epoch, seq = checked(fake, keys, argv)
    return [epoch.encode(), seq]

def publish(fake: Any, keys: list[str], argv: list[Any]) -> list[Any]:
    epoch, seq = checked(fake, keys, argv)
    log, meta_key, channels, foreign = keys[:4]
    maxlen, fingerprint, window = int(argv[1]), _text(argv[4]), int(argv[5])
    triples = [(_text(argv[i]), _text(argv[i + 1]), _bytes(argv[i + 2]))
               for i in range(7, len(argv), 3)]
    if fingerprint:
        prior = fake.data.strings.get(keys[4])
        if prior is not None:
            first = json.loads(prior)
            if first["e"] == epoch:
                if first["f"] != fingerprint:
                    raise reply_error("REUSED the key was used for another body")
                s, t = int(first["s"]), int(first["t"])
                again: list[Any] = [epoch.encode()]
                for j in range(int(first["n"])):
                    again += [s + j, b"%d" % (t + j)]
                return [*again, b"again"]
    held_channels = fake.data.hashes.get(channels, {})
    for kind, c, d in triples:
        if kind == "o" and json.loads(d)["op"] == "create" and c.encode() in held_channels:
            raise reply_error(f"EXISTS {c}")
    now = fake._now_us()
    meta = fake.data.hashes[meta_key]
    last = int(meta[b"t"])
    out: list[Any] = [epoch.encode()]
    prefix = log[:-3]  # "pushup:{T}:" of "pushup:{T}:log"
    told: list[tuple[str, list[Any]]] = []  # (channel, its entries), in log order
    for kind, c, d in triples:
        if kind == "f":
            notes = fake.data.hashes.setdefault(foreign, {})
            known = json.loads(notes.get(c.encode(), b"[]"))
            if _text(d) in known:
                continue
            notes[c.encode()] = json.dumps([*known, _text(d)]).encode()
        seq += 1
        now = max(now, last + 1)
        last = now
        stream = fake.data.streams.setdefault(log, [])
        stream.append((seq, [b"t", b"%d" % now, b"k", kind.encode(), b"c", c.encode(),
                             b"d", d]))
        del stream[:max(0, len(stream) - maxlen)]  # MAXLEN (exact: '~' trims no less)
        if kind == "o":
            held = fake.data.hashes.setdefault(channels, {})
            if json.loads(d)["op"] == "delete":
                held.pop(c.encode(), None)
            else:
                held[c.encode()] = d
        out += [seq, b"%d" % now]
        if kind == "m":
            fake.appended.append(f"{log.split('{')[1].split('}')[0]}.{epoch}-{seq}")
        for name in (json.loads(c) if kind == "m" else [c]):
            own = fake.data.streams.setdefault(f"{prefix}c:{epoch}:{name}", [])
            prev = own[-1][0] if own else 0
            own.append((seq, [b"t", b"%d" % now, b"k", kind.encode(), b"c", c.encode(),
                              b"d", d, b"p", b"%d" % prev]))
            del own[:max(0, len(own) - maxlen)]
            if not told or told[-1][0] != name:
                told.append((name, [epoch]))
            told[-1][1].extend([seq, str(now), kind, c, _text(d), prev])
    if not told:
        return out
    meta.update({b"s": b"%d" % seq, b"t": b"%d" % last})
    if fingerprint:
        fake.data.strings[keys[4]] = json.dumps(
            {"e": epoch, "f": fingerprint, "s": str(out[1]), "t": _text(out[2]),
             "n": str((len(out) - 1) // 2)}).encode()
        fake.clock.callLater(window / 1000, fake.data.strings.pop, keys[4], None)
    for name, entries in told:
        fake._spublish(f"{prefix}n:{name}", msgspec.msgpack.encode(entries))
    return out


def read_channels(fake: Any, keys: list[str], argv: list[Any]) -> list[Any]:
    """``READ_CHANNELS``: the epoch, the log's end, and per channel its
    explicit entry, its foreign note and its newest entries past a seq."""
    held_epoch = _text(argv[2])
    epoch, seq = checked(fake, keys, argv)
    most = int(argv[4])
    prefix = keys[0][:-3]
    out: list[Any] = [epoch.encode(), seq]
    for i in range(5, len(argv), 2):
        name = _text(argv[i])
        after = 0 if epoch != held_epoch else int(argv[i + 1])
        own = fake.data.streams.get(f"{prefix}c:{epoch}:{name}", [])
        newest = [[b"%d-0" % s, list(f)] for s, f in own if s > after][::-1][:most]
        out.append([fake.data.hashes.get(keys[2], {}).get(name.encode()),
                    fake.data.hashes.get(keys[3], {}).get(name.encode()), newest])
    return out
