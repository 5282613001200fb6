"""pushup/core/follow.py and ``Service.follow``: another origin's log, in both
engines' shapes, kept gap-free.

The mesh's shape: batches of messages with channel operations that take no
sequence number, sent from anywhere in the log (a resend, a late duplicate,
one past a hole), and resent from where a ``Hole`` says. The Redis log's
shape: pages read in order from a log whose head may have been trimmed, with
operations that take a sequence number of their own. Either way the node
holds every entry once, in order, never past a hole, and says a gap where
history was trimmed.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from pushup.core.channels import ChannelOp
from pushup.core.follow import Applied, Hole, LoggedOp, Place, Skip, place
from pushup.core.idempotency import Remembered
from pushup.core.model import Message, Origin, Query
from pushup.core.service import Service
from pushup.core.store import Retention, Store

S = 1_000_000
T0 = 1_763_800_000 * S
PEER = "peer.1"  # the origin followed


def service() -> Service:
    clock = Clock()
    clock.advance(T0 / S + 1)
    store = Store(Retention(3600 * S, 3600 * S, 10_000, 10**9), Origin("me", T0))
    return Service(store, clock, 120)


def message(seq: int) -> Message:
    return Message(PEER, seq, T0 + seq, ("c",), b"%d" % seq)


def held(s: Service) -> list[int]:
    """The sequence numbers of the followed origin's messages the node holds, in order."""
    answer = s.store.query(Query(("c", "ops"), 0, None, 100_000))
    return [m.seq for m in answer.messages if m.origin == PEER]


def test_place_is_the_gap_free_rule() -> None:
    assert [place(seq, 5) for seq in (4, 5, 6, 7)] == [
        Place.HELD, Place.HELD, Place.NEXT, Place.AHEAD]


# -- the mesh's shape --------------------------------------------------------


def mesh_log(n: int, ops_after: set[int]) -> list[Message | ChannelOp]:
    """An origin's log as the mesh sends it: messages 1..n, and after each seq
    in ``ops_after`` a renewal of channel ``ops`` stamped with that seq."""
    log: list[Message | ChannelOp] = []
    for seq in range(1, n + 1):
        log.append(message(seq))
        if seq in ops_after:
            log.append(ChannelOp("create", "ops", seq, 3600 * S, T0 + 3600 * S + seq))
    return log


def from_seq(log: list[Message | ChannelOp], start: int) -> list[Message | ChannelOp]:
    """The log from message ``start`` on, with the operations stamped before it
    that come after the previous message (as a link resends)."""
    out = []
    for entry in log:
        seq = entry.seq if isinstance(entry, Message) else entry.at_seq + 1
        if seq >= start:
            out.append(entry)
    return out


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 40), st.sets(st.integers(1, 40)),
       st.lists(st.tuples(st.integers(1, 45), st.integers(1, 12)), max_size=25))
# found by this property: a resend from message 1 applied the renewal after it
# again, over the later one after message 2 the node held already
@example(n=5, ops_after={1, 2}, sends=[(1, 5), (5, 1), (1, 2)])
def test_the_mesh_shape_is_applied_once_in_order_never_past_a_hole(
        n: int, ops_after: set[int], sends: list[tuple[int, int]]) -> None:
    log = mesh_log(n, {seq for seq in ops_after if seq <= n})
    s = service()
    expected = 1
    for start, length in sends:  # any part of the log, at any time
        batch = from_seq(log, start)[:length]
        answer = s.follow(PEER, batch)
        horizon = s.store.horizon_of(PEER)
        assert held(s) == list(range(1, horizon + 1))  # every one once, in order, no hole
        if isinstance(answer, Hole):
            assert answer.expected == horizon + 1
            expected = answer.expected
        else:
            assert answer == Applied(horizon)
    while (answer := s.follow(PEER, from_seq(log, expected))) != Applied(n):  # the link resends
        assert isinstance(answer, Hole)
        expected = answer.expected
    assert held(s) == list(range(1, n + 1))
    last_op = max((seq for seq in ops_after if seq <= n), default=None)
    channel = s.store.channel("ops")
    assert (channel is None) == (last_op is None)
    if channel is not None and last_op is not None:
        assert channel.expires_at == T0 + 3600 * S + last_op  # the last operation is the one held


