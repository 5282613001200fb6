"""Durable Streams subscriptions (protocol §6–7) on Redis: one node, the
home, holds them all, as on the mesh (whose news and hops this reuses:
:mod:`pushup.backplane.mesh.stream_subscriptions`); here the home is
whichever node holds a lease in Redis.

- **The lease.** ``pushup:{ds}:home`` holds the home's URL (``--advertise-url``,
  else ``http://HOST:PORT``), set ``NX`` with a ``LEASE_S`` expiry by the first
  node asked for a subscription while there is no home, renewed every
  ``CHECK_S`` while it lives. Every other node reads it every ``CHECK_S``,
  and hears at once when a node becomes home, and whenever a subscription is
  being made (the sharded channel ``pushup:{ds}:told``, published before
  the home answers): a node tells the home its news from then on, until
  the home answers that it holds none.
- **Requests.** A client's request under ``__ds/`` on another node goes to
  the home over HTTP as it came (the home authorizes it); one handed on to a
  node that is home no more is 503 (the client tries again).
- **What is kept.** Each subscription's state is a field of the hash
  ``pushup:{ds}:subs`` (JSON), written as it changes, in order, on one
  connection; a node that takes the lease over reads them back with every
  stream's tail (a ``SCAN`` of every primary for the streams' state), so
  what was appended meanwhile wakes. A home that cannot renew its lease
  stops holding them (its desk stops) before the lease can be another's.
- **News.** The other nodes tell the home their streams' changes as on the
  mesh, signed with ``--cluster-secret``, else with a random secret kept in
  Redis (``pushup:{ds}:secret``, made once by the first node).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Generator
from typing import Any

from twisted.internet import defer, task
from twisted.logger import Logger
from twisted.python.failure import Failure

from pushup.backplane.mesh.owners import HOP, TO_OWNER, hop_kind
from pushup.backplane.mesh.relay import Relay
from pushup.backplane.mesh.stream_subscriptions import HOME, MeshSubscriptions
from pushup.backplane.redis.cluster import Shards
from pushup.backplane.redis.streams import SharedStreams
from pushup.backplane.stream_engine import StreamRequest
from pushup.core import errors
from pushup.core.stream_values import Append, Position
from pushup.core.streams import Streams

log = Logger(namespace="pushup")
KEY_HOME = "pushup:{ds}:home"
KEY_SUBS = "pushup:{ds}:subs"
KEY_SECRET = "pushup:{ds}:secret"
TOLD = "pushup:{ds}:told"
LEASE_S = 6.0  # a home that stops renewing is replaced after this
CHECK_S = 2.0  # how often the home renews its lease, and the others read it
SCAN_COUNT = 1000
_RENEW = ("if redis.call('GET', KEYS[1]) == ARGV[1] then "
          "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end")
_STATE_KEYS = "pushup:{s:*:m"  # each stream's hash (pushup/backplane/redis/stream_keys.py)


class _Home:
    """What MeshSubscriptions asks of its routes, on Redis: this node, the
    relay to the home, the hops' signatures, and the home (for ``HOME``)."""

    def __init__(self, me: str, relay: Relay) -> None:
        self.me = me
        self.members = [me]  # the tails come from Redis, not from the nodes
        self.relay = relay
        self.home = ""

    def owner(self, path: str) -> str:
        assert path == HOME
        return self.home

    def hop(self, request: StreamRequest) -> str | None:
        mark = request.headers.get(HOP)
        if mark is None:
            return None
        return hop_kind(self.relay.secret, mark, request.method, request.path,
                        self.relay.clock.seconds())


class RedisKeeper:
    """The desk's keeper: the kept subscriptions read at the takeover, each
    change written to ``KEY_SUBS`` (in order; a failure said once)."""

    def __init__(self, shards: Shards, kept: dict[str, dict[str, Any]], timeout: float) -> None:
        self.shards = shards
        self.kept = kept
        self.timeout = timeout
        self._failing = False

    def subscriptions(self) -> dict[str, dict[str, Any]]:
        return self.kept

    def subscription_kept(self, sub_id: str, state: dict[str, object] | None) -> None:
        if state is None:
            written = self.shards.execute(KEY_SUBS, "HDEL", KEY_SUBS, sub_id,
                                          timeout=self.timeout)
        else:
            written = self.shards.execute(KEY_SUBS, "HSET", KEY_SUBS, sub_id,
                                          json.dumps(state, separators=(",", ":")),
                                          timeout=self.timeout)
        written.addCallbacks(self._written, self._unwritten)

    def _written(self, _: object) -> None:
        if self._failing:
            self._failing = False
            log.info("stream subscriptions: kept in Redis again")

    def _unwritten(self, failure: Any) -> None:
        if not self._failing:
            self._failing = True
            log.warn("stream subscriptions: a change was not kept in Redis ({why}); the "
                     "next home may not see it", why=failure.getErrorMessage())


