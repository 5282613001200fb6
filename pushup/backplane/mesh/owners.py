"""Which node of the mesh holds a Durable Stream, and the mark of a request
one node hands another for it.

A stream has one owner: the member of the configured cluster (this node's
``--advertise-url`` and its ``--peer`` URLs) that rendezvous (highest random
weight) hashing of the stream's path picks. The members are static, so every
node picks the same owner without asking anyone, and a node that is down
keeps its streams (it is never replaced by a live one, which would split
a stream in two). A fork lives with its source instead; its path's owner
then keeps a placement saying where (:mod:`pushup.backplane.mesh.stream_routes`).

A request a node hands on carries ``X-PushUp-Stream-Hop: KIND TIME SIGNATURE``,
an HMAC with the cluster secret over the kind, method, path and time
(:func:`pushup.backplane.mesh.wire.sign`), so only a member can say "serve
this here". Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from urllib.parse import urlsplit

from pushup.backplane.mesh.wire import sign, verify
from pushup.core import errors

HOP = b"x-pushup-stream-hop"
# The kinds of hop: to the path's owner (it may follow a placement), to the
# node that serves the stream (it answers, never hands on), and the question
# where a path's stream lives (answered in NODE); and the subscriptions' home
# and the other nodes asking each other (pushup.backplane.mesh.stream_subscriptions).
TO_OWNER, SERVE_HERE, WHERE = "owner", "here", "where"
SUBSCRIPTIONS = "subscriptions"
KINDS = (TO_OWNER, SERVE_HERE, WHERE, SUBSCRIPTIONS)
NODE = b"x-pushup-stream-node"


def member(url: str) -> str:
    """A member's URL as every node spells it: scheme and host lower-case,
    no trailing slash, a default port left out."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    if port is None or (scheme, port) in (("http", 80), ("https", 443)):
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def advertised(host: str, port: int) -> str:
    """The URL a node is known by when ``--advertise-url`` is not given."""
    return member(f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}")


def weight(node: str, path: str) -> int:
    digest = hashlib.blake2b(f"{node}\n{path}".encode("utf-8", "surrogateescape"),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner_of(path: str, members: Sequence[str]) -> str:
    """The member that owns ``path``: the highest weight (ties by URL)."""
    return max(members, key=lambda node: (weight(node, path), node))


def hop_mark(secret: str, kind: str, method: bytes, path: bytes, now_s: float) -> bytes:
    when = int(now_s)
    signature = sign(secret, method.decode("latin-1"), f"{kind} {path.decode('latin-1')}",
                     when, b"")
    return f"{kind} {when} {signature}".encode()


def hop_kind(secret: str, mark: bytes, method: bytes, path: bytes, now_s: float) -> str:
    """The kind of a hop whose mark is signed with ``secret``; 401 otherwise
    (a client cannot make a node serve a stream it does not own)."""
    parts = mark.decode("latin-1").split(" ")
    if (len(parts) != 3 or parts[0] not in KINDS or not secret
            or not verify(secret, method.decode("latin-1"),
                          f"{parts[0]} {path.decode('latin-1')}", parts[1], b"", parts[2],
                          now_s)):
        raise errors.Unauthorized("a stream request handed on by a node must be signed with "
                                  "the cluster secret")
    return parts[0]
