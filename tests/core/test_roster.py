"""The cluster's roster (pushup.core.roster): every node's presence merged,
one member per user, occupied/vacated and added/removed events, the cap,
snapshots, and what a follower reads after its position."""
from __future__ import annotations

from pushup.core.presence import Count, Join, Leave
from pushup.core.roster import ADDED, KEPT_PER_CHANNEL, OCCUPIED, REMOVED, VACATED, Event, Roster


def names(events):
    return [(e.name, e.channel, e.user) for e in events]


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


def test_a_follower_too_far_behind_gets_the_channel_as_it_stands():
    r = Roster()
    r.apply("n1", [Count("a", 1), Join("a", "stay", None)])
    at = r.seq
    for i in range(2 * KEPT_PER_CHANNEL + 1):  # more changes than the channel keeps
        r.apply("n1", [Join("a", f"u{i}", None)])
        r.apply("n1", [Leave("a", f"u{i}")])
    seen = r.since(["a"], at)
    assert ("member_added", "a", "stay") in names(seen)
    assert len(seen) <= 2 * KEPT_PER_CHANNEL + 1
