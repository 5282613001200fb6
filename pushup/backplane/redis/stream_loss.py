"""How a node tells that Redis lost writes of a Durable Stream it cached: pure
functions over the READ script's reply (pushup/backplane/redis/stream_keys.py).

The rule: a cache is Redis's stream only if Redis holds at least as many
appends and, where the cache's last append is, the same one (its position
and its write's mark: random, so never the same for two writes, where a
version number comes back after Redis lost writes and others followed). No
I/O here; pushup/backplane/redis/stream_cache.py acts on the answer.
"""

from __future__ import annotations

import json
from typing import Any

from pushup.core.stream import Stream
from pushup.core.stream_state import entry_of
from pushup.core.stream_values import Entry, Position

# READ's reply: at, uid, version, state, deadline, mark, count, head before, appends...
COUNT, BEFORE, APPENDS = 6, 7, 8


def unpacked(item: bytes) -> tuple[Entry, str | None]:
    """An append as Redis holds it (``streams._packed``) and its write's mark
    (None: written before appends carried one)."""
    head, _, data = item.partition(b"\n")
    appends, size, lengths, *mark = json.loads(head)
    return (entry_of(Position(appends, size), data,
                     None if lengths is None else json.dumps(lengths)),
            mark[0] if mark else None)


def diverged(stream: Stream, last_mark: str | None, reply: list[Any], first: int) -> bool:
    """Whether the cache of ``stream`` (its last append's mark ``last_mark``)
    holds appends Redis does not: ``reply`` is READ's for a changed stream,
    its appends from index ``first``. Fewer there, or another append where
    the cache's last is."""
    if not stream.entries:
        return False
    held = len(stream.entries) + stream.dropped  # Redis lists what retention let go of
    if int(reply[COUNT]) < held:
        return True
    if first == held:
        head = bytes(reply[BEFORE])
    elif first < held:
        head = bytes(reply[APPENDS + held - 1 - first]).partition(b"\n")[0]
    else:
        return False
    if not head:
        return True
    appends, size, _, *mark = json.loads(head)
    theirs = mark[0] if mark else None
    return (Position(appends, size) != stream.entries[-1].begins
            or (theirs is not None and last_mark is not None and theirs != last_mark))


def past(a: Position, b: Position) -> Position:
    """The first position at or past both ``a`` and ``b`` in each count."""
    return Position(max(a.appends, b.appends), max(a.size, b.size))
