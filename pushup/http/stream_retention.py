"""A Durable Stream's retention as HTTP says it (docs/api.md, "Retention"):
the ``Stream-Retention-Age`` / ``Stream-Retention-Bytes`` a creation asks (or
the node's ``--stream-retention-age`` / ``-bytes``), and the fields HEAD
answers with. What is let go of, and when, is the core's
(:meth:`pushup.core.stream.Stream.trim`); this module parses and renders only.
"""

from __future__ import annotations

from pushup.config import Config
from pushup.core.errors import BadRequest
from pushup.core.stream import Stream
from pushup.core.stream_values import decimal
from pushup.http import stream_headers as h
from pushup.http.exchange import Request

_ASKED = ((h.key(h.RETENTION_AGE), h.RETENTION_AGE, "stream_retention_age"),
          (h.key(h.RETENTION_BYTES), h.RETENTION_BYTES, "stream_retention_bytes"))


def retention_asked(request: Request, config: Config, *, fork: bool,
                    ) -> tuple[int | None, int | None]:
    """A creation's retention (age in seconds, bytes): its headers, else the
    node's defaults; none for a fork, which reads its source below its fork
    point. 400 for one that is not a whole number from 1, or given to a fork."""
    given: list[int | None] = []
    for key, name, default in _ASKED:
        text = request.headers.get(key)
        header = name.decode("latin-1")
        if text is not None and fork:
            raise BadRequest(f"{header} is not given to a fork: it reads its source "
                             "below its fork point")
        value = None if text is None else decimal(text.decode("latin-1"), header)
        if value == 0:
            raise BadRequest(f"{header}: 0 would keep nothing; give at least 1")
        if value is None and not fork:
            value = getattr(config, default) or None
        given.append(value)
    return given[0], given[1]


def retention_fields(stream: Stream) -> h.Headers:
    """A stream's retention, and the earliest offset it keeps, as HEAD says them."""
    if not stream.retains:
        return ()
    fields: h.Headers = ((h.EARLIEST_OFFSET, stream.earliest.offset.encode()),)
    if stream.retention_age is not None:
        fields += ((h.RETENTION_AGE, b"%d" % stream.retention_age),)
    if stream.retention_bytes is not None:
        fields += ((h.RETENTION_BYTES, b"%d" % stream.retention_bytes),)
    return fields
