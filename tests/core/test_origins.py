"""pushup/core/origins.py: horizons and losses only move forward; a newer epoch of a
node makes its older origins forgotten (history lost with a restart) or retired (they
hold nothing), and the cursors a store hands out name neither, nor more than
``MAX_ORIGINS`` origins."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pushup.core.cursor import MAX_ORIGINS, Cursor
from pushup.core.origins import READ_THROUGH, Origins

OLD, NEW = "n1.a", "n1.b"  # one node id, epochs 10 and 11 (base 36)
OTHER = "n2.a"


def origins(*held: str) -> Origins:
    """Origins of a store that caches messages of ``held`` only."""
    return Origins(holds=lambda origin: origin in held)


def test_a_horizon_starts_at_0_and_only_moves_forward():
    o = origins()
    assert o.horizon_of(OLD) == 0
    o.raise_horizon(OLD, 5)
    o.raise_horizon(OLD, 3)
    assert o.horizon_of(OLD) == 5
    o.raise_horizon(OTHER, 1)
    assert o.horizons() == {OLD: 5, OTHER: 1}
    o.horizons()[OLD] = 99  # a copy
    assert o.horizon_of(OLD) == 5


def test_passing_over_a_sequence_number_is_strictly_in_order():
    o = origins()
    o.pass_over(OLD, 1)
    o.pass_over(OLD, 2)
    o.pass_over(OLD, 2)  # already past: nothing
    assert o.horizon_of(OLD) == 2
    with pytest.raises(ValueError, match="expected seq 3, got 4"):
        o.pass_over(OLD, 4)
    assert o.horizon_of(OLD) == 2


def test_history_lost_everywhere_moves_the_horizon_and_is_remembered_once_ahead():
    o = origins()
    o.skip_to(OLD, 7, 700)
    assert o.horizon_of(OLD) == 7 and o.lost_of(OLD) == (7, 700)
    o.skip_to(OLD, 4, 400)  # behind the horizon: nothing
    assert o.lost_of(OLD) == (7, 700)
    assert o.lost_of(OTHER) is None


def test_a_reader_behind_lost_history_is_told_by_position_or_by_time():
    o = origins()
    o.skip_to(OLD, 7, 700)
    behind, past = Cursor.of({OLD: 6}), Cursor.of({OLD: 7})
    assert o.behind_lost(behind, behind.position)
    assert not o.behind_lost(past, past.position)
    assert o.behind_lost(699, None) and not o.behind_lost(700, None)


def test_restore_reads_back_every_origin_but_the_one_kept():
    o = origins()
    o.raise_horizon(NEW, 2)
    o.restore([(OLD, 4), (NEW, 9), (OTHER, 3)], [(OTHER, 3, 30)], keep=NEW)
    assert o.horizons() == {NEW: 2, OLD: 4, OTHER: 3}
    assert o.lost_of(OTHER) == (3, 30)


def test_a_newer_epoch_forgets_the_older_ones_history_the_store_does_not_hold():
    o = origins()
    o.raise_horizon(NEW, 1)
    assert o.forgotten(OLD)  # never held here: lost with the restart
    assert not o.forgotten(NEW) and not o.forgotten(OTHER)
    assert not o.forgotten("not an origin")
    o.raise_horizon(OLD, 3)  # held after all: not forgotten
    assert not o.forgotten(OLD)


def test_a_superseded_origin_that_holds_nothing_is_retired_either_way_round():
    newer_first = origins()
    newer_first.raise_horizon(NEW, 1)
    newer_first.raise_horizon(OLD, 1)
    older_first = origins()
    older_first.raise_horizon(OLD, 1)
    older_first.raise_horizon(NEW, 1)
    for o in (newer_first, older_first):
        assert o.retired == {OLD} and o.superseded(OLD) and not o.superseded(NEW)
    still_held = origins(OLD)
    still_held.raise_horizon(OLD, 1)
    still_held.raise_horizon(NEW, 1)
    assert still_held.retired == set()


def test_a_cursor_naming_a_newer_epoch_has_read_through_a_retired_one():
    o = origins()
    o.raise_horizon(OLD, 4)
    o.raise_horizon(NEW, 2)
    assert o.reader(Cursor.of({NEW: 1}))(OLD) == READ_THROUGH
    assert o.reader(Cursor.of({OLD: 2}))(OLD) == 2  # named: its own position
    assert o.reader(Cursor.of({OTHER: 1}))(OLD) == 0  # no newer epoch named
    assert o.reader(Cursor.of({NEW: 1}))(NEW) == 1


def test_cursors_handed_out_name_no_forgotten_and_no_passed_retired_origin():
    o = origins()
    o.raise_horizon(OLD, 4)
    o.raise_horizon(NEW, 2)  # OLD retired
    gone = "n1.9"  # an epoch before both: never held, forgotten
    tidied = o.tidy(Cursor.of({OLD: 4, NEW: 1, gone: 3, OTHER: 5}))
    assert tidied == Cursor.of({NEW: 1, OTHER: 5})
    kept = Cursor.of({OLD: 4})  # no newer epoch named: the retired one stays
    assert o.tidy(kept) is kept


def test_a_handed_out_cursor_has_at_most_max_origins_the_known_ones_first():
    o = origins()
    o.raise_horizon(OLD, 1)
    forged = {f"x{i}.a": 1 for i in range(MAX_ORIGINS + 5)}
    tidied = o.tidy(Cursor.of({**forged, OLD: 1}))
    assert len(tidied.positions) == MAX_ORIGINS and tidied.position(OLD) == 1


@given(st.lists(st.tuples(st.sampled_from([OLD, NEW, OTHER]), st.integers(0, 20))))
def test_horizons_are_the_highest_raise_of_each_origin(raises):
    o = origins()
    for origin, seq in raises:
        o.raise_horizon(origin, seq)
    best: dict[str, int] = {}
    for origin, seq in raises:
        best[origin] = max(best.get(origin, 0), seq)
    assert o.horizons() == best
