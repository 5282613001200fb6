"""A Durable Stream as kept outside a node's memory (``--data-dir``, the Redis
engine): its state as JSON values, and a stream and its appends made again
from them. Pure functions; the keepers are :mod:`pushup.backplane.disk_streams`
and :mod:`pushup.backplane.redis.streams`.
"""

from __future__ import annotations

import json
from typing import Any

from pushup.core.stream import Stream
from pushup.core.stream_values import Entry, Position, Producer


def state_of(stream: Stream, mapped: bool) -> dict[str, Any]:
    """``stream``'s state but its appends, as JSON values (``--data-dir``, Redis)."""
    return {
        "path": stream.path, "content_type": stream.content_type, "ttl": stream.ttl,
        "expires_at": stream.expires_at, "deadline": stream.deadline,
        "closed": stream.closed, "closed_by": stream.closed_by,
        "source": None if stream.source is None else stream.source.uid,
        "forked_at": [stream.forked_at.appends, stream.forked_at.size],
        "fork_request": stream.fork_request,
        "tail": [stream.tail.appends, stream.tail.size], "forks": stream.forks,
        "deleted": stream.deleted, "mapped": mapped,
        "producers": {name: [p.epoch, p.last_seq] for name, p in stream.producers.items()},
        "writer_seq": stream.writer_seq, "charged": stream.charged,
        "retention": [stream.retention_age, stream.retention_bytes,
                      [stream.earliest.appends, stream.earliest.size],
                      [list(mark) for mark in stream.marks]],
    }


def stream_of(uid: str, state: dict[str, Any]) -> Stream:
    """The stream ``state_of`` gave (no appends yet, no source linked)."""
    closed_by = state["closed_by"]
    fork_request = state["fork_request"]
    return Stream(
        state["path"], uid, state["content_type"], state["ttl"], state["expires_at"],
        state["deadline"], state["closed"],
        None if closed_by is None else (closed_by[0], closed_by[1], closed_by[2]),
        None, Position(*state["forked_at"]),
        None if fork_request is None else (fork_request[0], fork_request[1], fork_request[2]),
        tail=Position(*state["tail"]), forks=state["forks"], deleted=state["deleted"],
        producers={name: Producer(epoch, seq) for name, (epoch, seq)
                   in state["producers"].items()},
        writer_seq=state["writer_seq"], charged=state["charged"],
        **_retention_of(state))


def _retention_of(state: dict[str, Any]) -> dict[str, Any]:
    """A kept state's retention (none in a state kept before retention was)."""
    kept = state.get("retention")
    if kept is None:
        return {}
    age, size, earliest, marks = kept
    return {"retention_age": age, "retention_bytes": size, "earliest": Position(*earliest),
            "marks": [(m[0], m[1], m[2]) for m in marks]}


def entry_of(begins: Position, data: bytes, lengths: str | None) -> Entry:
    """An append as kept: its bytes and, JSON, each message's length (JSON)."""
    if lengths is None:
        return Entry(begins, data)
    messages = []
    at = 0
    for length in json.loads(lengths):
        messages.append(data[at:at + length])
        at += length + 1  # the comma after each
    return Entry(begins, data, tuple(messages))
