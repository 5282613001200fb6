"""pushup/core/changes.py: a journal's record of what changed since it last wrote:
keys only, ``on_first`` once per batch of changes (so one write is scheduled per
reactor turn), nothing kept by ``NO_CHANGES``."""

from __future__ import annotations

from pushup.core.changes import NO_CHANGES, Changes
from pushup.core.model import Message


def msg(seq: int) -> Message:
    return Message("n1.a", seq, seq * 10, ("a", "b"), b"1")


def test_the_first_change_after_a_clear_asks_for_one_write():
    writes: list[int] = []
    changes = Changes(on_first=lambda: writes.append(1))
    assert not changes
    changes.channel("a")
    changes.origin("n1.a")
    changes.message(msg(1), ["a"])
    assert writes == [1] and changes
    changes.clear()
    assert not changes
    changes.origin("n1.a")
    assert writes == [1, 1]


def test_each_kind_of_change_is_kept_by_key_the_latest_message_wins():
    changes = Changes(on_first=lambda: None)
    first, again = msg(1), msg(1)  # the same id: the journal reads the live one
    changes.message(first, ["a"])
    changes.message(again, ["b"])
    changes.channel("c")
    changes.origin("n1.a")
    changes.origin("n1.a")
    assert changes.messages == {"n1.a-1": again}
    assert changes.channels == {"a", "b", "c"} and changes.origins == {"n1.a"}
    changes.clear()
    assert (changes.messages, changes.channels, changes.origins, changes.keys) == (
        {}, set(), set(), [])


def test_a_store_without_a_journal_keeps_nothing():
    NO_CHANGES.message(msg(1), ["a"])
    NO_CHANGES.channel("a")
    NO_CHANGES.origin("n1.a")
    assert not NO_CHANGES
    assert (NO_CHANGES.messages, NO_CHANGES.channels, NO_CHANGES.origins) == ({}, set(), set())
