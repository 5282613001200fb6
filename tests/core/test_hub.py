from pushup.core.cursor import Cursor
from pushup.core.hub import Hub, Waiter
from pushup.core.model import Message, Query


def q(*channels, since=0, until=None):
    return Query(channels, since, until, 100)


def msg(seq, *channels, ts=None, origin="o.1"):
    return Message(origin, seq, ts if ts is not None else seq * 10, channels, b"1")


def test_a_message_takes_the_waiters_of_its_channels_once():
    hub = Hub()
    both, other = Waiter(q("a", "b"), 100, "w1"), Waiter(q("c"), 100, "w2")
    hub.add(both)
    hub.add(other)
    assert hub.take_matching(msg(1, "a", "b")) == [both]
    assert len(hub) == 1 and hub.waiting_on("a") == 0


def test_a_message_the_query_does_not_want_leaves_the_waiter():
    hub = Hub()
    past = Waiter(q("a", since=Cursor.of({"o.1": 5})), 100, "w")
    hub.add(past)
    assert hub.take_matching(msg(3, "a")) == []
    assert hub.take_matching(msg(6, "a")) == [past]
    bounded = Waiter(q("a", until=50), 100, "w")
    hub.add(bounded)
    assert hub.take_matching(msg(7, "a", ts=70)) == []


def test_timeouts_come_out_in_deadline_order():
    hub = Hub()
    waiters = [Waiter(q("a"), d, i) for i, d in enumerate([30, 10, 20])]
    for w in waiters:
        hub.add(w)
    assert hub.next_deadline() == 10
    assert [w.target for w in hub.take_expired(20)] == [1, 2]
    assert hub.next_deadline() == 30


def test_a_discarded_waiter_leaves_no_trace():
    hub = Hub()
    w = Waiter(q("a", "b"), 10, "w")
    hub.add(w)
    assert hub.discard(w)
    assert not hub.discard(w)
    assert len(hub) == 0 and hub.next_deadline() is None
    assert hub.take_matching(msg(1, "a")) == [] and hub._by_channel == {}


def test_a_discarded_waiter_behind_a_held_one_lets_go_of_its_connection():
    # its deadline entry stays in the index until the earlier one is gone
    # (issue 26: it held the aborted poll's connection until then)
    hub = Hub()
    held, gone = Waiter(q("a"), 10, "held"), Waiter(q("a"), 20, "gone")
    hub.add(held)
    hub.add(gone)
    assert hub.discard(gone)
    assert gone.target is None
    assert hub.next_deadline() == 10 and held.target == "held"
    assert hub.take_expired(30) == [held]


def test_closing_a_channel_takes_its_waiters_and_drain_takes_all():
    hub = Hub()
    a, b = Waiter(q("a"), 10, "a"), Waiter(q("b"), 10, "b")
    hub.add(a)
    hub.add(b)
    assert hub.take_channel("a") == [a]
    assert hub.take_all() == [b]
    assert len(hub) == 0


def test_a_large_fan_out_takes_its_waiters_and_keeps_everyone_else_in_order():
    hub = Hub()
    hot = [Waiter(q("hot"), 100 + i, f"h{i}") for i in range(300)]
    cold = [Waiter(q("cold"), 50 + 3 * i, f"c{i}") for i in range(100)]
    for w in hot + cold:
        hub.add(w)
    assert hub.take_matching(msg(1, "hot")) == hot
    assert len(hub) == 100 and hub.waiting_on("hot") == 0
    assert [w.target for w in hub.take_expired(56)] == ["c0", "c1", "c2"]
    assert hub.discard(cold[3]) and not hub.discard(hot[0])
    assert [w.target for w in hub.take_all()] == [f"c{i}" for i in range(4, 100)]