def test_an_operation_past_the_horizon_is_a_hole_and_applies_nothing_after_it() -> None:
    s = service()
    op = ChannelOp("create", "ops", 2, 60 * S, T0 + 60 * S)
    assert s.follow(PEER, [message(1), op, message(3)]) == Hole(2)
    assert held(s) == [1] and s.store.channel("ops") is None


def test_a_keyed_publish_is_remembered_once_its_last_message_is_held() -> None:
    s = service()
    record = Remembered("k", "f" * 64, PEER, [(1, T0 + 1), (2, T0 + 2)])
    assert s.follow(PEER, [message(1), message(3), record]) == Hole(2)
    assert s.store.keys.records() == []
    assert s.follow(PEER, [message(2), record]) == Applied(2)
    assert [r.key for r in s.store.keys.records()] == ["k"]


def test_a_skip_moves_past_history_gone_everywhere_and_readers_behind_it_get_a_gap() -> None:
    s = service()
    assert s.follow(PEER, [Skip(4, T0 + 4), message(5)]) == Applied(5)
    assert held(s) == [5]
    assert s.store.query(Query(("c",), 0, None, 10)).gap


# -- the Redis log's shape -----------------------------------------------------


def redis_log(n: int, ops_at: set[int]) -> list[Message | LoggedOp]:
    """Entries 1..n of a Redis log: an operation takes a sequence number."""
    return [LoggedOp(seq, T0 + seq, ChannelOp("create", "ops", seq, 3600 * S, T0 + S * seq))
            if seq in ops_at else message(seq) for seq in range(1, n + 1)]


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 40), st.sets(st.integers(1, 40)), st.integers(0, 40),
       st.integers(1, 15))
def test_the_redis_shape_reads_pages_in_order_and_a_trimmed_head_is_one_gap(
        n: int, ops_at: set[int], trimmed: int, page: int) -> None:
    log = redis_log(n, ops_at)
    left = log[min(trimmed, n - 1):]  # the log's head trimmed before the node read it
    s = service()
    for i in range(0, len(left), page):
        assert s.follow(PEER, left[i:i + page], trimmed=True) == Applied(left[i:i + page][-1].seq)
        s.follow(PEER, left[:i + page], trimmed=True)  # a page read again changes nothing
    first = left[0].seq
    messages = [e.seq for e in left if isinstance(e, Message)]
    assert held(s) == messages and s.store.horizon_of(PEER) == n
    assert s.store.query(Query(("c",), 0, None, 100)).gap == (first > 1)
    op_seqs = [e.seq for e in left if isinstance(e, LoggedOp)]
    channel = s.store.channel("ops")
    assert (channel is None) == (not op_seqs)
    if channel is not None:
        assert channel.expires_at == T0 + S * op_seqs[-1]


def test_a_page_past_the_next_without_trimmed_is_a_hole() -> None:
    """This node's own publish, as Redis stamped it, is applied only when next:
    otherwise the tail brings it, in order."""
    s = service()
    assert s.follow(PEER, [message(2)]) == Hole(1)
    assert held(s) == []


def test_a_message_past_this_nodes_message_ttl_is_never_held_and_its_readers_get_a_gap(
        ) -> None:
    """A log read late (a cold read, a peer's catch-up) brings messages older
    than this node's --message-ttl: the horizon moves past them, no reader is
    served one, and a reader behind them is told of the gap, as if the node
    had held them and let them go at their ttl."""
    s = service()
    ttl = s.store.retention.message_ttl
    now = s.now()
    old = Message(PEER, 1, now - ttl - 2 * S, ("c",), b"1")  # 2 s past the ttl
    young = Message(PEER, 2, now - ttl + 2 * S, ("c",), b"2")  # 2 s left
    assert s.follow(PEER, [old, young], trimmed=True) == Applied(2)
    answer = s.store.query(Query(("c",), 0, None, 100))
    assert [m.seq for m in answer.messages] == [2] and answer.gap is True
    assert s.store.message_count == 1
