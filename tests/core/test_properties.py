"""Store + cursor + hub against a plain list model, under random operations.

Two origins publish (one with a skewed clock, applied as a peer would), time
moves, retention evicts, and three clients poll with their cursors and small
limits. Every answer is compared with what the model says it must be, and at
the end every client has received each message of its channels exactly once,
or was told of a gap after that message was evicted.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pushup.core.cursor import Cursor, decode
from pushup.core.hub import Hub, Waiter
from pushup.core.model import Draft, Message, Origin, Query
from pushup.core.store import Retention, Store

CHANNELS = ("a", "b", "c")
CLIENTS = (("a",), ("a", "b"), ("b", "c"))
SECOND = 1_000_000
T0 = 1_700_000_000 * SECOND


class Client:
    def __init__(self, channels: tuple[str, ...]) -> None:
        self.channels = channels
        self.cursor = Cursor(())
        self.received: list[str] = []
        self.last_gap_step = -1
        self.waiter: Waiter | None = None


class StoreMachine(RuleBasedStateMachine):
    @initialize(
        per_channel=st.integers(2, 6),
        max_bytes=st.integers(600, 3000),
        skew=st.integers(-5 * SECOND, 5 * SECOND),
    )
    def setup(self, per_channel: int, max_bytes: int, skew: int) -> None:
        self.now = T0
        self.skew = skew
        retention = Retention(message_ttl=10 * SECOND, channel_ttl=10**6 * SECOND,
                              max_per_channel=per_channel, max_bytes=max_bytes)
        self.store = Store(retention, Origin("local", T0))
        self.peer = Origin("peer", T0)
        self.hub = Hub()
        self.published: dict[str, Message] = {}
        self.first_evicted: dict[tuple[str, str], int] = {}  # (id, channel) -> step
        self.step = 0
        self.clients = [Client(c) for c in CLIENTS]

    # -- the model ---------------------------------------------------------

    def retained(self, channel: str) -> set[str]:
        ch = self.store.channel(channel)
        return {m.id for run in (ch.runs.values() if ch else ()) for m in run}

    def note_evictions(self) -> None:
        for m in self.published.values():
            for c in m.channels:
                key = (m.id, c)
                if key not in self.first_evicted and m.id not in self.retained(c):
                    self.first_evicted[key] = self.step

    def expected(self, client: Client, since: Cursor | int, limit: int) -> list[str]:
        found = {}
        for c in client.channels:
            for mid in self.retained(c):
                m = self.published[mid]
                after = (m.seq > since.position(m.origin) if isinstance(since, Cursor)
                         else m.ts > since)
                if after:
                    found[mid] = m
        return [m.id for m in sorted(found.values(), key=lambda m: m.sort_key)][:limit]

    # -- operations --------------------------------------------------------

    def _arrived(self, messages: list[Message]) -> None:
        self.step += 1
        for m in messages:
            self.published[m.id] = m
        self.note_evictions()
        for m in messages:
            for waiter in self.hub.take_matching(m):
                client = waiter.target
                assert isinstance(client, Client)
                client.waiter = None
                self._poll(client, waiter.query.limit, must_have=m.id)

    @rule(channels=st.sets(st.sampled_from(CHANNELS), min_size=1), size=st.integers(0, 300))
    def publish_local(self, channels: set[str], size: int) -> None:
        draft = Draft(tuple(sorted(channels)), b'"' + b"x" * size + b'"')
        self._arrived(self.store.publish([draft], self.now))

    @rule(channels=st.sets(st.sampled_from(CHANNELS), min_size=1))
    def publish_from_peer(self, channels: set[str]) -> None:
        seq, ts = self.peer.next(self.now + self.skew)
        m = Message(self.peer.name, seq, ts, tuple(sorted(channels)), b"1")
        assert self.store.apply(m, self.now)
        assert not self.store.apply(m, self.now)  # a repeat is ignored
        self._arrived([m])

    @rule(seconds=st.integers(0, 4))
    def time_passes(self, seconds: int) -> None:
        self.now += seconds * SECOND
        self.step += 1
        self.store.expire(self.now, busy=lambda name: True)
        self.note_evictions()

    @rule(i=st.integers(0, len(CLIENTS) - 1), limit=st.integers(1, 4))
    def poll(self, i: int, limit: int) -> None:
        client = self.clients[i]
        if client.waiter is None:
            self._poll(client, limit)

    @rule(i=st.integers(0, len(CLIENTS) - 1), back=st.integers(0, 20))
    def poll_by_time(self, i: int, back: int) -> None:
        client = self.clients[i]
        since = self.now - back * SECOND
        result = self.store.query(Query(client.channels, since, None, 5))
        assert [m.id for m in result.messages] == self.expected(client, since, 5)
        evicted_after = any(self.published[mid].ts > since for mid, c in self.first_evicted
                            if c in client.channels)
        assert result.gap == evicted_after

    def _poll(self, client: Client, limit: int, must_have: str | None = None) -> None:
        query = Query(client.channels, client.cursor, None, limit)
        result = self.store.query(query)
        ids = [m.id for m in result.messages]
        assert ids == self.expected(client, client.cursor, limit)
        if must_have is not None:
            assert must_have in ids or result.gap, "a waiter was woken without its message"
        assert not set(ids) & set(client.received), "a message was delivered twice"
        for o, seq in client.cursor.positions:
            assert result.cursor.position(o) >= seq, "the cursor moved back"
        assert decode(result.cursor.encode()) == result.cursor
        if result.gap:
            # Sound: something on these channels was evicted before we saw it.
            assert any(c in client.channels and mid not in client.received
                       for mid, c in self.first_evicted)
            client.last_gap_step = self.step
        client.received += ids
        client.cursor = result.cursor
        if not ids and not result.gap:
            client.waiter = Waiter(query, self.now + 30 * SECOND, client)
            self.hub.add(client.waiter)

    @invariant()
    def order_and_caps(self) -> None:
        if not hasattr(self, "store"):
            return
        assert self.store.bytes <= self.store.retention.max_bytes
        for ch in map(self.store.channel, self.store.channel_names()):
            assert ch.count <= self.store.retention.max_per_channel
        assert len(self.hub) == sum(c.waiter is not None for c in self.clients)

    def teardown(self) -> None:
        if not hasattr(self, "store"):
            return
        for client in self.clients:
            if client.waiter is not None:
                self.hub.discard(client.waiter)
                client.waiter = None
            for _ in range(1000):
                before = len(client.received)
                self._poll(client, 7)
                if client.waiter is not None:
                    break
                assert len(client.received) > before or client.last_gap_step == self.step
            if client.waiter is not None:
                self.hub.discard(client.waiter)
            wanted = {mid for mid, m in self.published.items()
                      if set(m.channels) & set(client.channels)}
            missed = wanted - set(client.received)
            for mid in missed:
                evicted = [step for (eid, c), step in self.first_evicted.items()
                           if eid == mid and c in client.channels]
                assert evicted, f"{mid} was neither delivered nor evicted"
                assert client.last_gap_step >= min(evicted), f"{mid} was lost silently"
        assert len(self.hub) == 0


StoreMachine.TestCase.settings = settings(max_examples=400, stateful_step_count=50,
                                          deadline=None)
test_store_against_model = StoreMachine.TestCase
