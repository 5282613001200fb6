"""How an answer is framed on its connection: whether the connection stays
open after it, and how an event stream's body is delimited.

``Terms`` are fixed when a request's head is read (its HTTP version, whether
the client keeps the connection, a HEAD); a ``Queued`` request carries them
to its answer. An event stream is chunked on HTTP/1.1, so that each write
reaches a reader as it comes, and delimited by the close on HTTP/1.0. Values
and functions only: no socket, no clock, no state of a connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pushup.http.exchange import Request

CLOSE: Final = b"close"  # the Connection header of an answer that ends its connection
STREAM_TYPE: Final = b"text/event-stream; charset=utf-8"
LAST_CHUNK: Final = b"0\r\n\r\n"


# Terms and Queued are frozen by their Final attributes, not by a frozen
# dataclass: the compiled build makes a Final attribute read-only, and builds
# such a value in ~30 ns where a frozen dataclass's __init__ takes ~270 ns
# (object.__setattr__ per field) on every request, and each field read is a
# lookup instead of a load. mypy rejects an assignment in both builds.


class Terms:
    """What an answer to one request is framed by: ``keep_alive``, the client
    keeps the connection (HTTP/1.1's default, or HTTP/1.0's ``keep-alive``);
    ``http10``, it speaks HTTP/1.0; ``head``, a HEAD (the body is left out)."""

    def __init__(self, keep_alive: bool, http10: bool, head: bool) -> None:
        self.keep_alive: Final = keep_alive
        self.http10: Final = http10
        self.head: Final = head

    def shareable(self) -> bool:
        """Whether a fan-out's shared response (the same bytes to everyone:
        HTTP/1.1, kept alive, with a body) answers on these terms."""
        return self.keep_alive and not self.http10 and not self.head

    def __repr__(self) -> str:
        return f"Terms(keep_alive={self.keep_alive}, http10={self.http10}, head={self.head})"


# The terms of every request, made once (a request picks one, allocating nothing).
_TERMS: Final = tuple(Terms(bool(i & 4), bool(i & 2), bool(i & 1)) for i in range(8))
REFUSAL: Final = _TERMS[0]  # a refusal's or a timeout's: answered, then the connection closes


def terms(keep_alive: bool, http10: bool, head: bool) -> Terms:
    return _TERMS[(4 if keep_alive else 0) | (2 if http10 else 0) | (1 if head else 0)]


class Queued:
    """A request read and not yet answered; ``size``: its bytes, counted
    against the read-ahead (``protocol.PIPELINE_BYTES``) until it is answered."""

    def __init__(self, request: Request, terms: Terms, size: int) -> None:
        self.request: Final = request
        self.terms: Final = terms
        self.size: Final = size

    def closing(self) -> Queued:
        """The same request, its answer closing the connection."""
        given = self.terms
        return Queued(self.request, terms(False, given.http10, given.head), self.size)


def connection(given: Terms, close: bool, draining: bool) -> bytes:
    """The ``Connection`` header of an answer on ``given`` terms: ``CLOSE``
    when the connection ends after it (the client's wish, the answer's
    ``close``, a drain), ``keep-alive`` to an HTTP/1.0 client that keeps it,
    else none (``b""``)."""
    if not given.keep_alive or close or draining:
        return CLOSE
    return b"keep-alive" if given.http10 else b""


def chunk(data: bytes) -> bytes:
    """``data`` as one HTTP/1.1 chunk (RFC 9112 §7.1); ``b""`` is the last chunk."""
    return b"%x\r\n%b\r\n" % (len(data), data)


@dataclass(frozen=True, slots=True)
class StreamFraming:
    """An event stream's body: in chunks (HTTP/1.1), or bytes as they are,
    ended by the close (HTTP/1.0)."""

    chunked: bool

    def head_fields(self) -> tuple[tuple[bytes, bytes], ...]:
        return ((b"Transfer-Encoding", b"chunked"),) if self.chunked else ()

    def frame(self, data: bytes) -> bytes:
        return chunk(data) if self.chunked else data

    def end(self) -> bytes:
        """What ends the body before the close."""
        return LAST_CHUNK if self.chunked else b""


CHUNKED: Final = StreamFraming(True)
CLOSE_DELIMITED: Final = StreamFraming(False)


def stream_framing(given: Terms) -> StreamFraming:
    return CLOSE_DELIMITED if given.http10 else CHUNKED
