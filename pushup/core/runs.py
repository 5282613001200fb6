"""An origin's messages in sequence order: the store's per-channel and per-origin runs.

Messages almost always arrive in sequence order (an origin numbers its own,
peers apply them in order) and leave oldest first, so a run is two parallel
lists with a moving head: adding at the end and dropping the head cost
O(1); anything else falls back to a bisect. ``merge`` reads several runs as
one stream in (timestamp, id) order, each message once. Pure: no clock, no I/O.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator

from pushup.core.model import Message


class Run:
    __slots__ = ("_head", "_items", "_seqs")

    def __init__(self) -> None:
        self._items: list[Message] = []
        self._seqs: list[int] = []
        self._head = 0  # items before it are gone

    def __len__(self) -> int:
        return len(self._items) - self._head

    def __bool__(self) -> bool:
        return len(self._items) > self._head

    def __getitem__(self, i: int) -> Message:
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._items[self._head + i]

    def __iter__(self) -> Iterator[Message]:
        return self.islice(0)

    def add(self, m: Message) -> None:
        """Insert ``m`` in sequence order (at the end, almost always)."""
        seqs = self._seqs
        if len(seqs) == self._head or m.seq > seqs[-1]:
            seqs.append(m.seq)
            self._items.append(m)
            return
        i = bisect_right(seqs, m.seq, self._head)
        seqs.insert(i, m.seq)
        self._items.insert(i, m)

    def remove(self, m: Message) -> None:
        """Take ``m`` out (ValueError if absent); the oldest goes in O(1)."""
        head = self._head
        items = self._items
        # the oldest (eviction's, once per publish to a full channel) without a bisect
        i = head if head < len(items) and items[head] is m else bisect_left(self._seqs, m.seq, head)
        if i == len(items) or items[i] is not m:
            raise ValueError(f"{m.id} is not in this run")
        if i == head:
            self._items[head] = None  # type: ignore[call-overload]  # free it now
            self._head = head + 1
            if self._head * 2 > len(self._items):
                self._compact()
        else:
            del self._items[i]
            del self._seqs[i]

    def bisect_key_left(self, seq: int) -> int:
        return bisect_left(self._seqs, seq, self._head) - self._head

    def bisect_key_right(self, seq: int) -> int:
        return bisect_right(self._seqs, seq, self._head) - self._head

    def first_after(self, ts: int) -> int:
        """Index of the first message with a timestamp after ``ts`` (timestamps
        increase with sequence within an origin)."""
        lo, hi = 0, len(self)
        if hi and self[0].ts > ts:
            return 0
        while lo < hi:
            mid = (lo + hi) // 2
            if self[mid].ts <= ts:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def islice(self, start: int, stop: int | None = None) -> Iterator[Message]:
        """Messages from index ``start`` up to ``stop`` (not while the run changes)."""
        end = len(self._items) if stop is None else min(self._head + stop, len(self._items))
        return map(self._items.__getitem__, range(self._head + start, end))

    def _compact(self) -> None:
        del self._items[: self._head]
        del self._seqs[: self._head]
        self._head = 0


def oldest_head(runs: Iterable[Run]) -> Message | None:
    """The first by (timestamp, id) of the runs' heads (each run holds one at
    least), or None: what retention takes first. Compared field by field, as
    ``min`` by ``Message.sort_key`` would, without a key tuple per head
    (once per message evicted: per publish, once a channel is full)."""
    best: Message | None = None
    for run in runs:
        head = run[0]
        if best is None or head.ts < best.ts or (head.ts == best.ts and head.id < best.id):
            best = head
    return best


class OldestHeads:
    """The oldest by (timestamp, id) of the heads of ``runs`` (an origin's run
    each, none empty), kept as they change: a heap of heads, each checked
    against its run when it comes to the top and dropped there if its run
    has let it go. Whoever changes a run's head says so (:meth:`moved`).
    O(log n) a change instead of a walk of every run per look: a node
    following 1,024 Redis partitions looked once per publish (the sweep's
    next deadline), a third of its CPU per message."""

    __slots__ = ("_heap", "_runs")

    def __init__(self, runs: dict[str, Run]) -> None:
        self._runs = runs
        self._heap: list[tuple[int, str, str]] = []  # (ts, id, origin)

    def moved(self, origin: str) -> None:
        """``origin``'s run has a new head (or none)."""
        run = self._runs.get(origin)
        if run:
            head = run[0]
            heapq.heappush(self._heap, (head.ts, head.id, origin))
        if len(self._heap) > 2 * len(self._runs) + 64:  # heads let go, not yet on top
            self._heap = [(r[0].ts, r[0].id, o) for o, r in self._runs.items() if r]
            heapq.heapify(self._heap)

    def oldest(self) -> Message | None:
        heap = self._heap
        while heap:
            _, ident, origin = heap[0]
            run = self._runs.get(origin)
            if run and run[0].id == ident:
                return run[0]
            heapq.heappop(heap)
        return None


_Head = tuple[int, str, int, Message, Iterator[Message]]  # (ts, id, stream no., msg, rest)


def merge(streams: Iterable[Iterator[Message]], limit: int, until: int | None,
          room: int | None) -> tuple[list[Message], list[Message]]:
    """Read streams each in (timestamp, id) order as one: at most ``limit``
    messages, none after ``until``, at most ``room`` bytes of message JSON
    (but always one if any), a message found in several streams once.

    Returns the messages taken, and the next message of each stream that is
    not exhausted (what a cursor must not claim yet).
    """
    heap: list[_Head] = []
    for stream in streams:
        m = next(stream, None)
        if m is not None:
            heap.append((m.ts, m.id, len(heap), m, stream))
    heapq.heapify(heap)
    out: list[Message] = []
    last_id = ""
    while heap and len(out) < limit:
        ts, ident, k, m, stream = heap[0]
        if until is not None and ts > until:
            break
        if ident != last_id:  # the same message on another channel: once
            if room is not None:
                room -= m.size
                if room < 0 and out:  # at least one message, however large
                    break
            out.append(m)
            last_id = ident
        _advance(heap, k, stream)
    while heap and heap[0][1] == last_id:
        _advance(heap, heap[0][2], heap[0][4])
    return out, [head[3] for head in heap]


def _advance(heap: list[_Head], k: int, stream: Iterator[Message]) -> None:
    nxt = next(stream, None)
    if nxt is None:
        heapq.heappop(heap)
    else:
        heapq.heapreplace(heap, (nxt.ts, nxt.id, k, nxt, stream))
