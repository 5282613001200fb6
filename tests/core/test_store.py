import pytest

from pushup.core.cursor import Cursor
from pushup.core.errors import BadRequest, ChannelExists, NoSuchChannel
from pushup.core.image import StoreImage
from pushup.core.model import Draft, Message, Origin, Query
from pushup.core.store import Retention, Store

S = 1_000_000
T0 = 1_700_000_000 * S


def make(per_channel=100, max_bytes=10**9, message_ttl=3600 * S, channel_ttl=3600 * S):
    return Store(Retention(message_ttl, channel_ttl, per_channel, max_bytes), Origin("me", T0))


def pub(store, *channels, at=T0, data=b"1"):
    return store.publish([Draft(channels, data)], at)[0]


def read(store, channels, since=0, until=None, limit=100):
    return store.query(Query(tuple(channels), since, until, limit))


def test_a_message_on_two_subscribed_channels_is_returned_once():
    s = make()
    m = pub(s, "a", "b")
    r = read(s, ["a", "b"])
    assert r.messages == (m,)


def test_messages_come_sorted_by_timestamp_across_channels_and_origins():
    s = make()
    first = pub(s, "a", at=T0 + 10)
    peer = Message("peer.x", 1, T0 + 5, ("b",), b"2")  # an older message arriving late
    assert s.apply(peer, T0 + 20)
    last = pub(s, "b", at=T0 + 30)
    assert read(s, ["a", "b"]).messages == (peer, first, last)


def test_a_late_message_from_a_peer_is_not_skipped_by_a_cursor():
    s = make()
    pub(s, "a", at=T0 + 100)
    cursor = read(s, ["a"]).cursor
    late = Message("peer.x", 1, T0 + 1, ("a",), b"2")  # older timestamp, arrives later
    s.apply(late, T0 + 200)
    assert read(s, ["a"], since=cursor).messages == (late,)


def test_apply_refuses_a_hole_in_an_origins_sequence():
    s = make()
    with pytest.raises(ValueError):
        s.apply(Message("peer.x", 2, T0, ("a",), b"1"), T0)
    assert s.apply(Message("peer.x", 1, T0, ("a",), b"1"), T0)
    assert not s.apply(Message("peer.x", 1, T0, ("a",), b"1"), T0)


def test_limit_pages_through_every_message_once_in_order():
    s = make()
    sent = [pub(s, "a", "b", at=T0 + i) for i in range(10)]
    got, cursor = [], Cursor(())
    while True:
        r = read(s, ["a", "b"], since=cursor, limit=3)
        if not r.messages:
            break
        got += r.messages
        cursor = r.cursor
    assert got == sent


def test_since_as_time_is_strictly_after_and_until_is_inclusive():
    s = make()
    ms = [pub(s, "a", at=T0 + i * S) for i in range(5)]
    assert read(s, ["a"], since=ms[1].ts).messages == tuple(ms[2:])
    assert read(s, ["a"], since=ms[1].ts, until=ms[3].ts).messages == (ms[2], ms[3])


def test_a_cursor_cut_by_until_does_not_skip_what_comes_after():
    s = make()
    ms = [pub(s, "a", at=T0 + i * S) for i in range(4)]
    r = read(s, ["a"], until=ms[1].ts)
    assert r.messages == tuple(ms[:2])
    assert read(s, ["a"], since=r.cursor).messages == tuple(ms[2:])


def test_since_zero_after_evictions_reports_a_gap():
    s = make(per_channel=3)
    for i in range(5):
        pub(s, "a", at=T0 + i)
    r = read(s, ["a"])
    assert r.gap and len(r.messages) == 3


def test_a_current_cursor_whose_messages_expired_has_no_gap():
    s = make(message_ttl=10 * S)
    pub(s, "a")
    cursor = read(s, ["a"]).cursor
    s.expire(T0 + 11 * S, busy=lambda name: True)
    assert s.message_count == 0
    r = read(s, ["a"], since=cursor)
    assert not r.gap and r.messages == ()


