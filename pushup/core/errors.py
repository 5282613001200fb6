"""Every error PushUp answers a client with, and nothing else.

The core raises these; exactly one function in :mod:`pushup.http.exchange` turns them
into the JSON error body. Each class carries the HTTP status and the
machine-readable code of API.md, so a raise site only writes the sentence.
"""

from __future__ import annotations


class PushUpError(Exception):
    """An error a client caused or must be told about: status, code, message."""

    status = 500
    code = "internal_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class BadRequest(PushUpError):
    """400: malformed body, wrong type, out-of-range value."""

    status = 400
    code = "bad_parameter"


class BadJSON(BadRequest):
    code = "bad_json"


class BadChannelName(BadRequest):
    code = "bad_channel_name"


class TooManyChannels(BadRequest):
    code = "too_many_channels"


class BadIdempotencyKey(BadRequest):
    code = "bad_idempotency_key"


class Unauthorized(PushUpError):
    status = 401
    code = "unauthorized"


class Forbidden(PushUpError):
    """403: a token or origin that does not grant this."""

    status = 403
    code = "forbidden"


class NotFound(PushUpError):
    status = 404
    code = "not_found"


class NoSuchChannel(NotFound):
    code = "no_such_channel"


class MethodNotAllowed(PushUpError):
    status = 405
    code = "method_not_allowed"

    def __init__(self, message: str, allowed: tuple[str, ...]) -> None:
        super().__init__(message)
        self.allowed = allowed


class RequestTimeout(PushUpError):
    """408: a request that did not arrive in time (the connection closes)."""

    status = 408
    code = "request_timeout"


class ChannelExists(PushUpError):
    status = 409
    code = "channel_exists"


class TooLarge(PushUpError):
    status = 413
    code = "too_large"


class TargetTooLong(TooLarge):
    status = 414


class HeadersTooLarge(TooLarge):
    status = 431


class KeyReused(PushUpError):
    """422: an ``Idempotency-Key`` already used for a publish with another body."""

    status = 422
    code = "idempotency_key_reused"


class Unavailable(PushUpError):
    """503: work the node cannot hold right now."""

    status = 503
    code = "overloaded"
    retry_after: int | None = None  # seconds, sent as Retry-After when set


class EngineUnavailable(Unavailable):
    """The cluster's engine (Redis) is unreachable: the command was never sent,
    so nothing was stored (one sent and not answered is ``OutcomeUnknown``)."""

    code = "engine_unavailable"
    retry_after = 1


class OutcomeUnknown(PushUpError):
    """504: the engine was asked to store it and did not say whether it did
    (Redis did not answer in time, or the connection went while it was
    asked). It may be stored: retry with the same ``Idempotency-Key``."""

    status = 504
    code = "outcome_unknown"


class CatchingUp(Unavailable):
    """A node that is loading what it must hold before it serves: its peers'
    cache, the Redis log or its data directory."""

    code = "catching_up"


class ShuttingDown(Unavailable):
    code = "shutting_down"
