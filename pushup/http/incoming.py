"""The request being read: what one HTTP/1.1 message's head and body have
brought so far, while httptools parses it (uvicorn's request cycle, for the
reading half of a connection).

An ``Incoming`` is made for each message when the one before it is complete,
filled from the parser's callbacks and turned into a ``Request``; nothing of
it outlives its message. Its head is checked here, against the limits given
and the head's fixed ones (``MAX_HEADER_BYTES``, ``MAX_HEADERS``, one valid
Host, a target with a path): a head that fails raises ``Refuse`` with the
answer it gets, as h11's errors carry their status. No socket, no clock: the
time its head began is given.
"""

from __future__ import annotations

import re
from typing import Any, Final, cast

from httptools import HttpParserError, parse_url

from pushup.core import errors
from pushup.http.exchange import Response, error_response

MAX_HEADER_BYTES: Final = 16 * 1024  # a head's bytes besides its target (as h11 and Twisted)
MAX_HEADERS: Final = 100
# RFC 9112 §3.2 and RFC 3986 §3.2.2: uri-host [ ":" port ], at least one character
_HOST: Final = re.compile(
    rb"(\[[0-9A-Za-z:._~!$&'()*+,;=-]+\]|[0-9A-Za-z._~%!$&'()*+,;=-]+)(:[0-9]*)?")

# Host values that matched ``_HOST``, so a connection's next request skips the
# regex (~0.5 µs); bounded in count and size (a DNS name and a port), as
# clients choose them.
_GOOD_HOSTS: set[bytes] = set()
_GOOD_HOSTS_MAX: Final = 256
_GOOD_HOST_BYTES: Final = 262

BAD_HOST: Final = error_response(errors.BadRequest(
    "an HTTP/1.1 request needs exactly one valid Host header", code="bad_request"), close=True)
HEADERS_TOO_LARGE: Final = error_response(errors.HeadersTooLarge(
    f"a request's headers are at most {MAX_HEADER_BYTES} bytes in at most {MAX_HEADERS} "
    "lines; give a large token as token= in the query"), close=True)


class Refuse(Exception):
    """Raised while a request is read: answer ``response`` after those before
    it, read nothing more, close (``None``: the answer is queued already)."""

    def __init__(self, response: Response | None) -> None:
        self.response = response


class Incoming:
    """One message as read so far. Its fields are the protocol's to fill; the
    methods state the rules of a head."""

    def __init__(self) -> None:
        self.head_began = 0.0  # when its first byte was read
        self.head_bytes = 0  # bytes read since, while in the head
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.header_bytes = 0
        self.hosts = 0  # Host lines
        self.repeated_key = False  # two Idempotency-Key lines: refused once read
        self.path = b""
        self.query = b""
        self.limit = 0  # the body's size allowed (the handlers' ``admit``)
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.too_large = False  # its body is read and dropped
        # a 413 queued before its body came; the body is still read, and dropped
        self.refused_early: Response | None = None
        self.expects_continue = False  # 100 Continue goes after the answers before it
        self.http10 = False  # an HTTP/1.0 message (known once its head is read)

    def add_url(self, url: bytes, max_target: int) -> None:
        self.url += url
        if len(self.url) > max_target:
            raise Refuse(error_response(errors.TargetTooLong(
                "the request line is longer than any valid request needs"), close=True))

    def add_header(self, name: bytes, value: bytes, max_event_id: int) -> None:
        """Keep one header line (``name`` lower-case; a repeat is joined with
        ", "); refused past ``MAX_HEADER_BYTES`` or ``MAX_HEADERS`` (a
        Last-Event-ID up to ``max_event_id`` is not counted: any id an event
        stream issued comes back; its size: ``sse.max_event_id``)."""
        if name != b"last-event-id" or len(value) > max_event_id:
            self.header_bytes += len(name) + len(value) + 4
            if self.header_bytes > MAX_HEADER_BYTES:
                raise Refuse(HEADERS_TOO_LARGE)
        if name == b"host":
            self.hosts += 1
        headers = self.headers
        if name in headers:
            if name == b"idempotency-key":
                self.repeated_key = True
            value = headers[name] + b", " + value
        elif len(headers) >= MAX_HEADERS:
            raise Refuse(HEADERS_TOO_LARGE)
        headers[name] = value

    def head_too_large(self, max_event_id: int) -> bool:
        """Whether a head still being read is past its size already (a header
        in the making; a Last-Event-ID has its own allowance)."""
        return self.head_bytes - len(self.url) > MAX_HEADER_BYTES + max_event_id

    def check_head(self, http10: bool) -> None:
        """A complete head: exactly one valid Host (none from an HTTP/1.0
        client), and a target with a path, whose ``path`` and ``query`` are set."""
        self.http10 = http10
        host = self.headers.get(b"host")
        if host is None:
            if not http10:
                raise Refuse(BAD_HOST)
        elif self.hosts != 1:
            raise Refuse(BAD_HOST)
        elif host not in _GOOD_HOSTS:
            if not _HOST.fullmatch(host):
                raise Refuse(BAD_HOST)
            if len(host) <= _GOOD_HOST_BYTES:
                if len(_GOOD_HOSTS) >= _GOOD_HOSTS_MAX:
                    _GOOD_HOSTS.clear()
                _GOOD_HOSTS.add(host)
        if not self._split_target():
            raise Refuse(error_response(errors.NotFound(
                f"no such path: {self.url.decode('latin-1')[:100]}")))

    def _split_target(self) -> bool:
        """Set ``path`` and ``query`` from the target: origin form, or absolute
        form (RFC 9112 §3.2.2); ``*`` is a path (no handler's). False if it
        names no path, or does not parse."""
        url = self.url
        if url[:1] == b"/":
            self.path, _, self.query = url.partition(b"?")
            return True
        try:
            parsed = parse_url(url)
        except HttpParserError:
            return False
        # httptools' stub says `path: bytes` and `query: bytes`, but each is None
        # when absent: read untyped, or the compiled build checks for bytes and
        # fails (a target with no path was a 500 there, and 404 interpreted)
        path: bytes | None = cast(Any, parsed).path
        given: bytes | None = cast(Any, parsed).query
        if not path:
            return False
        self.path, self.query = path, (b"" if given is None else given)
        return True

    def take(self, chunk: bytes) -> bool:
        """Keep ``chunk`` of the body; False once the body is past ``limit``
        (from then on it is counted and dropped: ``too_large``)."""
        self.body_bytes += len(chunk)
        if self.too_large:
            return False
        if self.body_bytes <= self.limit:
            self.body.append(chunk)
            return True
        self.too_large = True
        self.body = []
        return False

    def whole_body(self) -> bytes:
        body = self.body
        return body[0] if len(body) == 1 else b"".join(body)