def test_a_cursor_behind_an_eviction_reports_a_gap_once():
    s = make(per_channel=2)
    cursor = read(s, ["a"]).cursor
    for i in range(4):
        pub(s, "a", at=T0 + i)
    r = read(s, ["a"], since=cursor)
    assert r.gap and len(r.messages) == 2
    assert not read(s, ["a"], since=r.cursor).gap


def test_total_bytes_cap_evicts_oldest_first():
    s = make(max_bytes=400)
    ms = [pub(s, "a", at=T0 + i, data=b'"' + b"x" * 50 + b'"') for i in range(10)]
    kept = read(s, ["a"]).messages
    assert s.bytes <= 400 and kept == tuple(ms[-len(kept):])


def test_retention_takes_the_oldest_of_every_origin_first():
    # Three origins whose messages interleave in time and arrive out of time
    # order: the bytes cap and the message ttl evict by (timestamp, id) across
    # all of them, and the snapshot lists what is left in that order.
    size = len(pub(make(), "a", at=T0).full)
    s = make(max_bytes=4 * size, message_ttl=100)
    ours = [pub(s, "a", at=T0 + t) for t in (10, 40)]
    p = [Message("p.x", i + 1, T0 + t, ("a",), b"1") for i, t in enumerate((5, 30, 50))]
    q = [Message("q.x", i + 1, T0 + t, ("a",), b"1") for i, t in enumerate((20, 45))]
    for m in (p[0], q[0], p[1], q[1], p[2]):
        assert s.apply(m, T0 + 60)
    by_time = [p[0], ours[0], q[0], p[1], ours[1], q[1], p[2]]
    assert s.message_count == 4 and s.all_messages() == by_time[3:]
    s.expire(T0 + 145, busy=lambda name: False)  # ttl 100: ts <= 45 is due
    assert s.all_messages() == [p[2]] and s.message_count == 1
    assert s.next_deadline() == p[2].ts + 100

def test_channel_lifecycle():
    s = make()
    ch = s.create("room", 60 * S, T0)
    assert ch.expires_at == T0 + 60 * S
    with pytest.raises(ChannelExists):
        s.create("room", None, T0)
    generated = s.create(None, None, T0)
    assert generated.name != "room" and s.channel(generated.name) is not None
    assert s.renew("room", 120 * S, T0 + S).expires_at == T0 + 121 * S
    s.delete("room")
    with pytest.raises(NoSuchChannel):
        s.get("room")
    with pytest.raises(NoSuchChannel):
        s.renew("room", None, T0)
    with pytest.raises(BadRequest):
        s.create("x", -1, T0)


def test_deleting_a_channel_drops_only_messages_no_other_channel_holds():
    s = make()
    shared = pub(s, "a", "b")
    pub(s, "a")
    s.delete("a")
    assert s.message_count == 1 and read(s, ["b"]).messages == (shared,)


def test_a_channel_expires_after_its_ttl_without_publishes_or_subscribers():
    s = make(channel_ttl=10 * S)
    pub(s, "idle")
    pub(s, "busy")
    pub(s, "live", at=T0 + 8 * S)
    removed = s.expire(T0 + 11 * S, busy=lambda name: name == "busy")
    assert removed == ["idle"]
    assert set(s.channel_names()) == {"busy", "live"}
    assert s.expire(T0 + 19 * S, busy=lambda name: False) == ["live"]
    assert s.expire(T0 + 22 * S, busy=lambda name: False) == ["busy"]
    assert s.message_count == 0 and s.next_deadline() is None


def test_renewing_to_an_earlier_time_is_honoured():
    s = make()
    s.create("c", 3600 * S, T0)
    s.renew("c", 5 * S, T0)
    assert s.expire(T0 + 6 * S, busy=lambda name: False) == ["c"]


def test_expiry_sweeps_many_channels_in_one_pass():
    s = make(channel_ttl=S)
    for i in range(1000):
        s.touch([f"c{i}"], T0)
    assert len(s.expire(T0 + 2 * S, busy=lambda name: False)) == 1000
    assert s.channel_count == 0


