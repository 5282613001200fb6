"""PeerLink's own bookkeeping (the link's HTTP behaviour is covered by tests/cluster)."""

from twisted.internet.task import Clock

from pushup.config import load
from pushup.model import Draft, Origin
from pushup.peers import PeerLink
from pushup.store import Retention, Store

S = 1_000_000


def link(max_ops: int = 10_000) -> PeerLink:
    store = Store(Retention(3600 * S, 3600 * S, 100, 10**9), Origin("me", 0))
    return PeerLink("http://127.0.0.1:1/", store, "secret", http=None, clock=Clock(),
                    max_ops=max_ops)


def test_the_channel_op_queue_is_bounded_by_peer_queue_and_drops_the_oldest():
    peer = link(max_ops=load(["serve", "--peer-queue", "2"], {}).peer_queue)
    for name in ("a", "b", "c"):
        peer.add_op(("delete", 0, name))
    assert [op[2] for op in peer.ops] == ["b", "c"] and peer.dropped_ops == 1


def test_queued_counts_our_messages_the_peer_has_not_confirmed():
    peer = link()
    peer.store.publish([Draft(("x",), b"1"), Draft(("x",), b"2")], 10 * S)
    assert peer.queued == 2 and peer.stats()["state"] == "connecting"
    peer.after = 1
    assert peer.queued == 1 and peer.url == "http://127.0.0.1:1"
