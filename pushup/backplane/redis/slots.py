"""Which Redis node holds what: the slot of a key (``key_slot``, by its ``hash_tag``,
the one rule for what of a name Redis Cluster hashes) and the slot map a
node reports (``Topology``), read by ``read_topology`` with one question to one node on
a connection of its own. Values and pure functions otherwise: no routing, and no
connection outlives its question (pool.py keeps the long-lived ones).
"""

from __future__ import annotations

import binascii
from collections.abc import Generator
from dataclasses import dataclass, replace
from typing import Any

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import connectProtocol

from pushup.backplane.redis.client import RedisProtocol, redis_endpoint
from pushup.config import RedisURL

SLOTS = 16384


def hash_tag(name: str) -> str:
    """What of a key or a channel's name Redis Cluster hashes: the part between its
    first ``{`` and the next ``}`` if that is not empty, else the whole name."""
    start = name.find("{")
    if start >= 0:
        end = name.find("}", start + 1)
        if end > start + 1:
            return name[start + 1:end]
    return name


def key_slot(key: str | bytes) -> int:
    """Redis Cluster's slot of ``key``: CRC16/XMODEM of its ``hash_tag``, mod 16384."""
    if isinstance(key, str):
        data = hash_tag(key).encode()  # UTF-8 never puts "{" or "}" inside a character
    else:  # latin-1 maps each byte to one character and back
        data = hash_tag(key.decode("latin-1")).encode("latin-1")
    return binascii.crc_hqx(data, 0) % SLOTS  # crc_hqx from 0 is CRC16/XMODEM


def address_of(url: RedisURL) -> str:
    """How a node is named in logs, /stats and MOVED replies: host:port ([v6]:port), or
    a Unix socket's path."""
    if url.path is not None:
        return url.path
    return f"[{url.host}]:{url.port}" if ":" in url.host else f"{url.host}:{url.port}"


@dataclass(frozen=True, slots=True)
class Topology:
    """Who owns each slot (by ``address_of``), and where to connect to each address."""

    clustered: bool
    owners: tuple[str | None, ...]  # SLOTS entries; None: no node serves the slot
    urls: dict[str, RedisURL]  # every node named, replicas too (to ask them next time)

    @staticmethod
    def single(url: RedisURL) -> Topology:
        """One redis-server: it owns every slot."""
        return Topology(False, (address_of(url),) * SLOTS, {address_of(url): url})

    @staticmethod
    def from_cluster_slots(reply: list[Any], asked: RedisURL) -> Topology:
        """The map in a ``CLUSTER SLOTS`` reply from the node at ``asked``; every node is
        reached with ``asked``'s credentials, database 0."""
        owners: list[str | None] = [None] * SLOTS
        urls: dict[str, RedisURL] = {}
        for start, end, *members in reply:
            for index, (host, port, *_rest) in enumerate(members):
                url = replace(asked, host=host.decode() if host else asked.host,  # "": asked
                              port=int(port), path=None, db=0)
                address = address_of(url)
                urls[address] = url
                if index == 0:  # the primary; then its replicas
                    owners[start:end + 1] = [address] * (end + 1 - start)
        return Topology(True, tuple(owners), urls)


@defer.inlineCallbacks
def read_topology(reactor: Any, url: RedisURL,
                  timeout: float) -> Generator[Deferred[Any], Any, Topology]:
    """Ask the node at ``url`` whether it is a cluster (``INFO cluster``) and if so for
    its ``CLUSTER SLOTS``, on a connection of its own, closed after (cancel the Deferred
    to drop it sooner). Database 0 whatever ``url`` says: a cluster refuses SELECT."""
    protocol = RedisProtocol(reactor, password=url.password, username=url.username,
                             handshake_timeout=timeout)
    yield connectProtocol(redis_endpoint(reactor, url, timeout),  # type: ignore[no-untyped-call]
                          protocol)
    try:
        yield protocol.ready
        info = yield protocol.execute("INFO", "cluster", timeout=timeout)
        if b"cluster_enabled:1" not in info:
            return Topology.single(url)
        reply = yield protocol.execute("CLUSTER", "SLOTS", timeout=timeout)
        return Topology.from_cluster_slots(reply, url)
    finally:
        protocol.abort("topology read")
