"""Durable Streams' header names, each written once, and the fields the core's
values go out in.

The core (:mod:`pushup.core.streams`) returns values (a tail, whether a stream
is closed, the sequence a producer is expected at) and raises errors that
carry values; this module names the protocol's headers and turns those values
into fields. A request's header is looked up by its name in lower case
(``key``), as the front hands headers over. It parses no HTTP.
"""

from __future__ import annotations

from pushup.core import errors
from pushup.core.errors import PushUpError

Headers = tuple[tuple[bytes, bytes], ...]

# -- the protocol's own (docs/api.md, "Durable Streams")
NEXT_OFFSET = b"Stream-Next-Offset"
CURSOR = b"Stream-Cursor"
UP_TO_DATE = b"Stream-Up-To-Date"
CLOSED = b"Stream-Closed"
TTL = b"Stream-TTL"
EXPIRES_AT = b"Stream-Expires-At"
SSE_DATA_ENCODING = b"Stream-SSE-Data-Encoding"
SEQ = b"Stream-Seq"
FORKED_FROM = b"Stream-Forked-From"
FORK_OFFSET = b"Stream-Fork-Offset"
FORK_SUB_OFFSET = b"Stream-Fork-Sub-Offset"
RETENTION_AGE = b"Stream-Retention-Age"  # PushUp's: seconds an append is kept
RETENTION_BYTES = b"Stream-Retention-Bytes"  # PushUp's: bytes of appends kept
EARLIEST_OFFSET = b"Stream-Earliest-Offset"  # PushUp's: the first offset kept (a 410)
PRODUCER_ID = b"Producer-Id"
PRODUCER_EPOCH = b"Producer-Epoch"
PRODUCER_SEQ = b"Producer-Seq"
PRODUCER_EXPECTED_SEQ = b"Producer-Expected-Seq"
PRODUCER_RECEIVED_SEQ = b"Producer-Received-Seq"
# -- HTTP's, as the protocol uses them
CONTENT_TYPE = b"Content-Type"
ETAG = b"ETag"
IF_NONE_MATCH = b"If-None-Match"
LOCATION = b"Location"
HOST = b"Host"
ALLOW = b"Allow"
AUTHORIZATION = b"Authorization"
CACHE_CONTROL = b"Cache-Control"
TRUE = b"true"


def key(name: bytes) -> bytes:
    """``name`` as a request's headers are keyed (lower case)."""
    return name.lower()


_EXPOSED = (NEXT_OFFSET, CURSOR, UP_TO_DATE, CLOSED, TTL, EXPIRES_AT, SSE_DATA_ENCODING,
            PRODUCER_EPOCH, PRODUCER_SEQ, PRODUCER_EXPECTED_SEQ, PRODUCER_RECEIVED_SEQ, ETAG,
            LOCATION, RETENTION_AGE, RETENTION_BYTES, EARLIEST_OFFSET)
# What every answer on a stream path carries besides its own.
COMMON: Headers = ((b"Cross-Origin-Resource-Policy", b"cross-origin"),
                   (b"Access-Control-Expose-Headers", b", ".join(_EXPOSED)))
# A preflight is answered on a stream path whatever --cors-origin says: without
# an Access-Control-Allow-Origin (the Writer's, from --cors-origin) a browser
# still refuses a foreign page, so this grants nothing the flag does not.
PREFLIGHT: Headers = (
    (b"Access-Control-Allow-Methods", b"GET, HEAD, PUT, POST, DELETE, OPTIONS"),
    (b"Access-Control-Allow-Headers", b", ".join((
        AUTHORIZATION, CONTENT_TYPE, IF_NONE_MATCH, TTL, EXPIRES_AT, CLOSED, SEQ,
        FORKED_FROM, FORK_OFFSET, FORK_SUB_OFFSET, PRODUCER_ID, PRODUCER_EPOCH,
        PRODUCER_SEQ, RETENTION_AGE, RETENTION_BYTES))),
    (b"Access-Control-Max-Age", b"86400"))


def closed(is_closed: bool) -> Headers:
    """``Stream-Closed: true`` for a closed stream, else nothing."""
    return ((CLOSED, TRUE),) if is_closed else ()


def error_fields(e: PushUpError) -> Headers:
    """The fields an error's values go out in, besides its JSON body."""
    if isinstance(e, errors.StreamClosed):
        return ((CLOSED, TRUE), (NEXT_OFFSET, e.tail.encode()))
    if isinstance(e, errors.SequenceGap):
        return ((PRODUCER_EXPECTED_SEQ, b"%d" % e.expected),
                (PRODUCER_RECEIVED_SEQ, b"%d" % e.received))
    if isinstance(e, errors.StaleEpoch):
        return ((PRODUCER_EPOCH, b"%d" % e.current),)
    if isinstance(e, errors.OffsetGone):
        return ((EARLIEST_OFFSET, e.earliest.encode()),)
    if isinstance(e, errors.MethodNotAllowed):
        return ((ALLOW, ", ".join(e.allowed).encode()),)
    return ()
