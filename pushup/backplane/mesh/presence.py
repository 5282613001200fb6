"""Presence across the mesh: each node tells every peer its own subscriptions.

Every ``TICK_S`` a node POSTs to each peer (``/peer/presence``, signed like
every peer request) what changed in its own presence since its last message
to that peer, numbered, or, when the peer has not followed it (first
contact, a lost message, a restart: the peer answers 409), its whole state.
A message with nothing new is the heartbeat. A peer not heard from for
``DEAD_S`` is gone: its subscribers leave the roster (each node decides it
on its own clock; the webhooks' one sender says it once). What this module
hands on and takes in are the core's values (:mod:`pushup.core.presence`);
the roster is the caller's (``Desk``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from twisted.internet import defer, task
from twisted.logger import Logger

from pushup.backplane import EngineAnswer
from pushup.core import errors
from pushup.core.presence import (
    Change,
    Presence,
    State,
    changes_json,
    changes_of,
    state_json,
    state_of,
)

log = Logger()
PATH = "/peer/presence"
TICK_S = 0.25  # how often changes go out (and the heartbeat)
DEAD_S = 3.0  # a peer not heard from for this long is gone


class Desk(Protocol):
    """The presence desk (pushup.http.presence.PresenceDesk), as far as we use it."""

    node: str
    local: Presence
    local_listeners: list[Any]

    def node_changes(self, node: str, changes: list[Change]) -> None: ...

    def node_state(self, node: str, state: State) -> None: ...

    def node_gone(self, node: str) -> None: ...


class Link(Protocol):
    url: str

    def request(self, method: str, path: str, body: bytes = b"") -> Any: ...


@dataclass(slots=True)
class _Outbound:
    link: Link
    pending: list[Change] = field(default_factory=list)
    seq: int = 0
    full: bool = True  # the peer needs our whole state next
    busy: bool = False


@dataclass(slots=True)
class _Heard:
    boot: str
    seq: int
    at: float


class MeshPresence:
    """This node's side of presence on the mesh: ``start`` after the links exist."""

    def __init__(self, desk: Desk, links: list[Any], clock: Any, boot: str) -> None:
        self.desk = desk
        self.clock = clock
        self.boot = boot  # this node's origin: a restarted node is followed anew
        self._out = [_Outbound(link) for link in links]
        self._heard: dict[str, _Heard] = {}
        self._loop = task.LoopingCall(self._tick)
        self._loop.clock = clock
        self._ticked = 0.0  # when the loop last ran
        desk.local_listeners.append(self._changed)

    def start(self) -> None:
        self._ticked = self.clock.seconds()
        self._loop.start(TICK_S, now=False)

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()

    def _changed(self, changes: list[Change]) -> None:
        for out in self._out:
            if not out.full:
                out.pending += changes

    # -- out -------------------------------------------------------------------

    def _tick(self) -> None:
        for out in self._out:
            if not out.busy:
                self._send(out)
        now = self.clock.seconds()
        late = now - self._ticked - TICK_S
        self._ticked = now
        if late > TICK_S:  # this node stalled: its peers' silence meanwhile says nothing
            for heard in self._heard.values():
                heard.at += late
        for node, heard in list(self._heard.items()):
            if now - heard.at > DEAD_S:
                del self._heard[node]
                self.desk.node_gone(node)

    @defer.inlineCallbacks
    def _send(self, out: _Outbound) -> Any:
        out.busy = True
        out.seq += 1
        message: dict[str, Any] = {"node": self.desk.node, "boot": self.boot, "seq": out.seq}
        if out.full:
            message["state"] = state_json(self.desk.local.state())
            out.full = False
            out.pending = []
        else:
            message["changes"] = changes_json(out.pending)
            out.pending = []
        try:
            status, _ = yield out.link.request("POST", PATH, json.dumps(message).encode())
        except Exception:  # the peer is down: its link says so; whole state next time
            status = 0
        out.busy = False
        if status != 204:
            out.full = True  # it did not follow (409), or lost us: start again

    # -- in --------------------------------------------------------------------

    def receive(self, body: bytes) -> EngineAnswer:
        """A peer's message (signed already): 204, or 409 when it must send
        its whole state (we did not follow it)."""
        try:
            message = json.loads(body)
            node, boot, seq = message["node"], message["boot"], message["seq"]
            if not (isinstance(node, str) and isinstance(boot, str) and isinstance(seq, int)):
                raise ValueError("node, boot and seq")
            state = state_of(message["state"]) if "state" in message else None
            changes = None if state is not None else changes_of(message["changes"])
        except (ValueError, KeyError, TypeError) as e:
            raise errors.BadRequest(f"not a presence message: {e}") from None
        if node == self.desk.node:
            raise errors.BadRequest("a presence message from this node's own id")
        heard = self._heard.get(node)
        now = self.clock.seconds()
        if state is not None:
            if heard is None or heard.boot != boot:
                log.info("presence: following node {node}", node=node)
            self._heard[node] = _Heard(boot, seq, now)
            self.desk.node_state(node, state)
            return EngineAnswer(204)
        if heard is None or heard.boot != boot or seq != heard.seq + 1:
            return EngineAnswer(409, b'{"error":{"code":"conflict","message":"send the state"}}')
        heard.seq, heard.at = seq, now
        assert changes is not None
        if changes:
            self.desk.node_changes(node, changes)
        return EngineAnswer(204)
