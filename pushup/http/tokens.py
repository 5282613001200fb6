"""Subscriber tokens: JWTs that name the channels a subscriber may read.

A token's claim ``channels`` lists exact names and prefixes ending in ``*``
(``chat:room42:*``); its standard claim ``exp`` bounds its life. It is signed
HS256 with a shared secret (the current one or the previous, for rotation), or
RS256, ES256 or EdDSA with a private key whose public half a JWKS lists under
the token's ``kid``. PyJWT checks every signature; this module only chooses
the key, and never reads a socket or the clock: the caller passes the time,
and the keys come from a ``KeySource`` (a file's, or a URL's fetched by
:mod:`pushup.ops.jwks`). A verified token's grants are kept (keyed by the
token itself, bounded) so a poll costs a dictionary lookup, not a signature.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import jwt
from twisted.internet import defer

from pushup.core.errors import Forbidden, Unauthorized

ALGORITHM = "HS256"  # with --subscribe-secret (and --subscribe-secret-previous)
ASYMMETRIC = ("RS256", "ES256", "EdDSA")  # with --subscribe-jwks
_KEPT = 4096  # verified tokens remembered


@dataclass(frozen=True, slots=True)
class Grant:
    exact: frozenset[str]
    prefixes: tuple[str, ...]
    expires: float
    not_before: float = 0.0

    def allows(self, channel: str) -> bool:
        return channel in self.exact or channel.startswith(self.prefixes)


def issue(key: Any, channels: Iterable[str], expires: float, *, algorithm: str = ALGORITHM,
          kid: str | None = None, issuer: str = "", audience: str = "", sub: str = "",
          info: Mapping[str, Any] | None = None) -> str:
    """A token for ``channels`` (names, or prefixes ending in ``*``) until
    ``expires``, signed with ``key``: the secret for HS256, a private key (PEM
    or a ``cryptography`` key) for RS256, ES256 or EdDSA, named by ``kid``.
    ``sub`` and ``info``: the user presence counts the subscriber as, and
    what it says of that user (docs/api.md, "Who a subscriber is")."""
    claims: dict[str, Any] = {"channels": list(channels), "exp": int(expires)}
    if issuer:
        claims["iss"] = issuer
    if audience:
        claims["aud"] = audience
    if sub:
        claims["sub"] = sub
    if info is not None:
        claims["info"] = dict(info)
    return jwt.encode(claims, key, algorithm=algorithm,
                      headers={"kid": kid} if kid is not None else None)


def signing_keys(jwks: Mapping[str, Any]) -> dict[str, jwt.PyJWK]:
    """The keys of a JWKS (``{"keys": [...]}``) a token may be verified with,
    by ``kid``: those for signing (``use`` absent or ``sig``) with a ``kid`` and
    one of the algorithms of :data:`ASYMMETRIC` (a symmetric ``oct`` key in a
    public key set is never one). Raises ``jwt.PyJWKSetError`` when none is."""
    found = {key.key_id: key for key in jwt.PyJWKSet.from_dict(dict(jwks)).keys
             if key.key_id and key.public_key_use in (None, "sig")
             and key.algorithm_name in ASYMMETRIC}
    if not found:
        raise jwt.PyJWKSetError(
            f"no key with a kid for {', '.join(ASYMMETRIC)} in the key set")
    return found


class KeySource(Protocol):
    """Where the public keys come from. ``version`` changes whenever the keys
    do (grants verified with a key since withdrawn are then forgotten)."""

    version: int

    def key(self, kid: str, now: float) -> jwt.PyJWK | None:
        """The key named ``kid`` now, or None."""

    def refresh(self, now: float) -> defer.Deferred[None] | None:
        """For a token of an unknown ``kid``: a Deferred that fires (never
        fails) once the keys have been looked up again, or None if they cannot
        be now (a file's keys; a URL's fetched too recently)."""


class StaticKeys:
    """The keys of a JWKS read once, at start (``--subscribe-jwks FILE``)."""

    version = 0

    def __init__(self, keys: Mapping[str, jwt.PyJWK]) -> None:
        self._keys = dict(keys)

    def key(self, kid: str, now: float) -> jwt.PyJWK | None:
        return self._keys.get(kid)

    def refresh(self, now: float) -> defer.Deferred[None] | None:
        return None


class Verifier:
    """Checks subscriber tokens: HS256 with ``secret`` (or, failing its
    signature, with ``previous``, kept during a rotation), and RS256, ES256 or
    EdDSA with the key of ``keys`` its header's ``kid`` names; with ``issuer``
    / ``audience``, the claims ``iss`` / ``aud`` must match.

    ``check`` is the whole contract: it raises ``Unauthorized`` (401) for a
    missing, forged, malformed or expired token, one of an unknown ``kid`` or
    of an algorithm not configured, and ``Forbidden`` (403) for a channel the
    token does not grant; otherwise it returns when the token expires, so a
    caller that keeps serving (an event stream) can end then. For a ``kid`` the
    keys do not hold yet it returns a Deferred instead, which fires with the
    same answer once the keys have been looked up again (or fails with the
    same errors). Expiry (``exp``, ``nbf``) is judged against the caller's
    clock, never the wall clock.
    """

    def __init__(self, secret: str = "", previous: str = "", keys: KeySource | None = None,
                 issuer: str = "", audience: str = "") -> None:
        self._secrets = tuple(s for s in (secret, previous) if s) if secret else ()
        self._keys = keys
        self._issuer = issuer
        self._audience = audience
        self._version = keys.version if keys is not None else 0
        self._grants: OrderedDict[str, Grant] = OrderedDict()

    def check(self, token: str | None, channels: Iterable[str], now: float,
              ) -> float | defer.Deferred[float]:
        """When the token expires (Unix seconds), or a Deferred of it; raise
        401 for a missing, invalid or expired token, 403 for a channel it does
        not grant."""
        if not token:
            raise Unauthorized("subscribing needs a token: token=... or Authorization: Bearer")
        self._forget_withdrawn()
        grant = self._grants.get(token)
        if grant is None:
            try:
                grant = self._verify(token, now)
            except _UnknownKey:
                assert self._keys is not None
                later = self._keys.refresh(now)
                if later is None:
                    raise
                names = list(channels)
                return later.addCallback(lambda _: self._after_refresh(token, names, now))
        return self._judge(token, grant, channels, now)

    def _after_refresh(self, token: str, channels: list[str], now: float) -> float:
        """:meth:`check` once the keys were looked up again: an unknown kid now is 401."""
        self._forget_withdrawn()
        return self._judge(token, self._verify(token, now), channels, now)

    def _forget_withdrawn(self) -> None:
        if self._keys is not None and self._keys.version != self._version:
            self._grants.clear()  # some were verified with keys since withdrawn
            self._version = self._keys.version

    def _judge(self, token: str, grant: Grant, channels: Iterable[str], now: float) -> float:
        if grant.expires <= now:
            self._grants.pop(token, None)
            raise Unauthorized("the subscribe token has expired")
        if now < grant.not_before:
            raise Unauthorized("the subscribe token is not valid yet (nbf)")
        for channel in channels:
            if not grant.allows(channel):
                raise Forbidden(f"the token does not grant channel {channel[:100]!r}")
        return grant.expires

    def _verify(self, token: str, now: float) -> Grant:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as e:
            raise Unauthorized(f"the subscribe token is not valid: {e}") from None
        algorithm = header.get("alg")
        if algorithm == ALGORITHM and self._secrets:
            claims = self._decode_hs256(token)
        elif algorithm in ASYMMETRIC and self._keys is not None:
            kid = header.get("kid")
            if not isinstance(kid, str) or not kid:
                raise Unauthorized(f"the subscribe token ({algorithm}) names no key: no kid")
            key = self._keys.key(kid, now)
            if key is None:
                raise _UnknownKey(f"the subscribe token's key {kid[:100]!r} is unknown")
            claims = self._decode(token, key, [key.algorithm_name])
        else:
            accepted = ([ALGORITHM] if self._secrets else []) + (
                list(ASYMMETRIC) if self._keys is not None else [])
            raise Unauthorized(f"the subscribe token's algorithm {str(algorithm)[:20]!r} is "
                               f"not accepted here: {', '.join(accepted)}")
        grant = _grant(claims)
        self._grants[token] = grant
        if len(self._grants) > _KEPT:
            self._grants.popitem(last=False)
        return grant

    def _decode_hs256(self, token: str) -> dict[str, Any]:
        """With the current secret, or else (a signature that does not match
        it) with the previous one, during a rotation."""
        for secret in self._secrets[:-1]:
            try:
                return self._decode(token, secret, [ALGORITHM])
            except _BadSignature:
                continue
        return self._decode(token, self._secrets[-1], [ALGORITHM])

    def _decode(self, token: str, key: Any, algorithms: list[str]) -> dict[str, Any]:
        required = ["exp", "channels"] + (["iss"] if self._issuer else []) + (
            ["aud"] if self._audience else [])
        try:
            # exp and nbf are judged by check() against the caller's clock, not here;
            # iss and aud only when configured (an identity provider's token carries
            # an aud this node need not know)
            claims: dict[str, Any] = jwt.decode(
                token, key, algorithms=algorithms, issuer=self._issuer or None,
                audience=self._audience or None,
                options={"require": required, "verify_exp": False, "verify_nbf": False,
                         "verify_iat": False, "verify_iss": bool(self._issuer),
                         "verify_aud": bool(self._audience)})
        except jwt.InvalidSignatureError as e:
            raise _BadSignature(f"the subscribe token is not valid: {e}") from None
        except jwt.InvalidTokenError as e:
            raise Unauthorized(f"the subscribe token is not valid: {e}") from None
        return claims


class _BadSignature(Unauthorized):
    """A token whose signature the key tried does not verify."""


class _UnknownKey(Unauthorized):
    """A token signed with a key (a ``kid``) the key source does not hold now."""


def _grant(claims: Mapping[str, Any]) -> Grant:
    names = claims["channels"]
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise Unauthorized("the token's channels claim is not a list of names")
    if not isinstance(claims["exp"], int | float) or isinstance(claims["exp"], bool):
        raise Unauthorized("the token's exp claim is not a time")
    not_before = claims.get("nbf", 0)
    if not isinstance(not_before, int | float) or isinstance(not_before, bool):
        raise Unauthorized("the token's nbf claim is not a time")
    return Grant(frozenset(n for n in names if not n.endswith("*")),
                 tuple(n[:-1] for n in names if n.endswith("*")), float(claims["exp"]),
                 float(not_before))
