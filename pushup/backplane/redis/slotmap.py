"""The slot map: which primary owns each of the 16,384 slots, kept right.

The rule: the map is read at start (``INFO cluster``, then ``CLUSTER SLOTS``) from
a connected primary, else from any node it named or a seed, and read again, one
read at a time, whenever a reply says it is stale (``MOVED``, an ``SSUBSCRIBE``
moved away) and, while a primary is unreachable, every second (a failover moves its
slots to a replica at another address). Each map read connects the pool to the
primaries it names and drops those that own nothing now. It never sends a caller's
command (``cluster.py`` routes them) and never subscribes (``subscriptions.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator, Sequence
from typing import Any

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from pushup.backplane import trouble
from pushup.backplane.links import SaidOnce, SingleFlight
from pushup.backplane.redis.client import MAX_DELAY
from pushup.backplane.redis.exceptions import RedisNotSent
from pushup.backplane.redis.pool import ASK_TIMEOUT, Pool, Primary
from pushup.backplane.redis.slots import SLOTS, Topology, address_of, key_slot, read_topology
from pushup.config import RedisURL

log = Logger()


class ShardsRefused(Exception):
    """This Redis cannot be used as configured (a database other than 0 on a cluster)."""


class SlotMap:
    """Who owns each slot (see the module's rule). ``on_applied`` listeners are called
    after each map read is taken, in the order added."""

    def __init__(self, seeds: Sequence[RedisURL], reactor: Any, pool: Pool, *,
                 name: str) -> None:
        self._seeds = list(seeds)
        self._reactor = reactor
        self._pool = pool
        self._name = name
        self.clustered = False
        # primary address by slot: written only through _own (the owners' set,
        # read by every /health and /stats, is kept with it)
        self.owners: list[str | None] = [None] * SLOTS
        self._owner_set: set[str | None] = {None}
        self.slots_owned: Counter[str | None] = Counter(self.owners)  # slots per owner
        self._nodes: dict[str, RedisURL] = {}  # every node the last map named, replicas too
        self.known = False  # the map was read at least once
        self.running = False
        self.on_applied: list[Callable[[], object]] = []
        self._reads = SingleFlight()  # map reads: one at a time, once more after
        self._refreshed: list[Deferred[None]] = []  # fire when the read under way is done
        self._first_read: list[Deferred[None]] = []  # read_once()'s
        self._retry: Any = None  # the next periodic re-read's IDelayedCall
        self._reading: Deferred[Any] | None = None  # a read_topology under way
        self._said = SaidOnce()  # the trouble last logged
        pool.on_commands_up.append(self.stop_rereading)
        pool.on_commands_lost.append(self.lost)

    # -- life -------------------------------------------------------------------------

    def start(self) -> None:
        """Read the map from a seed; keep at it."""
        if not self.running:
            self.running = True
            self.refresh()

    def read_once(self) -> Deferred[None]:
        """Fires once the map has been read (now, if it was); fails with
        ``ShardsRefused`` if this Redis cannot be used as configured."""
        if self.known:
            return defer.succeed(None)
        read: Deferred[None] = Deferred()
        self._first_read.append(read)
        return read

    def stop(self) -> None:
        """No more reads; the one under way is dropped."""
        self.running = False
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        if self._reading is not None:
            self._reading.cancel()
        self._own([None] * SLOTS)

    # -- what it says -----------------------------------------------------------------

    def owner_of(self, key: str | bytes) -> str | None:
        """The address of the primary owning ``key``'s slot (None: no node serves it)."""
        return self.owners[key_slot(key)]

    def owning(self) -> set[str]:
        """The primaries owning slots that the pool holds."""
        return {owner for owner in self._owner_set if owner is not None
                and owner in self._pool.primaries}

    def _own(self, owners: list[str | None]) -> None:
        """Every slot's owner is now as ``owners`` says."""
        self.owners = owners
        self._owner_set = set(owners)
        self.slots_owned = Counter(owners)

    @property
    def connected(self) -> bool:
        """Every primary's command and subscriber connections are up."""
        owners = self.owning()
        primaries = self._pool.primaries
        return self.known and bool(owners) and all(
            primaries[address].commands.connected
            and primaries[address].subscriber.connected for address in owners)

    def primaries(self) -> list[str]:
        """The primaries owning slots, as host:port (a Unix socket's path)."""
        return sorted(self.owning())

    # -- keeping it right -------------------------------------------------------------

    def moved(self, slot: int, address: str) -> Primary:
        """``slot`` is on ``address`` now: note it, and re-read the rest of the map."""
        self.owners[slot] = address
        self._own(self.owners)  # (a MOVED: rare)
        primary = self._pool.primary(address)
        self.refresh()
        return primary

    def lost(self) -> None:
        """A connection went: on a cluster a failover may be under way, and its new
        primary is elsewhere."""
        if self.clustered:
            self.refresh()

    def refresh(self) -> Deferred[None]:
        """Re-read the map; fires when done. One read at a time: asked during one,
        one more read follows it (the first may predate what prompted the ask)."""
        done: Deferred[None] = Deferred()
        self._refreshed.append(done)
        self._start_read()
        return done

    def _start_read(self) -> None:
        started = self._reads.ask(self._read)
        if started is not None:
            started.addBoth(self._read_done)

    def refresh_later(self) -> None:
        """Re-read the map in a second, unless every connection is up by then."""
        if self.running and (self._retry is None or not self._retry.active()):
            self._retry = self._reactor.callLater(MAX_DELAY, self._refresh_unless_connected)

    def stop_rereading(self) -> None:
        """Every connection is up: no periodic re-read (a loss starts it again)."""
        if self.connected and self._retry is not None and self._retry.active():
            self._retry.cancel()
            self._retry = None

    def complain(self, why: str) -> None:
        """Log ``why``, unless it is what was logged last."""
        if self._said.new(why):
            log.warn("redis {name}: {why}", name=self._name, why=why)

    def _read_done(self, result: Any) -> None:
        if not self.running:
            waiters, self._refreshed = self._refreshed, []
            for waiter in waiters:
                waiter.callback(None)
            return
        if isinstance(result, Failure):
            if isinstance(result.value, ShardsRefused):
                self._refuse(result)
                return
            self.complain(f"cannot read the topology ({trouble(result)})")
        if self._reads.take_owed():
            self._start_read()
            return
        if self.known:  # else they wait for the first map
            waiters, self._refreshed = self._refreshed, []
            waiters += self._first_read
            self._first_read = []
            for waiter in waiters:
                waiter.callback(None)
        if not self.connected:
            self.refresh_later()

    def _refuse(self, failure: Failure) -> None:
        log.error("redis {name}: {why}", name=self._name, why=failure.getErrorMessage())
        self.running = self._pool.running = False
        self._refreshed = []  # nothing more will be read
        waiters, self._first_read = self._first_read, []
        for waiter in waiters:
            waiter.errback(failure)

    def _refresh_unless_connected(self) -> None:
        if not self.connected:
            self.refresh()

    @defer.inlineCallbacks
    def _read(self) -> Generator[Deferred[Any], Any, None]:
        """Ask the primaries we are connected to, then every node and seed in turn, for
        the slot map; apply the first answer."""
        if self.known and not self.clustered:
            return  # one redis-server: its connections reconnect by themselves
        for primary in list(self._pool.primaries.values()):
            if primary.commands.connected and self.running:
                try:
                    reply = yield primary.commands.execute("CLUSTER", "SLOTS",
                                                           timeout=ASK_TIMEOUT)
                except Exception:
                    continue
                self._apply(Topology.from_cluster_slots(reply, primary.commands.url))
                return
        last: Exception | None = None
        urls = {**self._nodes, **{address_of(seed): seed for seed in self._seeds}}
        for url in urls.values():
            if not self.running:
                return
            self._reading = read_topology(self._reactor, url, ASK_TIMEOUT)
            try:
                topology = yield self._reading
            except Exception as error:
                last = error
                continue
            finally:
                self._reading = None
            if topology.clustered and any(seed.db for seed in self._seeds):
                raise ShardsRefused(f"{url} is a Redis Cluster, which has only database 0: "
                                    "drop the /DB from --engine")
            self._apply(topology)
            return
        raise last or RedisNotSent("no Redis to ask")

    def _apply(self, topology: Topology) -> None:
        """Take a slot map: connect to new primaries, close those that own nothing now,
        then tell the listeners (each subscription moves to its slot's owner)."""
        before = self.primaries() if self.known else None
        self.clustered = topology.clustered
        self._own(list(topology.owners))
        self._nodes = topology.urls
        self.known = True
        for address in self._owner_set:
            if address is not None and address not in self._pool.primaries:
                self._pool.primary(address, topology.urls[address])
        owning = self._owner_set
        for address in list(self._pool.primaries):
            if address not in owning:
                self._pool.drop(address)
        if before != self.primaries() and self.clustered:  # (one server: the start line says it)
            log.info("redis {name}: a cluster of {primaries}", name=self._name,
                     primaries=", ".join(self.primaries()))
        self._said.clear()
        for listener in list(self.on_applied):
            listener()
