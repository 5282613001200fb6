"""The re-poll fast path and the hub's deadline heap, under random operations.

``Store.query`` answers a cursor at the store's end without reading the
channels (``Store.at_end``). Here peers publish, restart (their old origin is
retired once it holds nothing), lose history everywhere (``skip_to``) and
retention evicts, while readers hold cursors from every point of that history
(answers, the end, one behind the end, a cursor naming a retired origin): the
fast answer is always the one the full scan gives (messages, cursor, gap).

The hub is checked against a plain dict of held waiters: each is taken exactly
once (by a message, its deadline, its channel's close, or a discard), and
timeouts come out earliest first, never early.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pushup.core.cursor import Cursor
from pushup.core.hub import Hub, Waiter
from pushup.core.model import Draft, Message, Origin, Query
from pushup.core.store import Retention, Store

SECOND = 1_000_000
T0 = 1_700_000_000 * SECOND
CHANNELS = ("a", "b", "c")
PEERS = ("p1", "p2")


class FastPathMachine(RuleBasedStateMachine):
    @initialize(per_channel=st.integers(1, 5))
    def setup(self, per_channel: int) -> None:
        self.now = T0
        retention = Retention(message_ttl=20 * SECOND, channel_ttl=10**6 * SECOND,
                              max_per_channel=per_channel, max_bytes=10**6)
        self.store = Store(retention, Origin("local", T0))
        self.peers = {p: Origin(p, T0) for p in PEERS}
        self.boots = 0
        self.cursors: list[Cursor] = [Cursor(())]
        self.fast = 0

    def _note(self, result_cursor: Cursor) -> None:
        self.cursors.append(result_cursor)
        del self.cursors[:-30]

    @rule(channels=st.sets(st.sampled_from(CHANNELS), min_size=1))
    def publish_local(self, channels: set[str]) -> None:
        self.now += 1000
        self.store.publish([Draft(tuple(sorted(channels)), b"1")], self.now)

    @rule(peer=st.sampled_from(PEERS), channels=st.sets(st.sampled_from(CHANNELS), min_size=1))
    def publish_from_peer(self, peer: str, channels: set[str]) -> None:
        self.now += 1000
        origin = self.peers[peer]
        seq, ts = origin.next(self.now)
        assert self.store.apply(Message(origin.name, seq, ts, tuple(sorted(channels)), b"2"),
                                self.now)

    @rule(peer=st.sampled_from(PEERS))
    def peer_restarts(self, peer: str) -> None:
        """A new epoch: the old origin is retired once the store holds none of it."""
        self.boots += 1
        self.now += 1000
        self.peers[peer] = Origin(peer, T0 + self.boots * SECOND)

    @rule(peer=st.sampled_from(PEERS), ahead=st.integers(1, 3))
    def peer_history_lost(self, peer: str, ahead: int) -> None:
        origin = self.peers[peer]
        for _ in range(ahead):
            seq, ts = origin.next(self.now)
        self.store.skip_to(origin.name, seq, ts)

    @rule(seconds=st.integers(1, 25))
    def time_passes(self, seconds: int) -> None:
        self.now += seconds * SECOND
        self.store.expire(self.now, busy=lambda name: True)

    @rule(channels=st.sets(st.sampled_from(CHANNELS), min_size=1), pick=st.integers(0, 29),
          limit=st.integers(1, 4), how=st.sampled_from(["kept", "end", "behind", "retired"]))
    def poll(self, channels: set[str], pick: int, limit: int, how: str) -> None:
        end = self.store.end()
        if how == "kept":
            since = self.cursors[pick % len(self.cursors)]
        elif how == "end":
            since = end
        elif how == "behind":  # one origin one message short of the end
            positions = end.as_dict()
            if positions:
                first = sorted(positions)[pick % len(positions)]
                positions[first] -= 1
            since = Cursor.of(positions)
        else:  # the end, plus a retired origin the store no longer names
            positions = end.as_dict()
            for o in sorted(self.store._origins.retired):
                positions[o] = 1
            since = Cursor.of(positions)
        query = Query(tuple(sorted(channels)), since, None, limit)
        answer = self.store.query(query)
        assert answer == self.store._views.read(query)
        if self.store.at_end(since):
            self.fast += 1
            assert answer.messages == () and not answer.gap and answer.cursor == since
        self._note(answer.cursor)

    @invariant()
    def the_end_is_fast_unless_retired_or_lost(self) -> None:
        if not hasattr(self, "store"):
            return
        end = self.store.end()
        held = end.as_dict()
        lost = self.store._origins.behind_lost(end, lambda o: held.get(o, 0))
        assert self.store.at_end(end) == (not self.store._origins.retired and not lost)


FastPathMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40,
                                             deadline=None)
test_fast_path_answers_as_the_scan_does = FastPathMachine.TestCase


class HubMachine(RuleBasedStateMachine):
    """The hub against a dict of who is held, with which deadline, on which channels."""

    def __init__(self) -> None:
        super().__init__()
        self.hub = Hub()
        self.held: dict[Waiter, None] = {}
        self.taken: set[Waiter] = set()  # kept alive: no id is reused
        self.now = 0
        self.made = 0

    def _took(self, waiters: list[Waiter]) -> None:
        for w in waiters:
            assert w not in self.taken, "a waiter was taken twice"
            assert w in self.held
            self.taken.add(w)
            del self.held[w]

    @rule(channels=st.sets(st.sampled_from(CHANNELS), min_size=1), timeout=st.integers(0, 50))
    def hold(self, channels: set[str], timeout: int) -> None:
        w = Waiter(Query(tuple(sorted(channels)), Cursor(()), None, 10), self.now + timeout, None)
        self.hub.add(w)
        self.held[w] = None

    @precondition(lambda self: bool(self.held))
    @rule(pick=st.integers(0, 10**6))
    def client_goes(self, pick: int) -> None:
        w = list(self.held)[pick % len(self.held)]
        assert self.hub.discard(w)
        assert not self.hub.discard(w)  # once only
        self._took([w])

    @rule(step=st.integers(0, 20))
    def time_passes(self, step: int) -> None:
        self.now += step
        due = self.hub.take_expired(self.now)
        assert [w.deadline for w in due] == sorted(w.deadline for w in due)
        assert set(due) == {w for w in self.held if w.deadline <= self.now}
        self._took(due)

    @rule(channel=st.sampled_from(CHANNELS))
    def message(self, channel: str) -> None:
        m = Message("o.1", 1, 1, (channel,), b"1")
        found = self.hub.take_matching(m)
        assert set(found) == {w for w in self.held if channel in w.query.channels}
        self._took(found)

    @rule(channel=st.sampled_from(CHANNELS))
    def channel_closes(self, channel: str) -> None:
        found = self.hub.take_channel(channel)
        assert set(found) == {w for w in self.held if channel in w.query.channels}
        self._took(found)

    @rule()
    def shutdown(self) -> None:
        everyone = self.hub.take_all()
        assert [w.deadline for w in everyone] == sorted(w.deadline for w in everyone)
        assert set(everyone) == set(self.held)
        self._took(everyone)

    @invariant()
    def figures(self) -> None:
        assert len(self.hub) == len(self.held)
        earliest = min((w.deadline for w in self.held), default=None)
        assert self.hub.next_deadline() == earliest
        for c in CHANNELS:
            assert self.hub.waiting_on(c) == sum(c in w.query.channels for w in self.held)


HubMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
test_hub_takes_each_waiter_exactly_once = HubMachine.TestCase


def test_a_held_repoll_reads_no_channel() -> None:
    """The fast path itself: at the end, ``query`` answers with the very cursor it
    was given (the full scan builds a new one from the channels it merged)."""
    store = Store(Retention(20 * SECOND, 10**6 * SECOND, 10, 10**6), Origin("local", T0))
    store.publish([Draft(("a",), b"1")], T0 + 1)
    end = store.end()
    assert store.query(Query(("a",), end, None, 10)).cursor is end
    assert store._views.read(Query(("a",), end, None, 10)).cursor is not end
    assert store._views.read(Query(("a",), end, None, 10)).cursor == end
