"""Subscriber tokens: HS256 JWTs that name the channels a subscriber may read.

A token's claim ``channels`` lists exact names and prefixes ending in ``*``
(``chat:room42:*``); its standard claim ``exp`` bounds its life. Checking is
pure: the caller passes the time. A verified token's grants are kept (keyed
by the token itself, bounded) so a poll costs a dictionary lookup and a
comparison, not a signature check.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import jwt

from pushup.core.errors import Forbidden, Unauthorized

ALGORITHM = "HS256"
_KEPT = 4096  # verified tokens remembered


@dataclass(frozen=True, slots=True)
class Grant:
    exact: frozenset[str]
    prefixes: tuple[str, ...]
    expires: float

    def allows(self, channel: str) -> bool:
        return channel in self.exact or channel.startswith(self.prefixes)


def issue(secret: str, channels: Iterable[str], expires: float) -> str:
    """A token for ``channels`` (names, or prefixes ending in ``*``) until ``expires``."""
    return jwt.encode({"channels": list(channels), "exp": int(expires)}, secret,
                      algorithm=ALGORITHM)


class Verifier:
    """Checks subscriber tokens (HS256 JWTs signed with ``--subscribe-secret``).

    ``check`` is the whole contract: it raises ``Unauthorized`` (401) for a
    missing, forged, malformed or expired token and ``Forbidden`` (403) for a
    channel the token does not grant, and otherwise returns when the token
    expires, so a caller that keeps serving (an event stream) can end then.
    Expiry is judged against the caller's clock, never the wall clock. A
    verified token's grant is remembered (at most ``_KEPT``, oldest first out),
    so a fan-out's re-polls cost one dictionary look-up, not one HMAC each.
    """

    def __init__(self, secret: str) -> None:
        self._secret = secret
        self._grants: OrderedDict[str, Grant] = OrderedDict()

    def check(self, token: str | None, channels: Iterable[str], now: float) -> float:
        """When the token expires (Unix seconds); raise 401 for a missing,
        invalid or expired token, 403 for a channel it does not grant."""
        if not token:
            raise Unauthorized("subscribing needs a token: token=... or Authorization: Bearer")
        grant = self._grants.get(token)
        if grant is None:
            grant = self._verify(token)
        if grant.expires <= now:
            self._grants.pop(token, None)
            raise Unauthorized("the subscribe token has expired")
        for channel in channels:
            if not grant.allows(channel):
                raise Forbidden(f"the token does not grant channel {channel[:100]!r}")
        return grant.expires

    def _verify(self, token: str) -> Grant:
        try:
            # exp is checked by check() against the caller's clock, not here
            claims = jwt.decode(token, self._secret, algorithms=[ALGORITHM],
                                options={"require": ["exp", "channels"], "verify_exp": False})
        except jwt.InvalidTokenError as e:
            raise Unauthorized(f"the subscribe token is not valid: {e}") from None
        names = claims["channels"]
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise Unauthorized("the token's channels claim is not a list of names")
        if not isinstance(claims["exp"], int | float):
            raise Unauthorized("the token's exp claim is not a time")
        grant = Grant(frozenset(n for n in names if not n.endswith("*")),
                      tuple(n[:-1] for n in names if n.endswith("*")), float(claims["exp"]))
        self._grants[token] = grant
        if len(self._grants) > _KEPT:
            self._grants.popitem(last=False)
        return grant
