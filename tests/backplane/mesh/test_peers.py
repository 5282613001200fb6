"""PeerLink's own bookkeeping (the link's HTTP behaviour is covered by tests/cluster)."""

from collections.abc import Callable

from twisted.internet.task import Clock

from pushup.backplane.mesh.peers import PeerLink
from pushup.config import load
from pushup.core.model import Draft, Origin
from pushup.core.store import Retention, Store
from tests.backplane.mesh.pipe import Pipe

S = 1_000_000


def link(max_ops: int = 10_000) -> PeerLink:
    store = Store(Retention(3600 * S, 3600 * S, 100, 10**9), Origin("me", 0))
    return PeerLink("http://127.0.0.1:1/", store, "secret", http=None, clock=Clock(),
                    max_ops=max_ops)


def test_the_channel_op_queue_is_bounded_by_peer_queue_and_drops_the_oldest():
    peer = link(max_ops=load(["serve", "--peer-queue", "2"], {}).peer_queue)
    for name in ("a", "b", "c"):
        peer.add_op(("delete", 0, name))
    assert [op[2] for op in peer.outbound.ops] == ["b", "c"] and peer.outbound.dropped_ops == 1


def test_queued_counts_our_messages_the_peer_has_not_confirmed():
    peer = link()
    peer.store.publish([Draft(("x",), b"1"), Draft(("x",), b"2")], 10 * S)
    assert peer.queued == 2 and peer.stats()["state"] == "connecting"
    peer.outbound.after = 1
    assert peer.queued == 1 and peer.url == "http://127.0.0.1:1"


def _linked(sender: Store, clock: Clock) -> tuple[Store, Pipe, PeerLink]:
    """A started link from ``sender`` to a receiving node's Mesh, run once."""
    from pushup.backplane.mesh.mesh import Mesh
    from pushup.config import Config
    from pushup.core.service import Service

    receiver_store = Store(Retention(3600 * S, 3600 * S, 100, 10**9), Origin("b", 0))
    receiver = Mesh(Service(receiver_store, clock, 120), Config(cluster_secret="s"),
                       clock, http=None)
    wire = Pipe(receiver)
    peer = PeerLink("http://b", sender, "s", http=wire, clock=clock, dial=wire.dial)
    peer.start()
    clock.advance(0)
    wire.deliver()  # handshake, the hello batch, its answer
    return receiver_store, wire, peer


def test_a_peer_behind_history_we_no_longer_hold_is_told_to_skip_and_sees_a_gap():
    from pushup.core.cursor import Cursor
    from pushup.core.model import Query

    clock = Clock()
    clock.advance(1_700_000_000)
    now = 1_700_000_000 * S
    sender = Store(Retention(10 * S, 3600 * S, 100, 10**9), Origin("a", 0))
    sender.publish([Draft(("x",), b"%d" % i) for i in range(5)], now)
    sender.expire(now + 11 * S, busy=lambda name: True)  # all five evicted here
    assert sender.message_count == 0 and sender.own_seq == 5

    receiver_store, wire, peer = _linked(sender, clock)
    assert receiver_store.horizon_of(sender.origin_name) == 5 and peer.after == 5
    assert peer.queued == 0 and wire.posts == 1  # one batch, no loop
    behind = receiver_store.query(Query(("x",), Cursor(()), None, 10))
    assert behind.gap and behind.messages == ()


def test_an_idle_link_sends_new_messages_on_this_reactor_turn_in_one_batch():
    from pushup.backplane.mesh.peers import HEARTBEAT

    clock = Clock()
    clock.advance(1_700_000_000)
    sender = Store(Retention(3600 * S, 3600 * S, 100, 10**9), Origin("a", 0))
    receiver_store, wire, peer = _linked(sender, clock)  # idle now: next run, the heartbeat
    posts = wire.posts
    sender.publish([Draft(("x",), b"1"), Draft(("x",), b"2")], int(clock.seconds() * S))
    peer.poke()
    peer.poke()
    clock.advance(0)  # no linger: the end of this turn, long before HEARTBEAT
    wire.deliver()
    assert receiver_store.horizon_of(sender.origin_name) == 2 and HEARTBEAT > 0
    assert wire.posts == posts + 1  # one batch carrying both


def test_a_peer_request_that_gets_no_answer_is_cancelled_on_the_links_clock():
    """The link's timeout is a timer on its injected clock (the node's reactor,
    here a ``task.Clock``), not on the global reactor behind its back."""
    from treq.client import HTTPClient
    from twisted.internet import defer, reactor

    class Silent:  # an IAgent whose requests are never answered
        def request(self, method, uri, headers=None, bodyProducer=None):
            return defer.Deferred()

    store = Store(Retention(3600 * S, 3600 * S, 100, 10**9), Origin("me", 0))
    clock = Clock()
    before = len(reactor.getDelayedCalls())
    peer = PeerLink("http://127.0.0.1:1", store, "secret", http=HTTPClient(Silent()),
                    clock=clock, timeout=10.0)
    failures: list = []
    peer.request("POST", "/peer/messages", b"{}").addErrback(failures.append)
    assert len(reactor.getDelayedCalls()) == before
    clock.advance(10)
    assert len(failures) == 1 and failures[0].check(defer.CancelledError)


