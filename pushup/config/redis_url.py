"""Where Redis is: the URLs ``--engine`` takes, parsed into ``RedisURL`` values.

``parse_url`` reads one ``redis://`` or ``unix://`` URL and ``parse_seeds`` the
comma list of a Redis Cluster's seeds; anything else is a ``ValueError`` with
a one-line message whose credentials are masked (``pushup.config`` turns it
into a ``ConfigError``). Pure parsing: no socket is opened, no name resolved.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

REDIS_PORT = 6379


@dataclass(frozen=True, slots=True)
class RedisURL:
    """Where Redis is: TCP ``host``/``port``, or a Unix socket ``path``; then db and auth."""

    host: str = "127.0.0.1"
    port: int = REDIS_PORT
    db: int = 0
    path: str | None = None  # a Unix socket; host and port are then unused
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def __str__(self) -> str:
        """The URL without its credentials (safe to log)."""
        if self.path is not None:
            return f"unix://{self.path}" + (f"?db={self.db}" if self.db else "")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"redis://{host}:{self.port}/{self.db}"


_URL_FORMS = (
    "redis://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...][/DB] or unix:///PATH[?db=N]")


def parse_url(text: str) -> RedisURL:
    """``redis://[[user]:password@]host[:port][/db]`` or ``unix:///path[?db=N&password=P]``.

    Raises ValueError with a one-line message (credentials masked) for anything else.
    """
    shown = re.sub(r"://([^:@/]*):[^@/]*@", r"://\1:***@", text)

    def bad(why: str) -> ValueError:
        return ValueError(f"bad Redis URL {shown!r}: {why} (expected {_URL_FORMS})")

    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as error:
        raise bad(str(error)) from None
    if parts.fragment:
        raise bad("a fragment is not allowed")
    if parts.scheme == "unix":
        if parts.netloc or not parts.path:
            raise bad("a Unix socket URL is unix:///absolute/path")
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
        unknown = set(query) - {"db", "password"}
        if unknown:
            raise bad(f"unknown option {sorted(unknown)[0]!r}")
        password = query.get("password", [None])[-1]
        return RedisURL(path=parts.path, db=_db(query.get("db", ["0"])[-1], bad),
                        password=password)
    if parts.scheme != "redis":
        raise bad(f"scheme {parts.scheme!r} is not supported" if parts.scheme else "no scheme")
    if not parts.hostname:
        raise bad("no host")
    if parts.query:
        raise bad("options are not allowed after a redis:// URL")
    path = parts.path.strip("/")
    return RedisURL(host=parts.hostname, port=REDIS_PORT if port is None else port,
                    db=_db(path or "0", bad),
                    username=unquote(parts.username) if parts.username else None,
                    password=unquote(parts.password) if parts.password is not None else None)


def parse_seeds(text: str) -> list[RedisURL]:
    """The Redis nodes ``--engine`` names: ``redis://[[user]:password@]HOST:PORT[,HOST:PORT
    ...][/db]`` (one redis-server, or seeds of one Redis Cluster: the same user, password
    and db for all), or one URL ``parse_url`` takes.

    Raises ValueError with a one-line message (credentials masked) for anything else.
    """
    head, sep, rest = text.partition("://")
    if not sep or head != "redis" or "," not in rest:
        return [parse_url(text)]
    userinfo, at, hosts = rest.rpartition("@")
    hosts, slash, db = hosts.partition("/")
    prefix = f"redis://{userinfo}{at}"
    seeds = []
    for host in hosts.split(","):
        if not host:
            raise ValueError(f"bad Redis URL list {'redis://' + hosts!r}: an empty HOST:PORT "
                             "between commas")
        seeds.append(parse_url(f"{prefix}{host}{slash}{db}"))
    return seeds


def _db(text: str, bad: Callable[[str], ValueError]) -> int:
    if not text.isascii() or not text.isdigit():
        raise bad(f"database {text!r} is not a number")
    return int(text)
