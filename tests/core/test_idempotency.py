"""pushup/core/idempotency.py: a keyed publish's record is small whatever the
publish's size, its retry is answered exactly as the first attempt, and the
records a node keeps are bounded in bytes as well as in number."""

from __future__ import annotations

import gc
import tracemalloc
import uuid

from pushup.core.idempotency import Idem, Keys, Remembered, replay
from pushup.core.model import Draft, Origin
from pushup.core.store import Retention, Store

S = 1_000_000
T0 = 1_700_000_000 * S
WINDOW = 600 * S


def store() -> Store:
    # a channel keeps 1,000 messages: the batch is evicted, its record is not
    return Store(Retention(3600 * S, 3600 * S, 1000, 10**9, key_window=WINDOW),
                 Origin("me", T0))


def held_after_publishing(s: Store, drafts: list[Draft], idem: Idem | None) -> int:
    """Bytes the store holds more after publishing ``drafts`` (garbage
    collected before and after: whether a collection ran during the publish
    is no figure of the store's; it moved the difference past 4 KiB once)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        s.publish(drafts, T0, idem)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_the_record_of_a_20000_message_batch_is_one_run_and_a_few_hundred_bytes():
    drafts = [Draft(("a",), b"%d" % i) for i in range(20_000)]
    unkeyed = held_after_publishing(store(), drafts, None)
    s = store()
    idem = Idem("batch-1", "f" * 32)
    keyed = held_after_publishing(s, drafts, idem)
    assert s.message_count == 1000  # the batch is mostly evicted already
    record = s.keys.recall(idem, T0 + S)
    assert record is not None and len(s.keys) == 1
    assert len(record.runs) == 1
    # The key costs its record's few hundred bytes (and, the first, its maps'
    # tables), not the 2.9 MB of 20,000 (seq, ts) pairs it kept for the window.
    assert keyed - unkeyed < 4096, keyed - unkeyed
    assert s.keys.bytes == record.size < 1000


def test_a_retry_is_answered_with_the_first_attempts_messages_exactly():
    s = store()
    drafts = [Draft(("a", "b") if i % 3 else ("a",), b'{"n":%d}' % i) for i in range(20_000)]
    idem = Idem("batch-2", "f" * 32)
    first = s.publish(drafts, T0, idem)
    record = s.keys.recall(idem, T0 + S)
    assert record is not None
    again = replay(record, drafts)
    assert [(m.id, m.ts, m.channels, m.full) for m in again] == \
           [(m.id, m.ts, m.channels, m.full) for m in first]
    assert record.last_id == first[-1].id and record.since == first[0].ts
    assert record.stamps == tuple((m.seq, m.ts) for m in first)  # what a peer or disk gets


def test_stamps_that_are_not_consecutive_are_kept_exactly():
    stamps = ((5, T0), (6, T0 + 1), (9, T0 + 2), (10, T0 + 3), (11, T0 + 9))
    record = Remembered("k", "f", "peer.x", stamps)
    assert record.runs == ((5, T0, 2), (9, T0 + 2, 2), (11, T0 + 9, 1))
    assert record.stamps == stamps and record.last_id == "peer.x-11"


def test_records_are_bounded_in_bytes_the_oldest_forgotten_first():
    one = Remembered("k-0", "f" * 32, "me.x", ((1, T0),)).size
    keys = Keys(WINDOW, most_bytes=3 * one)
    for i in range(5):
        assert keys.remember(Remembered(f"k-{i}", "f" * 32, "me.x", ((i + 1, T0 + i),)), T0 + i)
    assert [r.key for r in keys.records()] == ["k-2", "k-3", "k-4"]
    assert keys.bytes == 3 * one
    assert keys.ending_at("me.x-1") is None and keys.ending_at("me.x-5") is not None


def test_a_records_size_is_not_under_what_it_holds():
    """``size`` is what ``--max-cached-bytes``-like accounting may trust: measured,
    with a UUID key, for records of one run and of ten."""
    for runs in (1, 10):
        keys = Keys(WINDOW, most=10**6, most_bytes=10**12)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(2000):
                keys.remember(Remembered(str(uuid.uuid4()), uuid.uuid4().hex, "me.x",
                                         [(100 * i + 3 * j, T0 + 100 * i + 7 * j)
                                          for j in range(runs)]), T0)
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert len(keys) == 2000
        assert keys.bytes >= held, (runs, keys.bytes / 2000, held / 2000)
