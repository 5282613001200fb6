"""The composition root: build a node from a Config, listen, drain on stop.

Only this module and :mod:`pushup.ops.cli` know the real reactor. A node is a
``Service`` behind ``Handlers``, behind the HTTP ``Front`` (which counts
bytes and connections and refuses connections past the limit with a 503).
"""

from __future__ import annotations

import os
import random
import secrets
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST
from twisted.internet import defer
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort
from twisted.internet.tcp import makeBinding
from twisted.logger import Logger

from pushup import BUILD
from pushup.backplane import Alone, Backplane
from pushup.backplane.disk import DataDir, DataDirError, Durable
from pushup.backplane.disk_streams import StreamsFile, StreamsFileError
from pushup.backplane.mesh.dial import http_agent, http_client
from pushup.backplane.mesh.endpoints import MeshEndpoints
from pushup.backplane.mesh.mesh import PEER_FLUSH, Mesh
from pushup.backplane.mesh.owners import advertised, member
from pushup.backplane.mesh.presence import MeshPresence
from pushup.backplane.mesh.relay import Relay
from pushup.backplane.mesh.stream_routes import Placements, StreamRoutes
from pushup.backplane.stream_engine import LocalStreams, StreamEngine
from pushup.config import Config
from pushup.core.counters import Counters
from pushup.core.errors import PushUpError
from pushup.core.model import Origin, default_node_id
from pushup.core.service import Service
from pushup.core.store import Retention, Store
from pushup.core.streams import Streams
from pushup.http.exchange import Writer
from pushup.http.front import Front
from pushup.http.handlers import Handlers
from pushup.http.params import max_target
from pushup.http.presence import PresenceDesk
from pushup.http.sse import max_event_id
from pushup.http.stream_subscriptions import SubscriptionDesk
from pushup.http.streams import new_streams
from pushup.ops.admin import AdminApp
from pushup.ops.fleet import Fleet
from pushup.ops.jwks import subscribe_verifier
from pushup.ops.metrics import prometheus_text, registry_for, rss_bytes
from pushup.ops.stream_webhooks import WakeSender
from pushup.ops.timing import Timed, Timings
from pushup.ops.webhook_key import NodeKey
from pushup.ops.webhooks import Webhooks

if TYPE_CHECKING:  # (Redis's modules are imported only with --engine redis://)
    from pushup.backplane.redis.presence import RedisPresence

log = Logger()
ADMIN_CONNECTIONS = 64  # scrapers and operators, not clients
SELECT_CONNECTIONS = 900  # select() cannot watch descriptors past 1023
DRAIN_LIMIT = 4.0  # seconds a drain may take in all (the README promises exit within 5 s)
# past --drain-window: the most a stream's end (its last page) may take to go out
DRAIN_WINDOW_GRACE = 1.0
STREAM_IDLE_CONNECTIONS = 8  # idle connections kept to each peer for streams handed on
# a node that starts says no presence event before it heard the others' (their
# records expire in 3 s: pushup.backplane.{mesh,redis}.presence)
SETTLE_S = 4.0
STREAM_ANSWER_S = 10.0  # the most a stream's owner may take to answer (past a long poll's hold)


