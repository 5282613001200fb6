"""Subscriber tokens for a backend to hand its pages: JWTs with the claims
``channels`` and ``exp``, as ``pushup token`` signs them. HS256 with the secret
a node started with ``--subscribe-secret`` checks; or RS256, ES256 or EdDSA
with a private key whose public half the node's ``--subscribe-jwks`` lists
under ``kid`` (docs/api.md, "Subscriber tokens"; those need PyJWT's
``cryptography``: ``pip install 'pyjwt[crypto]'``). Pure: the caller may pass
the time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import jwt


def mint_token(secret: Any, channels: Iterable[str], ttl: float = 3600.0,
               now: float | None = None, *, algorithm: str = "HS256",
               kid: str | None = None, issuer: str | None = None,
               audience: str | None = None) -> str:
    """A token granting ``channels`` (exact names, or prefixes ending in ``*``;
    ``*`` alone grants all) for ``ttl`` seconds, signed with ``secret``: the
    HS256 secret, or for ``algorithm`` RS256, ES256 or EdDSA a private key (PEM
    text or a ``cryptography`` key) named by ``kid``. ``issuer`` and
    ``audience`` add the claims ``iss`` and ``aud`` (``--subscribe-issuer``,
    ``--subscribe-audience``). Raises ValueError for an empty list, an empty
    name, a name holding a comma, or an asymmetric key without a ``kid``."""
    names = list(channels)
    if not names:
        raise ValueError("a token needs at least one channel")
    for name in names:
        if not name or "," in name:
            raise ValueError(f"not a channel name or prefix: {name!r}")
    if algorithm != "HS256" and not kid:
        raise ValueError(f"an {algorithm} token needs a kid: the node picks its key by it")
    expires = (time.time() if now is None else now) + ttl
    claims: dict[str, Any] = {"channels": names, "exp": int(expires)}
    if issuer:
        claims["iss"] = issuer
    if audience:
        claims["aud"] = audience
    return jwt.encode(claims, secret, algorithm=algorithm,
                      headers={"kid": kid} if kid else None)