def test_a_node_that_does_not_know_an_origin_keeps_the_clients_position_for_it():
    s = make()
    pub(s, "a")
    since = Cursor.of({"elsewhere.x": 42, s.origin_name: 0})
    r = read(s, ["a"], since=since)
    assert len(r.messages) == 1
    assert r.cursor.position("elsewhere.x") == 42  # kept, never rewound
    later = Message("elsewhere.x", 1, T0 + 5, ("a",), b"old")
    s.apply(later, T0 + 5)  # the origin's early history arrives later: already seen
    assert read(s, ["a"], since=r.cursor).messages == ()


# -- restarts: origins lost, superseded and retired ---------------------------


def boot(node="n1", at=T0, **retention):
    """A store of node ``node`` booted at ``at`` (µs): its origin is ``node.<epoch>``."""
    return Store(Retention(retention.get("message_ttl", 3600 * S), 3600 * S, 100, 10**9),
                 Origin(node, at))


def test_a_cursor_naming_an_origin_lost_with_a_restart_gets_one_gap_then_none():
    before = boot(at=T0)
    pub(before, "a", at=T0 + 1)
    cursor = read(before, ["a"]).cursor
    pub(before, "a", at=T0 + 2)  # never read: gone with the restart
    after = boot(at=T0 + 5 * S)  # same node id, newer epoch, empty cache
    fresh = pub(after, "a", at=T0 + 6 * S)
    first = read(after, ["a"], since=cursor)
    assert first.gap and first.messages == (fresh,)
    assert before.origin_name not in first.cursor.as_dict()
    second = read(after, ["a"], since=first.cursor)
    assert not second.gap and second.messages == ()


def test_an_origin_of_a_node_the_store_never_heard_of_is_kept_without_a_gap():
    s = boot()
    cursor = Cursor.of({"other.abc": 5})
    r = read(s, ["a"], since=cursor)
    assert not r.gap
    assert r.cursor.position("other.abc") == 5


def test_an_origin_newer_than_the_store_knows_is_kept_without_a_gap():
    s = boot(at=T0)
    newer = f"n1.{_epoch(T0 + 9 * S)}"  # in a cluster it may simply not have arrived
    r = read(s, ["a"], since=Cursor.of({newer: 3}))
    assert not r.gap and r.cursor.position(newer) == 3


def image_of(m: Message) -> StoreImage:
    """A peer's snapshot holding ``m`` alone."""
    return StoreImage(horizon=(), lost=(), channels=(), messages=((m, m.channels),))


def test_a_superseded_origin_is_dropped_from_cursors_once_its_messages_are_gone():
    s = boot(at=T0 + 10 * S, message_ttl=60 * S)
    old = Message(f"n1.{_epoch(T0)}", 1, T0 + 1, ("a",), b"1")  # from a peer's snapshot
    s.load(image_of(old), T0 + 10 * S)
    r = read(s, ["a"])
    assert r.messages == (old,)  # a superseded origin's messages still serve
    mine = pub(s, "a", at=T0 + 11 * S)
    cursor = read(s, ["a"], since=r.cursor).cursor
    assert cursor.as_dict() == {old.origin: 1, s.origin_name: mine.seq}
    s.expire(T0 + 200 * S, busy=lambda name: True)  # both messages expire
    r = read(s, ["a"], since=cursor)
    assert not r.gap  # the reader had both
    assert r.cursor.as_dict() == {s.origin_name: mine.seq}
    assert read(s, ["a"], since=r.cursor).gap is False
    assert s.end().as_dict() == {s.origin_name: mine.seq}


def test_a_reader_behind_a_retired_origin_is_told_of_the_gap_once():
    s = boot(at=T0 + 10 * S, message_ttl=60 * S)
    old = f"n1.{_epoch(T0)}"
    s.load(image_of(Message(old, 1, T0 + 1, ("a",), b"1")), T0 + 10 * S)
    behind = Cursor.of({old: 0})
    pub(s, "a", at=T0 + 11 * S)
    s.expire(T0 + 200 * S, busy=lambda name: True)
    first = read(s, ["a"], since=behind)
    assert first.gap and old not in first.cursor.as_dict()
    assert not read(s, ["a"], since=first.cursor).gap


