"""The seam between a node and its cluster: the ``Backplane``.

Everything that changes what the cluster holds goes through a backplane:
publishes and channel operations. Each returns a Deferred that fires once the
change is *acknowledged* in the sense its engine promises (README, "What a
201 means"); only then does the client get its 201. The service, the store,
the hub and the cursor never know which backplane runs:

- ``Alone``: one node, no cluster (optionally a data directory, see
  :mod:`pushup.backplane.disk`);
- ``pushup.backplane.mesh.mesh.Mesh``: the full mesh of peers;
- ``pushup.backplane.redis.engine.RedisEngine``: one ordered log in Redis.

A backplane may also answer requests of its own under one path prefix (a
``Mount``): the HTTP layer hands each over as an ``EngineRequest`` and
renders the ``EngineAnswer``, or hands the connection to the protocol
``Mount.upgrade`` gives, knowing nothing of what they carry. A request the
node hands on to another (a Durable Stream's owner on the mesh) comes back
``Relayed``, or as a ``RelayedStream`` for an event stream.

This module holds the interface and the values that cross it (a channel
operation, ``ChannelOp``, is the core's: :mod:`pushup.core.channels`); it
opens no socket. ``trouble`` words a lost or refused connection for a log
line, as every backplane says it; ``client_endpoint`` is how every engine
dials TCP.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from twisted.internet import defer
from twisted.internet.interfaces import IProtocol

from pushup.core.channels import Channel
from pushup.core.idempotency import Idem
from pushup.core.model import Draft, Message
from pushup.core.service import Service


class EngineRequest(Protocol):
    """A request to an engine's own endpoints (under its mount's prefix), as the
    HTTP front read it (its ``Request`` is one)."""

    @property
    def method(self) -> bytes: ...

    @property
    def path(self) -> bytes:
        """The whole path, prefix included."""

    @property
    def body(self) -> bytes: ...

    def header(self, name: bytes) -> str:
        """A header's value as text ('' when absent); ``name`` in lower case."""


@dataclass(frozen=True, slots=True)
class EngineAnswer:
    """What an engine's endpoint answers: a status and a body (JSON), or none."""

    status: int
    body: bytes | None = None


class Mount(Protocol):
    """An engine's own endpoints: every path under ``prefix`` is the engine's,
    and the HTTP front knows nothing of what they carry."""

    prefix: bytes  # e.g. b"/peer/"
    body_limit: int  # the most body bytes a request to them may bring

    def admit(self, method: bytes, path: bytes, headers: Mapping[bytes, bytes]) -> int:
        """Before the body: the most body bytes this request may bring (0 for an
        upgrade, which authenticates itself); raises a ``PushUpError`` to refuse
        it unread (counted by the engine)."""

    def upgrade(self, request: EngineRequest) -> IProtocol | None:
        """The protocol that takes over a connection this request asks to
        upgrade, or None if it is no upgrade of the engine's."""

    def answer(self, request: EngineRequest, now: float) -> EngineAnswer:
        """The answer to a request; a ``PushUpError`` to refuse it."""


Fields = tuple[tuple[bytes, bytes], ...]


@dataclass(frozen=True, slots=True)
class Relayed:
    """The whole answer another node gave a request this node handed on to
    it (a Durable Stream's owner, on the mesh), to give the client as it is."""

    status: int
    content_type: bytes | None
    fields: Fields  # its headers but those of the connection (length, date, ...)
    body: bytes


@dataclass(frozen=True, slots=True)
class RelayedStream:
    """An event stream another node answers, being relayed to the client
    (already opened on it); ``cancel`` once the client goes first."""

    cancel: Callable[[], None]


class Unconfirmed(list[Message]):
    """A publish's messages, stored by this node but held by no other yet.

    A backplane that promises more than "this node has it" (the mesh with
    ``--publish-ack peer``) fires with this when it cannot keep the promise
    in time: the messages are published and will be delivered, but the crash
    of this node before a peer has them would lose them. Answered 202, not 201.
    """


