"""What a Durable Stream is charged against ``Streams.budget`` (``--max-cached-bytes``):
the bytes CPython holds for it, its state, its appends and its producers.

Pure functions of a stream's values; :mod:`pushup.core.streams` charges them.
"""

from __future__ import annotations

from collections.abc import Sequence

from pushup.core.stream import Stream

# What ``Streams.budget`` charges: what CPython holds, estimated from
# tracemalloc's count (3.11, the interpreted core; the compiled one holds
# less) and rounded up, so the streams never hold more than the budget.
# A stream's state (the Stream, its lists, id, map slot, a first producer's
# dict: ~660 measured), besides its strings (``stream_cost``):
STREAM_OVERHEAD = 768
# an append's Entry, offsets, index slot, its bytes' header and a JSON
# append's tuple (~175; ~220), besides its bytes (``append_cost``):
ENTRY_OVERHEAD = 256
# each message of a JSON append, held again as its own bytes: their header
# and tuple slot (41), besides the message's bytes:
MESSAGE_OVERHEAD = 48
# each producer a stream has seen, besides its id (~140):
PRODUCER_OVERHEAD = 160


def stream_cost(stream: Stream) -> int:
    """What ``stream`` is charged besides its appends and producers: its
    state and the strings it keeps (its path, Content-Type and
    Stream-Expires-At; a fork, its source's path as asked)."""
    source = "" if stream.fork_request is None else stream.fork_request[0]
    return (STREAM_OVERHEAD + len(stream.path) + len(stream.content_type)
            + len(stream.expires_at or "") + len(source))


def append_cost(data: bytes, messages: Sequence[bytes] | None) -> int:
    """What an append is charged: its bytes, or a JSON append's messages held
    twice (joined, each with its comma, and each on its own), and what
    keeping it costs besides (``ENTRY_OVERHEAD``, ``MESSAGE_OVERHEAD``)."""
    if messages is None:
        return ENTRY_OVERHEAD + len(data)
    return ENTRY_OVERHEAD + sum(2 * len(m) + 1 + MESSAGE_OVERHEAD for m in messages)
