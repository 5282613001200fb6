"""Subscriber tokens for a backend to hand its pages: HS256 JWTs with the
claims ``channels`` and ``exp``, as ``pushup token`` signs them and a node
started with ``--subscribe-secret`` checks them (docs/api.md, "Subscriber
tokens"). Pure: the caller may pass the time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import jwt


def mint_token(secret: str, channels: Iterable[str], ttl: float = 3600.0,
               now: float | None = None) -> str:
    """A token granting ``channels`` (exact names, or prefixes ending in ``*``;
    ``*`` alone grants all) for ``ttl`` seconds. Raises ValueError for an
    empty list, an empty name, or a name holding a comma."""
    names = list(channels)
    if not names:
        raise ValueError("a token needs at least one channel")
    for name in names:
        if not name or "," in name:
            raise ValueError(f"not a channel name or prefix: {name!r}")
    expires = (time.time() if now is None else now) + ttl
    return jwt.encode({"channels": names, "exp": int(expires)}, secret, algorithm="HS256")
