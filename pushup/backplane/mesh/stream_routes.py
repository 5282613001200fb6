"""Where a Durable Streams request is served on the mesh: here, or on the
node that holds the stream, to which it is handed on.

Every stream has one node that serves it, so every reader sees one order and
every node's offsets are that node's. By default it is the path's owner
(:mod:`pushup.backplane.mesh.owners`): a node that does not own a path hands
each request to its owner. A fork must live with its source (it reads the
source's appends, and the source's deletion waits for its forks), so its
path's owner places it on its source's node and keeps that placement (on
disk with ``--data-dir``, written before the fork is made): the owner hands
every later request for the path there. Placements are never undone but by
a fork made at the path again, once nothing is left at the old place.

While the owner decides a fork's placement, other requests to that path wait.
This module decides; :mod:`pushup.backplane.mesh.relay` carries.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any, Protocol

from twisted.internet import defer
from twisted.web.iweb import IResponse

from pushup.backplane import Relayed, RelayedStream
from pushup.backplane.mesh.owners import (
    HOP,
    NODE,
    SERVE_HERE,
    SUBSCRIPTIONS,
    TO_OWNER,
    WHERE,
    hop_kind,
    member,
    owner_of,
)
from pushup.backplane.mesh.relay import EventClient, Relay
from pushup.backplane.stream_engine import StreamRequest
from pushup.core import errors

STREAM_PREFIX = b"/v1/stream/"
HEAD_WAIT_S = 0.0  # a catch-up read, a write, an event stream's head: the relay's own limit
Routed = Relayed | RelayedStream


class PlacementStore(Protocol):
    """Where placements are kept across restarts (``--data-dir``)."""

    def placed(self, path: str, node: str | None) -> None:
        """``path``'s stream lives on ``node`` now (None: on its owner);
        kept before this returns."""


class Placements:
    """The forks this node owns the paths of and placed on another node."""

    def __init__(self, kept: dict[str, str], store: PlacementStore | None = None) -> None:
        self.nodes = dict(kept)
        self.store = store

    def get(self, path: str) -> str | None:
        return self.nodes.get(path)

    def place(self, path: str, node: str | None) -> None:
        if self.store is not None:
            self.store.placed(path, node)
        if node is None:
            self.nodes.pop(path, None)
        else:
            self.nodes[path] = node


class StreamRoutes:
    """This node's view of the mesh's streams: who serves a path, and the
    hand-on of a request to it (the mesh's ``StreamEngine``)."""

    shared = False  # each stream is one node's, in its memory (and --data-dir)

    def __init__(self, me: str, peers: Sequence[str], secret: str, relay: Relay,
                 placements: Placements, holds: Callable[[str], bool],
                 longest_poll_s: float) -> None:
        """``me``: this node's URL as its peers name it; ``holds(path)``:
        whether a stream (live or deleted while forks read it) is at ``path``
        here; ``longest_poll_s``: the longest a long poll waits (--max-timeout)."""
        self.me = member(me)
        self.members = sorted({self.me, *(member(url) for url in peers)})
        self.secret = secret
        self.relay = relay
        self.placements = placements
        self.holds = holds
        self.longest_poll_s = longest_poll_s
        self._deciding: dict[str, list[defer.Deferred[None]]] = {}

    def drain(self) -> None:
        """Every event stream relayed from another node ends."""
        self.relay.drain()

    def internal(self, request: StreamRequest) -> bool:
        """Whether ``request`` is a node's own: asking the owner of a path
        where its stream lives (``WHERE``), or the subscriptions' home
        appending a wake (``SUBSCRIPTIONS``); every other hop is a client's
        request handed on, authorized again where it is served with the
        client's own headers. 401 if wrongly signed."""
        return self.hop(request) in (WHERE, SUBSCRIPTIONS)

    def serve(self, paths: Sequence[str], run: Callable[[], object],
              request: StreamRequest | None = None, client: object = None) -> object:
        """``run()`` here, or the serving node's answer (``route``) for the
        request to ``paths[-1]``."""
        assert request is not None
        return self.route(request, paths[-1], client, run,  # type: ignore[arg-type]
                          self.hop(request))

    def owner(self, path: str) -> str:
        return owner_of(path, self.members)

    def hop(self, request: StreamRequest) -> str | None:
        """The kind of hop ``request`` is (signed by a member), or None: a
        client's own. A mark not signed with the cluster secret is 401."""
        mark = request.headers.get(HOP)
        if mark is None:
            return None
        return hop_kind(self.secret, mark, request.method, request.path,
                        self.relay.clock.seconds())

    def route(self, request: StreamRequest, path: str, client: EventClient,
              here: Callable[[], object], kind: str | None) -> object:
        """``here()`` (this node serves it), or the answer of the node that
        does (a ``Relayed`` or ``RelayedStream``, or a Deferred of one or of
        ``here()``'s outcome). ``path`` is the stream's, as the request
        names it; ``kind`` its hop's (``hop``); a ``PushUpError`` refuses it."""
        if kind == SERVE_HERE:
            return here()
        owner = self.owner(path)
        if owner != self.me:
            if kind is not None:  # its sender thinks we own it: the members differ
                raise errors.EngineUnavailable(
                    "the nodes disagree on which of them holds this stream: every node's "
                    "--peer list and --advertise-url must name the same members")
            return self._hand_on(owner, TO_OWNER, request, client)
        if kind == WHERE:
            return Relayed(204, None, ((NODE, self.placed(path).encode()),), b"")
        waiting = self._deciding.get(path)
        if waiting is not None:  # a fork is being placed at this path
            turn: defer.Deferred[None] = defer.Deferred()
            waiting.append(turn)
            turn.addCallback(lambda _: self._as_owner(request, path, client, here))
            return turn
        return self._as_owner(request, path, client, here)

    def placed(self, path: str) -> str:
        """The node that serves ``path``, as its owner (this node) knows."""
        return self.placements.get(path) or self.me

    def _as_owner(self, request: StreamRequest, path: str, client: EventClient,
                  here: Callable[[], object]) -> object:
        if request.method == b"PUT" and b"stream-forked-from" in request.headers \
                and not self.holds(path):
            return self._place_fork(request, path, client, here)
        placed = self.placements.get(path)
        if placed is None:
            return here()
        return self._hand_on(placed, SERVE_HERE, request, client)

    def _hand_on(self, node: str, kind: str, request: StreamRequest,
                 client: EventClient) -> defer.Deferred[Routed]:
        query = request.query
        wait_s = self.longest_poll_s if b"live=long-poll" in query else HEAD_WAIT_S
        return self.relay.hand_on(node, kind, request, client, wait_s)

    @defer.inlineCallbacks
    def _place_fork(self, request: StreamRequest, path: str, client: EventClient,
                    here: Callable[[], object]) -> Generator[defer.Deferred[Any], Any, object]:
        """A fork made at a path this node owns: on its source's node."""
        waiting: list[defer.Deferred[None]] = []
        self._deciding[path] = waiting
        try:
            source = request.headers[b"stream-forked-from"].decode("latin-1")
            where: str = yield self._locate(source)
            placed = self.placements.get(path)
            if placed is not None and placed != where:
                head: IResponse = yield self.relay.send(  # with the client's token
                    placed, SERVE_HERE, b"HEAD", path.encode("latin-1"),
                    fields=_token_of(request))
                if head.code != 404:  # a stream is there still: it answers (409 or 200)
                    return (yield self._hand_on(placed, SERVE_HERE, request, client))
            if where == self.me:
                if placed is not None:
                    self.placements.place(path, None)
                return here()
            if placed != where:
                self.placements.place(path, where)  # kept before the fork is made
            return (yield self._hand_on(where, SERVE_HERE, request, client))
        finally:
            del self._deciding[path]
            for turn in waiting:
                turn.callback(None)

    def _locate(self, source: str) -> defer.Deferred[str]:
        """The node that serves the stream at ``source`` (its whole path, as
        ``Stream-Forked-From`` names it)."""
        owner = self.owner(source)
        if owner == self.me or not source.startswith(STREAM_PREFIX.decode()):
            return defer.succeed(self.placed(source))  # (no stream path: here says 404)
        asked: defer.Deferred[Any] = self.relay.send(owner, WHERE, b"HEAD",
                                                      source.encode("latin-1"))

        def answered(response: IResponse) -> str:
            node: str = (response.headers.getRawHeaders(NODE) or [b""])[0].decode("latin-1")
            if response.code != 204 or node not in self.members:
                raise errors.EngineUnavailable(f"{owner} did not say where {source[:200]} is")
            return node

        asked.addCallback(answered)
        return asked


def _token_of(request: StreamRequest) -> dict[bytes, bytes]:
    given = request.headers.get(b"authorization")
    return {} if given is None else {b"authorization": given}
