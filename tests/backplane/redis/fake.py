"""A fake of the Redis (Cluster) client the engine's parts talk to (``Shards``),
on a ``task.Clock``: Redis's keyspace as the Lua scripts keep it, and two
connections whose traffic the test moves one step at a time.

The rule: a command runs when it is sent (Redis runs commands in the order they
arrive), and its reply waits in the command connection's queue until the test
``answer``s it; a notification a script sends (``SPUBLISH``) and Redis's
confirmation of a ``subscribe`` wait in the subscriber connection's queue until
the test ``push``es them. Any interleaving of the two connections is a choice of
the test, each connection keeping its own order (the test may break even that,
``reorder``). ``EVALSHA`` of a script this fake knows (``partitions.py``'s
``PUBLISH`` and ``CHECK`` in fake_partitions.py, the Durable Streams' in
fake_streams.py) answers what the script would return, with the writes it
would make; a test injects an error or a reply of its own (``fail_next``,
``reply_next``), drops a connection (``drop_commands``, ``drop_subscriber``:
what is queued is lost, a subscriber's subscriptions confirmed again once back,
the re-sync) and loses what Redis held (``lose``).

The fake stands beside the real Redis, not for it: it makes the engine's state
machine deterministic, while the real-Redis tests (test_engine.py,
test_scripts.py, test_cluster.py and tests/cluster/) stay for what only Redis
proves: the Lua scripts themselves, the bytes on the wire, MOVED and failovers
in a live cluster.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from pushup.backplane.redis import engine as engine_module
from pushup.backplane.redis.client import RedisGone, RedisNotSent
from pushup.backplane.redis.engine import RedisEngine
from pushup.backplane.redis.partitions import (
    CHECK_SHA,
    PUBLISH_SHA,
    READ_CHANNELS_SHA,
    partition_of,
    partition_tags,
)
from pushup.config import Config
from pushup.core.model import Origin
from pushup.core.service import Service
from pushup.core.store import Retention, Store
from tests.backplane.redis import fake_partitions
from tests.backplane.redis.fake_streams import SCRIPTS as STREAM_SCRIPTS

S = 1_000_000  # µs
MOST_STEPS = 100_000  # settle()'s bound: a test that loops this long is a bug


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)



@dataclass
class _Subscription:
    on_message: Callable[[bytes], None]
    on_synced: Callable[[], None]
    live: bool = True  # its connection is up (else Redis sends it nothing)
    on_lost: Callable[[], None] | None = None


@dataclass
class _Push:
    channel: bytes
    kind: str  # "synced" or "message"
    payload: bytes = b""
    to: _Subscription | None = None  # the subscription it was queued for


@dataclass
class Keyspace:
    """What Redis holds: streams (entry seq -> fields), hashes, strings."""

    streams: dict[str, list[tuple[int, list[bytes]]]] = field(default_factory=dict)
    hashes: dict[str, dict[bytes, bytes]] = field(default_factory=dict)
    strings: dict[str, bytes] = field(default_factory=dict)
    lists: dict[str, list[bytes]] = field(default_factory=dict)


@dataclass
class _Redis:
    """One Redis several clients (nodes) share: its keyspace and clock."""

    data: Keyspace = field(default_factory=Keyspace)
    appended: list[str] = field(default_factory=list)  # every message's id appended
    time_us: int = 0  # its clock's last reading
    clients: list[FakeShards] = field(default_factory=list)


class FakeShards:
    """``Shards`` as the engine uses it (see the module's rule). ``log`` lists
    every command run, by name ("PUBLISH", "CHECK", "XRANGE", ...). ``redis``:
    another node's client, whose Redis this one shares (each has its own
    connections; ``settle`` moves them all)."""

    def __init__(self, clock: Clock, *, replicas: int = 0,
                 redis: FakeShards | None = None) -> None:
        self.clock = clock
        self.shared = _Redis() if redis is None else redis.shared
        self.shared.clients.append(self)
        self.replicas = replicas  # what ROLE says the primary has
        self.acks: int | None = None  # what WAIT answers (None: every replica)
        self.log: list[str] = []
        self.commands_up = True
        self.subscriber_up = True
        self.replies: deque[tuple[defer.Deferred[Any], Any]] = deque()
        self.pushes: list[_Push] = []
        self.subscriptions: dict[bytes, _Subscription] = {}
        self._failures: dict[str, list[tuple[Exception, bool]]] = {}
        self._scripted: dict[str, list[Any]] = {}

    @property
    def data(self) -> Keyspace:
        return self.shared.data

    @property
    def appended(self) -> list[str]:
        """Every message's id a script appended, in order."""
        return self.shared.appended

    # -- Shards' interface ------------------------------------------------------

    connected = property(lambda self: self.commands_up and self.subscriber_up)
    probes_failed = 0
    clustered = False

    def start(self) -> None:
        pass

    def topology_read(self) -> defer.Deferred[None]:
        return defer.succeed(None)

    def stop(self) -> defer.Deferred[None]:
        return defer.succeed(None)

    def primaries(self) -> list[str]:
        return ["fake:6379"]

    def probe(self, timeout: float = 2.0) -> defer.Deferred[list[dict[str, Any]]]:
        state = "up" if self.connected else "down"
        return defer.succeed([{"address": "fake:6379", "state": state, "slots": 16384}])

    def evalsha(self, sha: str, script: str | bytes, keys: Sequence[Any], args: Sequence[Any],
                timeout: float | None = None) -> defer.Deferred[Any]:
        scripts: dict[str, tuple[str, Any]] = {
            PUBLISH_SHA: ("PUBLISH", fake_partitions.publish),
            CHECK_SHA: ("CHECK", fake_partitions.check),
            READ_CHANNELS_SHA: ("READ", fake_partitions.read_channels),
            **STREAM_SCRIPTS}
        name, run = scripts.get(sha, (f"EVALSHA {sha}", None))
        return self._run(name, lambda: self._unknown(name) if run is None
                         else run(self, [_text(k) for k in keys], list(args)))

    def execute(self, key: Any, *args: Any, timeout: float | None = None) -> defer.Deferred[Any]:
        name = _text(args[0]).upper()
        run = getattr(self, f"_{name.lower()}", None)
        return self._run(name, lambda: self._unknown(name) if run is None
                         else run(*(_text(a) if isinstance(a, bytes) else a for a in args[1:])))

    def subscribe(self, channel: str | bytes, on_message: Callable[[bytes], None],
                  on_synced: Callable[[], None],
                  on_lost: Callable[[], None] | None = None) -> None:
        name = _bytes(channel)
        sub = self.subscriptions[name] = _Subscription(on_message, on_synced, self.subscriber_up,
                                                       on_lost)
        if sub.live:
            self.pushes.append(_Push(name, "synced", to=sub))

    def unsubscribe(self, channel: str | bytes) -> None:
        self.subscriptions.pop(_bytes(channel), None)

    # -- what the test does -----------------------------------------------------

    def fail_next(self, name: str, error: Exception, *, ran: bool = False) -> None:
        """The next command ``name`` fails with ``error``; with ``ran``, it ran
        first (a reply lost: the write is in Redis)."""
        self._failures.setdefault(name, []).append((error, ran))

    def reply_next(self, name: str, reply: Any) -> None:
        """The next command ``name`` answers ``reply`` without running."""
        self._scripted.setdefault(name, []).append(reply)

    def answer(self) -> bool:
        """Deliver the oldest reply on the command connection; False if none."""
        if not self.replies:
            return False
        d, outcome = self.replies.popleft()
        if isinstance(outcome, Exception):
            d.errback(outcome)
        else:
            d.callback(outcome)
        return True

    def push(self, channel: str | bytes | None = None) -> bool:
        """Deliver the oldest push on the subscriber connection (of ``channel``
        only, as when each channel is on another primary); False if none."""
        for i, pushed in enumerate(self.pushes):
            if channel is None or pushed.channel == _bytes(channel):
                del self.pushes[i]
                sub = self.subscriptions.get(pushed.channel)
                if sub is None or sub is not pushed.to:
                    return True  # unsubscribed meanwhile (or again): Redis sends it no more
                if pushed.kind == "synced":
                    sub.on_synced()
                else:
                    sub.on_message(pushed.payload)
                return True
        return False

    def outcome(self, d: defer.Deferred[Any]) -> Any:
        """``d``'s result once everything queued is delivered: its value, or
        the exception it failed with."""
        self.settle()
        assert d.called, "no outcome once the fake Redis settled"
        box: list[Any] = []
        d.addBoth(box.append)
        return box[0].value if isinstance(box[0], Failure) else box[0]

    def reorder(self, i: int, j: int) -> None:
        """Swap two queued pushes (which no one connection would)."""
        self.pushes[i], self.pushes[j] = self.pushes[j], self.pushes[i]

    def settle(self) -> int:
        """Deliver everything queued to every client of this Redis, and what that
        sends, replies first; the steps."""
        for steps in range(MOST_STEPS):
            if not any(c.answer() or c.push() for c in self.shared.clients):
                return steps
        raise AssertionError("the fake Redis never settled")

    def drop_commands(self) -> None:
        """The command connection goes: replies queued are lost (the commands
        ran), and commands fail at once until ``reconnect``."""
        self.commands_up = False
        replies, self.replies = self.replies, deque()
        for d, _ in replies:
            d.errback(RedisGone("connection lost"))

    def drop_subscriber(self) -> None:
        """The subscriber connection goes: what it had queued is lost, and
        nothing reaches a subscription until ``reconnect``."""
        self.subscriber_up = False
        self.pushes = []
        for sub in self.subscriptions.values():
            sub.live = False
            if sub.on_lost is not None:
                sub.on_lost()

    def reconnect(self) -> None:
        """Both connections are up; each subscription is subscribed again
        (``on_synced`` once Redis confirms it, a ``push``)."""
        self.commands_up = True
        if not self.subscriber_up:
            self.subscriber_up = True
            for name, sub in list(self.subscriptions.items()):
                fresh = self.subscriptions[name] = _Subscription(sub.on_message, sub.on_synced,
                                                                 True, sub.on_lost)
                self.pushes.append(_Push(name, "synced", to=fresh))

    def publish_elsewhere(self, tag: str, channels: Sequence[str], data: bytes, *,
                          maxlen: int = 10_000) -> None:
        """Another node's publish to partition ``tag``: it runs now (that node
        holds nothing of the log), its notification is queued."""
        prefix = f"pushup:{{{tag}}}:"
        keys = [prefix + k for k in ("log", "meta", "channels", "foreign")]
        fake_partitions.publish(self, keys, [7, maxlen, "", 0, "", 0, 7_200_000,
                                             "m", json.dumps(list(channels)), data])

    def lose(self, tag: str, keep: int = 0) -> None:
        """Redis lost what it held of partition ``tag``: all of it (restarted
        empty), or with ``keep``, every entry past the first ``keep`` (a replica
        that lagged, promoted). Either drops both connections, as a restart or a
        failover does, for every client (``reconnect``): no reply crosses a loss."""
        prefix = f"pushup:{{{tag}}}:"
        for client in self.shared.clients:
            client.drop_commands()
            client.drop_subscriber()
        self.shared.time_us += 1000
        if keep == 0:
            for held in (self.data.streams, self.data.hashes, self.data.strings):
                for key in [k for k in held if k.startswith(prefix)]:
                    del held[key]
            return
        log = self.data.streams.get(prefix + "log", [])
        del log[keep:]
        meta = self.data.hashes[prefix + "meta"]
        meta[b"s"] = b"%d" % log[-1][0]
        for key, own in self.data.streams.items():  # each channel's own stream too
            if key.startswith(prefix + "c:"):
                own[:] = [(seq, f) for seq, f in own if seq <= log[-1][0]]

    def origin(self, tag: str) -> str:
        """Partition ``tag``'s origin as Redis holds it now: ``<tag>.<epoch>``."""
        epoch = self.data.hashes.get(f"pushup:{{{tag}}}:meta", {}).get(b"e", b"")
        return f"{tag}.{epoch.decode()}"

    def entries(self, tag: str) -> list[tuple[int, dict[str, str]]]:
        """Partition ``tag``'s log as Redis holds it: (seq, fields)."""
        return [(seq, {_text(k): _text(v) for k, v in zip(f[::2], f[1::2], strict=True)})
                for seq, f in self.data.streams.get(f"pushup:{{{tag}}}:log", [])]

    # -- running a command ------------------------------------------------------

    def _run(self, name: str, run: Callable[[], Any]) -> defer.Deferred[Any]:
        self.log.append(name)
        if not self.commands_up:
            return defer.fail(RedisNotSent("not connected to fake:6379"))
        failures = self._failures.get(name)
        scripted = self._scripted.get(name)
        if failures:
            error, ran = failures.pop(0)
            if isinstance(error, RedisNotSent):
                return defer.fail(error)  # never written: it fails at once, as client.py's
            if ran:
                self._outcome(run)
            outcome: Any = error
        elif scripted:
            outcome = scripted.pop(0)
        else:
            outcome = self._outcome(run)
        d: defer.Deferred[Any] = defer.Deferred()
        self.replies.append((d, outcome))
        return d

    @staticmethod
    def _outcome(run: Callable[[], Any]) -> Any:
        try:
            return run()
        except Exception as error:  # Redis's error reply (e.g. a script's EXISTS)
            return error

    @staticmethod
    def _unknown(name: str) -> Any:
        raise AssertionError(f"the fake Redis does not know {name}: script its reply")

    def _now_us(self) -> int:
        """Redis's TIME: the clock's, never back (a restart takes a millisecond at least)."""
        shared = self.shared
        shared.time_us = max(shared.time_us + 1, int(round(self.clock.seconds() * S)))
        return shared.time_us

    def _spublish(self, channel: str, payload: bytes) -> int:
        """Queue ``payload`` for every client subscribed to ``channel``."""
        told = 0
        for client in self.shared.clients:
            sub = client.subscriptions.get(channel.encode())
            if sub is not None and sub.live:
                client.pushes.append(_Push(channel.encode(), "message", payload, sub))
                told += 1
        return told

    # -- commands ---------------------------------------------------------------

    def _xrange(self, key: str, start: str, end: str, *count: Any) -> list[Any]:
        """``XRANGE key start end [COUNT n]`` of ``<seq>-0`` ids ("(" exclusive)."""
        low = 0 if start == "-" else int(start.lstrip("(").split("-")[0]) + start.startswith("(")
        page = [[b"%d-0" % seq, list(fields)]
                for seq, fields in self.data.streams.get(key, []) if seq >= low]
        return page[:int(count[1])] if count else page

    def _hgetall(self, key: str) -> list[bytes]:
        return [x for k, v in self.data.hashes.get(key, {}).items() for x in (k, v)]

    def _set(self, key: str, value: Any, *flags: str) -> Any:
        before = self.data.strings.get(key)
        if before is None or "NX" not in flags:
            self.data.strings[key] = _bytes(value)
        return before if "GET" in flags else b"OK"

    def _role(self) -> list[Any]:
        return [b"master", 0, [[b"127.0.0.1", b"6380", b"0"]] * self.replicas]

    def _wait(self, need: int, timeout_ms: int) -> int:
        return self.replicas if self.acks is None else self.acks

    def _ping(self) -> bytes:
        return b"PONG"