class Node:
    """One PushUp node: store, hub, HTTP, limits; ``listen`` then ``stop``."""

    def __init__(self, config: Config, reactor: Any, siblings: Sequence[str] = ()) -> None:
        self.config = config
        self.reactor = reactor
        self.data = DataDir(config.data_dir) if config.data_dir else None
        stored = self.data.node_id if self.data is not None else None
        node_id = config.node_id or stored or default_node_id(
            socket.gethostname(), config.port, secrets.token_hex(4))
        boot_us = time.time_ns() // 1000
        if self.data is not None:
            boot_us = self.data.begin(node_id, boot_us)
        origin = Origin(node_id, boot_us)
        retention = Retention(
            message_ttl=round(config.message_ttl * 1e6),
            channel_ttl=round(config.channel_ttl * 1e6),
            max_per_channel=config.max_messages_per_channel,
            max_bytes=config.max_cached_bytes,
            key_window=round(config.idempotency_window * 1e6),
        )
        self.service = Service(Store(retention, origin), reactor, config.max_timeout)
        self.timings = Timings(reactor)
        self.service.on_answered = self.timings.answered
        self.registry = registry_for(self.stats)
        self.mesh: Mesh | None = None  # the mesh, when it is the backplane
        self.backplane: Backplane
        if config.engine != "mesh":
            from pushup.backplane.redis.engine import RedisEngine

            self.backplane = RedisEngine(self.service, config, reactor)
        elif config.peer or config.cluster_secret:
            self.mesh = self.backplane = Mesh(self.service, config, reactor,
                                                    http_client(reactor), siblings=siblings)
        elif self.data is not None:
            self.backplane = Durable(self.service, self.data, reactor)
        else:
            self.backplane = Alone(self.service)
        # --presence: who subscribes (docs/api.md, "Presence"); off, nothing is counted
        clustered = (self.mesh is not None and bool(self.mesh.links)) or config.engine != "mesh"
        self.presence = None if not config.presence_on else PresenceDesk(
            self.service, config.presence_linger, config.presence_members,
            tokens=bool(config.subscribe_secret), settle=SETTLE_S if clustered else 0.0)
        self.webhooks: Webhooks | None = None
        self.spreads: MeshPresence | RedisPresence | None = None  # presence to the others
        if self.presence is not None:
            self.spreads = self._presence_spread(self.presence, origin.name)
            if config.webhook_url:
                self.webhooks = self._webhooks(self.presence, origin.name)
        endpoints = None if self.mesh is None else MeshEndpoints(
            self.mesh, self.spreads if isinstance(self.spreads, MeshPresence) else None)
        streams = new_streams(config)
        self.streams_file: StreamsFile | None = None  # --data-dir's (and the subscriptions')
        self.handlers = Handlers(self.service, config, self.stats, self.metrics,
                                 self.backplane, mount=endpoints,
                                 figures=not config.admin_port, streams=streams,
                                 stream_engine=self._stream_engine(streams),
                                 tokens=subscribe_verifier(config, reactor),
                                 presence=self.presence)
        self._stream_subscriptions()
        limit = config.max_connections
        if config.reactor == "select" and limit > SELECT_CONNECTIONS:
            log.warn("select reactor: capping connections at {n}", n=SELECT_CONNECTIONS)
            limit = SELECT_CONNECTIONS
        self.front = Front(Timed(self.handlers, self.timings), Writer(config.cors_origin),
                           self.service.counters,
                           reactor, limit=limit, max_target=max_target(config),
                           header_timeout=config.header_timeout,
                           keepalive_timeout=config.keepalive_timeout,
                           send_timeout=config.send_timeout,
                           max_event_id=max_event_id(config.max_channels))
        # --admin-port: the figures on a front of their own (its own counts too)
        self.admin = None if not config.admin_port else Front(
            AdminApp(self.handlers, self.stats, self.metrics), Writer(), Counters(), reactor,
            limit=ADMIN_CONNECTIONS, max_target=max_target(config),
            header_timeout=config.header_timeout, keepalive_timeout=config.keepalive_timeout,
            send_timeout=config.send_timeout)
        self.admin_port: IListeningPort | None = None
        self.service.on_fanout_done.append(self.front.release)
        self.port: IListeningPort | None = None
        self.private_port: IListeningPort | None = None  # a worker's, for its siblings
        self.fleet: Fleet | None = None  # with --workers: the whole node's figures

    def _presence_spread(self, desk: PresenceDesk,
                         boot: str) -> MeshPresence | RedisPresence | None:
        """How this node's presence reaches the others': peer to peer on the
        mesh, a record each in Redis; alone, nowhere."""
        if self.mesh is not None and self.mesh.links:
            return MeshPresence(desk, self.mesh.links, self.reactor, boot)
        if self.config.engine != "mesh":
            from pushup.backplane.redis.engine import RedisEngine
            from pushup.backplane.redis.presence import RedisPresence

            assert isinstance(self.backplane, RedisEngine)
            return RedisPresence(desk, self.backplane.shards, self.reactor, boot,
                                 self.backplane.timeout)
        return None

    def _webhooks(self, desk: PresenceDesk, ids: str) -> Webhooks:
        """The sender of ``--webhook-url``: on the cluster's one sender (the
        lowest node id the roster holds), each batch to every URL."""
        from treq.client import HTTPClient
        from twisted.web.client import Agent

        # a connection per request (at most 4 a second per URL): a kept one the
        # receiver closed meanwhile would fail a POST, which is not retried
        http = HTTPClient(Agent(self.reactor))  # type: ignore[no-untyped-call]
        hooks = Webhooks(self.config.webhook_url, self.config.webhook_secret, self.reactor,
                         http, ids, queue=self.config.webhook_queue, sends=desk.leads)
        desk.listeners.append(hooks.events)
        return hooks

    @property
    def subscriptions(self) -> SubscriptionDesk | None:
        """The desk serving Durable Streams subscriptions here (on a cluster,
        the home's holds them; another's is empty), or None: not served."""
        return self.handlers.streams.subscriptions

    def _stream_subscriptions(self) -> None:
        """The Durable Streams subscription APIs (``/v1/stream/__ds/``): on a
        node alone, and on a cluster, where one node holds them and the
        others tell it their streams' news (the mesh:
        pushup.backplane.mesh.stream_subscriptions; Redis:
        pushup.ops.redis_subscriptions). With ``--workers`` they answer 404
        (docs/api.md, "Stream subscriptions")."""
        from treq.client import HTTPClient
        from twisted.web.client import Agent

        from pushup.backplane.mesh.stream_subscriptions import MeshSubscriptions

        endpoints = self.handlers.streams
        engine = endpoints.engine
        self.stream_cluster: MeshSubscriptions | None = None
        if self.config.workers > 1:
            return
        key = NodeKey(self.config)  # read (or made) when first needed
        # a connection per delivery, as presence's webhooks (a kept one the
        # receiver closed meanwhile would fail a POST)
        sender = WakeSender(key, HTTPClient(Agent(self.reactor)),  # type: ignore[no-untyped-call]
                            self.reactor, self.config.stream_webhook_queue)
        if isinstance(engine, LocalStreams):
            endpoints.serve_subscriptions(key, sender, self.streams_file)
            return
        if isinstance(engine, StreamRoutes):
            mesh = self.stream_cluster = MeshSubscriptions(engine, endpoints.streams,
                                                           self.service.now)
            # only the home keeps them (another node's kept ones, from when
            # the members were others, are not woken)
            endpoints.serve_subscriptions(key, sender,
                                          self.streams_file if mesh.is_home else None, mesh)
            return
        from pushup.backplane.redis.engine import RedisEngine
        from pushup.backplane.redis.streams import SharedStreams
        from pushup.ops.redis_subscriptions import RedisKeeper, RedisSubscriptions

        assert isinstance(engine, SharedStreams) and isinstance(self.backplane, RedisEngine)
        config = self.config
        relay = Relay(http_agent(self.reactor, STREAM_IDLE_CONNECTIONS), self.reactor,
                      config.cluster_secret, answer_s=STREAM_ANSWER_S)

        def desk_of(keeper: RedisKeeper) -> SubscriptionDesk | None:
            endpoints.serve_subscriptions(key, sender, keeper, redis)
            return endpoints.subscriptions

        redis = RedisSubscriptions(
            self.backplane.shards, engine, endpoints.streams, relay,
            member(config.advertise_url or advertised(config.host, config.port)),
            config.cluster_secret, self.service.now, self.backplane.timeout, desk_of)
        self.stream_cluster = redis
        endpoints.serve_subscriptions(key, sender, None, redis)  # held by another, until taken

    def _stream_engine(self, streams: Streams) -> StreamEngine:
        """Where the Durable Streams of ``streams`` (the core's) are decided:
        in Redis, shared by every node; on the mesh, each on one node; else
        here alone (kept on disk too with ``--data-dir``)."""
        config = self.config
        if config.engine != "mesh":  # Durable Streams in Redis, shared by every node
            from pushup.backplane.redis.engine import RedisEngine
            from pushup.backplane.redis.streams import SharedStreams

            assert isinstance(self.backplane, RedisEngine)
            return SharedStreams(self.backplane.shards, streams, self.service.now,
                                 self.backplane.timeout, self.reactor)
        kept = self.streams_file = None
        if self.data is not None:  # Durable Streams on disk too
            try:
                kept = StreamsFile(self.data.path)
            except StreamsFileError as e:
                raise DataDirError(str(e)) from None
            self.streams_file = kept
            streams.restore(kept, kept.load(), self.service.now())
        if self.mesh is not None and config.peer:  # each stream on one node of the mesh
            return self._stream_routes(streams, kept)
        return LocalStreams()

    def _stream_routes(self, streams: Streams, kept: StreamsFile | None) -> StreamRoutes:
        """The mesh's Durable Streams: each on the node its path picks
        (``--advertise-url`` and ``--peer``), requests handed on to it."""
        config = self.config
        relay = Relay(http_agent(self.reactor, STREAM_IDLE_CONNECTIONS), self.reactor,
                      config.cluster_secret, answer_s=STREAM_ANSWER_S)
        placements = (Placements({}) if kept is None
                      else Placements(kept.placements(), kept))
        return StreamRoutes(config.advertise_url or advertised(config.host, config.port),
                            config.peer, config.cluster_secret, relay, placements,
                            lambda path: streams.holds(path, self.service.now()),
                            config.max_timeout)

    def listen(self, reuse_port: bool = False) -> int:
        """Start accepting connections; returns the port (useful with port 0).

        With ``reuse_port`` the port is shared (SO_REUSEPORT) with the other
        workers of ``--workers``.
        """
        port: Any = self.config.port
        if reuse_port:
            port = makeBinding(self.config.host, port, reuseAddress=True, reusePort=True)
        self.port = listening = self.reactor.listenTCP(port, self.front, backlog=4096,
                                                       interface=self.config.host)
        if self.admin is not None:
            admin: Any = self.config.admin_port
            if reuse_port:  # every worker answers for the whole node (pushup.ops.fleet)
                admin = makeBinding(self.config.admin_host, admin, reuseAddress=True,
                                    reusePort=True)
            self.admin_port = self.reactor.listenTCP(admin, self.admin,
                                                     interface=self.config.admin_host)
        address = listening.getHost()
        assert isinstance(address, IPv4Address | IPv6Address)
        return address.port

    def listen_once(self, reuse_port: bool = False) -> None:
        """``listen``, unless the node is draining already (a worker that is
        stopped before it caught up never takes the shared port)."""
        if self.service.draining:
            return
        try:
            self.listen(reuse_port)
        except CannotListenError as e:  # the supervisor restarts us
            log.error("cannot listen on {host}:{port}: {e}; stopping", host=e.interface,
                      port=e.port, e=e.socketError)
            self.reactor.stop()

    def adopt(self, fd: int) -> None:
        """Also serve on an inherited listening socket (a worker's private Unix socket)."""
        self.private_port = self.reactor.adoptStreamPort(fd, socket.AF_UNIX, self.front)
        os.close(fd)

    def start(self) -> defer.Deferred[None]:
        """Join the cluster (catch up from a peer, or load the engine's log)."""
        d: defer.Deferred[None] = self.backplane.start()
        d.addErrback(lambda f: log.failure("joining the cluster failed", failure=f))
        if self.spreads is not None:
            self.spreads.start()
        if self.stream_cluster is not None:  # (Redis: who holds the subscriptions)
            self.stream_cluster.start()
        return d

    def stats(self) -> dict[str, Any]:
        stats = self.fleet.stats() if self.fleet is not None else self.worker_stats()
        return {**stats, "build": BUILD}  # compiled or interpreted core (pushup/_build.py)

    def worker_stats(self) -> dict[str, Any]:
        """This process's figures (the node's, unless it is one of ``--workers``)."""
        return {**self.service.snapshot(rss=rss_bytes()), **self.backplane.stats(),
                "engine_up": self.engine_up(),
                "stream_long_polls": self.handlers.streams.long_polls,
                **({} if self.presence is None else {"presence": self.presence.figures()}),
                **({} if self.webhooks is None else {"webhooks": self.webhooks.stats()}),
                "stream_sse_readers": self.handlers.streams.sse_readers,
                "streams": self.stream_figures(),
                **({} if self.subscriptions is None
                   else {"stream_subscriptions": {
                       **self.subscriptions.stats(),
                       **({} if self.stream_cluster is None else self.stream_cluster.stats())}}),
                "timings": self.timings.figures()}

    def stream_figures(self) -> dict[str, int]:
        """The Durable Streams this node holds (/stats ``streams``): how many
        answer at a path, what they are charged against ``--max-cached-bytes``
        and the producers they keep; with ``--engine redis`` Redis holds them
        (the budget caps one write), so only how many this node has cached."""
        endpoints = self.handlers.streams
        return endpoints.streams.figures(shared=endpoints.engine.shared)

    def engine_up(self) -> int:
        """1 if the engine can take a publish now (the gauge an alert watches)."""
        try:
            self.backplane.check_ready()
        except PushUpError:
            return 0
        redis = self.backplane.stats().get("redis")
        return 0 if redis is not None and not redis["up"] else 1

    def metrics(self) -> tuple[bytes, bytes]:
        if self.fleet is not None:
            return CONTENT_TYPE_LATEST.encode(), self.fleet.metrics_text()
        return CONTENT_TYPE_LATEST.encode(), prometheus_text(self.registry)

    @defer.inlineCallbacks
    def stop(self) -> Any:
        """Drain, all within ``DRAIN_LIMIT`` seconds (past ``--drain-window``),
        in this order.

        The public port closes at once (a load balancer's next connection goes
        to another node); every held long poll is answered; event streams end
        at once, or with ``--drain-window`` one by one over that window
        (``pushup.http.stream_drain``), served meanwhile: the node still
        follows the cluster, and refuses publishes; peers then get what
        they lack for at most ``PEER_FLUSH`` seconds (a worker's private port,
        which its siblings flush to, stays open meanwhile); then connections
        close once their answers are sent, or when the limit is reached.
        """
        if self.port is not None:
            yield self.port.stopListening()
        window = self.config.drain_window
        streams = self.handlers.event_streams
        spread = streams.spread(window, random.Random()) if window > 0 else 0
        held = len(self.service.hub)
        self.service.drain(keep=streams.__contains__ if spread else None)
        log.info("stopped listening; draining: answered {n} waiting subscribers",
                 n=held - len(self.service.hub))
        self.handlers.streams.drain()  # Durable Streams' held reads, answered too
        if self.stream_cluster is not None:
            self.stream_cluster.stop()  # its news to the home: no retry armed
        # idle and answered connections go now, not after the flush; peers'
        # streams into us stay until then (they flush to us too), and so do
        # event streams given a time to end
        self.front.close_all(upgraded=False, streaming=not spread)
        if spread:
            log.info("draining: ending {n} event streams spread over {window} s",
                     n=spread, window=f"{window:g}")
            ended: defer.Deferred[None] = defer.Deferred()

            def all_ended() -> None:
                if not ended.called:  # (not after the timeout fired)
                    ended.callback(None)

            streams.when_empty(all_ended)
            ended.addTimeout(window + DRAIN_WINDOW_GRACE, self.reactor)
            try:
                yield ended
                log.info("draining: every event stream has ended")
            except defer.TimeoutError:
                log.warn("drain: {n} event streams had not ended by the window's end; "
                         "closing them", n=len(streams))
        started = self.reactor.seconds()
        if self.spreads is not None:  # (on Redis, this node's record goes)
            yield self.spreads.stop()
        yield self.backplane.stop(PEER_FLUSH)
        if self.private_port is not None:
            yield self.private_port.stopListening()
        if self.admin_port is not None:  # the figures stay readable during the drain
            yield self.admin_port.stopListening()
            self.admin.close_all()  # type: ignore[union-attr]
        closed = self.front.close_all()
        left = max(0.0, DRAIN_LIMIT - (self.reactor.seconds() - started))
        closed.addTimeout(left, self.reactor)
        try:
            yield closed
        except defer.TimeoutError:
            log.warn("drain: some clients did not read their answers in time")
        log.info("drained")