def test_a_retired_origin_stays_in_cursors_until_its_node_names_a_newer_one():
    s = boot(at=T0 + 10 * S, message_ttl=60 * S)
    old = f"n1.{_epoch(T0)}"
    s.load(image_of(Message(old, 1, T0 + 1, ("a",), b"1")), T0 + 10 * S)
    cursor = read(s, ["a"]).cursor
    s.expire(T0 + 200 * S, busy=lambda name: True)
    # nothing published by the new origin yet: dropping the old one would make
    # the next poll read it from 0 again and report its eviction a second time
    r = read(s, ["a"], since=cursor)
    assert not r.gap and r.cursor.as_dict() == {old: 1}
    pub(s, "a", at=T0 + 201 * S)
    r = read(s, ["a"], since=r.cursor)
    assert not r.gap and set(r.cursor.as_dict()) == {s.origin_name}


def test_two_thousand_restarts_of_one_node_keep_the_cursor_bounded():
    from pushup.core.cursor import decode

    cursor, gaps = Cursor(()), 0
    for k in range(2000):
        s = boot(at=T0 + k * S)
        pub(s, "a", at=T0 + k * S + 1)
        r = read(s, ["a"], since=cursor)
        gaps += r.gap
        cursor = decode(r.cursor.encode())  # the node accepts what it issued
        assert len(cursor.positions) == 1
    # Every restart without a data dir forgets the previous origin: its readers
    # are told (the node cannot know whether they had all of it).
    assert gaps == 1999


def test_a_cursor_of_many_foreign_origins_stays_one_the_node_accepts():
    from pushup.core.cursor import MAX_ORIGINS, decode

    s = boot()
    foreign = Cursor.of({f"x{i}.a": 1 for i in range(MAX_ORIGINS)})
    pub(s, "a")
    r = read(s, ["a"], since=decode(foreign.encode()))
    assert len(r.cursor.positions) == MAX_ORIGINS
    assert s.origin_name in r.cursor.as_dict()
    decode(r.cursor.encode())


