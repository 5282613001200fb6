"""A partition's follow phase: every move the table lists, and a move it does
not list raises."""

from __future__ import annotations

import pytest

from pushup.backplane.redis.following import MOVES, Follow, Partition, Step, follow_after
from pushup.backplane.redis.partitions import PartitionKeys, keys_of

LEGAL = [(phase, step, after) for phase, moves in MOVES.items()
         for step, after in moves.items()]
ILLEGAL = [(phase, step) for phase in Follow for step in Step if step not in MOVES[phase]]


def test_the_table_names_every_phase() -> None:
    assert set(MOVES) == set(Follow)


@pytest.mark.parametrize(("phase", "step", "after"), LEGAL,
                         ids=lambda v: getattr(v, "name", v))
def test_every_legal_move_lands_where_the_table_says(phase: Follow, step: Step,
                                                     after: Follow) -> None:
    assert follow_after(phase, step) is after


@pytest.mark.parametrize(("phase", "step"), ILLEGAL, ids=lambda v: getattr(v, "name", v))
def test_a_move_the_table_does_not_list_raises(phase: Follow, step: Step) -> None:
    with pytest.raises(ValueError, match=f"cannot {step.name} when {phase.name}"):
        follow_after(phase, step)


def test_the_illegal_moves_are_the_ones_that_would_skip_a_read_or_follow_twice() -> None:
    assert set(ILLEGAL) == {(Follow.UNFOLLOWED, Step.READ), (Follow.UNFOLLOWED, Step.LET_GO),
                            (Follow.FOLLOWED, Step.FOLLOW), (Follow.READY, Step.FOLLOW)}


def test_a_partition_is_followed_read_read_again_and_let_go() -> None:
    p = Partition(3, "p3")
    assert (p.phase, p.followed, p.ready) == (Follow.UNFOLLOWED, False, False)
    p.move(Step.FOLLOW)
    assert (p.phase, p.followed, p.ready) == (Follow.FOLLOWED, True, False)
    p.move(Step.READ)
    p.move(Step.READ)  # read again after a resubscription: still whole
    assert (p.phase, p.followed, p.ready) == (Follow.READY, True, True)
    p.move(Step.LET_GO)
    assert (p.phase, p.followed, p.ready) == (Follow.UNFOLLOWED, False, False)


def test_a_partition_not_followed_cannot_be_read_ready() -> None:
    p = Partition(0, "p0")
    with pytest.raises(ValueError):
        p.move(Step.READ)
    assert p.phase is Follow.UNFOLLOWED  # a refused move changes nothing


def test_a_partition_followed_twice_raises() -> None:
    p = Partition(0, "p0")
    p.move(Step.FOLLOW)
    with pytest.raises(ValueError):
        p.move(Step.FOLLOW)


def test_a_partitions_keys_are_its_own_value_apart_from_its_state() -> None:
    p = Partition(1, "p1-4")
    assert p.keys == PartitionKeys(1, "p1-4")
    assert (p.index, p.tag, p.origin) == (1, "p1-4", "p1-4.")
    assert (p.keys.log, p.keys.meta, p.keys.channels, p.keys.foreign, p.keys.key,
            p.keys.notify) == ("pushup:{p1-4}:log", "pushup:{p1-4}:meta",
                               "pushup:{p1-4}:channels", "pushup:{p1-4}:foreign",
                               "pushup:{p1-4}:key:", "pushup:{p1-4}:n")
    with pytest.raises(AttributeError):
        p.keys.log = "elsewhere"  # type: ignore[misc]
    assert keys_of("a{x}b", 4) == keys_of("x", 4)  # one hash tag, one partition
