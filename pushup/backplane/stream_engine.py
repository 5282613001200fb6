"""The seam between a node's Durable Streams and its cluster: the ``StreamEngine``.

The core's :class:`pushup.core.streams.Streams` decides every request to a
stream; an engine says where that decision is made and on what (as
centrifuge's ``MapBroker`` sits beside its ``Broker``). The HTTP layer hands
each request to its engine's ``serve`` with the decision to run, and renders
what comes back, knowing nothing of which engine runs:

- ``LocalStreams``: every stream is this node's alone (one node, with or
  without ``--data-dir``, or a mesh without peers);
- ``pushup.backplane.redis.streams.SharedStreams`` (``--engine redis``): Redis
  holds every node's streams, this node's ``Streams`` a cache of them, and the
  decision runs on what Redis holds, its changes written before the answer;
- ``pushup.backplane.mesh.stream_routes.StreamRoutes`` (the mesh): each
  stream is one node's, and a request for another's is handed on to it.

The composition root (:mod:`pushup.ops.node`) builds the engine and passes it
in; nothing sets it later. The one way back is the outcome ``serve`` returns
(and, for a shared store, the ``Journal`` calls and named methods of the core
it adopts what it read through). This module opens no socket.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol


class StreamRequest(Protocol):
    """A request to a stream path, as the HTTP front read it (its ``Request`` is one)."""

    @property
    def method(self) -> bytes: ...

    @property
    def path(self) -> bytes: ...

    @property
    def query(self) -> bytes: ...

    @property
    def headers(self) -> dict[bytes, bytes]:
        """By lower-case name."""

    @property
    def body(self) -> bytes:
        """Whole (an engine may hand the request on to another node)."""


class StreamEngine(Protocol):
    """Where a node's Durable Streams are decided and served."""

    @property
    def shared(self) -> bool:
        """Whether a store shared with other nodes holds the streams (this
        node's ``Streams`` a cache): ``serve`` then answers through a
        Deferred always, the store sweeps what expired, and the node's byte
        budget caps one write."""

    def internal(self, request: StreamRequest) -> bool:
        """Whether ``request`` is a node's own question to another (no
        client's request: no client's authorization guards it); a
        ``PushUpError`` (401) for one that claims so wrongly."""

    def serve(self, paths: Sequence[str], run: Callable[[], object],
              request: StreamRequest | None = None, client: object = None) -> object:
        """``run()``'s outcome (the core deciding on the streams at
        ``paths``, the request's own last, a fork's source before it), or
        the answer of the node that serves the stream (a
        ``pushup.backplane.Relayed`` or ``RelayedStream``); either now or as
        a Deferred of one. A ``PushUpError`` (raised, or failing the
        Deferred) is the request's answer."""

    def drain(self) -> None:
        """The node stops: whatever the engine holds open for a request ends."""


class LocalStreams:
    """Every stream is this node's alone: the decision runs here, now."""

    shared = False

    def internal(self, request: StreamRequest) -> bool:
        return False

    def serve(self, paths: Sequence[str], run: Callable[[], object],
              request: StreamRequest | None = None, client: object = None) -> object:
        return run()

    def drain(self) -> None:
        pass
