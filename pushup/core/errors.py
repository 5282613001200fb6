"""Every error PushUp answers a client with, and nothing else.

The core raises these; exactly one function in :mod:`pushup.http.exchange` turns them
into the JSON error body. Each class states, in its header, the HTTP status and the
machine-readable code of API.md (a subclass inherits what it does not state), so the
hierarchy reads as one table and a raise site only writes the sentence.
"""

from __future__ import annotations

from typing import Any


class PushUpError(Exception):
    """An error a client caused or must be told about: status, code, message."""

    status = 500
    code = "internal_error"

    def __init_subclass__(cls, *, status: int | None = None, code: str | None = None,
                          **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if code is not None:
            cls.code = code

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class BadRequest(PushUpError, status=400, code="bad_parameter"):
    """400: malformed body, wrong type, out-of-range value."""


class BadJSON(BadRequest, code="bad_json"): ...
class BadChannelName(BadRequest, code="bad_channel_name"): ...
class TooManyChannels(BadRequest, code="too_many_channels"): ...
class BadIdempotencyKey(BadRequest, code="bad_idempotency_key"): ...


class Unauthorized(PushUpError, status=401, code="unauthorized"): ...


class Forbidden(PushUpError, status=403, code="forbidden"):
    """403: a token or origin that does not grant this."""


class NotFound(PushUpError, status=404, code="not_found"): ...
class NoSuchChannel(NotFound, code="no_such_channel"): ...


class MethodNotAllowed(PushUpError, status=405, code="method_not_allowed"):
    def __init__(self, message: str, allowed: tuple[str, ...]) -> None:
        super().__init__(message)
        self.allowed = allowed


class RequestTimeout(PushUpError, status=408, code="request_timeout"):
    """408: a request that did not arrive in time (the connection closes)."""


class ChannelExists(PushUpError, status=409, code="channel_exists"): ...


class TooLarge(PushUpError, status=413, code="too_large"): ...
class TargetTooLong(TooLarge, status=414): ...
class HeadersTooLarge(TooLarge, status=431): ...


class KeyReused(PushUpError, status=422, code="idempotency_key_reused"):
    """422: an ``Idempotency-Key`` already used for a publish with another body."""


class Unavailable(PushUpError, status=503, code="overloaded"):
    """503: work the node cannot hold right now."""

    retry_after: int | None = None  # seconds, sent as Retry-After when set


class EngineUnavailable(Unavailable, code="engine_unavailable"):
    """The cluster's engine (Redis) is unreachable: the command was never sent,
    so nothing was stored (one sent and not answered is ``OutcomeUnknown``)."""

    retry_after = 1


class OutcomeUnknown(PushUpError, status=504, code="outcome_unknown"):
    """504: the engine was asked to store it and did not say whether it did
    (Redis did not answer in time, or the connection went while it was
    asked). It may be stored: retry with the same ``Idempotency-Key``."""


class CatchingUp(Unavailable, code="catching_up"):
    """A node that is loading what it must hold before it serves: its peers'
    cache, the Redis log or its data directory."""


class ShuttingDown(Unavailable, code="shutting_down"): ...


# -- Durable Streams (pushup.core.streams): what they carry is a value, which
# the HTTP layer renders in the protocol's headers

class StreamConflict(PushUpError, status=409, code="stream_conflict"):
    """409: the stream exists otherwise, is closed, or a sequence went back."""


class StreamClosed(StreamConflict):
    """409: data appended to a closed stream; ``tail``: the offset it ends at."""

    def __init__(self, message: str, tail: str) -> None:
        super().__init__(message)
        self.tail = tail


class SequenceGap(StreamConflict):
    """409: a producer's sequence number is not the one the stream expects
    (``expected``; it sent ``received``)."""

    def __init__(self, message: str, expected: int, received: int) -> None:
        super().__init__(message)
        self.expected = expected
        self.received = received


class ForkTooDeep(BadRequest, code="fork_too_deep"):
    """400: a fork of a stream that is ``MAX_FORK_DEPTH`` forks deep already."""


class StreamGone(PushUpError, status=410, code="stream_gone"):
    """410: the stream was deleted while forks still read it."""


class OffsetGone(PushUpError, status=410, code="offset_gone"):
    """410: the offset is before the earliest one the stream's retention keeps."""

    def __init__(self, message: str, earliest: str) -> None:
        super().__init__(message)
        self.earliest = earliest


class StreamsFull(PushUpError, status=507, code="streams_full"):
    """507: the node holds as many stream bytes as it may (``budget``)."""


class StaleEpoch(PushUpError, status=403, code="stale_producer_epoch"):
    """403: a producer's epoch older than the stream has seen (a zombie);
    ``current``: the stream's."""

    def __init__(self, current: int) -> None:
        super().__init__(f"producer epoch is stale; the current one is {current}")
        self.current = current


# -- Durable Streams subscriptions (pushup.core.subscriptions, protocol §6-7):
# the protocol's own codes, spelled as its clients match them

class WebhookUrlRejected(BadRequest, code="WEBHOOK_URL_REJECTED"):
    """400: a webhook URL the node will not POST to (§6.2, §12.8)."""


class SubscriptionConflict(PushUpError, status=409, code="SUBSCRIPTION_CONFLICT"):
    """409: a subscription exists at the id with another definition."""


class Fenced(PushUpError, status=409, code="FENCED"):
    """409: a callback, ack or release of a wake that is not the current one."""


class AlreadyClaimed(PushUpError, status=409, code="ALREADY_CLAIMED"):
    """409: a pull-wake claim while another worker holds the lease."""

    def __init__(self, message: str, holder: str, generation: int) -> None:
        super().__init__(message)
        self.holder = holder
        self.generation = generation

    @property
    def fields(self) -> dict[str, object]:
        """What the error body carries besides code and message (§7.2)."""
        return {"current_holder": self.holder, "generation": self.generation}