def test_the_log_tells_each_peer_state_once_and_down_only_after_down_log_after():
    from twisted.logger import globalLogPublisher

    from pushup.backplane.mesh.status import DOWN_LOG_AFTER

    peer = link()
    clock = peer.clock
    said: list[str] = []

    def observe(event):
        if event.get("log_namespace") == "pushup.backplane.mesh.peers":
            said.append(f"{event['log_level'].name} {event.get('state')}")

    globalLogPublisher.addObserver(observe)
    try:
        # Starting: the peer is not there yet; failures each second say nothing...
        for _ in range(int(DOWN_LOG_AFTER) - 1):
            clock.advance(1)
            peer.set_state("down", "connection refused")
        assert said == []
        peer.set_state("up")  # ...and it comes: one line
        assert said == ["info up"]
        peer.set_state("connecting", "connection lost")  # lost: one line...
        for _ in range(int(DOWN_LOG_AFTER) - 1):
            clock.advance(1)
            peer.set_state("down", "connection refused")
        assert said == ["info up", "info connecting"]
        clock.advance(1)  # ...down once DOWN_LOG_AFTER has passed, once
        for _ in range(5):
            peer.set_state("down", "connection refused")
            clock.advance(1)
        assert said == ["info up", "info connecting", "warn down"]
        peer.set_state("up")
        peer.set_state("up")
        assert said == ["info up", "info connecting", "warn down", "info up"]
    finally:
        globalLogPublisher.removeObserver(observe)


def test_a_signed_peer_request_is_stamped_by_the_links_clock():
    """The peer checks the stamp against its own clock: the link stamps with
    the one it was given (the node's reactor), never the wall clock behind it."""
    from twisted.internet import defer

    from pushup.backplane.mesh.wire import verify

    class Recording:  # a treq-like client that answers 200 and keeps what it was asked
        def __init__(self) -> None:
            self.asked: list[tuple[str, str, dict]] = []

        def request(self, method, url, data=None, headers=None, timeout=None, reactor=None):
            self.asked.append((method, url, headers))

            class Answer:
                code = 200

                def content(self):
                    return defer.succeed(b"{}")

            return defer.succeed(Answer())

    clock = Clock()
    clock.advance(1000)
    http = Recording()
    store = Store(Retention(3600 * S, 3600 * S, 100, 10**9), Origin("me", 0))
    peer = PeerLink("http://127.0.0.1:1", store, "secret", http=http, clock=clock)
    answered: list = []
    peer.request("POST", "/peer/repair", b"{}").addCallback(answered.append)
    [(method, url, headers)] = http.asked
    assert answered == [(200, b"{}")] and url == "http://127.0.0.1:1/peer/repair"
    assert headers["X-PushUp-Time"] == ["1000"]
    assert verify("secret", "POST", "/peer/repair", headers["X-PushUp-Time"][0], b"{}",
                  headers["X-PushUp-Signature"][0], now_s=clock.seconds())


def _run_timers(clock: Clock, until: Callable[[], bool], most: int) -> None:
    """Advance ``clock`` to each timer in turn until ``until()`` (``most`` turns at most)."""
    for _ in range(most):
        if until():
            return
        calls = clock.getDelayedCalls()
        assert calls, "no timer left: nothing will ever run again"
        clock.advance(max(0.0, min(c.getTime() for c in calls) - clock.seconds()))
    raise AssertionError(f"not done after {most} timers")


def test_a_peer_dead_for_thousands_of_attempts_is_dialled_at_the_capped_interval_forever():
    """Past 1,024 failures ``0.1 * 2 ** failures`` overflowed a float: the
    link raised in its errback, logged a traceback per attempt and stopped
    retrying on its backoff. Retries go on at the cap (with its jitter), one
    log line per change of state, until the peer is back."""
    import gc

    from twisted.logger import globalLogPublisher

    from pushup.backplane.mesh.peers import BACKOFF_MAX, JITTER

    clock = Clock()
    clock.advance(1_700_000_000)
    sender = Store(Retention(3600 * S, 3600 * S, 100, 10**9), Origin("a", 0))
    _, wire, peer = _linked(sender, clock)
    assert peer.state == "up"
    dialled: list[float] = []

    def dial(protocol):
        dialled.append(clock.seconds())
        return wire.dial(protocol)

    peer.dial = dial
    said: list[str] = []
    failures: list[str] = []

    def observe(event):
        if "log_failure" in event:
            failures.append(event["log_failure"].getTraceback())
        if event.get("log_namespace") == "pushup.backplane.mesh.peers":
            said.append(f"{event['log_level'].name} {event.get('state')}")

    globalLogPublisher.addObserver(observe)
    try:
        wire.dead = True  # SIGKILLed: the connection drops, every dial is refused
        _run_timers(clock, lambda: len(dialled) >= 2_100, most=10_000)
        gc.collect()  # a Deferred's unhandled failure is logged when it is collected
        assert failures == []
        assert peer.state == "down" and peer.stats()["dials"] >= 2_100
        gaps = [b - a for a, b in zip(dialled[20:], dialled[21:], strict=False)]
        low, high = (1 - JITTER) * BACKOFF_MAX, BACKOFF_MAX
        assert all(low - 1e-6 <= gap <= high + 1e-6 for gap in gaps), (min(gaps), max(gaps))
        assert said == ["info connecting", "warn down"]  # lost, then down: once each

        wire.dead = False  # back: the next attempt (its own timer) finds it
        attempts = len(dialled)
        _run_timers(clock, lambda: wire.client is not None, most=2)
        wire.deliver()
        assert peer.state == "up" and len(dialled) == attempts + 1
        assert said == ["info connecting", "warn down", "info up"]
    finally:
        globalLogPublisher.removeObserver(observe)
