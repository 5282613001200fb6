"""Presence across nodes on Redis: each node's own subscriptions in a record that expires.

Every ``TICK_S`` a node writes, when its presence changed, its whole state to
``pushup:{presence}:state:<node>`` and its version to
``pushup:{presence}:version:<node>`` (both with ``PX`` ``DEAD_S``; unchanged,
it only renews them), names itself in the set ``pushup:{presence}:nodes``,
and reads the others' versions, then the states that changed. A node whose
version key is gone (it stopped renewing it ``DEAD_S`` ago) is gone: its
subscribers leave. Every key carries the hash tag ``{presence}``, so on a
Redis Cluster they share one slot and ``MGET`` works. Commands go through the
engine's ``Shards``; what this module hands on are the core's values
(:mod:`pushup.core.presence`), to the caller's roster (``Desk``).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from twisted.internet import defer, task
from twisted.logger import Logger
from twisted.python.failure import Failure

from pushup.backplane.redis.cluster import Shards
from pushup.core.presence import Change, Presence, State, state_json, state_of

log = Logger()
TICK_S = 0.25  # how often a node writes (when changed) and reads the others'
DEAD_S = 3.0  # a record not renewed for this long expires: its node is gone
PREFIX = "pushup:{presence}:"
NODES = PREFIX + "nodes"


class Desk(Protocol):
    """The presence desk (pushup.http.presence.PresenceDesk), as far as we use it."""

    node: str
    local: Presence
    local_listeners: list[Any]

    def node_state(self, node: str, state: State) -> None: ...

    def node_gone(self, node: str) -> None: ...


class RedisPresence:
    """This node's side of presence on Redis: ``start`` once, ``stop`` at the drain."""

    def __init__(self, desk: Desk, shards: Shards, clock: Any, boot: str,
                 timeout: float) -> None:
        self.desk = desk
        self.shards = shards
        self.clock = clock
        self.boot = boot
        self.timeout = timeout
        self._version = 0  # of this node's state: moved by each change
        self._written = -1  # the version in Redis
        self._seen: dict[str, bytes] = {}  # another node's version, as last read
        self._busy = False
        self._failing = False
        self._loop = task.LoopingCall(self._tick)
        self._loop.clock = clock
        desk.local_listeners.append(self._changed)

    def start(self) -> None:
        self._loop.start(TICK_S, now=False)

    @defer.inlineCallbacks
    def stop(self) -> Any:
        """Stop, and take this node's record out (its subscribers leave at once)."""
        if self._loop.running:
            self._loop.stop()
        node = self.desk.node
        try:
            yield self.shards.execute(NODES, "DEL", PREFIX + "version:" + node,
                                      PREFIX + "state:" + node, timeout=self.timeout)
        except Exception as e:  # Redis away: the record expires by itself
            log.debug("presence: record not removed: {e}", e=e)

    def _changed(self, changes: list[Change]) -> None:
        self._version += 1

    def _tick(self) -> None:
        if not self._busy:
            self._busy = True
            self._round().addBoth(self._done)

    def _done(self, outcome: Any) -> None:
        self._busy = False
        failed = isinstance(outcome, Failure)
        if failed != self._failing:
            self._failing = failed
            if isinstance(outcome, Failure):
                log.warn("presence: Redis unreachable ({e}); retrying", e=outcome.value)
            else:
                log.info("presence: Redis reachable again")

    @defer.inlineCallbacks
    def _round(self) -> Any:
        node, execute, ttl = self.desk.node, self.shards.execute, int(DEAD_S * 1000)
        version_key, state_key = PREFIX + "version:" + node, PREFIX + "state:" + node
        version = self._version
        stamp = f"{self.boot}:{version}"
        if version != self._written:
            body = json.dumps(state_json(self.desk.local.state()), separators=(",", ":"))
            yield execute(NODES, "SET", state_key, body, "PX", ttl, timeout=self.timeout)
            yield execute(NODES, "SET", version_key, stamp, "PX", ttl, timeout=self.timeout)
            self._written = version
        else:
            yield execute(NODES, "PEXPIRE", state_key, ttl, timeout=self.timeout)
            renewed = yield execute(NODES, "PEXPIRE", version_key, ttl, timeout=self.timeout)
            if not renewed:  # expired meanwhile (Redis was away): write it again
                self._written = -1
        yield execute(NODES, "SADD", NODES, node, timeout=self.timeout)
        names = yield execute(NODES, "SMEMBERS", NODES, timeout=self.timeout)
        others = sorted(n.decode() for n in names if n.decode() != node)
        if not others:
            self._forget(set())
            return
        versions = yield execute(NODES, "MGET", *(PREFIX + "version:" + n for n in others),
                                 timeout=self.timeout)
        live = {n for n, v in zip(others, versions, strict=True) if v is not None}
        changed = [n for n, v in zip(others, versions, strict=True)
                   if v is not None and self._seen.get(n) != v]
        gone = [n for n in others if n not in live]
        if gone:  # tidy the directory (a live node names itself again next round)
            yield execute(NODES, "SREM", NODES, *gone, timeout=self.timeout)
        self._forget(live)
        if changed:
            states = yield execute(NODES, "MGET", *(PREFIX + "state:" + n for n in changed),
                                   timeout=self.timeout)
            for name, raw, v in zip(changed, states, versions_of(others, versions, changed),
                                    strict=True):
                if raw is None:
                    continue
                try:
                    state = state_of(json.loads(raw))
                except ValueError as e:
                    log.warn("presence: node {node}'s record is unreadable: {e}", node=name, e=e)
                    continue
                if name not in self._seen:
                    log.info("presence: following node {node}", node=name)
                self._seen[name] = v
                self.desk.node_state(name, state)

    def _forget(self, live: set[str]) -> None:
        for name in [n for n in self._seen if n not in live]:
            del self._seen[name]
            self.desk.node_gone(name)


def versions_of(names: list[str], versions: list[Any], wanted: list[str]) -> list[Any]:
    by_name = dict(zip(names, versions, strict=True))
    return [by_name[n] for n in wanted]
