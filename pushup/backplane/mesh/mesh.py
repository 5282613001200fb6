"""This node in its cluster: batches in, links out, catching up after a start.

A node applies each origin's messages in sequence order only; a batch that
would leave a hole is answered with the sequence it expects (a hole frame on
the replication stream, a 409 to the older POST), and the sender resends from
there. A node that starts with peers fills its cache
from a live peer's snapshot before it reports healthy; while it catches up it
answers 503 ``catching_up``. Channel operations travel with the origin's
messages, stamped with the origin's sequence at the time, and are applied in
that order.

A publish is acknowledged (the 201) once a peer holds it, with
``--publish-ack peer`` (the default), once every live peer does with
``all``, or at once with ``local`` (between workers, a sibling holds it once
its Unix socket does: :attr:`PeerLink.holds`); see
:mod:`pushup.backplane.mesh.acks` and the README, "What a 201 means". A keyed publish's
record travels with its last message (:mod:`pushup.backplane.mesh.wire`), so a retry on
any node that holds it stores nothing new.

With ``--workers`` each worker is a member of its own: it links to its
siblings (over Unix sockets) and to every ``--peer``. Another node reaches
one worker of ours per connection (the kernel picks it), so what a worker
receives from another node it relays to its siblings (``r`` frames, at most
``RELAY_WINDOW`` unanswered per sibling; what is not relayed, repair brings).
Only other nodes' confirmations count for the 201 when there are any: a
sibling shares our machine.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
from twisted.internet import defer, task
from twisted.internet.error import ConnectError
from twisted.logger import Logger

from pushup.backplane import Unconfirmed
from pushup.backplane.mesh.acks import Acks
from pushup.backplane.mesh.peers import PeerLink
from pushup.backplane.mesh.wire import (
    Batch,
    backlog,
    decode_repair,
    decode_snapshot,
    encode_repair,
    export_snapshot,
    pack_batch,
    unpack_batch,
)
from pushup.config import Config
from pushup.core import errors
from pushup.core.channels import Channel, ChannelOp, OpKind
from pushup.core.follow import Applied, Followed
from pushup.core.idempotency import Idem, Replayed
from pushup.core.model import Draft, Message
from pushup.core.service import Service

log = Logger()


def error_code(body: bytes) -> str | None:
    """The ``code`` of a node's JSON error body, if it is one."""
    try:
        error = msgspec.json.decode(body).get("error")
    except (msgspec.DecodeError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None
CATCH_UP_TIMEOUT = 15.0  # seconds to keep asking peers that answer badly
PEER_FLUSH = 2.0  # seconds a stopping node gives its peers to confirm what they lack
REPAIR_EVERY = 2.0  # seconds between asking a peer for what it holds and we lack
REPAIR_ROUNDS = 100  # batches at most per repair (more waits for the next)


class Mesh:
    """The mesh backplane (see :mod:`pushup.backplane`): every node sends what
    it accepts to every peer."""

    engine = "mesh"

    def __init__(self, service: Service, config: Config, clock: Any, http: Any,
                 siblings: Sequence[str] = ()) -> None:
        self.service = service
        self.store = service.store
        self.clock = clock
        self.secret = config.cluster_secret
        # Siblings first: a restarted worker catches up from its own machine.
        self.siblings = [PeerLink(url, self.store, self.secret, http, clock,
                                  max_ops=config.peer_queue) for url in siblings]
        self.others = [PeerLink(url, self.store, self.secret, http, clock,
                                max_ops=config.peer_queue) for url in config.peer]
        self.links = self.siblings + self.others
        # Whose confirmation answers a publish: other machines', when there are any.
        self.confirming = self.others or self.siblings
        self.ready = not self.links
        # Peer requests and streams refused: a bad or missing signature, or
        # a protocol violation (the links count the answers they refuse).
        self.refused = 0
        self.publish_ack = config.publish_ack
        self.acks = Acks(clock, config.publish_ack_timeout)
        for link in self.links:
            link.on_change = self._link_changed
        self._repairs = task.LoopingCall(self._repair)
        self._repairs.clock = clock
        self._next_repair = 0  # the link asked next (round-robin)
        # Each origin's horizon at the last repair: one that moved since is
        # not asked for (its stream brings it).
        self._repair_seen: dict[str, int] = {}
        # Origins a batch came from (one per start of each node: a handful):
        # the first batch of a new one is a node starting (``_started``).
        self._heard: set[str] = set()

    def check_ready(self) -> None:
        if not self.ready:
            raise errors.CatchingUp("this node is catching up with its peers; retry shortly")

    # -- out -----------------------------------------------------------------

    def publish(self, drafts: Sequence[Draft], idem: Idem | None = None,
                ) -> defer.Deferred[list[Message]]:
        """Store and send on; fires once a peer holds the batch (``peer``),
        once every peer not known to be down holds it (``all``), or at once
        (``local``, or no peers configured). When no peer can hold
        it, because every peer is ``down`` or ``refused`` or none confirmed
        within ``--publish-ack-timeout``, it fires with ``Unconfirmed``.

        A retry of a keyed publish (``Replayed``) stores nothing; it fires
        on the same terms for the first attempt's messages: at once when a
        peer took them (another origin's, or ours already confirmed)."""
        messages = self.service.publish(drafts, idem)
        if isinstance(messages, Replayed):
            return self._replayed(messages)
        for link in self.links:
            link.poke()
        if self.publish_ack == "local" or not self.confirming \
                or self._confirmed() >= messages[-1].seq:  # a sibling's socket took it
            return defer.succeed(messages)
        return self._acknowledged(messages)

    def _acknowledged(self, messages: list[Message]) -> defer.Deferred[list[Message]]:
        if not self._confirmable():
            # Known already (a down peer was retried DOWN_AFTER times): no wait.
            self.acks.unconfirmed += 1
            return defer.succeed(Unconfirmed(messages))
        return self.acks.wait(messages)

    def _replayed(self, messages: Replayed) -> defer.Deferred[list[Message]]:
        last = messages[-1]
        if self.publish_ack == "local" or not self.confirming \
                or last.origin != self.store.origin_name or self._confirmed() >= last.seq:
            return defer.succeed(messages)
        return self._acknowledged(messages)

    def _confirmed(self) -> int:
        """How far our origin is confirmed as ``--publish-ack`` counts it."""
        if self.publish_ack == "all":
            counted = [x.holds for x in self.confirming if x.state in ("up", "connecting")]
            return min(counted, default=0)
        return max(link.holds for link in self.confirming)

    def _confirmable(self) -> bool:
        """Some peer may yet confirm: one that is ``up`` or still ``connecting``."""
        return any(link.state in ("up", "connecting") for link in self.confirming)

    def _link_changed(self, link: PeerLink) -> None:
        """A peer confirmed more, or a link changed state: answer who can be."""
        if not len(self.acks) or link not in self.confirming:
            return
        if self.publish_ack == "all":
            # every peer that may yet confirm; one that went down is not waited for
            counted = [x.holds for x in self.confirming if x.state in ("up", "connecting")]
            if counted:
                self.acks.confirm(min(counted))
        else:
            self.acks.confirm(link.holds)
        if not self._confirmable():
            self.acks.give_up()

    def create_channel(self, name: str | None, ttl: int | None) -> defer.Deferred[Channel]:
        channel = self.service.create_channel(name, ttl)
        self._tell("create", channel)
        return defer.succeed(channel)

    def renew_channel(self, name: str, ttl: int | None) -> defer.Deferred[Channel]:
        channel = self.service.renew_channel(name, ttl)
        self._tell("renew", channel)
        return defer.succeed(channel)

    def delete_channel(self, name: str) -> defer.Deferred[None]:
        self.service.delete_channel(name)
        for link in self.links:
            link.add_op(ChannelOp("delete", name, self.store.own_seq))
        return defer.succeed(None)

    def _tell(self, kind: OpKind, channel: Channel) -> None:
        op = ChannelOp.of(kind, channel, self.store.own_seq)
        for link in self.links:
            link.add_op(op)

    # -- in ------------------------------------------------------------------

    def receive(self, batch: Batch) -> Followed:
        """Apply a peer's batch in order; on a hole, the sequence expected.

        A batch of this node's own origin is refused (``BadRequest``): only
        this process writes it, and a forged one would take the ids of its
        next publishes."""
        self.check_ready()
        if batch.origin == self.store.origin_name:
            raise errors.BadRequest("a batch of the receiver's own origin")
        if batch.origin not in self._heard:
            self._started(batch.origin)
        return self.service.follow(batch.origin, batch.entries())

    def relay(self, payload: bytes) -> None:
        """Hand our siblings a batch another node sent us (its encoded form)."""
        for link in self.siblings:
            link.relay(payload)

    def _started(self, origin: str | None = None) -> None:
        """A node just started, maybe one a link is failing to reach: a batch
        of an origin this node had not heard of (every start is a new origin),
        or a snapshot asked for (a node catches up once, as it starts, before
        it has anything to send). Each failing link tries once now instead of
        at the end of its backoff (up to ``BACKOFF_MAX``), so a cluster
        starting together links up at once. Only a start does: under load
        every batch did, and a dead peer was dialled once per batch received;
        a link that is down otherwise dials only on its own timer
        (``PeerLink``)."""
        if origin is not None:
            self._heard.add(origin)
        for link in self.links:
            if link.failing:
                link.kick()

    def snapshot(self) -> bytes:
        self.check_ready()
        self._started()
        return export_snapshot(self.store)

    # -- repair: what a peer holds of a third origin, and we lack --------------
    #
    # A node sends only its own messages. If it dies after one peer got them
    # (that peer's confirmation answered the 201) but before another did, the
    # other survivor would never get them from it. So every REPAIR_EVERY
    # seconds each node sends one live peer its horizon, and the peer answers
    # with the first batch it holds past it of an origin that is neither its
    # own (its link brings those) nor the asker's. Receiving is the usual
    # in-order apply, so a batch that both the origin and a peer send is
    # applied once. It asks only for the origins that did not move here
    # since its last round: one whose stream is bringing its messages is
    # not fetched a second time, over HTTP, from whichever peer happened to
    # read them a moment sooner.

    def repair(self, body: bytes) -> bytes | None:
        """A peer's repair request: a batch it lacks, or None if nothing."""
        self.check_ready()
        asker, theirs, wanted = decode_repair(body)
        store = self.store
        for origin, have in store.horizons().items():
            after = theirs.get(origin, 0)
            # It wants what it asks for, and any origin it never heard of.
            unwanted = wanted is not None and origin in theirs and origin not in wanted
            if origin in (store.origin_name, asker) or have <= after or unwanted:
                continue
            lost = store.lost_of(origin)  # if all of it was evicted here too: skip it
            ts = lost[1] if lost is not None and lost[0] == have else self.service.now()
            return pack_batch(backlog(store, origin, after, (have, ts)))
        return None

    @defer.inlineCallbacks
    def _repair(self) -> Any:
        """Ask the next live peer for what it holds and we lack."""
        live = [link for link in self.links if link.state == "up"]
        if not live or not self.ready:
            return
        link = live[self._next_repair % len(live)]
        self._next_repair += 1
        horizons = self.store.horizons()
        seen, self._repair_seen = self._repair_seen, horizons
        stalled = [o for o, seq in horizons.items()
                   if seen.get(o, seq) == seq and o != self.store.origin_name]
        if not stalled:
            return
        for _ in range(REPAIR_ROUNDS):
            body = encode_repair(self.store.origin_name, self.store.horizons(),
                                 want=stalled)
            try:
                status, raw = yield link.request("POST", "/peer/repair", body)
            except Exception as e:
                log.debug("repair from {url} failed: {e}", url=link.url, e=e)
                return
            if status != 200:
                return
            try:
                batch = unpack_batch(raw)
                received = self.receive(batch)
            except errors.PushUpError as e:
                if isinstance(e, errors.BadRequest):
                    self.refused += 1
                log.warn("repair from {url} refused: {e}", url=link.url, e=e)
                return
            if batch.messages:
                log.info("repaired {n} messages of {origin} from {url}",
                         n=len(batch.messages), origin=batch.origin, url=link.url)
            if not isinstance(received, Applied):
                return

    # -- starting ------------------------------------------------------------

    def prepare(self, channels: Iterable[str]) -> None:
        """Every node holds every channel: nothing to read first."""
        return None

    @defer.inlineCallbacks
    def start(self) -> Any:
        """Catch up from a live peer (if any is serving), then start the links."""
        if self.links:
            yield self._catch_up()
        self.ready = True
        for link in self.links:
            link.start()
        if self.links:
            self._repairs.start(REPAIR_EVERY, now=False).addErrback(
                lambda f: log.failure("the repair loop stopped", failure=f))

    @defer.inlineCallbacks
    def _catch_up(self) -> Any:
        """Load a snapshot from the first peer that serves one.

        Only a peer that may yet give one is waited for (at most
        ``CATCH_UP_TIMEOUT``): one that fails, answers 5xx other than 503, or
        503 ``overloaded`` (it runs and holds its cache, but is at
        ``--max-connections``: a worker restarted beside a full sibling must
        not serve an empty cache). A peer that is not running, is itself
        catching up or draining (503 ``catching_up``, ``shutting_down``),
        or refuses us (4xx: another secret, or not a peer URL) is not serving:
        when no peer is serving, the node starts with an empty cache at once
        (a cluster starting together has nothing to catch up on).
        """
        deadline = self.clock.seconds() + CATCH_UP_TIMEOUT
        while True:
            serving = False
            for link in self.links:
                if link.state == "refused":
                    continue
                try:
                    status, raw = yield link.request("GET", "/peer/snapshot")
                except ConnectError:
                    continue  # not running: nothing to learn from it
                except Exception as e:
                    serving = True
                    link.set_state("connecting", f"snapshot request failed: {e}")
                    continue
                if status == 200:
                    n = self.store.load(decode_snapshot(raw), self.service.now())
                    self.service.rearm()
                    log.info("caught up from {url}: {n} messages", url=link.url, n=n)
                    return
                if 400 <= status < 500:
                    link.set_state("refused", f"it answered {status} to a snapshot request")
                elif status != 503 or error_code(raw) == errors.Unavailable.code:
                    serving = True
                    link.set_state("connecting", f"it answered {status} to a snapshot request")
            if not serving:
                log.info("no peer is serving yet: starting with an empty cache")
                return
            if self.clock.seconds() > deadline:
                log.warn("no peer gave a snapshot in time: starting with what we have")
                return
            yield task.deferLater(self.clock, 0.5, lambda: None)

    @defer.inlineCallbacks
    def stop(self, grace: float = PEER_FLUSH) -> Any:
        """Let the links hand peers what we accepted (up to ``grace`` s), then stop."""
        deadline = self.clock.seconds() + grace
        # A peer that refuses us will not confirm anything: not waited for.
        waited = [link for link in self.links if link.state != "refused"]
        for link in waited:
            if not link.settled:
                link.kick()
        while self.ready and not all(link.settled for link in waited):
            if self.clock.seconds() >= deadline:
                log.warn("stopping with messages not yet confirmed by every peer")
                break
            yield task.deferLater(self.clock, 0.05, lambda: None)
        for link in self.links:
            link.stop()
        if self._repairs.running:
            self._repairs.stop()
        self.acks.stop()  # what no peer confirmed in time is answered 202

    def stats(self) -> dict[str, Any]:
        peers = [{**link.stats(), "sibling": link in self.siblings} for link in self.links]
        return {"engine": self.engine, "peers": peers,
                "peer_refused": self.refused + sum(link.violations for link in self.links),
                "publish_ack": self.publish_ack,
                "ack_waiting": len(self.acks), "unconfirmed": self.acks.unconfirmed}
