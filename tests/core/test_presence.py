"""This node's subscriptions (pushup.core.presence) and the cluster's roster
(pushup.core.roster): counts, members by user, the window, the merge of nodes."""
from __future__ import annotations

from pushup.core.presence import Count, Join, Leave, Presence
from pushup.core.roster import ADDED, OCCUPIED, REMOVED, VACATED, Event, Roster

S = 1_000_000  # µs


def names(events):
    return [(e.name, e.channel, e.user) for e in events]


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


def test_the_roster_merges_nodes_one_member_per_user():
    r = Roster()
    first = r.apply("n1", [Count("room", 1), Join("room", "ann", None)])
    assert names(first) == [(OCCUPIED, "room", None), (ADDED, "room", "ann")]
    assert r.apply("n2", [Count("room", 2), Join("room", "ann", None)]) == []
    seen = r.occupancy("room", cap=10)
    assert seen.subscribers == 3 and seen.members == (("ann", None),)
    assert r.apply("n1", [Count("room", 0), Leave("room", "ann")]) == []  # still on n2
    gone = r.forget("n2")
    assert names(gone) == [(REMOVED, "room", "ann"), (VACATED, "room", None)] or \
        names(gone) == [(VACATED, "room", None), (REMOVED, "room", "ann")]
    assert r.occupancy("room", cap=10).subscribers == 0 and r.channels == 0


def test_the_member_list_is_capped_while_the_count_stays_exact():
    r = Roster()
    r.apply("n1", [Count("big", 250)] + [Join("big", f"u{i}", None) for i in range(250)])
    seen = r.occupancy("big", cap=100)
    assert seen.subscribers == 250 and len(seen.members) == 100 and seen.truncated
    assert not r.occupancy("big", cap=250).truncated


def test_a_snapshot_replaces_what_a_node_said():
    r = Roster()
    r.apply("n2", [Count("a", 1), Join("a", "ann", None), Count("b", 1), Join("b", "bob", None)])
    events = r.replace("n2", {"b": (1, {"bob": None, "cy": None})})
    assert sorted(names(events)) == sorted([(REMOVED, "a", "ann"), (VACATED, "a", None),
                                            (ADDED, "b", "cy")])
    assert r.state_of("n2") == {"b": (1, {"bob": None, "cy": None})}


def test_a_follower_reads_the_changes_after_its_position():
    r = Roster()
    r.apply("n1", [Count("a", 1), Join("a", "ann", None)])
    at = r.seq
    r.apply("n1", [Count("a", 2), Join("a", "bob", '{"x":1}')])
    r.apply("n1", [Count("a", 1), Leave("a", "ann")])
    assert r.since(["a"], at) == [Event(ADDED, "a", "bob", '{"x":1}'), Event(REMOVED, "a", "ann")]
    assert r.since(["a"], r.seq) == []


def test_a_follower_without_a_position_gets_the_channel_as_it_stands():
    r = Roster()
    r.apply("n1", [Count("a", 2), Join("a", "ann", None), Join("a", "bob", None)])
    r.apply("n1", [Count("a", 1), Leave("a", "ann")])
    # ann left (said first: a follower that knew her drops her), bob is here
    assert names(r.since(["a"], None)) == [(REMOVED, "a", "ann"), (ADDED, "a", "bob")]
    assert names(r.since(["a"], r.seq + 5)) == names(r.since(["a"], None))  # not ours
