"""Request parameters → core values: the query string, path names, bodies.

Every parameter a client sends is checked here and nowhere else; a bad one
raises the ``PushUpError`` the contract names. Pure functions of bytes, so
the thread-per-request baseline in ``loadtest/`` parses exactly as we do.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any, Generic, TypeVar
from urllib.parse import unquote_to_bytes

from pushup.config import Config
from pushup.core import errors
from pushup.core.channels import ttl_in_seconds
from pushup.core.cursor import MAX_ORIGINS
from pushup.core.cursor import PREFIX as CURSOR_PREFIX
from pushup.core.cursor import decode as decode_cursor
from pushup.core.model import (
    MAX_CHANNEL_NAME,
    NOW,
    Query,
    check_channel_list,
    check_channel_name,
    loads,
    parse_time,
)

DEFAULT_TIMEOUT = 50.0
DEFAULT_LIMIT = 100
_WHOLE = re.compile(r"[0-9]+")
# The longest cursor we issue: MAX_ORIGINS of "<64>.<16>:<18 digits>;", base64.
MAX_CURSOR_CHARS = len(CURSOR_PREFIX) + (MAX_ORIGINS * (64 + 1 + 16 + 1 + 18 + 1) * 4 + 2) // 3
_SLACK = 8 * 1024  # timeout, limit, until, a cache-buster, a token...
QUERY_CACHE_BYTES = 4 * 1024 * 1024  # parsed subscribe queries kept, by the bytes they hold
QUERY_CACHE_ENTRIES = 4096
_QUERY_OVERHEAD = 512  # a parsed query's objects, besides what is as long as its text
T = TypeVar("T")


def max_target(config: Config) -> int:
    """The longest request target a valid subscribe can need: every channel at
    its longest, each character a 4-byte UTF-8 one percent-encoded (12
    characters), plus the longest cursor."""
    channels = config.max_channels * (MAX_CHANNEL_NAME * 12 + 1)
    return len("/subscribe?channels=&since=") + channels + MAX_CURSOR_CHARS + _SLACK


def query_args(raw: bytes) -> dict[bytes, list[bytes]]:
    """A query string's parameters as bytes (form-encoded: ``+`` is a space).

    Not ``urllib.parse.parse_qs``: given bytes, it re-encodes each value as
    ASCII and fails on a percent-encoded UTF-8 channel name.
    """
    args: dict[bytes, list[bytes]] = {}
    for part in raw.split(b"&"):
        if not part:
            continue
        name, _, value = part.partition(b"=")
        if b"%" in name or b"+" in name:
            name = unquote_to_bytes(name.replace(b"+", b" "))
        if b"%" in value or b"+" in value:
            value = unquote_to_bytes(value.replace(b"+", b" "))
        args.setdefault(name, []).append(value)
    return args


def subscribe_query(raw: dict[bytes, list[bytes]], config: Config) -> tuple[Query, float]:
    """``GET /subscribe`` parameters (parsed query string) → (Query, timeout s)."""
    args = Args(raw)
    names = args.get("channels")
    if names is None:
        raise errors.BadRequest("channels is required: ?channels=a,b")
    channels = check_channel_list(names.split(","), config.max_channels)
    since_text = args.get("since")
    since: Any = 0
    if since_text is not None:
        if since_text == "now":
            since = NOW
        elif since_text.startswith(CURSOR_PREFIX):
            since = decode_cursor(since_text)
        else:
            try:
                float(since_text)
            except ValueError:
                since = decode_cursor(since_text)  # 400: neither time nor cursor
            else:
                since = parse_time(since_text, "since")
    until_text = args.get("until")
    until = None if until_text is None else parse_time(until_text, "until")
    timeout = min(args.number("timeout", DEFAULT_TIMEOUT), config.max_timeout)
    limit = min(args.integer("limit", DEFAULT_LIMIT), config.max_limit)
    return Query(channels, since, until, limit, config.max_response_bytes), timeout


def path_name(segment: bytes) -> str:
    """A channel name from one percent-encoded path segment."""
    try:
        return check_channel_name(unquote_to_bytes(segment).decode("utf-8"))
    except UnicodeDecodeError:
        raise errors.BadChannelName("a channel name must be UTF-8") from None


def json_object(body: bytes, empty_ok: bool = False) -> dict[str, Any]:
    """A request body that must be one JSON object (or empty, if allowed)."""
    if empty_ok and not body.strip():
        return {}
    value = loads(body)
    if not isinstance(value, dict):
        raise errors.BadJSON("the body must be a JSON object")
    return value


def ttl_of(body: dict[str, Any]) -> int | None:
    """The optional ``ttl`` of a channel body, in microseconds."""
    ttl = body.get("ttl")
    return None if ttl is None else ttl_in_seconds(ttl)


class Args:
    """Query-string parameters: UTF-8, each at most once."""

    def __init__(self, raw: dict[bytes, list[bytes]]) -> None:
        self._raw = raw

    def get(self, name: str) -> str | None:
        values = self._raw.get(name.encode())
        if not values:
            return None
        if len(values) > 1:
            raise errors.BadRequest(f"{name} is given more than once")
        try:
            return values[0].decode("utf-8")
        except UnicodeDecodeError:
            raise errors.BadRequest(f"{name} is not valid UTF-8") from None

    def number(self, name: str, default: float) -> float:
        text = self.get(name)
        if text is None:
            return default
        try:
            value = float(text)
        except ValueError:
            raise errors.BadRequest(f"{name} must be a number of seconds") from None
        if not value >= 0 or value == float("inf"):
            raise errors.BadRequest(f"{name} must be a finite number, 0 or more")
        return value

    def integer(self, name: str, default: int) -> int:
        text = self.get(name)
        if text is None:
            return default
        digits = text.lstrip("0")
        if not _WHOLE.fullmatch(text) or not digits:
            raise errors.BadRequest(f"{name} must be a whole number, 1 or more")
        return int(digits) if len(digits) < 19 else 10**18  # the caller caps it anyway


class ParsedQueries(Generic[T]):
    """Parsed query strings, keyed by the raw query, within a byte budget.

    A fan-out's clients all re-poll with the same query string (same
    channels, same new cursor), so each distinct one is parsed once. The
    caller stores a query only once it is authorised, so refused requests
    leave nothing here. An entry is charged twice its length (the key, and
    what was parsed from it) plus an overhead; the least recently used go
    first, and a query over an eighth of the budget is never kept.
    """

    def __init__(self, budget: int = QUERY_CACHE_BYTES,
                 entries: int = QUERY_CACHE_ENTRIES) -> None:
        self.budget = budget
        self._entries = entries
        self._kept: OrderedDict[bytes, T] = OrderedDict()
        self.bytes = 0  # what the entries kept are charged

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, raw: bytes) -> T | None:
        value = self._kept.get(raw)
        if value is not None:
            self._kept.move_to_end(raw)
        return value

    def put(self, raw: bytes, value: T) -> None:
        cost = _cost(raw)
        if raw in self._kept or cost * 8 > self.budget:
            return
        kept = self._kept
        while kept and (self.bytes + cost > self.budget or len(kept) >= self._entries):
            oldest, _ = kept.popitem(last=False)
            self.bytes -= _cost(oldest)
        kept[raw] = value
        self.bytes += cost


def _cost(raw: bytes) -> int:
    return 2 * len(raw) + _QUERY_OVERHEAD
