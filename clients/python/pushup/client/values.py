"""What the client hands back: receipts of publishes, the items a subscription
yields, channel facts, and the exceptions it raises.

Plain frozen values parsed from the server's JSON (docs/api.md); nothing here
talks to the network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Receipt:
    """One stored message: its cluster-unique id, its timestamp, its channels."""

    id: str
    timestamp: float
    channels: tuple[str, ...]

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Receipt:
        return cls(str(body["id"]), float(body["timestamp"]), tuple(body["channels"]))


@dataclass(frozen=True, slots=True)
class Published:
    """The answer to a publish (one message, or a batch in order).

    ``acknowledged`` is True for a 201: the message is held as the node's
    ``--publish-ack`` promises (a peer, the disk, Redis). False for a 202: it
    was stored and delivered, but only this node holds it for now.
    ``idempotency_key`` is the key every attempt carried.
    """

    messages: tuple[Receipt, ...]
    acknowledged: bool
    status: int
    idempotency_key: str

    @property
    def id(self) -> str:
        """The id of the first (for a single publish: the only) message."""
        return self.messages[0].id

    @property
    def timestamp(self) -> float:
        return self.messages[0].timestamp


@dataclass(frozen=True, slots=True)
class Message:
    """One message a subscription received, with the subscribed channels it was on."""

    id: str
    timestamp: float
    channels: tuple[str, ...]
    data: Any

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Message:
        return cls(str(body["id"]), float(body["timestamp"]), tuple(body["channels"]),
                   body.get("data"))


@dataclass(frozen=True, slots=True)
class Gap:
    """The server's ``"gap": true``: messages after the subscription's position
    may be missing, and those are not coming. After an eviction (over the
    per-channel cap, expired) some were published and dropped unread. After a
    restart of a node without ``--data-dir`` (or of a whole cluster) the node
    lost its cache and cannot tell whether the subscription had read all of
    it, so it reports a gap once to every cursor from before the restart, even
    when nothing was lost. ``cursor`` is where reading resumes."""

    cursor: str


@dataclass(frozen=True, slots=True)
class Closed:
    """These channels were deleted; the subscription no longer follows them
    (it ends when none is left)."""

    channels: tuple[str, ...]


Event = Message | Gap | Closed


@dataclass(frozen=True, slots=True)
class ChannelInfo:
    """A channel's facts: when it expires and, from ``info``, how many messages
    it holds and how many subscribers wait on it (None where not reported)."""

    name: str
    expires_at: float
    messages: int | None = None
    subscribers: int | None = None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ChannelInfo:
        return cls(str(body["channel"]), float(body["expires_at"]), body.get("messages"),
                   body.get("subscribers"))


class PushUpError(Exception):
    """Every error this client raises."""


class APIError(PushUpError):
    """The server refused the request (a 4xx: never retried). ``status`` is the
    HTTP status, ``code`` the error body's code (``bad_channel_name``,
    ``unauthorized``, ``no_such_channel``, ...), ``message`` its sentence."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class Unavailable(PushUpError):
    """Every attempt failed with something retryable (503, 504, another 5xx,
    a timeout, a refused or dropped connection) and the retries ran out.

    ``outcome_unknown`` is False only when every attempt was certainly not
    stored (each a 503 or a refused connection); otherwise the publish may
    be stored: publish again with ``idempotency_key`` (the same key) and it
    is stored at most once. ``status``/``code`` describe the last answer
    (None after a network error); ``__cause__`` holds the last exception.
    """

    def __init__(self, what: str, attempts: int, status: int | None, code: str | None,
                 outcome_unknown: bool, idempotency_key: str | None = None) -> None:
        last = f"{status} {code}" if status is not None else "a network error"
        super().__init__(f"{what}: {attempts} attempts failed, the last with {last}")
        self.attempts = attempts
        self.status = status
        self.code = code
        self.outcome_unknown = outcome_unknown
        self.idempotency_key = idempotency_key
