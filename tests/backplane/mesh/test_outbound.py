"""Outbound: what a link owes its peer, across connections, and its invariants.

Driven as a value: a store, batches taken, answers given; no link, no socket.
"""

import pytest

from pushup.backplane.mesh.outbound import Outbound, PeerError
from pushup.core.channels import ChannelOp
from pushup.core.model import Draft, Origin
from pushup.core.store import Retention, Store

S = 1_000_000


def _outbound(published: int = 0) -> Outbound:
    store = Store(Retention(3600 * S, 3600 * S, 1000, 10**9), Origin("a", 0))
    for i in range(published):
        store.publish([Draft(("x",), b"%d" % i)], 10 * S)
    return Outbound(store, sibling=False, max_ops=100)


def _take(outbound: Outbound) -> tuple[bytes, int]:
    batch = outbound.take(0.0, hello=False)
    assert batch is not None
    return batch


# -- the invariants, each caught by ``check`` --------------------------------------


def test_an_ack_past_what_we_published_is_a_counted_violation_and_moves_nothing():
    outbound = _outbound(published=3)
    _take(outbound)
    with pytest.raises(PeerError, match="past the last we have"):
        outbound.answer(b"a", 4)
    assert outbound.violations == 1 and outbound.after == 0 and outbound.holds == 0
    assert len(outbound.in_flight) == 1  # the batch is still unanswered


def test_a_hole_past_what_we_published_is_a_violation_too():
    outbound = _outbound(published=3)
    _take(outbound)
    with pytest.raises(PeerError, match="past the last we have"):
        outbound.answer(b"n", 5)  # "I expect 5": it claims to hold 4
    assert outbound.violations == 1 and outbound.after == 0


def test_sending_past_what_we_published_is_caught():
    outbound = _outbound(published=3)
    outbound.next = 4
    with pytest.raises(AssertionError, match="sent up to 4, past 3"):
        outbound.check(outbound.after)


def test_more_batches_in_flight_than_the_window_is_caught():
    outbound = _outbound(published=3)
    _take(outbound)
    outbound.window = 0
    with pytest.raises(AssertionError, match="1 batches in flight"):
        outbound.check(outbound.after)


def test_bytes_counted_in_flight_with_no_batch_in_flight_are_caught():
    outbound = _outbound(published=3)
    outbound.in_flight_bytes = 10
    with pytest.raises(AssertionError, match="bytes in flight, no batch"):
        outbound.check(outbound.after)


# -- what survives a connection -------------------------------------------------------


def test_a_lost_connection_sends_again_from_what_the_peer_holds_ops_first_in_order():
    outbound = _outbound(published=4)
    outbound.cork = 0
    outbound.ops.append(ChannelOp("delete", "first", 4))
    _take(outbound)
    assert outbound.answer(b"a", 4) == ("acked", True)
    outbound.ops.append(ChannelOp("delete", "second", 4))
    outbound.ops.append(ChannelOp("delete", "third", 4))
    body, carried = _take(outbound)
    assert carried == 0 and not outbound.ops and outbound.in_flight_bytes == len(body)
    outbound.ops.append(ChannelOp("delete", "fourth", 4))
    outbound.rewind()
    assert [op.name for op in outbound.ops] == ["second", "third", "fourth"]
    assert not outbound.in_flight and outbound.in_flight_bytes == 0
    assert outbound.next == outbound.after == 4 and outbound.accepted == 4
