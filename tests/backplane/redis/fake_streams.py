"""The Durable Streams scripts of pushup/backplane/redis/stream_keys.py as the
fake Redis (fake.py) runs them: ``READ``, ``WRITE``, ``POINT``, ``UNPOINT`` and
``TOUCH``, each answering what its Lua returns and making its writes on the
fake's keyspace, the notices ``WRITE`` sends included.

The rule: the scripts' reads and writes, nothing more; key expiry (``PEXPIREAT``,
``PERSIST``) is not modelled, so a test of expiry in Redis belongs on a real
redis-server (test_shared_streams.py), as do the scripts themselves.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pushup.backplane.redis.stream_keys import (
    GONE,
    POINT_SHA,
    READ_SHA,
    TOUCH_SHA,
    UNPOINT_SHA,
    WRITE_SHA,
)

Script = Callable[[Any, list[str], list[Any]], Any]  # (fake, KEYS, ARGV) -> reply


def _b(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).encode()


def _t(value: Any) -> str:
    return _b(value).decode()


def read(fake: Any, keys: list[str], argv: list[Any]) -> list[Any]:
    data = fake.data
    at = data.strings.get(keys[0], b"")
    home, uid = _t(argv[0]), _t(argv[1])
    if uid == "":
        if b"/" in at:
            return [at]
        uid = at.decode()
    if uid == "":
        return [at]
    m = home + uid
    meta = data.hashes.get(m + ":m", {})
    if b"v" not in meta:
        return [at]
    first = int(_t(argv[3]) or 0) if uid == _t(argv[2]) else 0
    held = (uid == _t(argv[2]) and meta[b"v"] == _b(argv[4])
            and meta.get(b"w", b"") == _b(argv[5]))
    state = b"" if held else meta.get(b"state", b"")
    appends = data.lists.get(m + ":l", [])
    before = b""
    if not held and 0 < first <= len(appends):
        item = appends[first - 1]
        before = item[:item.find(b"\n")] if b"\n" in item else b""
    return [at, uid.encode(), meta[b"v"], state, meta.get(b"deadline", b""),
            meta.get(b"w", b""), len(appends), before, *appends[first:]]


def write(fake: Any, keys: list[str], argv: list[Any]) -> list[Any]:
    data = fake.data
    changes = json.loads(argv[0])
    for i, c in enumerate(changes, 1):
        meta = data.hashes.get(c["p"] + c["u"] + ":m", {})
        if int(meta.get(b"v", b"0")) != c["v"]:
            return [0, i]
        if c["map"] == 1 and data.strings.get(c["k"], b"") != _b(c["at"]):
            return [0, i]
        if c["drop"] == 1 and c["now"] != "":
            deadline = meta.get(b"deadline")
            if deadline is not None and int(deadline) > int(c["now"]):
                return [0, i]
    arg = 1
    for c in changes:
        m = c["p"] + c["u"]
        if c["drop"] == 1:
            data.hashes.pop(m + ":m", None)
            data.lists.pop(m + ":l", None)
        else:
            meta = data.hashes.setdefault(m + ":m", {})
            meta.update({b"v": _b(c["v"] + 1), b"state": _b(c["s"]), b"w": _b(c["w"])})
            if c["d"] != "" and (b"deadline" not in meta
                                 or int(meta[b"deadline"]) < int(_t(c["d"]))):
                meta[b"deadline"] = _b(c["d"])
            items = data.lists.setdefault(m + ":l", [])
            blanked = int(meta.get(b"b", b"0"))
            for i in range(blanked, min(c.get("t", 0), len(items))):  # retention let go of them
                items[i] = items[i].partition(b"\n")[0] + b"\n"
            if c.get("t", 0) > blanked:
                meta[b"b"] = _b(c["t"])
            items.extend(_b(a) for a in argv[arg:arg + c["n"]])
            arg += c["n"]
        if c["map"] == 1:
            data.strings[c["k"]] = _b(c["u"])
        elif c["map"] == 0 and c["k"] != "" and data.strings.get(c["k"]) == _b(c["u"]):
            del data.strings[c["k"]]
        fake._spublish(c["ch"], _b((GONE if c["drop"] == 1 else "") + c["u"]))
    return [1]


def point(fake: Any, keys: list[str], argv: list[Any]) -> int:
    if fake.data.strings.get(keys[0], b"") != _b(argv[0]):
        return 0
    fake.data.strings[keys[0]] = _b(argv[1])
    return 1


def unpoint(fake: Any, keys: list[str], argv: list[Any]) -> int:
    if fake.data.strings.get(keys[0]) == _b(argv[0]):
        del fake.data.strings[keys[0]]
    return 1


def touch(fake: Any, keys: list[str], argv: list[Any]) -> int:
    meta = fake.data.hashes.get(_t(argv[0]) + _t(argv[1]) + ":m")
    if meta is not None and (b"deadline" not in meta
                             or int(meta[b"deadline"]) < int(_t(argv[2]))):
        meta[b"deadline"] = _b(argv[2])
    return 1


SCRIPTS: dict[str, tuple[str, Script]] = {
    READ_SHA: ("READ", read), WRITE_SHA: ("WRITE", write), POINT_SHA: ("POINT", point),
    UNPOINT_SHA: ("UNPOINT", unpoint), TOUCH_SHA: ("TOUCH", touch)}