class Backplane(Protocol):
    """What a node needs of its cluster, whichever engine carries it."""

    engine: str  # "single", "mesh" or "redis": shown in /stats

    def check_ready(self) -> None:
        """Raise ``errors.Unavailable`` while the node cannot serve (catching up)."""

    def publish(self, drafts: Sequence[Draft], idem: Idem | None = None,
                ) -> defer.Deferred[list[Message]]:
        """Accept a batch (all or nothing); fires once it is acknowledged.

        With ``idem``, a key remembered anywhere in the cluster within its
        window stores nothing and fires with the first attempt's messages
        (``idempotency.Replayed``), once they are acknowledged as the first
        attempt's would be; the key with another body fails with
        ``errors.KeyReused``.
        """

    def create_channel(self, name: str | None, ttl: int | None) -> defer.Deferred[Channel]: ...

    def renew_channel(self, name: str, ttl: int | None) -> defer.Deferred[Channel]: ...

    def delete_channel(self, name: str) -> defer.Deferred[None]: ...

    def prepare(self, channels: Iterable[str]) -> defer.Deferred[None] | None:
        """Before a request reads ``channels``: None when this node holds what
        they need (always, but for the Redis engine, which follows only what
        its clients read), else a Deferred that fires once it does."""

    def start(self) -> defer.Deferred[None]:
        """Join: load what the cluster holds; the node is healthy after it."""

    def stop(self, grace: float) -> defer.Deferred[None]:
        """Hand on what only this node holds (within ``grace`` s), then stop."""

    def stats(self) -> dict[str, Any]:
        """The engine's part of ``/stats``: ``engine``, ``peers`` and its own."""


@runtime_checkable
class ExternalEngine(Protocol):
    """A backplane that relies on a server outside the node (Redis): the node
    can be up while that server is not, and then it cannot take a publish.
    ``/health`` asks ``probe`` so that a balancer stops sending it traffic."""

    def probe(self) -> defer.Deferred[dict[str, Any]]:
        """Fires, once the engine answered, with what ``/health``'s body adds
        (how each part of the engine is: on Redis, each primary's state), while
        the engine can serve some of what this node serves; fails with
        ``errors.EngineUnavailable`` when it can serve none of it: unreachable,
        or not answering in time (never anything else)."""


def client_endpoint(reactor: Any, host: str, port: int, timeout: float) -> Any:
    """The one way an engine dials TCP: an IPv4 or IPv6 literal directly,
    any other name through Twisted's ``HostnameEndpoint`` (which resolves in a
    thread and staggers attempts, so even a refused connection to 127.0.0.1
    would take a few hundred milliseconds to be reported)."""
    from twisted.internet.endpoints import (
        HostnameEndpoint,
        TCP4ClientEndpoint,
        TCP6ClientEndpoint,
    )

    try:
        version = ipaddress.ip_address(host).version
    except ValueError:
        return HostnameEndpoint(reactor, host, port, timeout=timeout)
    kind = TCP4ClientEndpoint if version == 4 else TCP6ClientEndpoint
    return kind(reactor, host, port, timeout=timeout)


class Alone:
    """One node and no cluster: what it accepts is acknowledged at once."""

    engine = "single"

    def __init__(self, service: Service) -> None:
        self.service = service

    def check_ready(self) -> None:
        pass

    def publish(self, drafts: Sequence[Draft], idem: Idem | None = None,
                ) -> defer.Deferred[list[Message]]:
        return defer.succeed(self.service.publish(drafts, idem))

    def create_channel(self, name: str | None, ttl: int | None) -> defer.Deferred[Channel]:
        return defer.succeed(self.service.create_channel(name, ttl))

    def renew_channel(self, name: str, ttl: int | None) -> defer.Deferred[Channel]:
        return defer.succeed(self.service.renew_channel(name, ttl))

    def delete_channel(self, name: str) -> defer.Deferred[None]:
        self.service.delete_channel(name)
        return defer.succeed(None)

    def prepare(self, channels: Iterable[str]) -> None:
        return None

    def start(self) -> defer.Deferred[None]:
        return defer.succeed(None)

    def stop(self, grace: float) -> defer.Deferred[None]:
        return defer.succeed(None)

    def stats(self) -> dict[str, Any]:
        return {"engine": self.engine, "peers": []}


def trouble(reason: object) -> str:
    """What went wrong with a connection, in a few words for a log line:
    Twisted's own sentences ("Connection was closed cleanly.") end in a full
    stop and say more than an operator needs, inside our ``(...)`` or before
    our ``;``. ``reason`` is a Failure or an exception."""
    from twisted.internet import error as twisted_errors

    problem = getattr(reason, "value", reason)  # a Failure's exception
    for kind, words in ((twisted_errors.ConnectionDone, "closed by the other end"),
                        (twisted_errors.ConnectionLost, "connection cut"),
                        (twisted_errors.ConnectionRefusedError, "connection refused"),
                        (twisted_errors.TCPTimedOutError, "connection timed out"),
                        (twisted_errors.TimeoutError, "connection timed out")):
        if isinstance(problem, kind):
            return words
    return str(problem).strip().rstrip(".") or type(problem).__name__
