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
    assert p.hold("t1", "ann", None, ("room",)) is None  # the next poll: nothing moved
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


def test_a_subscriber_polling_again_and_again_goes_one_window_after_its_last_poll():
    p = Presence(window=5 * S)
    assert p.hold("t1", "ann", None, ("room",)) == [Join("room", "ann", None)]
    assert p.release("t1", now=1 * S) is True  # the first key to linger: the alarm is for it
    p.hold("t2", "bob", None, ("room",))
    assert p.release("t2", now=2 * S) is False  # a key lingers already, due earlier
    for poll in range(1, 1000):  # ann re-polls, each held, then released, 1 ms apart
        assert p.hold("t1", "ann", None, ("room",)) is None
        assert p.release("t1", now=2 * S + poll * 1000) is False
    last = 2 * S + 999 * 1000
    assert p.next_deadline() == 7 * S  # bob's: ann's release moved hers behind his
    assert p.expire(7 * S) == [Leave("room", "bob")]
    assert p.next_deadline() == last + 5 * S
    assert p.expire(last + 5 * S - 1) == []
    assert p.expire(last + 5 * S) == [Leave("room", "ann")]
    assert p.next_deadline() is None and len(p) == 0


def test_a_key_held_again_is_passed_over_by_expiry_and_lingers_from_its_next_release():
    p = Presence(window=5 * S)
    p.hold("t1", "ann", None, ("room",))
    p.release("t1", now=1 * S)
    p.hold("t1", "ann", None, ("room",))  # an event stream, say: held long
    assert p.expire(60 * S) == [] and p.members("room") == {"ann": None}
    assert p.next_deadline() is None  # nothing lingers: no timer
    assert p.release("t1", now=61 * S) is True
    assert p.expire(66 * S) == [Leave("room", "ann")]