def _epoch(us):
    from pushup.core.model import base36

    return base36(us // 1000)


# -- the store's own state: journal, image, another node's channel operations --


def test_a_store_without_a_journal_notes_nothing_and_one_installed_sees_every_change():
    from pushup.core.changes import NO_CHANGES, Changes

    s = make()
    pub(s, "a")
    assert not NO_CHANGES  # the default journal keeps nothing
    turns = []
    changes = Changes(lambda: turns.append(1))
    s.journal_to(changes)
    m = pub(s, "b", at=T0 + 1)
    assert turns == [1] and changes.messages == {m.id: m}
    assert changes.channels == {"b"} and changes.origins == {s.origin_name}
    s.journal_to(NO_CHANGES)
    pub(s, "c", at=T0 + 2)
    assert "c" not in changes.channels


def test_an_image_loads_into_an_empty_store_as_the_store_it_was_made_of():
    from pushup.core.channels import ChannelOp

    old = make(per_channel=1)
    pub(old, "a", at=T0 + 1)
    pub(old, "a", "b", at=T0 + 2)  # pushes the first out of "a": a gap there
    old.apply_op(ChannelOp("create", "room", 0, 60 * S, T0 + 60 * S), T0 + 3)
    old.skip_to("elsewhere.1", 7, T0)
    new = Store(old.retention, Origin("you", T0 + S))
    assert new.load(old.image(), T0 + 10) == old.message_count
    assert new.image().messages == old.image().messages
    assert new.image().channels == old.image().channels
    assert new.lost_of("elsewhere.1") == (7, T0)
    assert new.horizon_of(old.origin_name) == 2
    for since in (0, Cursor(())):
        assert read(new, ["a", "b"], since) == read(old, ["a", "b"], since)


def test_another_nodes_channel_operation_leaves_the_channel_as_that_node_did():
    from pushup.core.channels import ChannelOp

    s = make()
    s.apply_op(ChannelOp("create", "room", 3, 60 * S, T0 + 60 * S), T0)
    room = s.channel("room")
    assert room is not None and (room.ttl, room.expires_at) == (60 * S, T0 + 60 * S)
    s.apply_op(ChannelOp("renew", "room", 4, 90 * S, T0 + 95 * S), T0 + 5 * S)
    assert (room.ttl, room.expires_at) == (90 * S, T0 + 95 * S)
    assert s.expire(T0 + 94 * S, busy=lambda name: False) == []
    s.apply_op(ChannelOp("delete", "room", 5), T0 + 6 * S)
    s.apply_op(ChannelOp("delete", "room", 6), T0 + 6 * S)  # again: nothing to do
    assert s.channel("room") is None and s.channel_count == 0


# -- scoped origins (the Redis engine's partitions) ------------------------------


def partitioned():
    """A store holding two scoped origins (partitions p1 and p2), each with
    messages of its own channel, and this node's own origin with none."""
    s = make()
    for origin in ("p1.e", "p2.e"):
        s.know(origin, scoped=True)
    s.apply(Message("p1.e", 1, T0 + 1, ("a",), b"1"), T0)
    s.apply(Message("p2.e", 1, T0 + 2, ("b",), b"2"), T0)
    s.apply(Message("p2.e", 2, T0 + 3, ("b",), b"3"), T0)
    return s


def test_a_cursor_names_a_scoped_origin_only_for_the_channels_that_hold_its_messages():
    s = partitioned()
    assert read(s, ["a"]).cursor == Cursor((("p1.e", 1),))
    assert read(s, ["b"]).cursor == Cursor((("p2.e", 2),))
    assert read(s, ["a", "b"]).cursor == Cursor((("p1.e", 1), ("p2.e", 2)))
    assert s.end(["a"]) == Cursor((("p1.e", 1),))
    assert s.end(["quiet"]) == Cursor(())
    assert s.end() == Cursor((("p1.e", 1), ("p2.e", 2)))  # no channels named: every origin


def test_an_unscoped_origin_is_named_by_every_cursor_as_before():
    s = make()
    s.apply(Message("peer.x", 1, T0 + 1, ("a",), b"1"), T0)
    assert read(s, ["b"]).cursor == Cursor((("peer.x", 1),))
    assert s.end(["b"]) == Cursor((("peer.x", 1),))


def test_a_scoped_cursor_at_the_end_is_answered_by_itself_and_misses_nothing_after():
    s = partitioned()
    at_end = read(s, ["a"]).cursor
    assert s.at_end(at_end, ["a"])
    assert read(s, ["a"], since=at_end) == read(s, ["a"], since=at_end)
    assert read(s, ["a"], since=at_end).messages == ()
    # a later message of p2 on "b" is out of view of a reader of "a" ...
    s.apply(Message("p2.e", 3, T0 + 4, ("b",), b"4"), T0)
    assert s.at_end(at_end, ["a"])
    # ... and one on "a" from a partition its cursor never named is listed
    later = Message("p2.e", 4, T0 + 5, ("a",), b"5")
    s.apply(later, T0)
    assert not s.at_end(at_end, ["a"])
    r = read(s, ["a"], since=at_end)
    assert r.messages == (later,)
    assert r.cursor == Cursor((("p1.e", 1), ("p2.e", 4)))


def test_a_scoped_end_for_a_quiet_channel_still_lists_its_first_message():
    s = partitioned()
    since = s.end(["c"])
    first = Message("p1.e", 2, T0 + 9, ("c",), b"9")
    s.apply(first, T0)
    assert read(s, ["c"], since=since).messages == (first,)


def test_history_lost_of_a_scoped_origin_is_a_gap_for_its_channels_readers_only():
    s = partitioned()
    s.sources_by(lambda name: {"a": ["p1"], "b": ["p2"]}.get(name, ["p9"]))
    quiet_reader = read(s, ["quiet"]).cursor  # its channel lives in no partition here
    a_reader = Cursor(())  # a reader of "a" that has read nothing yet
    s.skip_to("p1.e", 5, T0 + 10)  # p1's log lost what it had, up to 5
    assert read(s, ["quiet"], since=quiet_reader).gap is False
    assert read(s, ["b"], since=read(s, ["b"]).cursor).gap is False
    assert read(s, ["a"], since=a_reader).gap is True
    assert read(s, ["a"], since=a_reader).messages[0].origin == "p1.e"