def tag_of(channel: str, partitions: int) -> str:
    """The hash tag of the partition ``channel`` lives in, of ``partitions``."""
    return partition_tags(partitions)[partition_of(channel, partitions)]


def service_on(clock: Clock, name: str = "a") -> Service:
    """A node's service on ``clock``: an hour's retention, 1000 messages a channel."""
    store = Store(Retention(3600 * S, 3600 * S, 1000, 10**9), Origin(name, 1))
    return Service(store, clock, 60.0)


@contextmanager
def _shards_are(fake: FakeShards) -> Iterator[None]:
    """While an engine is made, its ``Shards`` is ``fake``: the engine builds its
    client from its seeds, and this is the one place that knows it."""
    with mock.patch.object(engine_module, "Shards", lambda seeds, reactor: fake):
        yield


def engine_on(fake: FakeShards, *, name: str = "a", partitions: int = 4,
              **settings: Any) -> RedisEngine:
    """A started ``RedisEngine`` whose Redis is ``fake`` (its parts made as the
    engine makes them), on the fake's clock."""
    config = Config(node_id=name, engine="redis://fake:6379", redis_partitions=partitions,
                    **settings)
    with _shards_are(fake):
        engine = RedisEngine(service_on(fake.clock, name), config, fake.clock)
    started = engine.start()
    fake.settle()
    assert started.called, "the engine did not start on the fake Redis"
    return engine


def node_on(fake: FakeShards, name: str = "a", **settings: Any) -> Any:
    """A started in-memory node (tests/conftest.py's ``Harness``) whose Redis is
    ``fake``, on the fake's clock: its requests are answered once the fake settles."""
    from tests.conftest import Harness

    config = Config(node_id=name, engine="redis://fake:6379", **settings)
    with _shards_are(fake):
        harness = Harness(config, clock=fake.clock)
    started = harness.node.start()
    fake.settle()
    assert started.called, "the node did not start on the fake Redis"
    return harness
