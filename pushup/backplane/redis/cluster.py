"""The Redis a node talks to, one redis-server or every primary of a Redis Cluster,
behind one interface: ``Shards``.

The rule: each command goes to the primary owning its key's slot, and a reply that
says it went to the wrong one is followed (``MOVED``: the slot moved, the map is
read again; ``ASK``: once, to a primary importing the slot; ``TRYAGAIN``: a
multi-key command caught mid-migration, sent again shortly). ``Shards`` puts
together what keeps the rest right: ``slotmap.py`` (who owns each slot),
``pool.py`` (one command and one subscriber connection per primary) and
``subscriptions.py`` (sharded pub/sub). It never interprets what a command does:
errors keep exceptions.py's types (``RedisNotSent``, ``RedisGone``, ``RedisTimeout``,
``RedisError`` and its kinds: ``Moved``, ``Ask`` and ``TryAgain`` are followed here).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet import defer, task
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from pushup.backplane.redis.client import Arg, RedisConnection
from pushup.backplane.redis.exceptions import Moved, Redirected, RedisNotSent, TryAgain
from pushup.backplane.redis.pool import Pool, Primary
from pushup.backplane.redis.slotmap import ShardsRefused, SlotMap
from pushup.backplane.redis.slots import key_slot
from pushup.backplane.redis.subscriptions import Subscriptions
from pushup.config import RedisURL

__all__ = ["Shards", "ShardsRefused", "key_slot"]

MAX_REDIRECTS = 5  # MOVED/ASK followed per command before the caller sees it
TRYAGAIN_DELAY = 0.05  # seconds before retrying a multi-key command caught mid-migration
# ... for up to 0.5 s: a slot in migration answers every multi-key command on
# it (a publish script names several keys of its partition) TRYAGAIN until
# its keys are all on one side; moving a slot's few keys takes milliseconds
# and passes unnoticed, a longer migration is the caller's prompt 503
# (retried by the publisher)
TRYAGAIN_TRIES = 10
PROBE_TIMEOUT = 2.0

Send = Callable[[RedisConnection, bool], Deferred[Any]]  # (connection, asking) -> reply


class Shards:
    """The Redis this node talks to: one redis-server, or every primary of a Redis
    Cluster. ``start``, then ``execute``/``evalsha`` (routed by key) and ``subscribe``
    (sharded pub/sub); ``stop``."""

    def __init__(self, seeds: Sequence[RedisURL], reactor: Any, *, name: str = "") -> None:
        if not seeds:
            raise ValueError("Shards needs at least one seed")
        self._reactor = reactor
        self._name = name or str(seeds[0])
        self._pool = Pool(seeds[0], reactor)
        self._map = SlotMap(seeds, reactor, self._pool, name=self._name)
        self._subscriptions = Subscriptions(self._pool, self._map)

    # -- life -------------------------------------------------------------------------

    def start(self) -> None:
        """Read the topology from a seed and connect to every primary; keep at it."""
        if not self._map.running:
            self._pool.running = True
            self._map.start()
            self._subscriptions.start_probing(self._reactor)

    def topology_read(self) -> Deferred[None]:
        """Fires once the topology has been read (now, if it was); fails with
        ``ShardsRefused`` if this Redis cannot be used as configured."""
        return self._map.read_once()

    def stop(self) -> Deferred[None]:
        """Close every connection; fires once all are closed."""
        self._subscriptions.stop_probing()
        self._map.stop()
        return self._pool.stop()

    # -- what /stats and /health show ---------------------------------------------------

    @property
    def connected(self) -> bool:
        """Every primary's command and subscriber connections are up."""
        return self._map.connected

    def primaries(self) -> list[str]:
        """The primaries owning slots, as host:port (a Unix socket's path)."""
        return self._map.primaries()

    @property
    def probes_failed(self) -> int:
        """Subscriber connections dropped for a liveness PING left unanswered."""
        return self._subscriptions.probes_failed

    @property
    def clustered(self) -> bool:
        """A Redis Cluster (else one redis-server)."""
        return self._map.clustered

    # -- commands ---------------------------------------------------------------------

    def execute(self, key: str | bytes | None, *args: Arg,
                timeout: float | None = None) -> Deferred[Any]:
        """Run a command on the primary owning ``key``'s slot (None: any primary)."""
        def send(connection: RedisConnection, asking: bool) -> Deferred[Any]:
            return connection.execute(*args, timeout=timeout)
        return self._route(key, send, MAX_REDIRECTS)

    def execute_on(self, address: str, *args: Arg,
                   timeout: float | None = None) -> Deferred[Any]:
        """Run a command on the primary at ``address`` (one of ``primaries()``:
        a SCAN walks each in turn); ``RedisNotSent`` if it is not known."""
        primary = self._pool.primaries.get(address)
        if primary is None:
            return defer.fail(RedisNotSent(f"redis {self._name}: no primary {address}"))
        return primary.commands.execute(*args, timeout=timeout)

    def evalsha(self, sha: str, script: str | bytes, keys: Sequence[Arg], args: Sequence[Arg],
                timeout: float | None = None) -> Deferred[Any]:
        """``RedisConnection.evalsha`` (EVAL on NOSCRIPT) on the owner of ``keys[0]``."""
        def send(connection: RedisConnection, asking: bool) -> Deferred[Any]:
            if asking:  # an importing node may lack the script; EVAL also runs once
                return connection.execute("EVAL", script, len(keys), *keys, *args,
                                          timeout=timeout)
            return connection.evalsha(sha, script, keys, args, timeout=timeout)
        key = keys[0] if keys else None
        return self._route(key if not isinstance(key, (int, float)) else str(key), send,
                           MAX_REDIRECTS)

    def probe(self, timeout: float = PROBE_TIMEOUT) -> Deferred[list[dict[str, Any]]]:
        """How each primary owning slots is, for ``/health``: one
        ``{"address", "state", "slots"}`` per primary, by address, its ``state``
        ``up`` when both its connections are up and it answered a PING within
        ``timeout`` seconds (of the node's own time, timer.py), else ``down``
        (not asked: a connection that is not up is reconnecting, and fails at once).
        Fires once every PING is answered or failed; fails with ``RedisNotSent``
        while the topology is not known, never otherwise."""
        owners = self._map.owning()
        if not self._map.known or not owners:
            return defer.fail(RedisNotSent(f"redis {self._name}: topology not known"))
        slots = self._map.slots_owned

        def state_of(address: str) -> Deferred[dict[str, Any]]:
            primary = self._pool.primaries[address]
            entry: dict[str, Any] = {"address": address, "state": "down",
                                     "slots": slots[address]}
            if not (primary.commands.connected and primary.subscriber.connected):
                return defer.succeed(entry)
            pinged = primary.commands.execute("PING", timeout=timeout)
            return pinged.addCallbacks(lambda _: {**entry, "state": "up"}, lambda _: entry)

        states = defer.gatherResults([state_of(address) for address in sorted(owners)])
        return states.addCallback(list)

    def _route(self, key: str | bytes | None, send: Send, left: int,
               asking: Primary | None = None, tries: int = 0) -> Deferred[Any]:
        if asking is not None:
            primary: Primary | None = asking
            asking.commands.execute("ASKING").addErrback(lambda _: None)  # shows on send
        elif key is None:
            owning = self._map.owning()
            primary = next((p for address, p in sorted(self._pool.primaries.items())
                            if address in owning and p.commands.connected), None)
        else:
            primary = self._pool.get(self._map.owner_of(key))
        if primary is None:
            return defer.fail(RedisNotSent(f"redis {self._name}: no primary known for this key"))
        sent = send(primary.commands, asking is not None)
        return sent.addErrback(self._redirected, key, send, left, tries)

    def _redirected(self, failure: Failure, key: str | bytes | None, send: Send,
                    left: int, tries: int) -> Any:
        """A MOVED, ASK or TRYAGAIN reply: the command did not run; send it again
        where Redis says (at most ``left`` more redirects, ``TRYAGAIN_TRIES``
        more tries)."""
        error = failure.value
        if isinstance(error, TryAgain):  # a multi-key command whose keys are split mid-migration
            if tries >= TRYAGAIN_TRIES:
                return failure
            return task.deferLater(self._reactor, TRYAGAIN_DELAY,
                                    lambda: self._route(key, send, left, tries=tries + 1))
        if left <= 0 or not isinstance(error, Redirected):
            return failure
        if isinstance(error, Moved):
            target = self._map.moved(error.slot, error.address)
            return self._pool.when_up(target).addCallback(
                lambda _: self._route(key, send, left - 1))
        target = self._pool.primary(error.address)  # ASK
        return self._pool.when_up(target).addCallback(
            lambda _: self._route(key, send, left - 1, asking=target))

    # -- sharded pub/sub ------------------------------------------------------------------

    def subscribe(self, channel: str | bytes, on_message: Callable[[bytes], None],
                  on_synced: Callable[[], None],
                  on_lost: Callable[[], None] | None = None) -> None:
        """``Subscriptions.subscribe``: SSUBSCRIBE ``channel`` on its owner, again after
        every reconnection and move, until ``unsubscribe``; ``on_synced()`` each time
        Redis confirms it, ``on_lost()`` each time it goes, ``on_message(payload)``
        per message, in order."""
        if on_lost is None:
            self._subscriptions.subscribe(channel, on_message, on_synced)
        else:
            self._subscriptions.subscribe(channel, on_message, on_synced, on_lost)

    def unsubscribe(self, channel: str | bytes) -> None:
        self._subscriptions.unsubscribe(channel)