class RedisSubscriptions(MeshSubscriptions):
    """This node's part on Redis (see the module's rule)."""

    complete = True  # Redis holds every stream

    def __init__(self, shards: Shards, shared: SharedStreams, streams: Streams, relay: Relay,
                 me: str, secret: str, now: Callable[[], int], timeout: float,
                 make_desk: Callable[[RedisKeeper], Any]) -> None:
        """``me``: this node's URL as the others reach it; ``secret``: the
        cluster secret (empty: one kept in Redis); ``make_desk(keeper)``: a
        new desk serving the subscriptions (its ``stop`` when they go)."""
        self.home_routes = _Home(me, relay)
        super().__init__(self.home_routes, streams, now)  # type: ignore[arg-type]
        self.redis = shards
        self.shared = shared
        self.timeout = timeout
        self.make_desk = make_desk
        self.home = self.home_routes.home = ""
        self.is_home = False
        self.given_secret = secret
        relay.secret = secret
        self._tails: dict[str, Position] | None = None  # read before a takeover's desk
        self._checks = task.LoopingCall(self._check)
        self._checks.clock = relay.clock
        self._waiting: list[defer.Deferred[None]] = []  # askers of the claim under way
        self._claim_failing = False  # said once until a claim succeeds

    def start(self) -> None:
        self.redis.subscribe(TOLD, self._told, lambda: None)
        self._checks.start(CHECK_S, now=True)

    def stop(self) -> None:
        super().stop()
        if self._checks.running:
            self._checks.stop()
        self.redis.unsubscribe(TOLD)
        if self.is_home:  # the next home need not wait for the lease to run out
            self.redis.execute(KEY_HOME, "EVAL", "if redis.call('GET', KEYS[1]) == ARGV[1] "
                               "then return redis.call('DEL', KEYS[1]) else return 0 end",
                               1, KEY_HOME, self.routes.me, timeout=self.timeout
                               ).addErrback(lambda _: None)

    # -- the home --------------------------------------------------------------------

    def _told(self, payload: bytes) -> None:
        """The home said its URL: it took them, or a subscription is being
        made (tell it our news again, though it said it held none)."""
        url = payload.decode("utf-8", "replace")
        self._home_is(url)
        if url and not self.is_home and not self.telling:
            self.telling = True

    def _home_is(self, url: str) -> None:
        if url == self.home or self.is_home:
            return
        self.home = self.home_routes.home = url
        self.telling = bool(url)  # a new home may hold subscriptions: tell it
        if url:
            self._send()

    @defer.inlineCallbacks
    def _check(self) -> Generator[Any, Any, None]:
        try:
            if not self.home_routes.relay.secret:
                yield self._secret()
            if self.is_home:
                renewed = yield self.redis.execute(
                    KEY_HOME, "EVAL", _RENEW, 1, KEY_HOME, self.routes.me,
                    int(LEASE_S * 1000), timeout=self.timeout)
                if not renewed:
                    self._lost("its lease is another node's")
                return
            home = yield self.redis.execute(KEY_HOME, "GET", KEY_HOME, timeout=self.timeout)
            self._home_is("" if home is None else _text(home))
            if home is None and (yield self.redis.execute(KEY_SUBS, "EXISTS", KEY_SUBS,
                                                          timeout=self.timeout)):
                yield self._claim()  # the home is gone, its subscriptions are not
        except Exception as e:
            if self.is_home:
                self._lost(f"Redis did not renew its lease: {e}")

    @defer.inlineCallbacks
    def _secret(self) -> Generator[Any, Any, None]:
        if self.given_secret:
            return
        yield self.redis.execute(KEY_SECRET, "SET", KEY_SECRET, secrets.token_hex(32), "NX",
                                 timeout=self.timeout)
        kept = yield self.redis.execute(KEY_SECRET, "GET", KEY_SECRET, timeout=self.timeout)
        self.home_routes.relay.secret = _text(kept)

    def _claim(self) -> defer.Deferred[None]:
        """Become the home if there is none: one claim at a time, each asker
        told when it ended (whatever its outcome: the asker looks again)."""
        waiter: defer.Deferred[None] = defer.Deferred()
        self._waiting.append(waiter)
        if len(self._waiting) == 1:
            self._claimed().addBoth(self._claim_done)
        return waiter

    def _claim_done(self, result: object) -> None:
        if not isinstance(result, Failure):
            self._claim_failing = False
        elif not self._claim_failing:  # once, not once a request
            self._claim_failing = True
            log.warn("stream subscriptions: this node could not take them ({why}); "
                     "trying again at the next request", why=result.getErrorMessage())
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            waiter.callback(None)

    @defer.inlineCallbacks
    def _claimed(self) -> Generator[Any, Any, None]:
        if not self.home_routes.relay.secret:
            yield self._secret()
        me = self.routes.me
        taken = yield self.redis.execute(KEY_HOME, "SET", KEY_HOME, me, "NX", "PX",
                                         int(LEASE_S * 1000), timeout=self.timeout)
        if taken is None:
            home = yield self.redis.execute(KEY_HOME, "GET", KEY_HOME, timeout=self.timeout)
            self._home_is("" if home is None else _text(home))
            return
        kept = yield self.redis.execute(KEY_SUBS, "HGETALL", KEY_SUBS, timeout=self.timeout)
        self._tails = yield self._scanned(self.now())  # (its own SPUBLISH below says it)
        states = {_text(kept[i]): json.loads(kept[i + 1]) for i in range(0, len(kept), 2)}
        self.home = self.home_routes.home = me
        self.is_home = True
        self.desk = self.make_desk(RedisKeeper(self.redis, states, self.timeout))
        yield self.redis.execute(TOLD, "SPUBLISH", TOLD, me, timeout=self.timeout)
        log.info("stream subscriptions: this node holds them now ({n} read back from Redis)",
                 n=len(states))

    def _lost(self, why: str) -> None:
        log.warn("stream subscriptions: this node holds them no more ({why})", why=why)
        self.is_home = False
        self.home = self.home_routes.home = ""
        desk, self.desk = self.desk, None
        if desk is not None:
            desk.stop()  # type: ignore[attr-defined]

    # -- a client's request --------------------------------------------------------------

    def serve(self, here: Callable[[], object], request: StreamRequest,
              client: object) -> object:
        if self.is_home:
            return here()
        if HOP in request.headers:  # handed on to us as the home: we are not
            raise errors.EngineUnavailable("the stream subscriptions moved to another node "
                                           "meanwhile; try again")
        if not self.home:
            return self._claim().addCallback(lambda _: self._served(here, request, client))
        return self._served(here, request, client)

    def _served(self, here: Callable[[], object], request: StreamRequest,
                client: object) -> object:
        if self.is_home:
            return here()
        if not self.home:
            raise errors.EngineUnavailable("no node holds the stream subscriptions now "
                                           "(Redis did not answer); try again")
        return self.home_routes.relay.hand_on(self.home, TO_OWNER, request,
                                              client, 0.0)  # type: ignore[arg-type]

    # -- the home's reach ------------------------------------------------------------------

    def tails(self, now: int) -> defer.Deferred[dict[str, Position]]:
        """Every stream's tail, as Redis holds them (each primary scanned)."""
        if self._tails is not None:  # read just before the takeover's desk asks
            tails, self._tails = self._tails, None
            return defer.succeed(tails)
        # a subscription is being made: every node tells its news from now on
        told = self.redis.execute(TOLD, "SPUBLISH", TOLD, self.routes.me, timeout=self.timeout)
        return told.addCallback(lambda _: self._scanned(now))

    @defer.inlineCallbacks
    def _scanned(self, now: int) -> Generator[Any, Any, dict[str, Position]]:
        tails: dict[str, Position] = {}
        for address in self.redis.primaries():
            cursor = b"0"
            while True:
                cursor, keys = yield self.redis.execute_on(
                    address, "SCAN", cursor, "MATCH", _STATE_KEYS, "COUNT", SCAN_COUNT,
                    timeout=self.timeout)
                states = yield defer.gatherResults([
                    self.redis.execute_on(address, "HGET", key, "state", timeout=self.timeout)
                    for key in keys])
                for state in states:
                    if state is None:
                        continue
                    value = json.loads(state)
                    deadline = value.get("deadline")
                    if value.get("deleted") or not value.get("mapped") or (
                            deadline is not None and now >= deadline):
                        continue
                    tails[value["path"]] = Position(*value["tail"])
                if _text(cursor) == "0":
                    break
        return tails

    def append(self, path: str, event: bytes, now: int) -> defer.Deferred[Position]:
        """A wake event appended as a client's append is: through Redis."""
        def run() -> Position:
            return self.streams.append(path, Append("application/json", event, False, None,
                                                    None), now).tail
        served: defer.Deferred[Position] = self.shared.serve([path], run)
        return served

    def heard(self, *args: Any, **kwargs: Any) -> None:
        if self.home or self.is_home:
            super().heard(*args, **kwargs)

    def gone(self, path: str) -> None:
        if self.home or self.is_home:
            super().gone(path)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

