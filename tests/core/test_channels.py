"""pushup/core/channels.py: a channel lives its ttl after its creation, last publish or
renewal; the sweep gets exactly the channels due (one with a waiting subscriber lives
one more ttl); names are checked, generated names are unique to the node, and every
change of a channel's existence or lifetime is noted for the journal."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pushup.core.changes import Changes
from pushup.core.channels import MAX_TTL, STALE_SLACK, Channel, ChannelOp, Channels, check_ttl
from pushup.core.cursor import Cursor
from pushup.core.errors import BadChannelName, BadRequest, ChannelExists, NoSuchChannel
from pushup.core.model import Message
from pushup.core.runs import Run

TTL = 100


def channels() -> Channels:
    made = Channels(default_ttl=TTL, prefix="n1.a")
    made.changes = Changes(on_first=lambda: None)
    return made


def due(chs: Channels, now: int, busy: frozenset[str] = frozenset()) -> list[str]:
    """Sweep as the store does: remove each channel as it is yielded."""
    out = []
    for name in chs.expired(now, lambda n: n in busy):
        chs.remove(name)
        out.append(name)
    return out


def test_a_ttl_is_the_default_or_within_0_and_366_days():
    assert check_ttl(None, 7) == 7
    assert check_ttl(MAX_TTL, 7) == MAX_TTL
    for bad in (0, -1, MAX_TTL + 1):
        with pytest.raises(BadRequest):
            check_ttl(bad, 7)


def test_a_channel_is_created_once_with_the_default_ttl_and_noted():
    chs = channels()
    made = chs.ensure("a", now=10)
    assert chs.ensure("a", now=50) is made and made.expires_at == 10 + TTL
    assert "a" in chs and len(chs) == 1 and chs.names() == ["a"]
    assert chs.changes.channels == {"a"}
    assert chs.touch(["a", "b"], now=20) and not chs.touch(["a", "b"], now=30)
    assert chs.find("b").expires_at == 20 + TTL and chs.find("zz") is None


def test_explicit_creation_checks_the_name_and_refuses_a_taken_one():
    chs = channels()
    assert chs.create("x", ttl=5, now=0).expires_at == 5
    with pytest.raises(ChannelExists):
        chs.create("x", ttl=None, now=0)
    with pytest.raises(BadChannelName):
        chs.create("a b", ttl=None, now=0)
    with pytest.raises(BadRequest):
        chs.create("y", ttl=0, now=0)
    assert chs.names() == ["x"]


def test_generated_names_carry_the_prefix_and_skip_taken_ones():
    chs = channels()
    chs.ensure("_n1.a.2", now=0)  # taken already, e.g. a peer's
    names = [chs.create(None, None, now=0).name for _ in range(3)]
    assert names == ["_n1.a.1", "_n1.a.3", "_n1.a.4"]


def test_renewal_lives_a_ttl_from_now_and_an_unknown_channel_is_404():
    chs = channels()
    chs.create("x", ttl=40, now=0)
    assert chs.renew("x", None, now=30).expires_at == 70  # its own ttl
    renewed = chs.renew("x", 200, now=50)
    assert (renewed.ttl, renewed.expires_at) == (200, 250)
    with pytest.raises(NoSuchChannel):
        chs.renew("nope", None, now=0)
    with pytest.raises(NoSuchChannel):
        chs.remove("nope")


def test_the_sweep_yields_exactly_the_channels_due_in_deadline_order():
    chs = channels()
    chs.ensure("late", now=50)
    chs.ensure("early", now=0)
    chs.ensure("mid", now=20)
    assert chs.next_deadline() == 0 + TTL
    assert due(chs, now=TTL + 19) == ["early"]
    assert due(chs, now=TTL + 50) == ["mid", "late"]
    assert len(chs) == 0 and chs.next_deadline() is None


def test_a_renewed_channel_is_swept_at_its_new_deadline_only():
    chs = channels()
    chs.ensure("longer", now=0)
    chs.ensure("shorter", now=0)
    chs.renew("longer", 300, now=10)  # 310: the old deadline's entry is stale
    chs.renew("shorter", 5, now=10)  # 15: earlier than its queued deadline
    assert due(chs, now=15) == ["shorter"]
    assert due(chs, now=TTL) == []
    assert due(chs, now=310) == ["longer"]


def test_a_channel_with_a_waiting_subscriber_lives_one_more_ttl():
    chs = channels()
    chs.ensure("held", now=0)
    assert due(chs, now=TTL, busy=frozenset({"held"})) == []
    assert chs.find("held").expires_at == 2 * TTL
    assert due(chs, now=2 * TTL) == ["held"]


def test_a_deleted_channel_is_not_swept_and_a_new_one_of_its_name_starts_afresh():
    chs = channels()
    chs.ensure("x", now=0)
    chs.remove("x")
    chs.ensure("x", now=60)
    assert due(chs, now=TTL) == []
    assert due(chs, now=60 + TTL) == ["x"]


def test_another_nodes_operation_leaves_the_channel_as_it_left_it():
    here, there = channels(), channels()
    made = there.create("x", ttl=40, now=5)
    op = ChannelOp.of("create", made, at_seq=3)
    assert op == ChannelOp("create", "x", 3, 40, 45)
    settled = here.settle(op, now=20)  # later here: the origin's expiry holds
    assert (settled.ttl, settled.expires_at) == (40, 45)
    here.settle(ChannelOp("renew", "x", 4, 90, 200), now=30)
    assert here.find("x").expires_at == 200
    assert due(here, now=199) == [] and due(here, now=200) == ["x"]


def msg(seq: int, origin: str = "n1.a", ts: int | None = None) -> Message:
    return Message(origin, seq, seq * 10 if ts is None else ts, ("c",), b"1")


def test_dropping_a_message_records_the_gap_a_reader_behind_it_has():
    channel = Channel("c", TTL, now=0)
    ms = [msg(1), msg(2), msg(1, "n2.a", ts=15)]
    for m in ms:
        channel.runs.setdefault(m.origin, Run()).add(m)
        channel.count += 1
    assert channel.oldest() is ms[0] and channel.holds(ms[1])
    channel.drop(ms[0])
    assert not channel.holds(ms[0]) and channel.count == 2
    assert channel.evicted == {"n1.a": 1} and channel.evicted_ts == 10
    assert channel.has_gap(Cursor.of({})) and not channel.has_gap(Cursor.of({"n1.a": 1}))
    assert channel.has_gap(9) and not channel.has_gap(10)
    channel.drop(ms[2])
    assert "n2.a" not in channel.runs and channel.oldest() is ms[1]
    assert channel.has_gap(Cursor.of({"n1.a": 1}))  # behind n2.a's eviction now


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from(["ensure", "renew",
                                                                        "remove"]),
                          st.integers(1, 300)), max_size=30),
       st.integers(0, 400))
def test_the_sweep_takes_exactly_the_channels_whose_lifetime_is_over(ops, now):
    chs = channels()
    clock = 0
    for name, op, ttl in ops:
        clock += 1
        if op == "ensure":
            chs.ensure(name, clock, ttl)
        elif op == "renew" and name in chs:
            chs.renew(name, ttl, clock)
        elif op == "remove" and name in chs:
            chs.remove(name)
    now = max(now, clock)
    expected = sorted(c.name for c in chs.values() if c.expires_at <= now)
    assert sorted(due(chs, now)) == expected
    assert all(c.expires_at > now for c in chs.values())


def test_channels_removed_before_their_deadline_leave_no_expiry_entry_behind():
    chs = channels()
    for k in range(300):
        chs.ensure(f"c{k}", now=k)  # due at k + TTL
    chs.renew("c299", ttl=TTL * 10, now=0)  # a second entry of its own, the first stale
    for k in range(290):
        chs.remove(f"c{k}")
    # 10 live entries and at most STALE_SLACK + as many stale ones, not 301
    assert chs.scheduled <= 2 * len(chs) + STALE_SLACK < 300
    assert due(chs, 299 + TTL) == [f"c{k}" for k in range(290, 299)]  # still swept in time
    assert due(chs, TTL * 10) == ["c299"]
    assert chs.scheduled == 0
