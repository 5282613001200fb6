"""A followed channel's phase: every move the table lists, and a move it does
not list raises; a partition serves, and moves its horizon, by its channels'."""

from __future__ import annotations

import pytest

from pushup.backplane.redis.following import (
    MOVES,
    Follow,
    FollowedChannel,
    Partition,
    Step,
    follow_after,
)
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


def test_the_illegal_moves_are_reads_of_a_subscription_never_confirmed() -> None:
    # a read counts only once Redis confirmed the channel's subscription: else
    # what was published between the read and the subscription would be missed
    assert set(ILLEGAL) == {(Follow.ASKED, Step.READ), (Follow.ADRIFT, Step.READ)}


def test_a_channel_is_asked_confirmed_read_lost_rejoined_and_read_again() -> None:
    c = FollowedChannel(0.0)
    assert (c.phase, c.served) == (Follow.ASKED, False)
    c.move(Step.CONFIRMED)
    assert (c.phase, c.served) == (Follow.SUBSCRIBED, False)
    c.move(Step.READ)
    assert (c.phase, c.served) == (Follow.READY, True)
    c.move(Step.LOST)  # the connection went: still served as it was
    assert (c.phase, c.served) == (Follow.ADRIFT, True)
    c.move(Step.CONFIRMED)
    assert (c.phase, c.served) == (Follow.REJOINED, True)
    c.move(Step.READ)
    assert c.phase is Follow.READY


def test_a_refused_move_changes_nothing() -> None:
    c = FollowedChannel(0.0)
    with pytest.raises(ValueError):
        c.move(Step.READ)
    assert c.phase is Follow.ASKED


def test_a_partition_serves_its_ready_channels_and_is_unsteady_while_one_is_adrift() -> None:
    p = Partition(0, "p0")
    assert (p.followed, p.ready, p.steady, p.readable()) == (False, False, True, [])
    a = p.channels["a"] = FollowedChannel(0.0)
    b = p.channels["b"] = FollowedChannel(0.0)
    a.move(Step.CONFIRMED)
    assert (p.followed, p.readable(), p.serves("a"), p.serves("b")) == (True, ["a"], False,
                                                                         False)
    a.move(Step.READ)
    assert (p.ready, p.serves("a"), p.steady) == (True, True, True)
    a.move(Step.LOST)
    assert (p.serves("a"), p.steady, p.readable()) == (True, False, [])
    b.move(Step.CONFIRMED)
    assert p.readable() == ["b"]


def test_a_partitions_keys_are_its_own_value_apart_from_its_state() -> None:
    p = Partition(1, "p1-4")
    assert p.keys == PartitionKeys(1, "p1-4")
    assert (p.index, p.tag, p.origin) == (1, "p1-4", "p1-4.")
    assert (p.keys.log, p.keys.meta, p.keys.channels, p.keys.foreign, p.keys.key,
            p.keys.notify_of("a"), p.keys.stream_of("e1", "a")) == (
        "pushup:{p1-4}:log", "pushup:{p1-4}:meta", "pushup:{p1-4}:channels",
        "pushup:{p1-4}:foreign", "pushup:{p1-4}:key:", "pushup:{p1-4}:n:a",
        "pushup:{p1-4}:c:e1:a")
    with pytest.raises(AttributeError):
        p.keys.log = "elsewhere"  # type: ignore[misc]
    assert keys_of("a{x}b", 4) == keys_of("x", 4)  # one hash tag, one partition
