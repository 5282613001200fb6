"""This node's subscriptions (pushup.core.presence): counts, members by user,
the window, anonymous polls, and the wire form of changes and states."""
from __future__ import annotations

import pytest

from pushup.core.presence import (
    Count,
    Join,
    Leave,
    Presence,
    changes_json,
    changes_of,
    state_json,
    state_of,
)

S = 1_000_000  # µs


def test_a_user_with_three_tabs_is_one_member_and_three_subscribers():
    p = Presence(window=5 * S)
    out = []
    for tab in ("t1", "t2", "t3"):
        out += p.hold(tab, "ann", '{"n":1}', ("room",))
    assert p.subscribers("room") == 3
    assert p.members("room") == {"ann": '{"n":1}'}
    assert out == [Join("room", "ann", '{"n":1}')]
    assert p.take_counts() == [Count("room", 3)]  # three holds: one count
    assert p.take_counts() == []


def test_a_released_subscription_counts_for_the_window_then_leaves():
    p = Presence(window=5 * S)
    p.hold("t1", "ann", None, ("room",))
    p.take_counts()
    p.release("t1", now=10 * S)
    assert p.subscribers("room") == 1 and p.take_counts() == []
    assert p.next_deadline() == 15 * S
    assert p.expire(15 * S - 1) == []
    assert p.expire(15 * S) == [Leave("room", "ann")]
    assert p.take_counts() == [Count("room", 0)]
    assert p.subscribers("room") == 0 and p.members("room") == {}
    assert p.next_deadline() is None and len(p) == 0 and p.channels == 0


def test_a_poll_again_within_the_window_is_no_change():
    p = Presence(window=5 * S)
    p.hold("t1", "ann", None, ("room",))
    p.release("t1", now=10 * S)
    p.take_counts()
    assert p.hold("t1", "ann", None, ("room",)) == []  # the next poll: nothing changed
    assert p.take_counts() == []
    assert p.expire(20 * S) == []  # held: it lingers no more
    assert p.subscribers("room") == 1
    assert p.next_deadline() is None


def test_an_anonymous_poll_counts_while_held_only():
    p = Presence(window=5 * S)
    p.hold_anonymous(("room", "hall"))
    assert p.subscribers("room") == 1 and len(p) == 1
    assert p.take_counts() == [Count("room", 1), Count("hall", 1)]
    p.release_anonymous(("room", "hall"))
    assert p.take_counts() == [Count("room", 0), Count("hall", 0)]
    assert p.members("room") == {} and p.channels == 0 and len(p) == 0


def test_a_key_that_changes_user_is_a_new_subscription():
    p = Presence(window=5 * S)
    p.hold("t1", "ann", None, ("room",))
    p.release("t1", now=0)
    assert p.hold("t1", "bob", None, ("room",)) == [Leave("room", "ann"), Join("room", "bob", None)]
    assert p.subscribers("room") == 1
    assert p.next_deadline() is None  # ann's lingering key went with her


def test_changes_and_states_go_over_the_wire_and_back():
    changes = [Count("a", 2), Join("a", "ann", '{"n":1}'), Leave("a", "bob")]
    assert changes_of(changes_json(changes)) == changes
    state = {"a": (2, {"ann": None, "bob": '{"x":2}'})}
    assert state_of(state_json(state)) == state


@pytest.mark.parametrize("raw", [{}, [["x", "a"]], [["c", "a", "2"]], [["j", "a", 1, None]],
                                 [["l", 5, "u"]], "nope"])
def test_a_malformed_change_list_is_refused(raw):
    with pytest.raises(ValueError):
        changes_of(raw)
